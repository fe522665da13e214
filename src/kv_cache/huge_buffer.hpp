// A cache's storage buffer (allocate_streamed: 2 MiB pages where the system gives them —
// decode streams the whole cache every step). Shared by KVCache and PagedKVCache.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <string>

#include "../core/allocate.hpp"

namespace attn::detail {

// `bytes` is a checked size; `what` names the buffer when the system refuses it (OutOfMemory).
struct HugeBuffer {
    void* data = nullptr;

    HugeBuffer(std::int64_t bytes, const std::string& what) : data(allocate_streamed(bytes, what)) {}
    ~HugeBuffer() { std::free(data); }
    HugeBuffer(const HugeBuffer&) = delete;
    HugeBuffer& operator=(const HugeBuffer&) = delete;
};

}  // namespace attn::detail
