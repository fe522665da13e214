// A cache's storage buffer: large ones are 2 MiB aligned and advised to use transparent huge
// pages — decode streams the whole cache every step, and first-touch faults and TLB misses on
// 4 KiB pages cost far more than the kernel (measured: ≈ 2 GB/s with 4 KiB pages against
// ≈ 12 GB/s with huge pages). Shared by KVCache and PagedKVCache.
#pragma once

#include <sys/mman.h>

#include <cstdint>
#include <cstdlib>
#include <string>

#include "../core/allocate.hpp"

namespace attn::detail {

// `bytes` is a checked size; `what` names the buffer when the system refuses it (OutOfMemory).
struct HugeBuffer {
    void* data = nullptr;

    HugeBuffer(std::int64_t bytes, const std::string& what) {
        constexpr std::int64_t kHuge = std::int64_t{2} << 20;
        const bool huge = bytes >= kHuge;
        data = allocate_aligned(bytes, huge ? kHuge : 64, what);
        // Advice only: failure is harmless. Whole huge pages of the buffer.
        if (huge) madvise(data, static_cast<std::size_t>(bytes / kHuge * kHuge), MADV_HUGEPAGE);
    }
    ~HugeBuffer() { std::free(data); }
    HugeBuffer(const HugeBuffer&) = delete;
    HugeBuffer& operator=(const HugeBuffer&) = delete;
};

}  // namespace attn::detail
