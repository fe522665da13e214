#include "atomic_file.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "attn/error.hpp"

namespace attn::detail {

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)) {
    const std::size_t slash = path_.find_last_of('/');
    const std::string dir = slash == std::string::npos ? "" : path_.substr(0, slash + 1);
    const std::string base = slash == std::string::npos ? path_ : path_.substr(slash + 1);
    if (base.empty()) throw Error(path_ + ": output path names a directory, not a file");
    std::vector<char> tmpl(dir.begin(), dir.end());
    const std::string tail = "." + base + ".tmp.XXXXXX";
    tmpl.insert(tmpl.end(), tail.begin(), tail.end());
    tmpl.push_back('\0');
    const int fd = ::mkstemp(tmpl.data());
    if (fd < 0) throw Error(path_ + ": cannot create output file (" + std::strerror(errno) + ")");
    temp_ = tmpl.data();
    file_ = ::fdopen(fd, "wb");
    if (file_ == nullptr) {
        ::close(fd);
        ::unlink(temp_.c_str());
        throw Error(path_ + ": cannot open output file (" + std::strerror(errno) + ")");
    }
}

AtomicFile::~AtomicFile() {
    if (file_ != nullptr) {
        std::fclose(file_);
        ::unlink(temp_.c_str());
    }
}

void AtomicFile::write(const void* data, std::size_t bytes) {
    if (bytes != 0 && std::fwrite(data, 1, bytes, file_) != bytes) {
        throw Error(path_ + ": write failed (" + std::strerror(errno) + ")");
    }
}

void AtomicFile::commit() {
    std::FILE* f = file_;
    file_ = nullptr;
    const bool ok = std::fflush(f) == 0 && ::fsync(::fileno(f)) == 0;
    const int err = errno;
    if (std::fclose(f) != 0 || !ok) {
        ::unlink(temp_.c_str());
        throw Error(path_ + ": write failed (" + std::strerror(err) + ")");
    }
    // mkstemp creates 0600; give the output the usual permissions (0666 & ~umask).
    const mode_t mask = ::umask(0);
    ::umask(mask);
    ::chmod(temp_.c_str(), 0666 & ~mask);
    if (std::rename(temp_.c_str(), path_.c_str()) != 0) {
        const int e = errno;
        ::unlink(temp_.c_str());
        throw Error(path_ + ": cannot move the finished file into place (" + std::strerror(e) + ")");
    }
}

}  // namespace attn::detail
