// numpy's description of an array → how attn sees it: every decision of view_of
// (convert.cpp), which only reads the array's description into a RawArray and acts on the
// answer, made here on plain numbers, without pybind11 or a Python runtime, so that the
// fuzzer (fuzz/fuzz_array.cpp) runs the very rules Python runs on any dtype/shape/strides.
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
    bool native_order = true;  // dtype.isnative: false for '>f4' on a little-endian machine
    bool aligned = true;       // numpy's ALIGNED flag: data pointer and strides fit the element
    // NumPy has no bfloat16: a uint16 array holds bfloat16 bit patterns when the caller says so
    // (dtype="bfloat16"); otherwise uint16 is refused like any other unsupported dtype.
    bool uint16_is_bf16 = false;
};

struct ArrayLayout {
    // A refused array: `rank` is a ValueError, `dtype` a TypeError; `message` names the argument.
    enum class Refusal { none, rank, dtype };
    Refusal refusal = Refusal::none;
    std::string message;
    attn::DType dtype = attn::DType::f32;
    attn::Shape shape;
    attn::Strides strides{};   // in elements
    // The kernels cannot read the array in place as native typed elements — a non-native
    // byte order, a misaligned pointer or stride, a byte stride that no element stride
    // expresses: copy it to a native-order, aligned, C-contiguous array first (and take the
    // layout of the copy). `strides` are then meaningless.
    bool needs_copy = false;
};

// The array's rank must lie in [min_rank, max_rank] (`layout` names the dims for the message).
ArrayLayout layout_of(const RawArray& a, const std::string& name, int min_rank, int max_rank, const char* layout);

// `t` seen with `rank` dims by adding leading size-1 (stride-0) dims: (L, D) → (1, 1, L, D).
attn::TensorView expand_rank(const attn::TensorView& t, int rank);

}  // namespace attn_py
