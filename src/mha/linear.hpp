// The GEMMs of the MHA layer (projections forward, their gradients backward), on attn's own
// packed GEMM (src/gemm/gemm.hpp): the kernel table's row, OpenMP's thread count.
//
// Results do not depend on the thread count, by construction: every element of C is one FMA
// chain over K in chunks whose bounds depend on K only, and threads split C's rows or
// columns, never K (gemm/gemm_driver.hpp).
#pragma once

#include <cstdint>

#include "attn/tensor.hpp"

namespace attn::detail {

class PackedB;

// A row-major matrix operand of the projections: float32, or float16/bfloat16 (16-bit weights
// or activations), which the GEMM widens exactly while packing — fp32 accumulation, no
// whole-matrix copy. A const float* converts implicitly (the float32 call sites).
struct Operand {
    const void* data = nullptr;
    DType dtype = DType::f32;
    // A weight's pre-packed panels (MultiHeadAttention::pack_weights), or null: linear() reads
    // them instead of `data` when they fit the call (the whole matrix, the current ISA row),
    // else packs `data` as usual — the result is the same bits either way.
    const PackedB* packed = nullptr;
    Operand() = default;
    Operand(const float* p) : data(p) {}  // NOLINT(google-explicit-constructor): float32 is the common case
    Operand(const void* p, DType dt) : data(p), dtype(dt) {}
    // The operand `elements` elements further on (a row or column block; not packed).
    Operand offset(std::int64_t elements) const {
        return Operand(static_cast<const char*>(data) + elements * static_cast<std::int64_t>(dtype_size(dtype)), dtype);
    }
};

// C (M, N) row stride ldc  =  op(A) · op(B)  +  beta · C, row-major; op(A) is (M, K),
// op(B) is (K, N); ta/tb transpose. beta = 0 does not read C.
void gemm(bool ta, bool tb, std::int64_t M, std::int64_t N, std::int64_t K, const float* A, std::int64_t lda,
          const float* B, std::int64_t ldb, float beta, float* C, std::int64_t ldc);

// y's columns stored in blocks (GemmArgs::c_block): block q of `width` columns is a matrix of
// its own at y + q·stride (row stride ldy); width 0: y is one row-major matrix.
struct ColumnBlocks {
    std::int64_t width = 0, stride = 0;
};

// x's rows in groups (GemmArgs::a_group): group q of `rows` rows is a matrix of its own at
// x + q·stride elements, row stride ldx; rows 0: x is one matrix.
struct RowGroups {
    std::int64_t rows = 0, stride = 0;
};

// y: (N, M) row stride ldy  =  x: (N, K) row stride ldx  ·  wᵀ,  w: (M, K) contiguous  (+ bias (M,) per row)
// This is torch.nn.functional.linear.
// x and w may each be float32, float16 or bfloat16; y, bias and the accumulation are float32.
// y_blocks: y stored in column blocks; x_groups: x's rows read in groups (each the same values,
// other addresses: y's row i is x's row i, wherever either lies).
void linear(Operand x, std::int64_t N, std::int64_t K, std::int64_t ldx, Operand w, std::int64_t M,
            const float* bias, float* y, std::int64_t ldy, ColumnBlocks y_blocks = {}, RowGroups x_groups = {});

// acc (M,) (+)= Σ over N rows of x (N, M) row stride ld: a bias gradient (accumulate = false
// overwrites acc).
void sum_rows(const float* x, std::int64_t N, std::int64_t M, std::int64_t ld, float* acc, bool accumulate);

}  // namespace attn::detail
