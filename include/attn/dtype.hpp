// Element types attn understands. Kernels compute in fp32 (the reference in double);
// the others are storage types or mask/length types.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace attn {

enum class DType : std::uint8_t { f32, f64, f16, bf16, boolean, i32, i64 };

constexpr std::size_t dtype_size(DType t) {
    switch (t) {
        case DType::f32: return 4;
        case DType::f64: return 8;
        case DType::f16: return 2;
        case DType::bf16: return 2;
        case DType::boolean: return 1;
        case DType::i32: return 4;
        case DType::i64: return 8;
    }
    return 0;
}

constexpr std::string_view dtype_name(DType t) {
    switch (t) {
        case DType::f32: return "float32";
        case DType::f64: return "float64";
        case DType::f16: return "float16";
        case DType::bf16: return "bfloat16";
        case DType::boolean: return "bool";
        case DType::i32: return "int32";
        case DType::i64: return "int64";
    }
    return "?";
}

constexpr bool is_floating(DType t) {
    return t == DType::f32 || t == DType::f64 || t == DType::f16 || t == DType::bf16;
}

}  // namespace attn
