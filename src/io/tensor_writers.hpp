// Writing tensors into an output that is already open, so that several outputs can be
// written completely before any of them is published (the CLI's all-or-nothing outputs).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "atomic_file.hpp"
#include "attn/tensor.hpp"

namespace attn::detail {

void write_npy_into(AtomicFile& out, const TensorView& t);  // header + data; no finish/publish

// The raw elements of `t` in C order, in its own dtype (a strided view element by element).
void write_elements_into(AtomicFile& out, const TensorView& t);

// safetensors in two steps, so that every name and dtype is checked before a file is opened:
// the header (throws attn::Error "PATH: ..." for a bad name or a non-floating tensor), then
// header + data. keep_16bit: float16/bfloat16 views are stored as F16/BF16 (the CLI's
// outputs); otherwise, and for float64 always, every tensor is converted to F32
// (write_safetensors).
struct SafetensorsHeader {
    std::string text;            // the JSON, padded to 8 bytes
    std::int64_t data_bytes = 0;  // the tensors' bytes after it (checked: <= INT64_MAX)
};
SafetensorsHeader safetensors_header(const std::string& path, const std::vector<std::pair<std::string, TensorView>>& tensors,
                                     const std::map<std::string, std::string>& metadata, bool keep_16bit);
void write_safetensors_into(AtomicFile& out, const SafetensorsHeader& header,
                            const std::vector<std::pair<std::string, TensorView>>& tensors, bool keep_16bit);

}  // namespace attn::detail
