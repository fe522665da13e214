// UTF-8 well-formedness, for text that crosses a boundary: file text quoted in messages
// (quoted, check.hpp) and names written into a safetensors header (JSON must be UTF-8).
#pragma once

#include <cstddef>
#include <string_view>

namespace attn::detail {

// Length of the well-formed UTF-8 sequence starting at text[i] (1 for ASCII), or 0 when the
// bytes there are not one (a stray continuation byte, a cut or overlong sequence, a surrogate).
std::size_t utf8_sequence_length(std::string_view text, std::size_t i);

}  // namespace attn::detail
