// The portable flash path: the same driver and tiles as the AVX2 path, with micro-kernels
// in plain C++ over 16-lane arrays (the compiler vectorises them with whatever the
// baseline ISA offers, e.g. SSE2). No ISA flags: runs on any CPU.
#define ATTN_FLASH_NS flash_portable_ns
#include "attn/half.hpp"
#include "../simd/exp2.hpp"
#include "flash_driver.hpp"

namespace attn::detail {
namespace flash_portable_ns {
namespace {

typedef float v4 __attribute__((vector_size(16)));
inline v4 load4(const float* p) {
    v4 x;
    std::memcpy(&x, p, sizeof x);
    return x;
}
inline void store4(float* p, v4 x) { std::memcpy(p, &x, sizeof x); }

struct PortableOps {
    static constexpr int kPanel = kFlashPanelPortable;  // queries per panel: four 4-lane vectors
    static constexpr int kRows = 6;  // keys (qk) / head-dim rows (pv) per call: the 6 × 16 tile
    // s[r][0..16) = c2 · Σ_d k[r][d]·qt[d][0..16)      k: (rows, ldk), qt: (Dk, 16)
    // Explicit 4-lane vectors (GCC/Clang vector extension: SSE2 on x86-64, NEON on Arm,
    // scalar code elsewhere): left alone, GCC vectorised this loop along d with shuffles.
    static void qk(const float* qt, const float* k, std::int64_t ldk, int rows, int Dk, float c2, float* s, int ldS) {
        for (int r = 0; r < rows; ++r) {
            v4 a0 = {}, a1 = {}, a2 = {}, a3 = {};
            const float* kr = k + r * ldk;
            for (int d = 0; d < Dk; ++d) {
                const v4 kv = v4{} + kr[d];
                const float* q = qt + d * kPanel;
                a0 += kv * load4(q);
                a1 += kv * load4(q + 4);
                a2 += kv * load4(q + 8);
                a3 += kv * load4(q + 12);
            }
            float* o = s + r * ldS;
            store4(o, a0 * c2);
            store4(o + 4, a1 * c2);
            store4(o + 8, a2 * c2);
            store4(o + 12, a3 * c2);
        }
    }

    // Online-softmax update of one key block, vertical over keys; loops run along the
    // columns (contiguous) so the compiler can vectorise them.
    // s: (nk, ldS) scores → probabilities; m, l, alpha: (ncols)
    static void softmax(float* s, int ldS, int nk, int ncols, float* m, float* l, float* alpha) {
        float mx[kPanel], use[kPanel], sum[kPanel];
        for (int c0 = 0; c0 < ncols; c0 += kPanel) {
            for (int c = 0; c < kPanel; ++c) mx[c] = m[c0 + c];
            for (int j = 0; j < nk; ++j) {
                const float* sj = s + j * ldS + c0;
                for (int c = 0; c < kPanel; ++c) mx[c] = sj[c] > mx[c] ? sj[c] : mx[c];
            }
            for (int c = 0; c < kPanel; ++c) {
                use[c] = mx[c] == kNegInf ? 0.0f : mx[c];
                sum[c] = 0.0f;
            }
            for (int j = 0; j < nk; ++j) {
                float* sj = s + j * ldS + c0;
                for (int c = 0; c < kPanel; ++c) {
                    const float e = exp2poly::exp2_scalar((sj[c] - use[c]) * kLog2e);
                    sj[c] = e;
                    sum[c] += e;
                }
            }
            for (int c = 0; c < kPanel; ++c) {
                alpha[c0 + c] = exp2poly::exp2_scalar((m[c0 + c] - use[c]) * kLog2e);
                l[c0 + c] = l[c0 + c] * alpha[c0 + c] + sum[c];
                m[c0 + c] = mx[c];
            }
        }
    }

    // ot[r][0..16) = alpha·ot[r] + Σ_j v[j][r]·p[j][0..16)    v: (nk, ldv), p: (nk, ldP)
    // alpha = nullptr: every α is 1 (the driver checked; no multiply).
    static void pv(const float* p, int ldP, const float* v, std::int64_t ldv, int nk, int rows, float* ot, int ldO,
                   const float* alpha) {
        static const float kOnes[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
        if (alpha == nullptr) alpha = kOnes;
        for (int r = 0; r < rows; ++r) {
            float* o = ot + r * ldO;
            v4 a0 = load4(o) * load4(alpha), a1 = load4(o + 4) * load4(alpha + 4);
            v4 a2 = load4(o + 8) * load4(alpha + 8), a3 = load4(o + 12) * load4(alpha + 12);
            for (int j = 0; j < nk; ++j) {
                const v4 vv = v4{} + v[j * ldv + r];
                const float* pj = p + j * ldP;
                a0 += vv * load4(pj);
                a1 += vv * load4(pj + 4);
                a2 += vv * load4(pj + 8);
                a3 += vv * load4(pj + 12);
            }
            store4(o, a0);
            store4(o + 4, a1);
            store4(o + 8, a2);
            store4(o + 12, a3);
        }
    }

    // n float16/bfloat16 values (element stride `stride`) → float32, exactly (attn/half.hpp,
    // the conversions the decode kernel's portable row uses too).
    static void widen(const std::uint16_t* src, std::int64_t stride, std::int64_t n, bool is_f16, float* dst) {
        for (std::int64_t i = 0; i < n; ++i) dst[i] = is_f16 ? f16_to_float(src[i * stride]) : bf16_to_float(src[i * stride]);
    }

    // Dropout factors of a row segment (Philox4x32-10; the backward's implementation).
    static void dropout_row(const DropoutRowArgs& a) { dropout_row_portable(a); }

    // s[j][c] = 2^((s[j][c] − m[c])·log2 e − lse2[c])
    static void weights_exp(float* s, int ldS, int nk, int ncols, const float* m, const float* lse2) {
        for (int j = 0; j < nk; ++j)
            for (int c = 0; c < ncols; ++c)
                s[j * ldS + c] = exp2poly::exp2_scalar((s[j * ldS + c] - m[c]) * kLog2e - lse2[c]);
    }
};

}  // namespace
}  // namespace flash_portable_ns

void flash_forward_portable(const FlashJob* jobs, std::int64_t n, const FlashTiles& tiles, int threads) {
    flash_portable_ns::run_flash<flash_portable_ns::PortableOps>(jobs, n, tiles, threads);
}

}  // namespace attn::detail
