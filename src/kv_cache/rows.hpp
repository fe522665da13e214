// Writing K/V rows into cache storage, shared by KVCache and PagedKVCache (the same rounding
// to float16/bfloat16, so both caches hold the same bits for the same tokens).
#pragma once

#include <cstdint>
#include <cstring>

#include "attn/half.hpp"
#include "attn/tensor.hpp"

namespace attn::detail {

// Converts `count` elements of a row (stride `stride` elements, any float dtype) into the
// storage type at dst. The common cases (same dtype, float32 source) avoid the generic load.
// The source may be a view of the cache's own storage (a prefix copied between sequences),
// even one overlapping the destination row (of the free positions): hence memmove.
inline void convert_row(const TensorView& src, std::int64_t offset, std::int64_t stride, std::int64_t count, DType dst_type,
                 void* dst) {
    const DType st = src.dtype();
    if (st == dst_type && stride == 1) {
        std::memmove(dst, static_cast<const char*>(src.data()) + offset * static_cast<std::int64_t>(dtype_size(st)),
                    static_cast<std::size_t>(count) * dtype_size(st));
        return;
    }
    for (std::int64_t d = 0; d < count; ++d) {
        const std::int64_t off = offset + d * stride;
        // Every value is rounded once: a float64 one straight to the storage type.
        const double x = st == DType::f32 ? src.data_as<const float>()[off] : src.load_as_double(off);
        switch (dst_type) {
            case DType::f32: static_cast<float*>(dst)[d] = static_cast<float>(x); break;
            case DType::f16: static_cast<std::uint16_t*>(dst)[d] = double_to_f16(x); break;
            default: static_cast<std::uint16_t*>(dst)[d] = double_to_bf16(x); break;
        }
    }
}

}  // namespace attn::detail
