#include "scratch.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>

namespace attn_fuzz {

MemFile::MemFile(const char* name) : fd_(::memfd_create(name, 0)) {
    if (fd_ < 0) finding("memfd_create failed");
    path_ = "/proc/self/fd/" + std::to_string(fd_);
}

void MemFile::set(const std::uint8_t* data, std::size_t size) {
    if (::ftruncate(fd_, 0) != 0) finding("ftruncate of the memfd failed");
    std::size_t done = 0;
    while (done < size) {
        const ssize_t n = ::pwrite(fd_, data + done, size - done, static_cast<off_t>(done));
        if (n <= 0) finding("pwrite to the memfd failed");
        done += static_cast<std::size_t>(n);
    }
}

namespace {
std::string g_dir;
void remove_dir() {
    std::error_code ec;
    std::filesystem::remove_all(g_dir, ec);
}
}  // namespace

const std::string& scratch_dir() {
    if (g_dir.empty()) {
        const char* tmp = std::getenv("TMPDIR");
        std::string tmpl = std::string(tmp && *tmp ? tmp : "/tmp") + "/attn-fuzz.XXXXXX";
        if (::mkdtemp(tmpl.data()) == nullptr) finding("mkdtemp failed for " + tmpl);
        g_dir = tmpl;
        std::atexit(remove_dir);
    }
    return g_dir;
}

void finding(const std::string& what) {
    std::fprintf(stderr, "attn fuzz: FINDING: %s\n", what.c_str());
    std::abort();
}

}  // namespace attn_fuzz
