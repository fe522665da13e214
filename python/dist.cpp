// attn.dist: ring attention over MPI from Python (built when attn is built with MPI). The
// communicator is an mpi4py one (anything with py2f(): its Fortran handle crosses into C with
// MPI_Comm_f2c, so no mpi4py header is needed at build time). Every function is collective.
//
//   out, lse = attn.dist.ring_attention(q_local, k_local, v_local, comm, is_causal=False, scale=None,
//                                       layout="zigzag", <masking, modifier and dropout keywords>)
//   dq, dk, dv[, dsinks] = attn.dist.ring_attention_backward(q_local, k_local, v_local, out, lse, grad_out,
//                                                            comm, ...)   (dsinks when sinks is given)
// The masking, modifier and dropout keywords mean what they mean for scaled_dot_product_attention
// (options.hpp: causal_alignment, window, window_alignment, query_offset; key_lengths; softcap,
// alibi_slopes, sinks; dropout_p, dropout_seed), on global positions, and must be the same on every
// rank (key_lengths and a (B,) query_offset: the same arrays); dropout drops exactly what
// single-process attention drops with the same seed.
//   attn.dist.rank_segments(L, P, rank, layout="zigzag") -> [(start, length), ...]
// Arrays: (B, H, L_local, D) float32, the rank's rows as rank_segments gives them, concatenated.
#include <mpi.h>

#include <exception>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "attn/ring.hpp"
#include "attn/threads.hpp"
#include "bind.hpp"
#include "convert.hpp"
#include "gradients.hpp"
#include "options.hpp"

namespace attn_py {
namespace {

MPI_Comm comm_of(const py::handle& comm) {
    int ready = 0;
    MPI_Initialized(&ready);
    if (!ready) value_error("comm: MPI is not initialized (import mpi4py.MPI first)");
    if (!py::hasattr(comm, "py2f")) type_error("comm: expected an mpi4py communicator (e.g. MPI.COMM_WORLD)");
    const MPI_Comm c = MPI_Comm_f2c(comm.attr("py2f")().cast<MPI_Fint>());
    // What Split gives a rank it leaves out. Said before any MPI call on it (which only mpi4py's
    // MPI_ERRORS_RETURN kept from aborting the job), on this rank alone: it has no one to tell.
    if (c == MPI_COMM_NULL) value_error("comm: MPI.COMM_NULL is not a communicator (pass MPI.COMM_WORLD or one of its splits)");
    return c;
}

// The keywords both calls take, as given (converted by ring_options: a wrong type is a
// TypeError naming the keyword).
struct RingArgs {
    AlignmentArgs alignment;  // is_causal, causal_alignment, window, window_alignment, query_offset
    py::object scale, layout, key_lengths;
    ModifierArgs modifiers;  // softcap, alibi_slopes, sinks
    py::object dropout_p, dropout_seed, impl;
};

// RingOptions whose views point into arrays held in `keep` (alive as long as it is).
struct RingCall {
    CallOptions keep;  // the sdpa keywords' conversion (options.hpp), and the arrays
    attn::dist::RingOptions ring;
};

RingCall ring_options(std::string_view op, const RingArgs& a, std::int64_t heads) {
    RingCall c;
    set_alignment(a.alignment, c.keep);
    set_modifiers(a.modifiers, heads, c.keep);
    if (!a.key_lengths.is_none()) {
        c.keep.key_lengths = as_array(a.key_lengths, "key_lengths");
        c.ring.key_lengths = view_of(c.keep.key_lengths, "key_lengths", 1, 1, "shape (B,)");
    }
    const attn::SdpaOptions& s = c.keep.sdpa;
    c.ring.causal = s.causal;
    c.ring.window = s.window;
    c.ring.query_offset = s.query_offset;
    c.ring.softcap = s.softcap;
    c.ring.alibi_slopes = s.alibi_slopes;
    c.ring.sinks = s.sinks;
    c.ring.scale = optional_float_arg(a.scale, "scale");
    c.ring.layout = attn::dist::parse_layout(str_arg(a.layout, "layout"));
    c.ring.dropout_p = float_arg(a.dropout_p, "dropout_p");
    c.ring.dropout_seed = dropout_seed_arg(a.dropout_seed, c.ring.dropout_p, op);  // inside agree_on_arguments
    c.ring.impl = attn::parse_impl(str_arg(a.impl, "impl"));  // which impls a block takes: ring_attention says
    return c;
}

// Converts a call's arguments on every rank and agrees on the outcome before the ring's first
// collective: a rank whose arguments are refused would otherwise raise alone and leave the others
// waiting in the ring for ever (a review found that hang). The refused rank raises its own error;
// the others an attn::Error naming it.
template <class F>
void agree_on_arguments(MPI_Comm comm, const char* op, F&& convert) {
    std::exception_ptr failure;
    try {
        convert();
    } catch (...) {
        failure = std::current_exception();
    }
    // A communicator MPI refuses (MPI_COMM_NULL, a freed one; mpi4py sets MPI_ERRORS_RETURN) is
    // said as such: unchecked, the agreement read as "rank 0 refused its arguments".
    const auto succeeded = [&](int rc, const char* call) {
        if (rc == MPI_SUCCESS) return;
        char text[MPI_MAX_ERROR_STRING];
        int length = 0;
        if (MPI_Error_string(rc, text, &length) != MPI_SUCCESS) length = 0;
        throw attn::Error(std::string(op) + ": comm: " + call + " refused it: " + std::string(text, static_cast<std::size_t>(length)) +
                          " (pass MPI.COMM_WORLD or one of its splits)");
    };
    int rank = 0;
    succeeded(MPI_Comm_rank(comm, &rank), "MPI_Comm_rank");
    // The lowest rank that refused, as the library's own agreement names (INT_MAX: none).
    const int mine = failure ? rank : std::numeric_limits<int>::max();
    int refused = std::numeric_limits<int>::max();
    int rc = MPI_SUCCESS;
    {
        py::gil_scoped_release release;
        rc = MPI_Allreduce(&mine, &refused, 1, MPI_INT, MPI_MIN, comm);
    }
    succeeded(rc, "MPI_Allreduce");
    if (failure) std::rethrow_exception(failure);
    if (refused != std::numeric_limits<int>::max()) {
        throw attn::Error(std::string(op) + ": rank " + std::to_string(refused) +
                          " refused its arguments (its own error says which and why)");
    }
}

const char* const kRingLayout = "(B, H, L_local, D)";

// What both calls convert first, in the same order: query, key, value (dtype="bfloat16": uint16
// bits), the keywords (ring_options) and threads=. Inside agree_on_arguments.
struct RingInputs {
    Input q, k, v;
    std::optional<RingCall> call;
    int threads = 0;
};

void convert_ring_inputs(std::string_view op, RingInputs& in, const py::handle& query, const py::handle& key, const py::handle& value,
                         const RingArgs& args, const py::object& threads_obj, bool bf16) {
    in.q = input(query, "query", 4, 4, kRingLayout, bf16);
    in.k = input(key, "key", 4, 4, kRingLayout, bf16);
    in.v = input(value, "value", 4, 4, kRingLayout, bf16);
    in.call.emplace(ring_options(op, args, in.q.view.dim(1)));
    in.threads = threads_arg(threads_obj);
}

py::tuple ring_forward(const py::handle& query, const py::handle& key, const py::handle& value, const py::handle& comm,
                       const py::object& is_causal, const py::object& scale, const py::object& layout,
                       const py::object& causal_alignment, const py::object& window, const py::object& window_alignment,
                       const py::object& query_offset, const py::object& key_lengths, const py::object& softcap,
                       const py::object& alibi_slopes, const py::object& sinks, const py::object& dropout_p,
                        const py::object& dropout_seed, const py::object& dtype, const py::object& out_dtype,
                       const py::object& impl, const py::object& threads_obj) {
    const MPI_Comm c = comm_of(comm);
    RingInputs in;
    const attn::TensorView &q = in.q.view, &v = in.v.view;
    py::array out, lse;
    agree_on_arguments(c, "ring_attention", [&] {
        convert_ring_inputs("ring_attention", in, query, key, value,
                            {{is_causal, causal_alignment, window, window_alignment, query_offset}, scale, layout,
                             key_lengths, {softcap, alibi_slopes, sinks}, dropout_p, dropout_seed, impl},
                            threads_obj, uint16_is_bf16_arg(dtype));
        // out in out_dtype (default: a 16-bit query's dtype, else float32); lse float32.
        const attn::DType odt = out_dtype_arg(out_dtype, sixteen_bit_or_f32(q.dtype()));
        out = new_array(odt, {q.dim(0), q.dim(1), q.dim(2), v.dim(3)}, "out (B, H, L_local, Dv)");
        lse = new_array(attn::DType::f32, {q.dim(0), q.dim(1), q.dim(2)}, "lse (B, H, L_local)");
    });
    const attn::TensorView ov = output_view(out, 4), lv = output_view(lse, 3);
    {
        py::gil_scoped_release release;
        const attn::ScopedNumThreads scoped_threads(in.threads);
        attn::dist::ring_attention(c, q, in.k.view, v, in.call->ring, ov, &lv);
    }
    return py::make_tuple(out, lse);
}

py::tuple ring_backward(const py::handle& query, const py::handle& key, const py::handle& value, const py::handle& out,
                        const py::handle& lse, const py::handle& grad_out, const py::handle& comm,
                        const py::object& is_causal, const py::object& scale, const py::object& layout,
                        const py::object& causal_alignment, const py::object& window, const py::object& window_alignment,
                        const py::object& query_offset, const py::object& key_lengths, const py::object& softcap,
                        const py::object& alibi_slopes, const py::object& sinks, const py::object& dropout_p,
                        const py::object& dropout_seed, const py::object& dtype, const py::object& out_dtype,
                        const py::object& impl, const py::object& threads_obj) {
    const MPI_Comm c = comm_of(comm);
    RingInputs in;
    Input o, l, g;
    Gradients grads;
    agree_on_arguments(c, "ring_attention_backward", [&] {
        const bool bf16 = uint16_is_bf16_arg(dtype);
        convert_ring_inputs("ring_attention_backward", in, query, key, value,
                            {{is_causal, causal_alignment, window, window_alignment, query_offset}, scale, layout,
                             key_lengths, {softcap, alibi_slopes, sinks}, dropout_p, dropout_seed, impl},
                            threads_obj, bf16);
        o = input(out, "out", 4, 4, kRingLayout, bf16);
        l = input(lse, "lse", 3, 3, "(B, H, L_local)");
        g = input(grad_out, "grad_out", 4, 4, kRingLayout, bf16);
        // dq/dk/dv in out_dtype, else each in its input's dtype (float32 for a float64 one: the
        // forward's out rule, per input).
        grads = new_gradients(in.q.view, in.k.view, in.v.view, out_dtype, BackwardPrecision::float32, 4, in.call->ring.sinks);
    });
    {
        py::gil_scoped_release release;
        const attn::ScopedNumThreads scoped_threads(in.threads);
        attn::dist::ring_attention_backward(c, in.q.view, in.k.view, in.v.view, o.view, l.view, g.view, in.call->ring,
                                            grads.dqv, grads.dkv, grads.dvv, nullptr, grads.dsinks_view());
    }
    return grads.result();
}

}  // namespace

void bind_dist(py::module_& m) {
    py::module_ d = m.def_submodule("dist", "Ring attention over MPI (mpi4py communicators); docs/ring.md");
    // The keywords after comm, shared by both calls (the defaults of attn.scaled_dot_product_attention).
#define ATTN_RING_KEYWORDS                                                                                           \
    py::kw_only(), py::arg("is_causal") = false, py::arg("scale") = py::none(), py::arg("layout") = "zigzag",        \
        py::arg("causal_alignment") = "top-left", py::arg("window") = py::none(),                                  \
        py::arg("window_alignment") = "top-left", py::arg("query_offset") = py::none(),                            \
        py::arg("key_lengths") = py::none(), py::arg("softcap") = py::none(), py::arg("alibi_slopes") = py::none(), \
        py::arg("sinks") = py::none(), py::arg("dropout_p") = 0.0, py::arg("dropout_seed") = py::none(),                   \
        py::arg("dtype") = py::none(), py::arg("out_dtype") = py::none(), py::arg("impl") = "auto",                \
        py::arg("threads") = py::none()
    d.def("ring_attention", &ring_forward, py::arg("query"), py::arg("key"), py::arg("value"), py::arg("comm"),
          ATTN_RING_KEYWORDS,
          "Collective: this rank's rows of O and lse (float32) for the sequence split over comm's ranks.\n"
          "query/key/value float32, float16, or uint16 bfloat16 bits with dtype=\"bfloat16\" (16-bit K/V travel\n"
          "in 16 bits); out in out_dtype: \"float32\", \"float16\" or \"bfloat16\" (default: a 16-bit query's\n"
          "dtype, else float32; no \"float64\": the ring computes in float32).\n"
          "The masking, modifier and dropout keywords are attn.scaled_dot_product_attention's, on global\n"
          "positions, the same on every rank (key_lengths and a (B,) query_offset: the same arrays);\n"
          "dropout_p/dropout_seed drop exactly what single-process attention drops with the same seed.\n"
          "impl: each block's kernel (\"auto\", \"flash\", \"reference\"; the backward: auto or flash);\n"
          "threads: this rank's thread count for the call (None: attn's setting).");
    d.def("ring_attention_backward", &ring_backward, py::arg("query"), py::arg("key"), py::arg("value"), py::arg("out"),
          py::arg("lse"), py::arg("grad_out"), py::arg("comm"), ATTN_RING_KEYWORDS,
          "Collective: this rank's rows of dQ, dK, dV (the gradients of <O, dO>), from ring_attention's out and lse\n"
          "(the same keywords as the forward). dq, dk, dv all in out_dtype when given, else each in its own\n"
          "input's dtype when that is 16-bit, else float32 (dq from query's, dk from key's, dv from value's);\n"
          "with sinks also dsinks (Hq,), the gradient over the whole sequence (the same on every rank).");
#undef ATTN_RING_KEYWORDS
    d.def(
        "rank_segments",
        // Converted by name (convert.hpp), as every scalar argument: pybind11's casters took True
        // as 1 and answered 1.5, "8" or 2**70 with their signature dump. P and rank are MPI's
        // ints: a value past int's range, [-2^31, 2^31 - 1], is named here, not truncated into
        // another rank (-2^31 fits: the library names it as a P < 1 or a rank < 0).
        [](const py::object& L_arg, const py::object& P_arg, const py::object& rank_arg, const py::object& layout_arg) {
            const std::int64_t L = int_arg(L_arg, "L");
            const std::int64_t P = int_arg(P_arg, "P");
            const std::int64_t rank = int_arg(rank_arg, "rank");
            const std::string layout = str_arg(layout_arg, "layout");
            for (const auto& [name, v] : {std::pair{"P", P}, std::pair{"rank", rank}}) {
                if (v < std::numeric_limits<int>::min() || v > std::numeric_limits<int>::max()) {
                    value_error(std::string("rank_segments: ") + name +
                                ": expected an int of MPI's range, [-2^31, 2^31 - 1], but got " + std::to_string(v));
                }
            }
            std::vector<std::pair<std::int64_t, std::int64_t>> out;
            for (const auto& s : attn::dist::rank_segments(L, static_cast<int>(P), static_cast<int>(rank),
                                                           attn::dist::parse_layout(layout)))
                out.emplace_back(s.start, s.length);
            return out;
        },
        py::arg("L"), py::arg("P"), py::arg("rank"), py::arg("layout") = "zigzag",
        "The global rows [(start, length), ...] that rank of P holds, in local order.");
}

}  // namespace attn_py
