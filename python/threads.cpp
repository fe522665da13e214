// attn._ScopedThreads(n, fallback): a context manager holding attn::ScopedNumThreads, so a block of
// Python code (attn.torch: torch.get_num_threads() or the caller's threads=) runs attn's
// calls on n threads — the one thread setting of attn/threads.hpp, not a second one. The
// setting is per OS thread, and a with-block enters and leaves on the same thread.
#include <memory>

#include "attn/threads.hpp"
#include "bind.hpp"
#include "convert.hpp"

namespace attn_py {
namespace {

struct ScopedThreads {
    int n;
    std::unique_ptr<attn::ScopedNumThreads> scope;
};

}  // namespace

void bind_threads(py::module_& m) {
    py::class_<ScopedThreads>(m, "_ScopedThreads")
        // The range and message of every threads=; None or 0 is `fallback` (attn.torch: torch's
        // count), as threads_arg's None or 0 is attn's setting.
        .def(py::init([](const py::object& n_arg, const py::object& fallback) {
                 const int n = threads_arg(n_arg, "torch.get_num_threads()");
                 return ScopedThreads{n != 0 ? n : threads_arg(fallback, "torch.get_num_threads()"), nullptr};
             }),
             py::arg("threads"), py::arg("fallback") = py::none())
        .def("__enter__",
             [](ScopedThreads& s) {
                 if (s.scope) value_error("_ScopedThreads: already entered");
                 s.scope = std::make_unique<attn::ScopedNumThreads>(s.n);
             })
        .def("__exit__", [](ScopedThreads& s, const py::args&) {
            s.scope.reset();
            return false;
        });
}

}  // namespace attn_py
