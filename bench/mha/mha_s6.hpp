// S6 of bench/shapes.md — the MHA layer, BERT-base: B=4, L=512, E=768, h=12
// (d_h = 64), self-attention, batch_first, no mask, need_weights=false — split into the
// parts a reader needs to judge it: the whole forward, the fused QKV GEMM, attention
// (attn::sdpa on the stride views), the output GEMM, and the same GEMM on a square problem
// of the QKV GEMM's FLOPs (the rate the projections are compared with), and OpenBLAS on
// the QKV and square GEMMs.
//
// Each part is a callable with its FLOP count, so any timing harness (attn bench, or
// a scratch program) can time it. Buffers are allocated and touched once, in the
// constructor, and reused: no call pays page faults.
//
// FLOP (counted by the written formula, multiply-add = 2):
//   QKV   2·(B·L)·E·3E          out  2·(B·L)·E·E
//   attention 4·B·h·L·L·d_h     forward = the sum of the three
#pragma once

#include <cstdint>
#include <memory>
#include <optional>

#include "attn/mha.hpp"

namespace attn::bench {

struct MhaS6Shape {
    std::int64_t B = 4, L = 512, E = 768, h = 12;
    Impl impl = Impl::automatic;  // the sdpa kernel
    // The layer's weight matrices, input and output (float32, float16 or bfloat16); only
    // forward() is meant for a 16-bit layer (the parts read float32 weights).
    DType dtype = DType::f32;
    // forward()'s MhaForwardOptions::intermediate_dtype (unset: float32 Q, K, V and O).
    std::optional<DType> intermediate_dtype;
};

class MhaS6 {
public:
    explicit MhaS6(const MhaS6Shape& shape = {});
    ~MhaS6();

    void forward();         // MultiHeadAttention::forward_into, workspace reused
    // The layer's weights are pre-packed (MultiHeadAttention::pack_weights), as in forward().
    void qkv_projection();  // X (B·L, E) · in_proj_weightᵀ (E, 3E) + bias → (B·L, 3E), stored head-major
    void attention();       // attn::sdpa on the (B, h, L, d_h) stride views of that buffer
    void out_projection();  // O (B·L, E) · out_proj.weightᵀ + bias → (B·L, E)
    void square_gemm();     // attn's GEMM (src/gemm) n×n×n with 2n³ ≈ flop_qkv()
    // OpenBLAS (one multi-threaded cblas_sgemm, the library's former path) on the same
    // operands as qkv_projection (no bias) and square_gemm: the yardstick in the same process.
    void qkv_gemm_openblas();
    void square_gemm_openblas();

    double flop_qkv() const;
    double flop_attention() const;
    double flop_out() const;
    double flop_forward() const { return flop_qkv() + flop_attention() + flop_out(); }
    double flop_square() const;
    std::int64_t square_n() const { return square_n_; }
    const MhaS6Shape& shape() const { return shape_; }
    // Which kernel sdpa ran in attention() (its SdpaReport), e.g. "reference".
    std::string attention_kernel() const;

private:
    struct Buffers;
    MhaS6Shape shape_;
    std::int64_t square_n_ = 0;
    std::unique_ptr<Buffers> b_;
};

}  // namespace attn::bench
