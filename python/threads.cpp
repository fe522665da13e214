// attn._ScopedThreads(n): a context manager holding attn::ScopedNumThreads, so a block of
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
        // The range and message of every threads= (attn.torch turns None into torch's count first).
        .def(py::init([](const py::object& n_arg) {
                 return ScopedThreads{threads_arg(n_arg, "torch.get_num_threads()"), nullptr};
             }),
             py::arg("threads"))
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
