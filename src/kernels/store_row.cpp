#include "store_row.hpp"

#include <cstring>

#include "attn/half.hpp"

namespace attn::detail {

void store_row(const TensorView& out, std::int64_t offset, std::int64_t stride, const float* src,
               std::int64_t src_stride, std::int64_t n, float f) {
    switch (out.dtype()) {
        case DType::f32: {
            float* o = out.data_as<float>() + offset;
            if (stride == 1 && src_stride == 1) {  // the common case, in a loop the compiler vectorises
                for (std::int64_t i = 0; i < n; ++i) o[i] = src[i] * f;
                break;
            }
            for (std::int64_t i = 0; i < n; ++i) o[i * stride] = src[i * src_stride] * f;
            break;
        }
        case DType::f64: {
            double* o = out.data_as<double>() + offset;
            for (std::int64_t i = 0; i < n; ++i) o[i * stride] = static_cast<double>(src[i * src_stride] * f);
            break;
        }
        case DType::f16: {
            std::uint16_t* o = out.data_as<std::uint16_t>() + offset;
            for (std::int64_t i = 0; i < n; ++i) o[i * stride] = float_to_f16(src[i * src_stride] * f);
            break;
        }
        default: {  // bfloat16 (make_problem admits no other output dtype)
            std::uint16_t* o = out.data_as<std::uint16_t>() + offset;
            if (stride == 1 && src_stride == 1) {  // float_to_bf16 without its branch, so it vectorises
                for (std::int64_t i = 0; i < n; ++i) {
                    const float x = src[i] * f;
                    std::uint32_t u;
                    std::memcpy(&u, &x, 4);
                    const std::uint32_t nan = (u >> 16) | 0x40u, rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
                    o[i] = static_cast<std::uint16_t>(static_cast<std::int32_t>(u & 0x7fffffffu) > 0x7f800000 ? nan : rounded);
                }
                break;
            }
            for (std::int64_t i = 0; i < n; ++i) o[i * stride] = float_to_bf16(src[i * src_stride] * f);
            break;
        }
    }
}

}  // namespace attn::detail
