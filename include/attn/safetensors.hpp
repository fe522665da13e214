// safetensors files (https://huggingface.co/docs/safetensors): the weight format PyTorch
// users share. Layout: 8 bytes little-endian u64 N, N bytes of JSON header, the data.
//   header = { "<name>": {"dtype": "F32", "shape": [3, 4], "data_offsets": [begin, end]}, ...,
//              "__metadata__": {"<key>": "<string>", ...} }   (offsets relative to the data)
//
// Reading: F32, F16, BF16, F64, I64, I32 and BOOL tensors, kept in their dtype (attn::to_dtype
// converts). A file may also hold the format's other dtypes (U8, I16, F8_E4M3, ...): their
// entries are checked like the others, and reading one of them is the error — so the other
// tensors of such a file can be read by name (read_safetensors_tensor).
// Writing: floats as F32 (the CLI's outputs keep F16/BF16), I64, I32 and BOOL as they are.
//
// Files are never trusted. Before anything is allocated or read, the header is checked
// completely: its length against the file, the JSON syntax (nlohmann-json's SAX parser: no
// JSON document is built), duplicate keys, nesting no deeper than the format's, every entry's
// fields, the dtype, the shape (rank <= 4) against the byte count, and the offsets — in
// range, not overlapping, and covering the data exactly (the format forbids holes). Every
// error is an attn::Error that starts with the file name; running out of memory is
// std::bad_alloc (attn::OutOfMemory for a tensor's data), in reading and in writing.
#pragma once

#include <cstddef>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "attn/error.hpp"
#include "attn/tensor.hpp"

namespace attn {

struct SafetensorsFile {
    std::vector<std::pair<std::string, Tensor>> tensors;  // in the order of their data
    std::map<std::string, std::string> metadata;          // "__metadata__", if any

    // nullptr when the file has no tensor of that name.
    const Tensor* find(std::string_view name) const;
};

// Header limit, as in the reference implementation: a larger header is refused unread.
inline constexpr std::size_t kSafetensorsMaxHeader = 100u << 20;

SafetensorsFile read_safetensors(const std::string& path);  // regular files only (not a FIFO or device)

// One tensor of a file: the header is checked whole as above, only that tensor's data is read.
// A name the file does not hold is an attn::Error listing the names it does hold.
Tensor read_safetensors_tensor(const std::string& path, const std::string& name);

// The names of a file's tensors, in the order of their data: the header is checked whole as above,
// no tensor's data is read (what to write after ':' in FILE.safetensors:NAME).
std::vector<std::string> safetensors_names(const std::string& path);

// The tensors whose names start with `prefix` (one layer of a whole model's state_dict:
// "layers.0.self_attn."): the header is checked whole as above, only their data is read, so
// another layer's tensor of a dtype attn has no type for (a quantized layer's U8) is no error
// and the rest of the model is not loaded. `held`, when given, gets every name the file holds,
// in the order of their data. An empty prefix reads every tensor, as read_safetensors.
SafetensorsFile read_safetensors_prefix(const std::string& path, const std::string& prefix,
                                        std::vector<std::string>* held = nullptr);

// The same checks on a file image already in memory; `what` names it in errors.
SafetensorsFile parse_safetensors(const void* data, std::size_t size, const std::string& what);

// Writes every float tensor as F32 — with keep_16bit, float16/bfloat16 ones as F16/BF16 (float64 is
// F32 either way) — and integers and bool as they are, in the given order; names must be unique,
// non-empty, not "__metadata__" and, like the metadata, UTF-8 (the header is JSON). The file appears complete or not at all (temporary file +
// rename); a character device or FIFO is written into instead (docs/conventions.md, "Files").
void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, TensorView>>& tensors,
                       const std::map<std::string, std::string>& metadata = {}, bool keep_16bit = false);

}  // namespace attn
