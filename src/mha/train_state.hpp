// What MultiHeadAttention::backward checks of an MhaForwardState before it reads one element.
#pragma once

#include "attn/mha.hpp"

namespace attn::detail {

// The state was filled by forward_train or forward_packed_train of a layer configured like
// `layer` (MhaForwardState::layer records that configuration), and every tensor in it has the
// shape and dtype that fill gives it. Otherwise attn::Error names what differs: a state from
// another layer, or one edited by hand, is an error, never a read past a buffer.
void check_train_state(const MultiHeadAttention& layer, const MhaForwardState& s);

}  // namespace attn::detail
