// attn.dist: ring attention over MPI from Python (built when attn is built with MPI). The
// communicator is an mpi4py one (anything with py2f(): its Fortran handle crosses into C with
// MPI_Comm_f2c, so no mpi4py header is needed at build time). Every function is collective.
//
//   out, lse = attn.dist.ring_attention(q_local, k_local, v_local, comm, is_causal=False, scale=None,
//                                       layout="zigzag")
//   dq, dk, dv = attn.dist.ring_attention_backward(q_local, k_local, v_local, out, lse, grad_out, comm, ...)
//   attn.dist.rank_segments(L, P, rank, layout="zigzag") -> [(start, length), ...]
// Arrays: (B, H, L_local, D) float32, the rank's rows as rank_segments gives them, concatenated.
#include <mpi.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "attn/ring.hpp"
#include "bind.hpp"
#include "convert.hpp"

namespace attn_py {
namespace {

MPI_Comm comm_of(const py::handle& comm) {
    int ready = 0;
    MPI_Initialized(&ready);
    if (!ready) value_error("comm: MPI is not initialized (import mpi4py.MPI first)");
    if (!py::hasattr(comm, "py2f")) type_error("comm: expected an mpi4py communicator (e.g. MPI.COMM_WORLD)");
    return MPI_Comm_f2c(comm.attr("py2f")().cast<MPI_Fint>());
}

attn::dist::RingOptions options(bool is_causal, const py::handle& scale, const std::string& layout) {
    attn::dist::RingOptions o;
    o.causal = is_causal ? attn::Causal::top_left : attn::Causal::none;
    o.scale = optional_float_arg(scale, "scale");
    o.layout = attn::dist::parse_layout(layout);
    return o;
}

py::tuple ring_forward(const py::handle& query, const py::handle& key, const py::handle& value, const py::handle& comm,
                       bool is_causal, const py::handle& scale, const std::string& layout) {
    const char* kLayout = "(B, H, L_local, D)";
    const Input q = input(query, "query", 4, 4, kLayout), k = input(key, "key", 4, 4, kLayout),
                v = input(value, "value", 4, 4, kLayout);
    const MPI_Comm c = comm_of(comm);
    const attn::dist::RingOptions o = options(is_causal, scale, layout);
    py::array out = new_array(attn::DType::f32, {q.view.dim(0), q.view.dim(1), q.view.dim(2), v.view.dim(3)});
    py::array lse = new_array(attn::DType::f32, {q.view.dim(0), q.view.dim(1), q.view.dim(2)});
    const attn::TensorView ov = output_view(out, 4), lv = output_view(lse, 3);
    {
        py::gil_scoped_release release;
        attn::dist::ring_attention(c, q.view, k.view, v.view, o, ov, &lv);
    }
    return py::make_tuple(out, lse);
}

py::tuple ring_backward(const py::handle& query, const py::handle& key, const py::handle& value, const py::handle& out,
                        const py::handle& lse, const py::handle& grad_out, const py::handle& comm, bool is_causal,
                        const py::handle& scale, const std::string& layout) {
    const char* kLayout = "(B, H, L_local, D)";
    const Input q = input(query, "query", 4, 4, kLayout), k = input(key, "key", 4, 4, kLayout),
                v = input(value, "value", 4, 4, kLayout), o = input(out, "out", 4, 4, kLayout),
                l = input(lse, "lse", 3, 3, "(B, H, L_local)"), g = input(grad_out, "grad_out", 4, 4, kLayout);
    const MPI_Comm c = comm_of(comm);
    const attn::dist::RingOptions opt = options(is_causal, scale, layout);
    py::array dq = new_array(attn::DType::f32, dims_of(q.view));
    py::array dk = new_array(attn::DType::f32, dims_of(k.view));
    py::array dv = new_array(attn::DType::f32, dims_of(v.view));
    const attn::TensorView dqv = output_view(dq, 4), dkv = output_view(dk, 4), dvv = output_view(dv, 4);
    {
        py::gil_scoped_release release;
        attn::dist::ring_attention_backward(c, q.view, k.view, v.view, o.view, l.view, g.view, opt, dqv, dkv, dvv);
    }
    return py::make_tuple(dq, dk, dv);
}

}  // namespace

void bind_dist(py::module_& m) {
    py::module_ d = m.def_submodule("dist", "Ring attention over MPI (mpi4py communicators); docs/ring.md");
    d.def("ring_attention", &ring_forward, py::arg("query"), py::arg("key"), py::arg("value"), py::arg("comm"),
          py::kw_only(), py::arg("is_causal") = false, py::arg("scale") = py::none(), py::arg("layout") = "zigzag",
          "Collective: this rank's rows of O and lse for the sequence split over comm's ranks (float32).");
    d.def("ring_attention_backward", &ring_backward, py::arg("query"), py::arg("key"), py::arg("value"), py::arg("out"),
          py::arg("lse"), py::arg("grad_out"), py::arg("comm"), py::kw_only(), py::arg("is_causal") = false,
          py::arg("scale") = py::none(), py::arg("layout") = "zigzag",
          "Collective: this rank's rows of dQ, dK, dV (the gradients of <O, dO>), from ring_attention's out and lse.");
    d.def(
        "rank_segments",
        [](std::int64_t L, int P, int rank, const std::string& layout) {
            std::vector<std::pair<std::int64_t, std::int64_t>> out;
            for (const auto& s : attn::dist::rank_segments(L, P, rank, attn::dist::parse_layout(layout)))
                out.emplace_back(s.start, s.length);
            return out;
        },
        py::arg("L"), py::arg("P"), py::arg("rank"), py::arg("layout") = "zigzag",
        "The global rows [(start, length), ...] that rank of P holds, in local order.");
}

}  // namespace attn_py
