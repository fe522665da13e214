// The one "store a row of float32 results" of the forward kernels (flash and decode): out
// may be float32, float64, float16 or bfloat16. Compiled once without ISA flags
// (store_row.cpp) and called from the ISA files: a row is Dv values per query row, so the
// call costs nothing next to the row's Lk·(Dk+Dv) FMAs. The rounding is attn/half.hpp's
// (round to nearest even — detail::store's): contiguous rows through the kernel table's
// narrow16 (vectorised, the same bits), strided ones one value at a time.
#pragma once

#include <cstdint>

#include "attn/tensor.hpp"

namespace attn::detail {

// out[offset + i·stride] = src[i·src_stride]·f for i < n, rounded once to out's dtype from
// the float32 product (float64: the float32 product, widened exactly).
void store_row(const TensorView& out, std::int64_t offset, std::int64_t stride, const float* src,
               std::int64_t src_stride, std::int64_t n, float f);

}  // namespace attn::detail
