// What a stat() mode is, in words for error messages ("is a FIFO (named pipe), not ...").
#pragma once

#include <sys/stat.h>

#include <string>

namespace attn::detail {

inline std::string describe_file_kind(mode_t mode) {
    if (S_ISREG(mode)) return "a regular file";
    if (S_ISDIR(mode)) return "a directory";
    if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
    if (S_ISCHR(mode)) return "a character device";
    if (S_ISBLK(mode)) return "a block device";
    if (S_ISSOCK(mode)) return "a socket";
    if (S_ISLNK(mode)) return "a symbolic link";
    return "a special file";
}

}  // namespace attn::detail
