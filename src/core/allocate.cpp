#include "allocate.hpp"

#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>

#if __has_include(<sys/mman.h>)
#include <sys/mman.h>  // madvise
#endif

#include "attn/error.hpp"
#include "check.hpp"

namespace attn::detail {

std::string describe_bytes(std::int64_t bytes) {
    static const char* const units[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    double v = static_cast<double>(bytes);
    int u = 0;
    while (v >= 1024.0 && u < 6) {
        v /= 1024.0;
        ++u;
    }
    std::string s = std::to_string(bytes) + " bytes";
    if (u > 0) {
        char buf[32];
        std::snprintf(buf, sizeof buf, " (%.1f %s)", v, units[u]);
        s += buf;
    }
    return s;
}

void* allocate_aligned_or_null(std::int64_t bytes, std::size_t align) noexcept {
    ATTN_DASSERT(bytes >= 0 && align > 0 && (align & (align - 1)) == 0);
    // aligned_alloc wants a multiple of the alignment, and never 0. The rounding is done in
    // size_t, which holds any int64 byte count plus one alignment.
    const std::size_t n = static_cast<std::size_t>(bytes);
    const std::size_t padded = n == 0 ? align : (n + align - 1) / align * align;
    return std::aligned_alloc(align, padded);
}

void* allocate_aligned(std::int64_t bytes, std::size_t align, std::string_view what) {
    void* p = allocate_aligned_or_null(bytes, align);
    if (p == nullptr) throw_out_of_memory(bytes, std::string(what).c_str());
    return p;
}

void* allocate_streamed_or_null(std::int64_t bytes) noexcept {
    constexpr std::int64_t kHuge = std::int64_t{2} << 20;
    if (bytes < kHuge) return allocate_aligned_or_null(bytes, 64);
    void* p = allocate_aligned_or_null(bytes, kHuge);
#if defined(MADV_HUGEPAGE)
    if (p != nullptr) madvise(p, static_cast<std::size_t>(bytes / kHuge * kHuge), MADV_HUGEPAGE);  // advice: failure is harmless
#endif
    return p;
}

void* allocate_streamed(std::int64_t bytes, std::string_view what) {
    void* p = allocate_streamed_or_null(bytes);
    if (p == nullptr) throw_out_of_memory(bytes, std::string(what).c_str());
    return p;
}

void throw_out_of_memory(std::int64_t bytes, const char* what) {
    throw OutOfMemory("out of memory: cannot allocate " + describe_bytes(bytes) + " for " + what);
}

void throw_bookkeeping_out_of_memory(const std::bad_alloc& refused, const char* what) {
    if (dynamic_cast<const OutOfMemory*>(&refused) != nullptr) throw;  // named already: the handler's exception as it is
    throw OutOfMemory(std::string("out of memory: cannot allocate the few hundred bytes for ") + what + "; nothing was written");
}

}  // namespace attn::detail
