// Where the file-reading fuzz targets put their inputs and round-trip outputs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace attn_fuzz {

// A file whose bytes are replaced for every input, kept in memory (memfd) and opened by
// name (/proc/self/fd/N), so the readers take their real path — open, type check, size —
// without disk traffic. A memfd is a regular file, as a .npy or .safetensors file is.
class MemFile {
public:
    explicit MemFile(const char* name);
    void set(const std::uint8_t* data, std::size_t size);
    const std::string& path() const { return path_; }

private:
    int fd_ = -1;
    std::string path_;
};

// A private directory for files the writers create (they stage and rename in place);
// made once per process and removed, with its files, at exit.
const std::string& scratch_dir();

// The process stops with a message: a broken invariant is a finding like a crash.
[[noreturn]] void finding(const std::string& what);

}  // namespace attn_fuzz
