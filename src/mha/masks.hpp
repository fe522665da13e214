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

#include <cstdint>
#include <optional>

#include "attn/tensor.hpp"

namespace attn::detail {

// PyTorch's two masks as 4-D views (b, head, i, j), stride 0 where broadcast:
//   attn_mask (Lq, Lk) → (1, 1, Lq, Lk);  (B·h, Lq, Lk) [unbatched (h, Lq, Lk)] → (B, h, Lq, Lk)
//   key_padding_mask (B, Lk) [unbatched (Lk,)] → (B, 1, 1, Lk)
// store_* own the masks once pad_masks has copied them.
struct PytorchMasks {
    std::optional<TensorView> attn, kpm;
    Tensor attn_store, kpm_store;
};

// Checks each given mask's dtype and shape (attn::Error naming it, prefixed by the class
// MultiHeadAttention) and views it as 4-D; the data stays the caller's.
PytorchMasks pytorch_masks_4d(const std::optional<TensorView>& attn_mask, const std::optional<TensorView>& key_padding_mask,
                              bool batched, std::int64_t B, std::int64_t heads, std::int64_t Lq, std::int64_t Lk);

// Replaces each mask by an owned contiguous copy with `keys` columns (pad_keys below): for
// the appended keys of add_bias_kv / add_zero_attn, and for a training state that must not
// point into the caller's memory.
void pad_masks(PytorchMasks& m, std::int64_t keys);

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
