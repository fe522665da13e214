// Aligned allocation of a buffer whose byte count checked_size.hpp has validated. One place
// for the rounding to the alignment and for the out-of-memory message, which names what was
// being allocated and how many bytes, so "out of memory" is never anonymous.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace attn::detail {

// At least max(bytes, 1) bytes aligned to `align` (a power of two), to be released with
// std::free. Throws attn::OutOfMemory "out of memory: cannot allocate N bytes (x GiB) for
// <what>" when the system refuses. `bytes` must be >= 0 (a checked size).
void* allocate_aligned(std::int64_t bytes, std::size_t align, std::string_view what);

// Throws attn::OutOfMemory "out of memory: cannot allocate N bytes (…) for <what>": for the
// kernels' own malloc calls (ISA-compiled code builds no std::string: flash_driver.hpp says why).
[[noreturn]] void throw_out_of_memory(std::int64_t bytes, const char* what);

// "281474976710656 bytes (256.0 TiB)": the exact count for scripts, a readable one for people.
std::string describe_bytes(std::int64_t bytes);

}  // namespace attn::detail
