// A tile's row count as a template argument, shared by the AVX-512 flash paths (float32 in
// flash_avx512.cpp, bf16 compute in flash_avx512_bf16.cpp): each row count is its own
// instantiation of the tile, so its accumulators stay in registers. Internal linkage, as
// column_max_avx512.hpp: each ISA file gets its own copy.
#pragma once

#include <type_traits>

namespace attn::detail {
namespace {

// f(std::integral_constant<int, rows>{}) for 1 <= rows <= R (the full tile, R rows, tested
// first); any other count runs f's 1-row form.
template <int R, class F>
__attribute__((always_inline)) inline void with_rows(int rows, F&& f) {
    if constexpr (R > 1) {
        if (rows == R) f(std::integral_constant<int, R>{});
        else with_rows<R - 1>(rows, f);
    } else {
        f(std::integral_constant<int, 1>{});
    }
}

}  // namespace
}  // namespace attn::detail
