// A file that appears complete or not at all: bytes go to a temporary file beside the
// target, which commit() renames into place. Destroyed without commit(), it removes
// the temporary — so an error half-way leaves no half-written output.
#pragma once

#include <cstddef>
#include <cstdio>
#include <string>

namespace attn::detail {

class AtomicFile {
public:
    explicit AtomicFile(std::string path);  // throws attn::Error if the directory is not writable
    ~AtomicFile();
    AtomicFile(const AtomicFile&) = delete;
    AtomicFile& operator=(const AtomicFile&) = delete;

    void write(const void* data, std::size_t bytes);  // throws attn::Error (e.g. disk full)
    void commit();                                    // flush, close, rename into place

private:
    std::string path_, temp_;
    std::FILE* file_ = nullptr;
};

}  // namespace attn::detail
