// sdpa_varlen and its backward: attn::sdpa_varlen / sdpa_varlen_backward on packed arrays
// (total_tokens, H, D) + cu_seqlens (N+1,), FlashAttention's flash_attn_varlen_func layout.
// The keywords are scaled_dot_product_attention's, with the same meanings, applied per
// sequence (options.hpp); attn_mask and key_lengths are refused by the C++ layer, which says why.
#include <pybind11/stl.h>

#include <cstdint>
#include <string>
#include <vector>

#include "attn/sdpa_varlen.hpp"
#include "attn/threads.hpp"
#include "bind.hpp"
#include "convert.hpp"
#include "gradients.hpp"
#include "interruptible.hpp"
#include "options.hpp"

namespace attn_py {
namespace {

const char* const kPacked = "(total_tokens, H, D)";

// The arrays and options both calls read first, in the same order (and so with the same errors):
// query, key, value, cu_seqlens_q, cu_seqlens_k, then the keywords (alibi_slopes (Hq,) or (N, Hq)).
struct PackedCall {
    Input q, k, v, cq, ck;
    CallOptions opt;
};

PackedCall packed_call(std::string_view op, const py::object& query, const py::object& key, const py::object& value,
                       const py::object& cu_seqlens_q, const py::object& cu_seqlens_k, const SdpaArgs& args,
                       const ModifierArgs& modifiers) {
    PackedCall c;
    c.q = input(query, "query", 3, 3, kPacked, args.uint16_is_bf16);
    c.k = input(key, "key", 3, 3, kPacked, args.uint16_is_bf16);
    c.v = input(value, "value", 3, 3, kPacked, args.uint16_is_bf16);
    c.cq = input(cu_seqlens_q, "cu_seqlens_q", 1, 1, "(N+1,)");
    c.ck = input(cu_seqlens_k, "cu_seqlens_k", 1, 1, "(N+1,)");
    c.opt = make_options(op, args, modifiers, c.q.view.dim(1));
    return c;
}

py::object sdpa_varlen_py(const py::object& query, const py::object& key, const py::object& value,
                          const py::object& cu_seqlens_q, const py::object& cu_seqlens_k, const py::object& attn_mask,
                          const py::object& dropout_p, const py::object& is_causal, const py::object& scale,
                          const py::object& causal_alignment, const py::object& key_lengths, const py::object& window,
                          const py::object& window_alignment, const py::object& query_offset,
                          const py::object& return_lse_arg, const py::object& dropout_seed, const py::object& impl,
                          const py::object& softcap, const py::object& alibi_slopes, const py::object& sinks,
                          const py::object& threads_obj, const py::object& dtype, const py::object& out_dtype) {
    const bool return_lse = bool_arg(return_lse_arg, "return_lse");
    const int threads = threads_arg(threads_obj);
    const bool bf16 = uint16_is_bf16_arg(dtype);
    const PackedCall c = packed_call("sdpa_varlen", query, key, value, cu_seqlens_q, cu_seqlens_k,
                                     {attn_mask, dropout_p, scale, key_lengths,
                                      {is_causal, causal_alignment, window, window_alignment, query_offset, "N"},
                                      dropout_seed, impl, bf16},
                                     {softcap, alibi_slopes, sinks});
    const attn::TensorView& q = c.q.view;
    // As sdpa's: out in out_dtype (default the query's), lse float (stat_dtype).
    const attn::DType odt = out_dtype_arg(out_dtype, q.dtype(), "out_dtype", /*with_float64=*/true);
    py::array out = new_array(odt, {q.dim(0), q.dim(1), c.v.view.dim(2)}, "out (Tq, Hq, Dv)");
    py::array lse = new_array(stat_dtype(q.dtype()), {q.dim(0), q.dim(1)}, "lse (Tq, Hq)");
    const attn::TensorView ov = output_view(out, 3), lv = output_view(lse, 2);
    {
        const InterruptibleCall nogil(attention_work(q, c.k.view.dim(0), c.v.view.dim(2)));  // Tk: a bound
        const attn::ScopedNumThreads scoped_threads(threads);
        with_python_names([&] { attn::sdpa_varlen(q, c.k.view, c.v.view, c.cq.view, c.ck.view, c.opt.sdpa, ov, &lv); });
    }
    if (!return_lse) return out;
    return py::make_tuple(out, lse);
}

py::tuple sdpa_varlen_backward_py(const py::object& query, const py::object& key, const py::object& value,
                                  const py::object& cu_seqlens_q, const py::object& cu_seqlens_k,
                                  const py::object& out, const py::object& lse, const py::object& grad_out,
                                  const py::object& attn_mask, const py::object& dropout_p,
                                  const py::object& is_causal, const py::object& scale,
                                  const py::object& causal_alignment, const py::object& key_lengths,
                                  const py::object& window, const py::object& window_alignment,
                                  const py::object& query_offset, const py::object& dropout_seed,
                                  const py::object& impl, const py::object& softcap, const py::object& alibi_slopes,
                                  const py::object& sinks, const py::object& threads_obj, const py::object& dtype,
                                  const py::object& out_dtype) {
    const int threads = threads_arg(threads_obj);
    const bool bf16 = uint16_is_bf16_arg(dtype);
    const PackedCall c = packed_call("sdpa_varlen_backward", query, key, value, cu_seqlens_q, cu_seqlens_k,
                                     {attn_mask, dropout_p, scale, key_lengths,
                                      {is_causal, causal_alignment, window, window_alignment, query_offset, "N"},
                                      dropout_seed, impl, bf16},
                                     {softcap, alibi_slopes, sinks});
    const Input o = input(out, "out", 3, 3, kPacked, bf16);
    const Input l = input(lse, "lse", 2, 2, "(total_tokens, H)");
    const Input g = input(grad_out, "grad_out", 3, 3, kPacked, bf16);
    // As sdpa_backward's; dsinks summed over the sequences (sdpa_varlen_backward).
    Gradients grads = new_gradients(c.q.view, c.k.view, c.v.view, out_dtype, BackwardPrecision::with_float64, 3, c.opt.sdpa.sinks);
    {
        const InterruptibleCall nogil(2.5 * attention_work(c.q.view, c.k.view.dim(0), c.v.view.dim(2)));
        const attn::ScopedNumThreads scoped_threads(threads);
        with_python_names([&] {
            attn::sdpa_varlen_backward(c.q.view, c.k.view, c.v.view, c.cq.view, c.ck.view, o.view, l.view, g.view,
                                       c.opt.sdpa, grads.dqv, grads.dkv, grads.dvv, nullptr, grads.dsinks_view());
        });
    }
    return grads.result();
}

}  // namespace

void bind_varlen(py::module_& m) {
    m.def("sdpa_varlen", &sdpa_varlen_py, py::arg("query"), py::arg("key"), py::arg("value"), py::arg("cu_seqlens_q"),
          py::arg("cu_seqlens_k"), py::kw_only(), py::arg("attn_mask") = py::none(), py::arg("dropout_p") = 0.0,
          py::arg("is_causal") = false, py::arg("scale") = py::none(), py::arg("causal_alignment") = "top-left",
          py::arg("key_lengths") = py::none(), py::arg("window") = py::none(),
          py::arg("window_alignment") = "top-left", py::arg("query_offset") = py::none(),
          py::arg("return_lse") = false, py::arg("dropout_seed") = py::none(), py::arg("impl") = "auto",
          py::arg("softcap") = py::none(), py::arg("alibi_slopes") = py::none(), py::arg("sinks") = py::none(),
          py::arg("threads") = py::none(), py::arg("dtype") = py::none(), py::arg("out_dtype") = py::none(),
          "scaled_dot_product_attention over sequences packed without padding (flash_attn_varlen_func's layout).\n"
          "query (Tq, Hq, D), key/value (Tk, Hkv, D); cu_seqlens_q/cu_seqlens_k (N+1,) int32/int64 offsets:\n"
          "sequence b is rows cu[b]..cu[b+1]-1. Every keyword means what it means in\n"
          "scaled_dot_product_attention, per sequence: bottom-right aligns to each sequence's own lengths;\n"
          "query_offset is an int or an (N,) array. attn_mask and key_lengths are not accepted.\n"
          "softcap, sinks (Hq,) and alibi_slopes (True, (Hq,) or one row per sequence (N, Hq)) as there.\n"
          "dropout_p > 0 needs dropout_seed; sequence b drops what scaled_dot_product_attention drops on it\n"
          "alone with dropout_seed=varlen_dropout_seed(dropout_seed, b).\n"
          "threads: compute on this many threads (default None: attn.get_num_threads()).\n"
          "query/key/value: float32, float64, float16, or uint16 bfloat16 bits with dtype=\"bfloat16\".\n"
          "out_dtype=\"float32\"|\"float64\"|\"float16\"|\"bfloat16\": out's dtype (default: query's); lse float32\n"
          "(float64 for a float64 query). Returns out (Tq, Hq, Dv), or (out, lse (Tq, Hq)) when return_lse.");
    m.def("sdpa_varlen_backward", &sdpa_varlen_backward_py, py::arg("query"), py::arg("key"), py::arg("value"),
          py::arg("cu_seqlens_q"), py::arg("cu_seqlens_k"), py::arg("out"), py::arg("lse"), py::arg("grad_out"),
          py::kw_only(), py::arg("attn_mask") = py::none(), py::arg("dropout_p") = 0.0, py::arg("is_causal") = false,
          py::arg("scale") = py::none(), py::arg("causal_alignment") = "top-left", py::arg("key_lengths") = py::none(),
          py::arg("window") = py::none(), py::arg("window_alignment") = "top-left",
          py::arg("query_offset") = py::none(), py::arg("dropout_seed") = py::none(), py::arg("impl") = "auto",
          py::arg("softcap") = py::none(), py::arg("alibi_slopes") = py::none(), py::arg("sinks") = py::none(),
          py::arg("threads") = py::none(), py::arg("dtype") = py::none(), py::arg("out_dtype") = py::none(),
          "Gradients (dq, dk, dv) of sdpa_varlen given its out and lse (return_lse=True) and grad_out;\n"
          "with sinks (dq, dk, dv, dsinks), dsinks summed over the sequences. The same options as the forward.\n"
          "dtype=\"bfloat16\": uint16 inputs hold bfloat16 bits. dq, dk, dv all in out_dtype when given, else\n"
          "each in its own input's dtype: dq in query's, dk in key's, dv in value's. out_dtype=\"float64\"\n"
          "as the forward's (the reference's double result, a float32 kernel's widened exactly).");
    m.def(
        "varlen_dropout_seed",
        [](const py::object& seed_obj, const py::object& b_obj) {
            const std::uint64_t seed = uint_arg(seed_obj, "seed");
            const std::int64_t b = int_arg(b_obj, "b");
            if (b < 0) value_error("b: expected a sequence index >= 0 but got " + std::to_string(b));
            return attn::varlen_dropout_seed(seed, b);
        },
        py::arg("seed"), py::arg("b"),
        "The dropout seed sdpa_varlen (and its backward) gives sequence b of a call with dropout_seed=seed:\n"
        "its keep mask is scaled_dot_product_attention's on that sequence alone (batch index 0) with\n"
        "dropout_seed=varlen_dropout_seed(seed, b). splitmix64 of seed + (b + 1)*0x9E3779B97F4A7C15 (mod 2**64),\n"
        "written out in include/attn/sdpa_varlen.hpp; varlen_dropout_seed(0, 0) == 0xE220A8397B1DCDAF.\n"
        "seed: an int in [0, 2**64); b: an int >= 0. Returns an int in [0, 2**64).");
    m.def("release_varlen_scratch", &attn::release_varlen_scratch,
          "Free the head-major buffer (up to 256 MiB on 2 MiB pages) that sdpa_varlen and its backward keep\n"
          "between calls; the next call allocates it again.");
    m.def("varlen_scratch_bytes", &attn::varlen_scratch_bytes,
          "Bytes of the head-major buffer sdpa_varlen keeps between calls (0 after release_varlen_scratch()).");
}

}  // namespace attn_py
