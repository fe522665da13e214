// scaled_dot_product_attention and its backward: attn::sdpa / attn::sdpa_backward on arrays
// of rank 2..4 — (B, H, L, D), (H, L, D) or (L, D) — seen as rank 4 by leading size-1 dims.
#include <pybind11/stl.h>

#include <ctime>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "attn/sdpa.hpp"
#include "attn/sdpa_backward.hpp"
#include "attn/threads.hpp"
#include "bind.hpp"
#include "convert.hpp"
#include "gradients.hpp"
#include "interruptible.hpp"
#include "options.hpp"
#include "sdpa/problem.hpp"

namespace attn_py {

namespace {

const char* const kLayout = "(B, H, L, D), (H, L, D) or (L, D)";

// out follows the query's dtype, each gradient its own input's (gradients.hpp), unless out_dtype=
// says otherwise: float16 → a float16 array, bfloat16 → a uint16 array of bfloat16 bits. lse,
// weights, scores and dsinks stay float: float64 for a float64 query, else float32 (stat_dtype).

// Scalar keywords arrive as py::object and are converted by name (convert.hpp).
// kCheckOnly (_check_sdpa): every conversion and check of the call, size-0 dims allowed, and no
// computing — for attn.torch, which answers a call with an empty dim itself (the core has nothing
// to compute there) but must refuse what this call would refuse, in its words.
template <bool kCheckOnly>
py::object sdpa_py(const py::object& query, const py::object& key, const py::object& value,
                   const py::object& attn_mask, const py::object& dropout_p, const py::object& is_causal,
                   const py::object& scale, const py::object& causal_alignment, const py::object& key_lengths,
                   const py::object& window, const py::object& window_alignment, const py::object& query_offset,
                   const py::object& return_lse_arg, const py::object& return_weights_arg,
                   const py::object& dropout_seed, const py::object& impl, const py::object& softcap,
                   const py::object& alibi_slopes, const py::object& sinks, const py::object& return_scores,
                   const py::object& threads_obj, const py::object& dtype, const py::object& out_dtype,
                   const py::object& dropout_origin) {
    const int threads = threads_arg(threads_obj);
    const bool bf16 = uint16_is_bf16_arg(dtype);
    const bool return_lse = bool_arg(return_lse_arg, "return_lse");
    std::optional<attn::ScoreStage> stage;
    if (!return_scores.is_none()) {
        const std::string text = str_arg(return_scores, "return_scores");  // not a str: TypeError, as every keyword's
        try {
            stage = attn::parse_score_stage(text);
        } catch (const attn::Error&) {
            value_error("return_scores: expected \"scaled\", \"softcapped\" or \"masked\" (or None) but got " +
                        std::string(py::repr(return_scores)));
        }
    }
    const bool return_weights = bool_arg(return_weights_arg, "return_weights");
    const Input q = input(query, "query", 2, 4, kLayout, bf16);
    const Input k = input(key, "key", 2, 4, kLayout, bf16);
    const Input v = input(value, "value", 2, 4, kLayout, bf16);
    const int rank = q.view.rank();
    if (k.view.rank() != rank || v.view.rank() != rank) {
        value_error("key/value: expected the rank of query (" + std::to_string(rank) + ") but got key " +
                    shape_str(k.array) + " and value " + shape_str(v.array));
    }
    const CallOptions opt = make_options("sdpa", {attn_mask, dropout_p, scale, key_lengths,
                                          {is_causal, causal_alignment, window, window_alignment, query_offset},
                                          dropout_seed, impl, bf16, dropout_origin, rank},
                                         {softcap, alibi_slopes, sinks}, rank >= 3 ? q.view.dim(rank - 3) : 1);
    const attn::DType odt = out_dtype_arg(out_dtype, q.view.dtype(), "out_dtype", /*with_float64=*/true);
    const attn::DType sdt = stat_dtype(q.view.dtype());
    if constexpr (kCheckOnly) {
        std::vector<py::ssize_t> od = dims_of(q.view);
        od.back() = v.view.dim(rank - 1);
        // No element when B, H, Lq or Dv is 0; with only Lk = 0 it is the call's (B, H, Lq, Dv), as
        // large as the zeros attn.torch returns for it.
        py::array out = new_array(odt, od, "out");
        with_python_names([&] {  // impl="flash" on float64, … too
            attn::detail::check_call(expand_rank(q.view, 4), expand_rank(k.view, 4), expand_rank(v.view, 4), opt.sdpa,
                                     output_view(out, 4), nullptr, "sdpa", attn::detail::SizeZero::allowed);
        });
        return py::none();
    }
    // Q, K and V checked as sdpa checks them before any output is allocated: the (…, Lq, Lk)
    // weights of a call about to be refused (K's head dim not Q's) were a MemoryError of 64 GiB
    // at Lq = Lk = 2^17, not the error naming K.
    with_python_names([&] { (void)attn::sdpa_output_shapes(expand_rank(q.view, 4), expand_rank(k.view, 4), expand_rank(v.view, 4)); });
    std::vector<py::ssize_t> od = dims_of(q.view);
    od.back() = v.view.dim(rank - 1);
    const std::vector<py::ssize_t> ld(od.begin(), od.end() - 1);
    std::vector<py::ssize_t> wd = ld;
    wd.push_back(k.view.dim(rank - 2));
    py::array out = new_array(odt, od, "out");
    py::array lse = return_lse ? new_array(sdt, ld, "lse") : py::array();
    py::array w = return_weights ? new_array(sdt, wd, "the weights (…, Lq, Lk)") : py::array();
    py::array sc = stage ? new_array(sdt, wd, "the scores (…, Lq, Lk)") : py::array();
    attn::ScoresOutput so;
    if (stage) so = attn::ScoresOutput{output_view(sc, 4), *stage};
    const attn::TensorView ov = output_view(out, 4);
    attn::TensorView lv, wv;
    if (return_lse) lv = output_view(lse, 3);
    if (return_weights) wv = output_view(w, 4);
    {
        const InterruptibleCall nogil(attention_work(q.view, k.view.dim(k.view.rank() - 2), v.view.dim(v.view.rank() - 1)));
        const attn::ScopedNumThreads scoped_threads(threads);
        with_python_names([&] {
            attn::sdpa(expand_rank(q.view, 4), expand_rank(k.view, 4), expand_rank(v.view, 4), opt.sdpa, ov,
                       return_lse ? &lv : nullptr, return_weights ? &wv : nullptr, nullptr, stage ? &so : nullptr);
        });
    }
    if (!return_lse && !return_weights && !stage) return out;
    py::list r;
    r.append(out);
    if (return_lse) r.append(lse);
    if (return_weights) r.append(w);
    if (stage) r.append(sc);
    return py::tuple(r);
}

py::tuple sdpa_backward_py(const py::object& query, const py::object& key, const py::object& value,
                           const py::object& out, const py::object& lse, const py::object& grad_out,
                           const py::object& attn_mask, const py::object& dropout_p, const py::object& is_causal,
                           const py::object& scale, const py::object& causal_alignment,
                           const py::object& key_lengths, const py::object& window,
                           const py::object& window_alignment, const py::object& query_offset,
                           const py::object& dropout_seed, const py::object& impl, const py::object& softcap,
                           const py::object& alibi_slopes, const py::object& sinks, const py::object& threads_obj,
                           const py::object& dtype, const py::object& out_dtype, const py::object& dropout_origin) {
    const int threads = threads_arg(threads_obj);
    const bool bf16 = uint16_is_bf16_arg(dtype);
    const Input q = input(query, "query", 2, 4, kLayout, bf16);
    const int r = q.view.rank();
    const Input k = input(key, "key", r, r, "the query's rank", bf16);
    const Input v = input(value, "value", r, r, "the query's rank", bf16);
    const Input o = input(out, "out", r, r, "the query's rank", bf16);
    std::string lse_shape = "the query's shape without D, (";  // e.g. "(2, 4, 7)" for a (2, 4, 7, 64) query
    for (int d = 0; d + 1 < r; ++d) lse_shape += std::to_string(q.view.dim(d)) + (d + 2 < r ? ", " : r == 2 ? ",)" : ")");
    const Input l = input(lse, "lse", r - 1, r - 1, lse_shape.c_str());
    const Input g = input(grad_out, "grad_out", r, r, "the query's rank", bf16);
    const CallOptions opt = make_options("sdpa_backward", {attn_mask, dropout_p, scale, key_lengths,
                                          {is_causal, causal_alignment, window, window_alignment, query_offset},
                                          dropout_seed, impl, bf16, dropout_origin, r},
                                         {softcap, alibi_slopes, sinks}, r >= 3 ? q.view.dim(r - 3) : 1);
    Gradients grads = new_gradients(q.view, k.view, v.view, out_dtype, BackwardPrecision::with_float64, 4, opt.sdpa.sinks);
    {
        const InterruptibleCall nogil(2.5 * attention_work(q.view, k.view.dim(r - 2), v.view.dim(r - 1)));  // the backward: 2.5x
        const attn::ScopedNumThreads scoped_threads(threads);
        with_python_names([&] {
            attn::sdpa_backward(expand_rank(q.view, 4), expand_rank(k.view, 4), expand_rank(v.view, 4),
                                expand_rank(o.view, 4), expand_rank(l.view, 3), expand_rank(g.view, 4), opt.sdpa,
                                grads.dqv, grads.dkv, grads.dvv, nullptr, grads.dsinks_view());
        });
    }
    return grads.result();
}

// For bench/python_bench.py: the C++ call alone, timed in C++ on views built once — the
// baseline the binding's overhead is measured against, in the same process and build.
// q/k/v (B, H, L, D) float32; returns the seconds of each of `runs` calls.
std::vector<double> time_cpp_sdpa(const py::object& query, const py::object& key, const py::object& value,
                                  const py::object& runs_arg, const py::object& cpu_clock_arg) {
    const std::int64_t runs = int_arg(runs_arg, "runs");
    const bool cpu_clock = bool_arg(cpu_clock_arg, "cpu_clock");
    const Input q = input(query, "query", 4, 4, "(B, H, L, D)");
    const Input k = input(key, "key", 4, 4, "(B, H, L, D)");
    const Input v = input(value, "value", 4, 4, "(B, H, L, D)");
    py::array out = new_array(attn::DType::f32, {q.view.dim(0), q.view.dim(1), q.view.dim(2), v.view.dim(3)}, "out");
    const attn::TensorView ov = output_view(out, 4);
    std::vector<double> seconds;
    py::gil_scoped_release nogil;
    // cpu_clock: the process's CPU time (all threads), like Python's time.process_time —
    // robust to other processes on a loaded machine when attn runs on one thread.
    const auto now = [cpu_clock] {
        timespec ts{};
        clock_gettime(cpu_clock ? CLOCK_PROCESS_CPUTIME_ID : CLOCK_MONOTONIC, &ts);
        return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
    };
    for (std::int64_t i = 0; i < runs; ++i) {
        const double t0 = now();
        attn::sdpa(q.view, k.view, v.view, attn::SdpaOptions{}, ov);
        seconds.push_back(now() - t0);
    }
    return seconds;
}

// scaled_dot_product_attention's parameters, for it and for _check_sdpa (one list).
auto sdpa_parameters() {
    return std::make_tuple(
        py::arg("query"), py::arg("key"), py::arg("value"), py::arg("attn_mask") = py::none(),
        py::arg("dropout_p") = 0.0, py::arg("is_causal") = false, py::arg("scale") = py::none(), py::kw_only(),
        py::arg("causal_alignment") = "top-left", py::arg("key_lengths") = py::none(), py::arg("window") = py::none(),
        py::arg("window_alignment") = "top-left", py::arg("query_offset") = py::none(), py::arg("return_lse") = false,
        py::arg("return_weights") = false, py::arg("dropout_seed") = py::none(), py::arg("impl") = "auto",
        py::arg("softcap") = py::none(), py::arg("alibi_slopes") = py::none(), py::arg("sinks") = py::none(),
        py::arg("return_scores") = py::none(), py::arg("threads") = py::none(), py::arg("dtype") = py::none(),
        py::arg("out_dtype") = py::none(), py::arg("dropout_origin") = py::none());
}

}  // namespace

void bind_sdpa(py::module_& m) {
    std::apply([&](const auto&... params) {
        m.def("_check_sdpa", &sdpa_py<true>, params...,
              "scaled_dot_product_attention's checks alone, size-0 dims allowed: raises what the call would\n"
              "raise, computes nothing, returns None (attn.torch's empty calls).");
    }, sdpa_parameters());
    std::apply([&](const auto&... params) {
        m.def("scaled_dot_product_attention", &sdpa_py<false>, params...,
              "softmax(query·keyᵀ·scale + mask)·value, as torch.nn.functional.scaled_dot_product_attention.\n"
              "query (B, H, Lq, D), (H, Lq, D) or (Lq, D); key/value of the same rank (Hq % Hkv == 0: GQA).\n"
              "attn_mask: bool (True = may attend) or float (added), broadcastable to (B, H, Lq, Lk), of rank <= query's.\n"
              "key_lengths (B,): sequence b has keys 0..key_lengths[b]-1.\n"
              "window=(left, right): query i sees keys d-left .. d+right around its diagonal d (-1 or None:\n"
              "unbounded on that side); window_alignment places d like causal_alignment: top-left d = i,\n"
              "bottom-right d = i + n_b - Lq (n_b = key_lengths[b], else Lk).\n"
              "query_offset: an int or a (B,) int32/int64 array; d = i + query_offset[b] for causal and window.\n"
              "softcap=c: scores c*tanh(s/c) before any mask; alibi_slopes (Hq,)/(B, Hq) float32 or True\n"
              "(the standard slopes): s -= m_h*|d - j| from the bottom-right diagonal d; sinks (Hq,) float32:\n"
              "a per-head logit in the softmax with no value (lse includes it). Slopes and sinks of another float\n"
              "dtype (a list is float64) are rounded to float32 once.\n"
              "A row with no visible key gives 0 (lse -inf; with a sink: lse = sink).\n"
              "return_scores=\"scaled\"|\"softcapped\"|\"masked\": the score matrix at that stage (ONNX\n"
              "qk_matmul_output_mode 0/1/2), not with dropout.\n"
              "dropout_p > 0 needs dropout_seed (an int): the keep mask is a function of it (a new seed per\n"
              "training step; the backward takes the forward's).\n"
              "dropout_origin=(batch, head, row, key): the call is a piece of a larger problem whose (0, 0, 0, 0)\n"
              "sits there: weight (b, h, i, j) takes the whole's keep decision at (batch+b, head+h, row+i, key+j),\n"
              "so pieces drop what the whole drops with the same seed (default None: the whole problem).\n"
              "threads: compute on this many threads (default None: attn.get_num_threads()).\n"
              "query/key/value: float32, float64, float16, or uint16 arrays of bfloat16 bits with\n"
              "dtype=\"bfloat16\" (NumPy has no bfloat16; dtype says how to read every uint16 input).\n"
              "out_dtype=\"float32\"|\"float64\"|\"float16\"|\"bfloat16\": the dtype of out (default: query's);\n"
              "float64 keeps the reference's double result (a float32 kernel's is widened exactly); float16\n"
              "is a float16 array, bfloat16 a uint16 array of its bits. lse/weights/scores: float32\n"
              "(float64 for a float64 query).\n"
              "Returns out, or (out[, lse][, weights][, scores]) when return_lse / return_weights / return_scores.");
    }, sdpa_parameters());
    m.def("scaled_dot_product_attention_backward", &sdpa_backward_py, py::arg("query"), py::arg("key"),
          py::arg("value"), py::arg("out"), py::arg("lse"), py::arg("grad_out"), py::arg("attn_mask") = py::none(),
          py::arg("dropout_p") = 0.0, py::arg("is_causal") = false, py::arg("scale") = py::none(), py::kw_only(),
          py::arg("causal_alignment") = "top-left", py::arg("key_lengths") = py::none(),
          py::arg("window") = py::none(), py::arg("window_alignment") = "top-left",
          py::arg("query_offset") = py::none(), py::arg("dropout_seed") = py::none(), py::arg("impl") = "auto",
          py::arg("softcap") = py::none(), py::arg("alibi_slopes") = py::none(), py::arg("sinks") = py::none(),
          py::arg("threads") = py::none(), py::arg("dtype") = py::none(), py::arg("out_dtype") = py::none(),
          py::arg("dropout_origin") = py::none(),
          "Gradients (dq, dk, dv) of scaled_dot_product_attention given the forward's out and lse\n"
          "(return_lse=True) and grad_out = dLoss/dout; the same options as the forward (dropout_p,\n"
          "dropout_seed and dropout_origin too: the backward regenerates the forward's keep mask).\n"
          "With sinks: (dq, dk, dv, dsinks). ALiBi slopes get no gradient.\n"
          "dtype=\"bfloat16\": uint16 inputs hold bfloat16 bits. dq, dk, dv all in out_dtype when given, else\n"
          "each in its own input's dtype: dq in query's, dk in key's, dv in value's. out_dtype=\"float64\"\n"
          "as the forward's (the reference's double result, a float32 kernel's widened exactly).");
    m.def(
        "alibi_slopes",
        [](const py::object& heads_obj) {
            const std::int64_t heads = int_arg(heads_obj, "heads");
            const attn::Tensor s = attn::alibi_slopes(heads);
            py::array_t<float> a(static_cast<py::ssize_t>(heads));
            std::copy(s.data_as<float>(), s.data_as<float>() + heads, a.mutable_data());
            return a;
        },
        py::arg("heads"), "The ALiBi paper's slopes for `heads` heads, float32 (heads,).");
    m.attr("sdpa") = m.attr("scaled_dot_product_attention");
    m.attr("sdpa_backward") = m.attr("scaled_dot_product_attention_backward");
    m.def("_time_cpp_sdpa", &time_cpp_sdpa, py::arg("query"), py::arg("key"), py::arg("value"), py::arg("runs"),
          py::arg("cpu_clock") = false,
          "Benchmark helper: seconds of each of `runs` plain attn::sdpa calls made from C++.");
}

}  // namespace attn_py
