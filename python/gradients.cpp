#include "gradients.hpp"

namespace attn_py {

py::tuple Gradients::result() const {
    if (with_sinks) return py::make_tuple(dq, dk, dv, dsinks);
    return py::make_tuple(dq, dk, dv);
}

Gradients new_gradients(const attn::TensorView& q, const attn::TensorView& k, const attn::TensorView& v,
                        const py::handle& out_dtype, BackwardPrecision precision, int rank,
                        const std::optional<attn::TensorView>& sinks) {
    const bool with_float64 = precision == BackwardPrecision::with_float64;
    // Parsed once, for all three (a bad value is refused before any array is made).
    const std::optional<attn::DType> chosen = given_out_dtype_arg(out_dtype, "out_dtype", with_float64);
    const auto dtype_of = [&](const attn::TensorView& input) {
        return chosen.value_or(with_float64 ? input.dtype() : sixteen_bit_or_f32(input.dtype()));
    };
    Gradients g;
    g.dq = new_array(dtype_of(q), dims_of(q), "dq (the query's shape)");
    g.dk = new_array(dtype_of(k), dims_of(k), "dk (the key's shape)");
    g.dv = new_array(dtype_of(v), dims_of(v), "dv (the value's shape)");
    g.dqv = output_view(g.dq, rank);
    g.dkv = output_view(g.dk, rank);
    g.dvv = output_view(g.dv, rank);
    g.with_sinks = sinks.has_value();
    if (g.with_sinks) {
        g.dsinks = new_array(stat_dtype(q.dtype()), {static_cast<py::ssize_t>(sinks->dim(0))}, "dsinks (Hq,)");
        g.dsv = output_view(g.dsinks, 1);
    }
    return g;
}

}  // namespace attn_py
