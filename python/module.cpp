// The `attn` Python module: attn::sdpa, attn::sdpa_backward, attn::MultiHeadAttention and the
// KV cache on NumPy arrays, with PyTorch's names and conventions (README.md, "Python").
// Each concept has its file (bind.hpp); conversions are convert.hpp's, keyword → option
// mapping is options.hpp's.
// Errors: attn::Error becomes TypeError or ValueError by its kind (attn::ErrorKind, given where it
// is raised: a dtype or type the argument does not take, or a value), with the same message;
// attn::Interrupted (Ctrl-C) KeyboardInterrupt.
#include <pybind11/pybind11.h>

#include <exception>
#include <string>

#include "attn/error.hpp"
#include "attn/threads.hpp"
#include "attn/version.hpp"
#include "bind.hpp"
#include "convert.hpp"
#include "core/check.hpp"
#include "interruptible.hpp"

namespace py = pybind11;

PYBIND11_MODULE(_attn, m) {
    // The package `attn` (python/attn/__init__.py) re-exports everything defined here.
    m.doc() = "attn: scaled dot-product attention for CPUs, on NumPy arrays with PyTorch's names";
    m.attr("__version__") = attn::kVersion;
    attn_py::remember_main_thread();

    py::register_exception_translator([](std::exception_ptr p) {
        try {
            if (p) std::rethrow_exception(p);
        } catch (const attn::Interrupted&) {
            // A SIGINT stopped the call (interruptible.hpp): Python's handler has tripped its flag,
            // and PyErr_CheckSignals runs the Python-level one (KeyboardInterrupt by default). One
            // that raised nothing, or a SIGINT that came before Python's flag was chained to: the
            // call did not finish all the same.
            if (PyErr_CheckSignals() == 0) PyErr_SetNone(PyExc_KeyboardInterrupt);
        } catch (const attn::Error& e) {
            PyErr_SetString(e.kind() == attn::ErrorKind::type ? PyExc_TypeError : PyExc_ValueError, e.what());
        }
    });

    m.def("_input_copies", &attn_py::input_copies,
          "How many input arrays the binding has copied so far: a non-native byte order, a misaligned\n"
          "pointer or stride, or a stride that is not a multiple of the item size (README, Inputs).");
    // The argument through int_arg (convert.hpp): a bool or str is a TypeError naming `n`, and a
    // value past int's range reaches the library's own range check instead of pybind11's
    // "incompatible function arguments".
    m.def(
        "set_num_threads",
        [](const py::object& n_arg) {
            const std::int64_t n = attn_py::int_arg(n_arg, "n");
            if (n < 0 || n > 4096)
                throw attn::Error("set_num_threads: expected a thread count from 1 to 4096 (0 = the default) but got " +
                                  std::to_string(n));
            attn::set_num_threads(static_cast<int>(n));
        },
        py::arg("n"),
          "Threads every attn call computes on (process-wide); 0 = the default: ATTN_NUM_THREADS, else\n"
          "OpenMP's count (OMP_NUM_THREADS, else every CPU; after `import torch`, torch's count). A\n"
          "call's threads= keyword overrides it for that call; attn.torch follows torch's count instead.");
    m.def("get_num_threads", [] { return attn::num_threads(); }, "The thread count attn's next call will use.");
    // The library's rule for a dropout probability, for attn.torch's checks before it draws a seed
    // from torch's generator: one range in one wording ("sdpa: dropout_p: must be in [0, 1) but got
    // 1.5"), with the caller's op and name for the argument.
    m.def(
        "_require_dropout_p",
        [](const std::string& op, double p, const std::string& name) { attn::detail::require_dropout_p(op, p, name); },
        py::arg("op"), py::arg("p"), py::arg("name"),
        "Raises ValueError 'op: name: must be in [0, 1) but got p' unless 0 <= p < 1 (attn's rule).");
    // The binding's rule for a bool keyword (True/False, or NumPy's bool_), for attn.torch's own
    // bool arguments (enable_gqa): one rule and one wording with is_causal's.
    m.def(
        "_bool_arg", [](const py::object& value, const std::string& name) { return attn_py::bool_arg(value, name); },
        py::arg("value"), py::arg("name"),
        "value as a bool, or TypeError 'name: expected True or False but got <type> <value>' (attn's rule).");
    attn_py::bind_sdpa(m);
    attn_py::bind_varlen(m);
    attn_py::bind_kv_cache(m);
    attn_py::bind_paged_kv_cache(m);
    attn_py::bind_mha(m);
    attn_py::bind_threads(m);
    attn_py::bind_safetensors(m);
#if ATTN_PY_WITH_MPI
    attn_py::bind_dist(m);
#endif
}
