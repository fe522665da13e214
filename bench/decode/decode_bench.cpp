#include "decode_bench.hpp"

#include <immintrin.h>
#include <omp.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "attn/decode.hpp"
#include "attn/kv_cache.hpp"
#include "attn/tensor.hpp"
#include "../../src/kernels/decode/decode.hpp"

namespace attn::bench {
namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const std::size_t n = v.size();
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// A huge-page-advised, touched buffer of 64-bit words.
struct Buffer {
    std::uint64_t* p = nullptr;
    std::size_t words = 0;
    explicit Buffer(std::size_t bytes) : words(bytes / 8) {
        p = static_cast<std::uint64_t*>(std::aligned_alloc(2u << 20, bytes));
        if (p == nullptr) throw std::bad_alloc();
        madvise(p, bytes, MADV_HUGEPAGE);
#pragma omp parallel for schedule(static)
        for (std::size_t i = 0; i < words; ++i) p[i] = i;
    }
    ~Buffer() { std::free(p); }
};

// Σ of words [lo, hi) with as few instructions per byte as the CPU allows (32-byte loads,
// four independent sums), so that a slow or shared core still measures memory, not itself.
__attribute__((target("avx2"))) std::uint64_t sum_avx2(const std::uint64_t* p, std::size_t lo, std::size_t hi) {
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    std::size_t i = lo;
    for (; i + 16 <= hi; i += 16) {
        a0 = _mm256_add_epi64(a0, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i)));
        a1 = _mm256_add_epi64(a1, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 4)));
        a2 = _mm256_add_epi64(a2, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 8)));
        a3 = _mm256_add_epi64(a3, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 12)));
    }
    alignas(32) std::uint64_t t[4];
    _mm256_store_si256(reinterpret_cast<__m256i*>(t), _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3)));
    std::uint64_t s = t[0] + t[1] + t[2] + t[3];
    for (; i < hi; ++i) s += p[i];
    return s;
}

std::uint64_t sum_portable(const std::uint64_t* p, std::size_t lo, std::size_t hi) {
    std::uint64_t s = 0;
    for (std::size_t i = lo; i < hi; ++i) s += p[i];
    return s;
}

// Σ of every word, each thread streaming one contiguous part (as decode's items do).
std::uint64_t stream_sum(const Buffer& b) {
    static const bool avx2 = __builtin_cpu_supports("avx2");
    std::uint64_t total = 0;
#pragma omp parallel reduction(+ : total)
    {
        const std::size_t nt = static_cast<std::size_t>(omp_get_num_threads());
        const std::size_t t = static_cast<std::size_t>(omp_get_thread_num());
        // 64-byte aligned parts (the buffer is 2 MiB aligned).
        const std::size_t part = (b.words / nt + 7) / 8 * 8;
        const std::size_t lo = std::min(b.words, t * part), hi = std::min(b.words, lo + part);
        total += avx2 ? sum_avx2(b.p, lo, hi) : sum_portable(b.p, lo, hi);
    }
    return total;
}

volatile std::uint64_t g_sink;

// Deterministic, cheap values in [-1, 1) (xorshift), enough to make real scores.
void fill(float* x, std::size_t n, std::uint64_t seed) {
    std::uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
    for (std::size_t i = 0; i < n; ++i) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        x[i] = static_cast<float>(static_cast<double>(s >> 11) * 0x1.0p-52 - 1.0);
    }
}

}  // namespace

struct FlushBuffer::Impl {
    Buffer b;
    explicit Impl(std::size_t bytes) : b(bytes) {}
};
FlushBuffer::FlushBuffer(std::size_t bytes) : impl_(std::make_unique<Impl>(bytes)) {}
FlushBuffer::~FlushBuffer() = default;
std::size_t FlushBuffer::bytes() const { return impl_->b.words * 8; }

DecodeTiming time_decode_shape(const std::string& name, std::int64_t Hq, std::int64_t Hkv, DType storage, int runs,
                               const FlushBuffer* flush_buffer, const SdpaOptions& modifiers) {
    const Buffer* flush = flush_buffer != nullptr ? &flush_buffer->impl_->b : nullptr;
    constexpr std::int64_t B = 1, Lk = 16384, D = 128, kChunk = 1024;
    DecodeTiming t;
    t.shape = name;
    t.storage = storage;
    t.B = B;
    t.Hq = Hq;
    t.Hkv = Hkv;
    t.Lk = Lk;
    t.D = D;
    t.bytes = 2.0 * B * Hkv * Lk * D * static_cast<double>(dtype_size(storage));

    KVCacheConfig cfg;
    cfg.batch = B;
    cfg.kv_heads = Hkv;
    cfg.head_dim = D;
    cfg.capacity = Lk;
    cfg.storage = storage;
    KVCache cache(cfg);
    // Fill (and so touch) the whole cache before any timing: a prompt of Lk tokens.
    Tensor k(DType::f32, Shape{B, Hkv, kChunk, D}), v(DType::f32, Shape{B, Hkv, kChunk, D});
    for (std::int64_t c = 0; c < Lk / kChunk; ++c) {
        fill(k.data_as<float>(), static_cast<std::size_t>(k.numel()), 2 * c + 1);
        fill(v.data_as<float>(), static_cast<std::size_t>(v.numel()), 2 * c + 2);
        cache.append(k, v);
    }
    Tensor q(DType::f32, Shape{B, Hq, 1, D}), out(DType::f32, Shape{B, Hq, 1, D});
    fill(q.data_as<float>(), static_cast<std::size_t>(q.numel()), 77);
    SdpaOptions opt;  // a generation step: causal, bottom-right per sequence
    opt.causal = Causal::bottom_right;
    opt.softcap = modifiers.softcap;
    opt.alibi_slopes = modifiers.alibi_slopes;
    opt.sinks = modifiers.sinks;
    for (int w = 0; w < 2; ++w) decode_attention(q, cache, opt, out);  // warm-up (workspace pages, code)
    std::vector<double> ms, frac;
    for (int r = 0; r < runs; ++r) {
        double flush_gbps = 0;
        if (flush != nullptr) {  // evict, and sample the bandwidth right now
            const auto f0 = Clock::now();
            g_sink = stream_sum(*flush);
            flush_gbps = static_cast<double>(flush->words * 8) / (ms_since(f0) * 1e-3) / 1e9;
        }
        const auto t0 = Clock::now();
        decode_attention(q, cache, opt, out);
        ms.push_back(ms_since(t0));
        if (flush != nullptr) frac.push_back(t.bytes / (ms.back() * 1e-3) / 1e9 / flush_gbps);
    }
    t.samples_ms = ms;
    t.median_ms = median(ms);
    if (!frac.empty()) t.median_bw_fraction = median(frac);
    t.min_ms = *std::min_element(ms.begin(), ms.end());
    return t;
}


}  // namespace attn::bench
