// PyTorch's MHA masks → attn::sdpa's masks: the one place where the conventions meet
// (docs/conventions.md, section "MultiHeadAttention").
//
//   PyTorch (nn.MultiheadAttention)              attn::sdpa
//   attn_mask bool:  True = NOT allowed      →   bool_mask: true = may attend  (negated)
//   key_padding_mask bool: True = padding    →   bool_mask (negated, broadcast over heads, queries)
//   float masks: added to the scores         →   additive_mask (the same numbers)
//
// sdpa takes one mask of each kind; when both PyTorch masks are bool (or both float) they
// are combined here into one (B, Ha, Lq, Lk) mask (Ha = h for a 3-D attn_mask, else 1).
// A float mask already in float32/float64 is passed through without a copy.
#pragma once

#include <optional>

#include "attn/tensor.hpp"

namespace attn::detail {

struct SdpaMasks {
    std::optional<TensorView> keep;  // sdpa bool_mask (true = may attend)
    std::optional<TensorView> add;   // sdpa additive_mask
    Tensor keep_store, add_store;    // owners when a mask had to be built
};

// attn: (1 or B, 1 or h, Lq, Lk)   kpm: (B or 1, 1, 1, Lk)   — 4-D views of the PyTorch
// masks (bool or floating; checked by the caller).
// A copy of a 4-D mask (.., .., Lq, Lk) with columns up to `keys`, the new ones allowed
// (false for bool, 0 for float; floats become float32): PyTorch's pad for add_bias_kv and
// add_zero_attn.
Tensor pad_keys(const TensorView& mask, std::int64_t keys);

SdpaMasks to_sdpa_masks(const std::optional<TensorView>& attn, const std::optional<TensorView>& kpm);

}  // namespace attn::detail
