// The checks of a MultiHeadAttention call's query/key/value, written once for forward_into
// and forward_train: they return the sizes every later step needs.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "attn/mha.hpp"
#include "../core/check.hpp"
#include "head_layout.hpp"

namespace attn::detail {

// The public class name: every message of the layer starts with it.
inline constexpr const char* kMha = "MultiHeadAttention";

struct MhaShapes {
    bool batched = true;           // rank 3 (else unbatched (L, F), B = 1)
    std::int64_t B = 1, Lq = 0, Lk = 0;
    std::int64_t extra = 0;        // keys appended by add_bias_kv / add_zero_attn
    std::int64_t Lkx = 0;          // Lk + extra
    Rows rq, rk;                   // rows of (b, l) in the query's / key's layout
    const char* layout = "";       // "(L, B, E)", "(B, L, E)" or "(L, E)", for messages
};

// query (Lq, B, E) | (B, Lq, E) | (Lq, E);  key (Lk, B, kdim) ...;  value (Lk, B, vdim) ...
// Throws attn::Error naming the argument, what was expected and what was given.
MhaShapes check_inputs(const MhaConfig& c, const TensorView& query, const TensorView& key, const TensorView& value,
                       const MhaForwardOptions& options);

// Throws unless every entry of the (h,) sinks is finite (a head's extra logit; sdpa refuses a
// non-finite one too, but later). `what` starts the message: "state_dict: tensor 'sinks'",
// "forward_incremental: parameter 'sinks'".
void check_finite_sinks(const TensorView& sinks, const char* what);

// The same tensor: one view of the same memory (data pointer, dtype, shape and strides).
bool same_view(const TensorView& a, const TensorView& b);

// The layer's one rule for an output over its activation inputs (query, key, value; x_new),
// docs/conventions.md "MultiHeadAttention": they are read only by the input projections, which
// end before the output is written, so the output may be exactly one of them (same_view: the
// layer in place, as `x = layer(x)`) or share no memory with it; a partial overlap is refused.
// (Masks, weights and parameters are read or written later: require_apart keeps them apart.)
void require_output_in_place_or_apart(std::string_view op, const TensorView& output, const std::vector<Named>& inputs);

// The layer's parameters are inputs of every forward: an output over one of them would rewrite
// the layer. Throws (op: "<output name>: must not share memory with <parameter>") unless each
// output (null: not given) lies apart from every parameter.
void require_apart_from_parameters(std::string_view op, const MultiHeadAttention& m, const std::vector<Named>& outputs);

}  // namespace attn::detail
