// The values of a layer's configuration that need neither a tensor nor embed_dim: num_heads and
// softcap. The constructor and from_state_dict check them first; the CLI (attn mha) right after
// parsing, before it reads --params, so a bad --softcap is named before a missing file is, and
// with the library's words (the CLI renames the field to its option, flag_names.hpp).
#pragma once

#include <cstdint>

namespace attn::detail {

// num_heads >= 1 ("MultiHeadAttention: num_heads: must be >= 1 but got 0") and softcap by sdpa's
// rule (require_softcap, src/sdpa/option_values.hpp): one range and one wording for one value.
void check_config_values(std::int64_t num_heads, double softcap);

}  // namespace attn::detail
