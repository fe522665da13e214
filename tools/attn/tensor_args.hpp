// Tensor arguments of the CLI, read one way for every command: a path is a .npy file, or
// `FILE.safetensors:NAME` names one tensor of a safetensors file (the only way to give
// bfloat16, which .npy cannot hold). Files are never trusted (src/io checks them whole);
// every error starts with the option ("--k: ...") and is raised before any output is written.
#pragma once

#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include "attn/dtype.hpp"
#include "attn/tensor.hpp"
#include "core/float32_values.hpp"

namespace attn::cli {

// Reads `spec` for option `flag`: "x.npy" (any path not naming a safetensors tensor) or
// "w.safetensors:name" (split after the first ".safetensors:", so the name may hold ':') — unless
// the whole spec names an existing file, which is read as that file.
// A bare "w.safetensors" is refused with the way to name a tensor.
Tensor read_tensor_arg(const std::string& flag, const std::string& spec);

// read_tensor_arg, then the dtype must be one of `allowed` (else "--q: SPEC must hold
// float32, ... but holds int32").
Tensor read_tensor_arg(const std::string& flag, const std::string& spec, std::initializer_list<DType> allowed);

// An optional tensor option, read only when given (`spec` not empty): the tensor is kept in
// `holder`, because an options struct holds views, and `dst` is set to its view; not given,
// both are left as they are. One rule for every command's optional tensors (--sinks,
// --alibi-slopes, --key-lengths, masks, ...). Dst: TensorView, or a type made from one.
template <class Dst>
void read_optional_tensor_arg(const std::string& flag, const std::string& spec, Tensor& holder, std::optional<Dst>& dst) {
    if (spec.empty()) return;
    holder = read_tensor_arg(flag, spec);
    dst = holder.view();
}

// A score-modifier parameter (--alibi-slopes, --sinks): as read_optional_tensor_arg, but another
// floating dtype is rounded to float32 once, by the rule Python and `attn mha` use
// (detail::float32_values: a finite value beyond float32 is named as given). Any other dtype is
// left to the library's check, which names it.
template <class Dst>
void read_optional_float32_arg(const std::string& flag, const std::string& spec, Tensor& holder, std::optional<Dst>& dst) {
    read_optional_tensor_arg(flag, spec, holder, dst);
    if (spec.empty() || holder.dtype() == DType::f32 || !is_floating(holder.dtype())) return;
    holder = detail::float32_values(holder.view(), flag);
    dst = holder.view();
}

// The file a spec reads (FILE of FILE.safetensors:NAME, else the spec).
std::string tensor_arg_file(const std::string& spec);

// Whether two specs name the same tensor: the same file however it is spelt ("x.npy",
// "./x.npy", a link to it) and, for FILE.safetensors:NAME, the same name.
bool same_tensor_arg(const std::string& a, const std::string& b);

// Q, K, V, dO: float32, float64, float16 or bfloat16.
Tensor read_float_arg(const std::string& flag, const std::string& spec);

// --out-dtype, parsed with the other options before any file is read (its default depends on
// Q, which is not read yet): nullopt when not given ("" from the parser), else float16,
// bfloat16, float32 or, with_float64 (attn sdpa, whose reference computes in double), float64.
std::optional<DType> parse_out_dtype(const std::string& text, bool with_float64 = false);
// The outputs' dtype once Q is read: the given --out-dtype, else a 16-bit Q's dtype, else
// float32 (a float64 Q too).
DType out_dtype_for(std::optional<DType> given, DType q_dtype);
// A dtype flag's value: float16, bfloat16, float32 (or float64, with_float64), else an error
// naming `flag` and the dtypes it takes.
DType parse_float_dtype(const std::string& flag, const std::string& text, bool with_float64 = false);
// The dtypes parse_float_dtype takes, in the order its error lists them.
std::vector<DType> float_dtypes(bool with_float64);
// "float16, bfloat16 or float32": the names, for a message.
std::string dtype_list(const std::vector<DType>& dtypes);

}  // namespace attn::cli
