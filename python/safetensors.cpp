// attn.save_safetensors: a dict of name -> array (a state_dict) written as a safetensors file,
// which `attn mha --params` and MultiheadAttention.load_safetensors read. Without it a Python
// user without the `safetensors` package (PyPI) had no way to make one from a torch model.
#include <pybind11/pybind11.h>

#include <map>
#include <string>
#include <vector>

#include "attn/safetensors.hpp"
#include "bind.hpp"
#include "convert.hpp"

namespace attn_py {

namespace py = pybind11;

namespace {

void save_safetensors_py(const py::object& path_arg, const py::object& tensors_arg, const py::object& metadata_arg,
                         const py::object& dtype) {
    const std::string path = path_arg_of(path_arg, "path");
    if (!py::isinstance<py::dict>(tensors_arg)) {
        type_error("tensors: expected a dict of name -> array (e.g. a state_dict) but got " +
                   std::string(py::str(py::type::of(tensors_arg).attr("__name__"))));
    }
    std::vector<Input> keep;
    const auto tensors = named_inputs(py::reinterpret_borrow<py::dict>(tensors_arg), "tensors", keep, uint16_is_bf16_arg(dtype));
    std::map<std::string, std::string> metadata;
    if (!metadata_arg.is_none()) {
        if (!py::isinstance<py::dict>(metadata_arg)) {
            type_error("metadata: expected a dict of str -> str but got " +
                       std::string(py::str(py::type::of(metadata_arg).attr("__name__"))));
        }
        for (const auto& item : py::reinterpret_borrow<py::dict>(metadata_arg)) {
            const std::string key = str_arg(item.first, "metadata key");
            metadata[key] = str_arg(item.second, "metadata['" + key + "']");
        }
    }
    py::gil_scoped_release nogil;
    attn::write_safetensors(path, tensors, metadata, /*keep_16bit=*/true);
}

}  // namespace

void bind_safetensors(py::module_& m) {
    m.def("save_safetensors", &save_safetensors_py, py::arg("path"), py::arg("tensors"), py::kw_only(),
          py::arg("metadata") = py::none(), py::arg("dtype") = py::none(),
          "Writes tensors, a dict of name -> array of rank <= 4 (a state_dict: torch tensors or NumPy\n"
          "arrays), as a safetensors file at path (complete or not at all): float32 as F32, float16 as\n"
          "F16, float64 as F32 (rounded); torch.bfloat16 tensors, and uint16 arrays of bfloat16 bits with\n"
          "dtype=\"bfloat16\", as BF16.\n"
          "metadata: a dict of str -> str for the header's __metadata__. What `attn mha --params` and\n"
          "MultiheadAttention.load_safetensors read, e.g.\n"
          "attn.save_safetensors(\"p.safetensors\", {k: v.numpy() for k, v in module.state_dict().items()}).");
}

}  // namespace attn_py
