// Decode steps of bench/shapes.md S5 and S7 (B = 1, Hq = 32, Lk = 16384, D = 128, Lq = 1;
// Hkv = 32 or 8), timed cold: before every timed step a streaming sum over a large buffer
// evicts the CPU caches (this CPU's L3 could otherwise hold a 64–256 MiB cache that a
// model's many layers would not keep there) and samples the read bandwidth at that
// moment. `attn bench --shapes S5,S7` (bench/decode_cases.cpp) reports these timings.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "attn/dtype.hpp"
#include "attn/sdpa.hpp"

namespace attn::bench {

struct DecodeTiming {
    std::string shape;           // "S5" or "S7"
    DType storage = DType::f32;  // cache storage
    long long B = 0, Hq = 0, Hkv = 0, Lk = 0, D = 0;
    double bytes = 0;            // K + V bytes one step must read
    double median_ms = 0, min_ms = 0;
    std::vector<double> samples_ms;  // every timed step, in run order
    // Cold runs only: each step's GB/s over the read bandwidth of the eviction stream that
    // ran just before it (the same threads, the same moment): robust to a shared machine.
    double median_bw_fraction = 0;
    double gbps() const { return bytes / (median_ms * 1e-3) / 1e9; }
    double flops() const { return 4.0 * B * Hq * Lk * D; }  // Lq = 1: QKᵀ and AV
};

// A touched, huge-page-advised buffer whose streaming sum evicts the caches.
class FlushBuffer {
public:
    explicit FlushBuffer(std::size_t bytes);
    ~FlushBuffer();
    std::size_t bytes() const;

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
    friend DecodeTiming time_decode_shape(const std::string&, std::int64_t, std::int64_t, DType, int, const FlushBuffer*,
                                          const SdpaOptions&);
};

// One shape and storage: the cache is allocated and filled (touched) first, two warm-up
// steps, then `runs` timed steps, each after a flush when `flush` is given (else warm).
// `modifiers`: its softcap, alibi_slopes and sinks are set on every step (the rest is the
// step's own: causal bottom-right).
DecodeTiming time_decode_shape(const std::string& name, std::int64_t Hq, std::int64_t Hkv, DType storage, int runs,
                               const FlushBuffer* flush, const SdpaOptions& modifiers = {});

}  // namespace attn::bench
