// The backward of MultiHeadAttention::forward_packed_train (mha_packed.cpp), reached through
// MultiHeadAttention::backward() when the state holds cu_seqlens.
#pragma once

#include <cstdint>

#include "attn/mha.hpp"

namespace attn::detail {

// (T, heads·d_h) float32 rows seen as the packed (T, heads, d_h) layout sdpa_varlen takes.
TensorView packed_heads(const Tensor& rows, std::int64_t heads, std::int64_t dh);

// Replaces the score modifiers s.sdpa points to (the layer's ALiBi slopes and sinks) by owned
// float32 copies in s: a training state outlives the layer's views. Shared by forward_train and
// forward_packed_train.
void own_score_modifiers(MhaForwardState& s);

// Gradients of the parameters and of the packed query (Tq, E), key (Tk, kdim), value (Tk, vdim).
MhaGradients packed_backward(const MultiHeadAttention& layer, const MhaForwardState& s, const TensorView& grad_output);

}  // namespace attn::detail
