// Aligned allocation of a buffer whose byte count checked_size.hpp has validated. One place
// for the rounding to the alignment and for the out-of-memory message, which names what was
// being allocated and how many bytes, so "out of memory" is never anonymous.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace attn::detail {

// At least max(bytes, 1) bytes aligned to `align` (a power of two), to be released with
// std::free. Throws attn::OutOfMemory "out of memory: cannot allocate N bytes (x GiB) for
// <what>" when the system refuses. `bytes` must be >= 0 (a checked size).
void* allocate_aligned(std::int64_t bytes, std::size_t align, std::string_view what);

}  // namespace attn::detail
