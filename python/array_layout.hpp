// numpy's description of an array → how attn sees it: the decisions of view_of
// (convert.cpp) on plain numbers, without pybind11 or a Python runtime, so that the
// conversion's checks can be fuzzed on any dtype/shape/strides (fuzz/fuzz_array.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "attn/tensor.hpp"

namespace attn_py {

// What numpy says about an array: dtype.kind, dtype.itemsize, dtype.name, shape, strides.
struct RawArray {
    char kind = 'f';
    std::int64_t itemsize = 4;
    std::string dtype_name = "float32";
    std::vector<std::int64_t> shape, byte_strides;
};

struct ArrayLayout {
    // A refused array: `rank` is a ValueError, `dtype` a TypeError; `message` names the argument.
    enum class Refusal { none, rank, dtype };
    Refusal refusal = Refusal::none;
    std::string message;
    attn::DType dtype = attn::DType::f32;
    attn::Shape shape;
    attn::Strides strides{};   // in elements
    bool needs_copy = false;   // a byte stride that no element stride expresses: copy to C order first
};

// The array's rank must lie in [min_rank, max_rank] (`layout` names the dims for the message).
ArrayLayout layout_of(const RawArray& a, const std::string& name, int min_rank, int max_rank, const char* layout);

}  // namespace attn_py
