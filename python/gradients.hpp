// The outputs of every backward binding (scaled_dot_product_attention_backward,
// sdpa_varlen_backward, attn.dist.ring_attention_backward), made in one place: dq, dk and dv with
// the shapes of q, k and v in the call's out dtype, and dsinks (Hq,) when the call has sinks —
// float32, or float64 for a float64 query (stat_dtype) — with the views the C++ call writes.
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

// `rank`: the rank the C++ call takes (4 for sdpa and ring, 3 for packed sequences);
// `sinks`: the call's (Hq,) sinks, if any.
Gradients new_gradients(const attn::TensorView& q, const attn::TensorView& k, const attn::TensorView& v,
                        attn::DType dtype, int rank, const std::optional<attn::TensorView>& sinks);

}  // namespace attn_py
