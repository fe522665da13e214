// Output files of a CLI command: every path is checked (distinct, creatable) before any
// compute, and each file is renamed into place only after all results exist.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "attn/tensor.hpp"

namespace attn::cli {

class OutputFiles {
public:
    // `flag` names the option in errors, e.g. "--weights". Empty paths are ignored.
    void add(const std::string& flag, const std::string& path);
    // Throws attn::Error if two outputs share a path or a directory is not writable.
    void check() const;
    // Writes each (path, tensor) as .npy: all are written to staging files first, then renamed,
    // so an error while writing leaves none of them behind.
    static void write_all(const std::vector<std::pair<std::string, TensorView>>& outputs);

private:
    std::vector<std::pair<std::string, std::string>> files_;
};

}  // namespace attn::cli
