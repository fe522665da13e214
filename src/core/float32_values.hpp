// Score-modifier parameters (ALiBi slopes, sinks) are float32 in the library; the Python module
// and the CLI take them in any floating dtype (a Python list is float64) and round them here,
// once, for every entry point (docs/conventions.md, "Score modifiers").
#pragma once

#include <string_view>

#include "attn/tensor.hpp"

namespace attn::detail {

// `values` (any rank, any floating dtype) rounded to float32, to nearest even. A finite value
// that float32 cannot hold — it would round to ±inf, and the check for finite values would then
// name an inf the caller never gave — is an attn::Error naming it as given, by its index:
// "alibi_slopes[2] = 1e+300 does not fit float32 (it rounds to inf; float32's largest magnitude is
// 3.4028235e+38)". NaN and ±inf stay what they are (the callee's finiteness check names them);
// a value too small for float32 rounds towards 0 as any float32 result. A dtype that is not
// floating is an ErrorKind::type error naming `name`.
Tensor float32_values(const TensorView& values, std::string_view name);

}  // namespace attn::detail
