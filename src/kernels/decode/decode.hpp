// The decode kernel: Lq = 1..16 new queries per sequence against a long K/V (a KV cache),
// bandwidth-bound. Internal interface shared by the sdpa dispatch, KVCache's
// decode_attention and the tests.
//
// Work decomposition (results never depend on the thread count):
//   item = (b, kv head hk, key chunk c). One item reads K[b, hk, chunk] and V[b, hk, chunk]
//   once and computes all M = group·Lq query rows that read KV head hk (GQA/MQA: the
//   `group` query heads hk·group .. hk·group+group−1, each with its Lq queries).
//   When B·Hkv alone gives too few items to keep the cores busy, the keys are split into
//   `nsplit` chunks (flash-decoding); each chunk leaves an unnormalised partial
//   (o_c, m_c, l_c) and a merge pass combines them by their log-sum-exp:
//       M = max_c m_c,   w_c = exp(m_c − M),   l = Σ_c w_c·l_c,
//       out = Σ_c w_c·o_c / l,   lse = M + log l
//   The split depends only on the shape and the machine's core count, never on the
//   number of threads that run it; the merge order is fixed (c = 0, 1, ...).
#pragma once

#include <cstdint>
#include <string>

#include "attn/dtype.hpp"

namespace attn::detail {

struct SdpaProblem;

// Plain pointers and element strides only: this struct crosses into the AVX2 translation
// unit, which must not instantiate inline C++ library code (see decode_avx2.cpp).
struct DecodeArgs {
    std::int64_t B = 0, Hq = 0, Hkv = 0, Lq = 0, Lk = 0, Dk = 0, Dv = 0, group = 1;
    float scale = 1.0f;
    const float* q = nullptr;        // (B, Hq, Lq, Dk)
    std::int64_t qs[4] = {};
    DType kv = DType::f32;           // storage of K and V: f32, f16 or bf16
    const void* k = nullptr;         // (B, Hkv, Lk, Dk), unit stride along Dk
    std::int64_t ks[4] = {};
    const void* v = nullptr;         // (B, Hkv, Lk, Dv), unit stride along Dv
    std::int64_t vs[4] = {};
    float* out = nullptr;            // (B, Hq, Lq, Dv)
    std::int64_t os[4] = {};
    float* lse = nullptr;            // (B, Hq, Lq) or null
    std::int64_t ls[3] = {};
    // Visible keys [range[2·(b·Lq+i)], range[2·(b·Lq+i)+1]) of query i of sequence b:
    // the structural masks (causal, window, lengths), decided by the caller.
    const std::int64_t* range = nullptr;
    // Optional element-wise masks, already broadcast to (B, Hq, Lq, Lk) by strides.
    const unsigned char* bool_mask = nullptr;  // nonzero = may attend
    std::int64_t bms[4] = {};
    const void* add_mask = nullptr;  // float32 or float64 bias
    bool add_mask_f64 = false;
    std::int64_t ams[4] = {};
    // Plan (plan_decode) and the caller-owned scratch it sized.
    std::int64_t nsplit = 1, chunk = 0;
    float* work = nullptr;           // per-thread scratch, work_per_thread floats each
    std::int64_t work_per_thread = 0;
    int max_threads = 1;             // threads the scratch was sized for
    float* partial = nullptr;        // B·Hkv·nsplit·(M·Dv + 2·M) floats when nsplit > 1
};

// Keys processed per block (K block then V block, each read once from memory).
inline constexpr std::int64_t kDecodeBlock = 64;

struct DecodePlan {
    std::int64_t nsplit = 1, chunk = 0;
    std::int64_t work_per_thread = 0;  // floats
    std::int64_t partial_floats = 0;
};

// forced_split: 0 = automatic, 1 = no split, n > 1 = n chunks (tests).
DecodePlan plan_decode(std::int64_t B, std::int64_t Hkv, std::int64_t group, std::int64_t Lq, std::int64_t Lk,
                       std::int64_t Dk, std::int64_t Dv, std::int64_t forced_split);

// Runs the plan: allocates the scratch, picks the AVX2+FMA+F16C path when the CPU has it
// (unless force_portable), fills args.work/partial and calls the kernel.
struct DecodeTuning {
    std::int64_t split = 0;       // as forced_split above
    bool force_portable = false;  // tests: run the portable path on an AVX2 machine
};
void run_decode(DecodeArgs args, const DecodeTuning& tuning);

// The two implementations (same algorithm; decode_core.hpp).
void decode_portable(const DecodeArgs& args);
void decode_avx2(const DecodeArgs& args);
bool decode_cpu_has_avx2();  // AVX2 + FMA + F16C, checked once

// sdpa path. decode_declines: empty when the decode kernel can run the problem,
// otherwise why not (one short clause, for SdpaReport and error messages).
std::string decode_declines(const SdpaProblem& p);
void decode_forward(const SdpaProblem& p, const DecodeTuning& tuning = {});

// Which implementation run_decode would use ("avx2" or "portable").
const char* decode_isa(const DecodeTuning& tuning = {});

}  // namespace attn::detail

namespace attn { enum class Impl; struct SdpaReport; }

namespace attn::detail {

// The decode branch of run_forward (kernels/dispatch.cpp), called before any other choice.
// Returns true when it ran the decode kernel (and filled the report). Returns false to let
// the other kernels choose, after adding a line to `explanation`. Throws attn::Error when
// the call has float16/bfloat16 K/V that only decode (or an explicit reference) can run.
bool dispatch_decode(const SdpaProblem& p, Impl requested, SdpaReport* report, std::string& explanation);

}  // namespace attn::detail
