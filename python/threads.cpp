// The OpenMP thread count attn's kernels use when called from this Python thread (an
// OpenMP ICV of the calling thread): attn.torch sets it to torch.get_num_threads(), or to
// the caller's `threads=`, around each call and gives the previous count back.
#include <omp.h>

#include "bind.hpp"
#include "convert.hpp"

namespace attn_py {

void bind_threads(py::module_& m) {
    m.def("_get_num_threads", [] { return omp_get_max_threads(); },
          "The number of threads attn's kernels use when called from this thread.");
    m.def(
        "_set_num_threads",
        [](const py::object& n_arg) {
            const std::int64_t n = int_arg(n_arg, "threads");
            if (n < 1 || n > 4096) value_error("threads: expected an int in [1, 4096] but got " + std::to_string(n));
            omp_set_num_threads(static_cast<int>(n));
        },
        py::arg("threads"), "Sets the number of threads attn's kernels use when called from this thread.");
}

}  // namespace attn_py
