// Aligned allocation of a buffer whose byte count checked_size.hpp has validated. One place
// for the rounding to the alignment and for the out-of-memory message, which names what was
// being allocated and how many bytes, so "out of memory" is never anonymous.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <new>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace attn::detail {

// At least max(bytes, 1) bytes aligned to `align` (a power of two), to be released with
// std::free. Throws attn::OutOfMemory "out of memory: cannot allocate N bytes (x GiB) for
// <what>" when the system refuses. `bytes` must be >= 0 (a checked size).
void* allocate_aligned(std::int64_t bytes, std::size_t align, std::string_view what);

// A buffer the kernels stream (a Tensor, a KV cache): allocate_aligned(bytes, 64, what), except
// that one of at least 2 MiB is 2 MiB aligned and its whole 2 MiB pages are advised to be
// transparent huge pages (Linux MADV_HUGEPAGE; advice only — nothing changes where THP is off,
// and the tail past the last whole page keeps 4 KiB pages, so no memory is added). With 4 KiB
// pages, first-touch faults and TLB misses cost more than the work: decode streamed a cache at
// ≈ 2 GB/s against ≈ 12 GB/s, and S6's attention on the MHA layer's QKV buffer ran 3–5 % slower.
void* allocate_streamed(std::int64_t bytes, std::string_view what);
// The same, or null when the system refuses: for a caller that builds its message only then
// (a Tensor: a description built before every allocation was itself an allocation, whose
// refusal came out as a bare std::bad_alloc naming nothing).
void* allocate_streamed_or_null(std::int64_t bytes) noexcept;

// The same, or null when the system refuses: for buffers taken inside an OpenMP parallel region,
// which no exception may leave (std::terminate); the caller says the refusal after the region.
void* allocate_aligned_or_null(std::int64_t bytes, std::size_t align) noexcept;

// Throws attn::OutOfMemory "out of memory: cannot allocate N bytes (…) for <what>": for the
// kernels' own malloc calls (ISA-compiled code builds no std::string: flash_driver.hpp says why).
[[noreturn]] void throw_out_of_memory(std::int64_t bytes, const char* what);

// For a call's bookkeeping before it writes anything — its argument checks' lists of tensors, the
// report's text, each a few hundred bytes at most —: runs `step`, and a refusal there comes out as
// attn::OutOfMemory "out of memory: cannot allocate the few hundred bytes for <what>; nothing was
// written", not as a bare std::bad_alloc, which names nothing (and does not say how many bytes were
// asked for). An attn::OutOfMemory from `step` (a large check buffer) passes as it is.
[[noreturn]] void throw_bookkeeping_out_of_memory(const std::bad_alloc& refused, const char* what);
template <class Step>
void naming_bookkeeping(const char* what, Step&& step) {
    try {
        step();
    } catch (const std::bad_alloc& e) {
        throw_bookkeeping_out_of_memory(e, what);
    }
}

// "281474976710656 bytes (256.0 TiB)": the exact count for scripts, a readable one for people.
std::string describe_bytes(std::int64_t bytes);

// v.resize(n), with std::bad_alloc (or a byte count past 2^63) as attn::OutOfMemory naming
// `what` and the bytes: for host-side tables sized by a caller (a cu_seqlens of 2^40 empty
// sequences is valid, and its std::bad_alloc named nothing).
template <class T, class Alloc>
void resize_or_throw(std::vector<T, Alloc>& v, std::int64_t n, const char* what) {
    std::int64_t bytes = 0;
    if (__builtin_mul_overflow(n, static_cast<std::int64_t>(sizeof(T)), &bytes)) {
        throw_out_of_memory(std::numeric_limits<std::int64_t>::max(), what);
    }
    try {
        v.resize(static_cast<std::size_t>(n));
    } catch (const std::bad_alloc&) {
        throw_out_of_memory(bytes, what);
    } catch (const std::length_error&) {
        throw_out_of_memory(bytes, what);
    }
}

// A std::vector allocator whose buffers start on a cache line (64 bytes: one zmm), for kernel
// scratch that vector loops read and write a whole vector at a time. glibc's malloc aligns to 16
// bytes only, so such a buffer's 64-byte rows straddled two cache lines at every load and store:
// on Sapphire Rapids the float32 backward tile ran 7 % slower on its std::vector scratch, and the
// AMX backward tile, whose C rows are that scratch, 1.4× slower (docs/kernels-lab.md#bwd-5).
// Refusal is std::bad_alloc, as with std::allocator.
template <class T>
struct CacheLineAllocator {
    using value_type = T;
    static constexpr std::align_val_t kAlign{64};
    CacheLineAllocator() = default;
    template <class U>
    CacheLineAllocator(const CacheLineAllocator<U>&) noexcept {}
    T* allocate(std::size_t n) {
        if (n > std::numeric_limits<std::size_t>::max() / sizeof(T)) throw std::bad_array_new_length();
        return static_cast<T*>(::operator new(n * sizeof(T), kAlign));
    }
    void deallocate(T* p, std::size_t) noexcept { ::operator delete(p, kAlign); }
    template <class U>
    bool operator==(const CacheLineAllocator<U>&) const noexcept { return true; }
};
template <class T>
using CacheLineVector = std::vector<T, CacheLineAllocator<T>>;

}  // namespace attn::detail
