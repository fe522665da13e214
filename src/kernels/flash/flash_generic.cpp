// The portable flash path: the same driver and tiles as the AVX2 path, with micro-kernels
// in plain C++ over 16-lane arrays (the compiler vectorises them with whatever the
// baseline ISA offers, e.g. SSE2). No ISA flags: runs on any CPU.
#define ATTN_FLASH_NS flash_generic_ns
#include "exp2.hpp"
#include "flash_driver.hpp"

namespace attn::detail {
namespace flash_generic_ns {
namespace {

struct GenericOps {
    // s[r][0..16) = c2 · Σ_d k[r][d]·qt[d][0..16)      k: (rows, ldk), qt: (Dk, 16)
    static void qk(const float* qt, const float* k, std::int64_t ldk, int rows, int Dk, float c2, float* s, int ldS) {
        for (int r = 0; r < rows; ++r) {
            float acc[kPanel] = {};
            const float* kr = k + r * ldk;
            for (int d = 0; d < Dk; ++d) {
                const float kv = kr[d];
                const float* q = qt + d * kPanel;
                for (int c = 0; c < kPanel; ++c) acc[c] += kv * q[c];
            }
            for (int c = 0; c < kPanel; ++c) s[r * ldS + c] = acc[c] * c2;
        }
    }

    // Online-softmax update of one key block, column by column (vertical over keys).
    // s: (nk, ldS) scores in base 2 → probabilities; m, l, alpha: (ncols)
    static void softmax(float* s, int ldS, int nk, int ncols, float* m, float* l, float* alpha) {
        for (int c = 0; c < ncols; ++c) {
            float mx = m[c];
            for (int j = 0; j < nk; ++j) mx = s[j * ldS + c] > mx ? s[j * ldS + c] : mx;
            const float use = mx == kNegInf ? 0.0f : mx;
            alpha[c] = exp2poly::exp2_scalar(m[c] - use);
            float sum = 0.0f;
            for (int j = 0; j < nk; ++j) {
                const float e = exp2poly::exp2_scalar(s[j * ldS + c] - use);
                s[j * ldS + c] = e;
                sum += e;
            }
            l[c] = l[c] * alpha[c] + sum;
            m[c] = mx;
        }
    }

    // ot[r][0..16) = alpha·ot[r] + Σ_j v[j][r]·p[j][0..16)    v: (nk, ldv), p: (nk, ldP)
    static void pv(const float* p, int ldP, const float* v, std::int64_t ldv, int nk, int rows, float* ot, int ldO,
                   const float* alpha) {
        for (int r = 0; r < rows; ++r) {
            float acc[kPanel];
            for (int c = 0; c < kPanel; ++c) acc[c] = ot[r * ldO + c] * alpha[c];
            for (int j = 0; j < nk; ++j) {
                const float vv = v[j * ldv + r];
                const float* pj = p + j * ldP;
                for (int c = 0; c < kPanel; ++c) acc[c] += vv * pj[c];
            }
            for (int c = 0; c < kPanel; ++c) ot[r * ldO + c] = acc[c];
        }
    }

    // s[j][c] = 2^(s[j][c] − m[c] − lse2[c])
    static void weights_exp(float* s, int ldS, int nk, int ncols, const float* m, const float* lse2) {
        for (int j = 0; j < nk; ++j)
            for (int c = 0; c < ncols; ++c) s[j * ldS + c] = exp2poly::exp2_scalar(s[j * ldS + c] - m[c] - lse2[c]);
    }
};

}  // namespace
}  // namespace flash_generic_ns

void flash_forward_generic(const SdpaProblem& p, const FlashTiles& tiles, int threads) {
    flash_generic_ns::run_flash<flash_generic_ns::GenericOps>(p, tiles, threads);
}

void flash_exp2_generic(const float* x, float* y, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) y[i] = exp2poly::exp2_scalar(x[i]);
}

}  // namespace attn::detail
