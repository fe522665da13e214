// Opening an input file: the one way every reader (.npy, safetensors, the CLI's text files)
// opens what a user names. Only regular files are inputs: a FIFO would block the open or the
// read forever, a device like /dev/zero never ends, a directory reads as garbage. The type is
// checked before opening (so a FIFO or device is never even opened), the open is non-blocking
// (so a file swapped for a FIFO in between cannot hang it) and the type is checked again on
// the descriptor (so what is read is what was checked).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace attn::detail {

class InputFile {
public:
    // Throws attn::Error "PATH: ..." if the path is missing, unreadable or not a regular file.
    explicit InputFile(const std::string& path);
    ~InputFile();
    InputFile(const InputFile&) = delete;
    InputFile& operator=(const InputFile&) = delete;

    const std::string& path() const { return path_; }
    std::uint64_t size() const { return size_; }  // as fstat saw it at open
    // Reads exactly n bytes at offset; throws attn::Error naming the path on a short read.
    void read_at(std::uint64_t offset, void* dst, std::size_t n) const;

private:
    std::string path_;
    int fd_ = -1;
    std::uint64_t size_ = 0;
};

// A whole text input, at most max_bytes long (a file that claims more is refused before
// anything is read). Errors are "PATH: ...".
std::string read_text_file(const std::string& path, std::size_t max_bytes);

}  // namespace attn::detail
