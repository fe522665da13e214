// A value rounded on its own: the one guard against GCC's contraction where a kernel's bits need
// two roundings (docs/conventions.md, "Numerics and threads"). C++ builds default to
// -ffp-contract=fast, under which GCC fuses a product with the add or subtract that consumes it —
// `a * b + c`, vector-extension expressions and a pair of intrinsics (_mm256_mul_ps then
// _mm256_sub_ps) alike — into one FMA, in some inlined copies and not in others. The empty asm
// makes x opaque: the product is rounded before the consumer sees it, on GCC and clang, scalar or
// vector, at the cost of nothing (no instruction). On AVX-512 the same guard is the `_round` form
// of the multiply (_mm512_mul_round_ps with _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), which
// GCC does not fuse either.
#pragma once

namespace attn::detail {

template <class V>
__attribute__((always_inline)) inline V rounded(V x) {
    asm("" : "+v"(x));  // "v": any SSE/AVX register (xmm/ymm/zmm 0–31 where AVX-512 has them)
    return x;
}

}  // namespace attn::detail
