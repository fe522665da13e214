// The input projections of the MHA layer (Q = x_q·W_Qᵀ + b_Q, K, V likewise), written once
// for forward_into, forward_train and the incremental path. Rows keep the input's order and
// heads are column blocks or, head-major, heads are matrices of their own with batch-major
// rows; either is seen through stride views (head_layout.hpp).
#pragma once

#include "attn/mha.hpp"
#include "inputs.hpp"
#include "linear.hpp"

namespace attn::detail {

// A float32 workspace tensor of `shape`, re-allocated only when the shape changes, so
// repeated calls reuse memory that is already faulted in. `what` names it in an out-of-memory
// message (attn::OutOfMemory "… for <what> (float32) of shape …").
float* ensure(Tensor& t, const Shape& shape, const char* what = "a buffer of the MHA layer's workspace");
// The same for a tensor of dtype dt.
void* ensure(Tensor& t, DType dt, const Shape& shape, const char* what = "a buffer of the MHA layer's workspace");

// Rows of an input as a (rows, features) matrix with unit column stride, for the projection
// GEMM: the input itself when it is contiguous float32, float16 or bfloat16 (the GEMM widens
// 16-bit rows while packing), else a copy kept in `copy` (float64 → float32; a strided
// 16-bit input stays 16-bit). `what` names the copy in an out-of-memory message: one of the names
// below (a name built here would be an allocation of its own, refused as a bare std::bad_alloc).
Operand as_rows(const TensorView& x, Tensor& copy, const char* what);
// Which argument is copied, and why.
inline constexpr const char* kQueryRows = "the MHA layer's copy of query, strided or float64, as the contiguous rows its projection GEMM reads";
inline constexpr const char* kKeyRows = "the MHA layer's copy of key, strided or float64, as the contiguous rows its projection GEMM reads";
inline constexpr const char* kValueRows = "the MHA layer's copy of value, strided or float64, as the contiguous rows its projection GEMM reads";
inline constexpr const char* kNewTokenRows =
    "the MHA layer's copy of x_new, strided or float64, as the contiguous rows its projection GEMM reads";

// The dtype of a layer output: `requested` if set (float32, float16 or bfloat16), else the
// input's when it is 16-bit, else float32. `what` names the option in the error.
DType output_dtype(const std::optional<DType>& requested, DType input);

// The float32 result rows `src` (rows, cols) contiguous written to `out` (contiguous, same
// element count) in its dtype: a copy for float32, one rounding to nearest even for 16 bits.
void store_output(const float* src, const TensorView& out);

// float32 rows rounded once to dt (a new tensor), or the rows themselves when dt is float32.
Tensor rounded_rows(Tensor rows, DType dt);

// A layer's output tensor argument: contiguous, of `shape`, float32/float16/bfloat16 (or
// float32 only: the attention weights).
void check_output(const char* name, const TensorView& out, const Shape& shape, bool float32_only = false);

// The layer's input weights and biases: W_Q (E, E), W_K (E_kv, kdim), W_V (E_kv, vdim), the
// rows of in_proj_weight when kdim == vdim == E (so W_Q, W_K, W_V are contiguous: wq is the
// fused (E + 2·E_kv, E) matrix); biases null without bias.
struct InputWeights {
    bool packed = false;
    Operand wq, wk, wv;  // in config().param_dtype
    const float *bias = nullptr, *bq = nullptr, *bk = nullptr, *bv = nullptr;
};
// With use_packed, each whole weight matrix carries the layer's pre-packed panels, if any
// (inference only: the training paths read the parameters, which the caller may have changed
// through views since pack_weights()).
InputWeights input_weights(const MultiHeadAttention& layer, bool use_packed = false);

// out_proj.weight as a GEMM operand (its storage dtype; use_packed as above).
Operand out_weight(const MultiHeadAttention& layer, bool use_packed = false);

// Q (B, h, Lq, d_h), K and V (B, h_kv, Lkx, d_h): views of ws.proj_q / proj_kv / proj_v.
struct Projected {
    TensorView Q, K, V;
};

// How the inputs relate: key and value are the query itself (self-attention: one fused
// QKV GEMM) or one shared tensor (one fused KV GEMM); batch_major puts K and V in
// (B·Lkx, E_kv) buffers with the appended bias_k / zero rows — required when
// s.extra > 0, and what the backward reads.
struct ProjectionPlan {
    bool self_attention = false, shared_kv = false, batch_major = false;
    bool use_packed = false;  // input_weights' use_packed: inference calls
    // Q, K and V stored head-major (head_layout.hpp: each head a (rows, d_h) matrix; not the
    // batch-major K and V): the inference forward, whose attention then reads a head's K/V rows
    // in place (docs/conventions.md, "How the layer runs"). The training paths keep the rows:
    // the backward's weight-gradient GEMMs read them as (rows, E) matrices.
    bool head_major = false;
};

// The dtype of the layer's intermediates (MhaForwardOptions::intermediate_dtype): float32
// when unset; float32, float16 or bfloat16, else an error naming the option.
DType intermediate_dtype(const std::optional<DType>& requested);

// p's Q, K and V rounded once to dt (float16/bfloat16): every float32 buffer of ws the views
// read (proj_q, proj_kv, proj_v) is rounded whole into its twin in ws.proj16, and each view is
// rebased onto the twin with the same shape and strides. Writes only ws.
Projected round_projected(const Projected& p, DType dt, MhaWorkspace& ws);

// xq, xk, xv: the inputs' rows (as_rows). Writes only ws.
Projected project_qkv(const MultiHeadAttention& layer, const MhaShapes& s, Operand xq, Operand xk, Operand xv,
                      ProjectionPlan plan, MhaWorkspace& ws);

}  // namespace attn::detail
