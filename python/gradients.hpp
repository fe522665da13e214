// The outputs of every backward binding (scaled_dot_product_attention_backward,
// sdpa_varlen_backward, attn.dist.ring_attention_backward), made in one place: dq, dk and dv with
// the shapes of q, k and v, and dsinks (Hq,) when the call has sinks — float32, or float64 for a
// float64 query (stat_dtype) — with the views the C++ call writes. The gradients' dtypes are
// decided here, for every binding (docs/conventions.md, "The gradients' dtypes").
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <optional>

#include "attn/tensor.hpp"
#include "convert.hpp"

namespace attn_py {

struct Gradients {
    py::array dq, dk, dv, dsinks;
    attn::TensorView dqv, dkv, dvv, dsv;  // expanded to the C++ call's rank
    bool with_sinks = false;

    attn::TensorView* dsinks_view() { return with_sinks ? &dsv : nullptr; }
    py::tuple result() const;  // (dq, dk, dv), or (dq, dk, dv, dsinks) with sinks
};

// What a backward computes in, which decides its gradients' dtypes: `with_float64` (sdpa and
// varlen: a float64 input keeps a float64 gradient — the reference backward runs in double — and
// out_dtype="float64" is taken) or `float32` (the ring: a float64 input's gradient is float32,
// sixteen_bit_or_f32, and out_dtype="float64" is refused, out_dtype_arg).
enum class BackwardPrecision { with_float64, float32 };

// dq, dk, dv each in out_dtype= when it is given (all three), else dq in q's dtype, dk in k's, dv
// in v's (float32 for a float64 one under BackwardPrecision::float32): one dtype for all three
// rounded every gradient into q's, so a float32 key's gradient under a bfloat16 query kept 8 bits,
// and a bfloat16 value's overflowed to inf past float16's 65504 under a float16 query (torch's
// rule: a gradient has its tensor's dtype).
// `rank`: the rank the C++ call takes (4 for sdpa and ring, 3 for packed sequences);
// `sinks`: the call's (Hq,) sinks, if any.
Gradients new_gradients(const attn::TensorView& q, const attn::TensorView& k, const attn::TensorView& v,
                        const py::handle& out_dtype, BackwardPrecision precision, int rank,
                        const std::optional<attn::TensorView>& sinks);

}  // namespace attn_py
