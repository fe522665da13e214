#include "store_row.hpp"

#include "attn/half.hpp"
#include "isa.hpp"

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
        default: {  // float16 or bfloat16 (make_problem admits no other output dtype)
            std::uint16_t* o = out.data_as<std::uint16_t>() + offset;
            const bool f16 = out.dtype() == DType::f16;
            if (stride == 1 && src_stride == 1) {  // the ISA's narrowing, on the products in pieces
                const auto narrow16 = kernel_set().narrow16;
                if (f == 1.0f) {
                    narrow16(src, o, static_cast<std::size_t>(n), f16);
                    break;
                }
                float scaled[256];
                for (std::int64_t i0 = 0; i0 < n; i0 += 256) {
                    const std::int64_t len = n - i0 < 256 ? n - i0 : 256;
                    for (std::int64_t i = 0; i < len; ++i) scaled[i] = src[i0 + i] * f;
                    narrow16(scaled, o + i0, static_cast<std::size_t>(len), f16);
                }
                break;
            }
            for (std::int64_t i = 0; i < n; ++i) {
                const float x = src[i * src_stride] * f;
                o[i * stride] = f16 ? float_to_f16(x) : float_to_bf16(x);
            }
            break;
        }
    }
}

}  // namespace attn::detail
