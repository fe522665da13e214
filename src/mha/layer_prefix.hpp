// One layer of a whole model's state_dict in a safetensors file: the tensors whose names start
// with a prefix ("layers.0.self_attn."), without it. `attn mha --params FILE.safetensors:PREFIX`
// and Python's MultiheadAttention.load_safetensors(path, prefix=...) read a layer through it, so
// a file that holds a whole model gets the same answers from both: the layer's tensors, or an
// error that names the prefix to give, spelt as the caller gives it.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "attn/safetensors.hpp"
#include "attn/tensor.hpp"

namespace attn::detail {

// How a caller names its prefix argument in errors.
struct PrefixSpelling {
    std::string argument;   // what each error starts with: "--params", "load_safetensors: prefix"
    std::string select;     // put before a prefix to show how to select it: "--params m.safetensors:", "prefix="
    std::string give;       // how to give another prefix: "after ':' give the prefix", "give the prefix"
    bool quote_prefix = false;  // the prefix in `select` is quoted (a Python str) or not (a command line)
};

// The tensors of `params` (read_safetensors_prefix(file, prefix, &held)) with `prefix` removed from
// their names. A prefix that selects nothing, one that is a whole tensor's name, and a file whose
// layers all carry a prefix the caller did not give are errors naming the prefix to give.
std::vector<std::pair<std::string, TensorView>> layer_of(const SafetensorsFile& params, const std::vector<std::string>& held,
                                                         const std::string& file, const std::string& prefix,
                                                         const PrefixSpelling& spelling);

}  // namespace attn::detail
