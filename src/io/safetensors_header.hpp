// Reading a safetensors header: the JSON text streamed through nlohmann-json's SAX parser
// straight into the entries below, every check of include/attn/safetensors.hpp made on them —
// no JSON document is built (nlohmann's value destructor allocates, and an allocation failure
// there is std::terminate: out of memory must be std::bad_alloc, like every other failure).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "attn/dtype.hpp"
#include "attn/tensor.hpp"

namespace attn::detail {

struct SafetensorsEntry {
    std::string name;
    DType dtype = DType::f32;
    std::string unreadable;  // a dtype of the format that attn has no type for ("U8", ...), else empty
    Shape shape;
    std::uint64_t begin = 0, end = 0;  // relative to the data section
};

// The dtypes attn reads, for messages about the others.
inline constexpr const char* kSafetensorsReadable = "F32, F16, BF16, F64, I64, I32 or BOOL";

// Parses and checks a header; `data_size` is the number of bytes after it. Throws attn::Error
// "FILE: ..." for anything the format does not allow, std::bad_alloc when memory runs out.
// Returns the entries in the order of their data, which they cover exactly; fills `metadata`.
std::vector<SafetensorsEntry> parse_safetensors_header(std::string_view text, std::uint64_t data_size, const std::string& file,
                                                       std::map<std::string, std::string>& metadata);

}  // namespace attn::detail
