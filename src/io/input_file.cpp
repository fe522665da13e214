#include "input_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "../core/check.hpp"
#include "attn/error.hpp"
#include "file_kind.hpp"

namespace attn::detail {
namespace {

[[noreturn]] void fail(const std::string& path, const std::string& what) { throw Error(detail::quoted_path(path) + ": " + what); }

void require_regular(const std::string& path, mode_t mode) {
    if (!S_ISREG(mode)) fail(path, "is " + describe_file_kind(mode) + ", not a regular file (inputs must be regular files)");
}

}  // namespace

InputFile::InputFile(const std::string& path) : path_(path) {
    if (path.empty()) fail("", "an empty path names no file");
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) fail(path, std::string("cannot open for reading (") + std::strerror(errno) + ")");
    require_regular(path, st.st_mode);
    // O_NONBLOCK: should the path have become a FIFO since the stat, the open still returns
    // at once and the fstat below refuses it. (On a regular file the flag changes nothing.)
    fd_ = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd_ < 0) fail(path, std::string("cannot open for reading (") + std::strerror(errno) + ")");
    if (::fstat(fd_, &st) != 0) {
        const int e = errno;
        ::close(fd_);
        fail(path, std::string("cannot stat (") + std::strerror(e) + ")");
    }
    if (!S_ISREG(st.st_mode)) {
        ::close(fd_);
        require_regular(path, st.st_mode);
    }
    size_ = static_cast<std::uint64_t>(st.st_size);
}

InputFile::~InputFile() {
    if (fd_ >= 0) ::close(fd_);
}

void InputFile::read_at(std::uint64_t offset, void* dst, std::size_t n) const {
    auto* p = static_cast<char*>(dst);
    std::size_t done = 0;
    while (done < n) {
        const ssize_t got = ::pread(fd_, p + done, n - done, static_cast<off_t>(offset + done));
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) {
            fail(path_, "read of " + std::to_string(n) + " bytes at offset " + std::to_string(offset) + " failed (" +
                            (got < 0 ? std::string(std::strerror(errno)) : std::string("the file ended early; changed while reading?")) +
                            ")");
        }
        done += static_cast<std::size_t>(got);
    }
}

std::string read_text_file(const std::string& path, std::size_t max_bytes) {
    const InputFile f(path);
    if (f.size() > max_bytes) {
        fail(path, "holds " + std::to_string(f.size()) + " bytes, more than the " + std::to_string(max_bytes) +
                       " bytes a text input may hold");
    }
    std::string text(static_cast<std::size_t>(f.size()), '\0');
    f.read_at(0, text.data(), text.size());
    return text;
}

}  // namespace attn::detail
