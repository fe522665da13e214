// Portable tile of the tiled backward and the portable dropout rows: plain loops the
// compiler vectorises for the baseline ISA. The kernel table's portable row.
#include <cmath>
#include <cstddef>

#include "../../core/dropout.hpp"
#include "../finite.hpp"
#include "../isa.hpp"
#include "../simd/tanh.hpp"
#include "../simd/exp2.hpp"
#include "tile.hpp"

namespace attn::detail {
namespace {

// C(M×N) (+)= A(M×K)·B(K×N): each C row is a sum of scaled B rows (axpy form).
// (No requests: the driver gives RowsAhead to the avx512 tile only.)
void gemm(int M, int N, int K, const float* a, std::ptrdiff_t a_rs, std::ptrdiff_t a_ks, const float* b,
          std::ptrdiff_t ldb, float* c, std::ptrdiff_t ldc, bool accumulate, RowsAhead* = nullptr) {
    for (int r = 0; r < M; ++r) {
        float* cr = c + r * ldc;
        if (!accumulate)
            for (int n = 0; n < N; ++n) cr[n] = 0.0f;
        for (int k = 0; k < K; ++k) {
            const float av = a[r * a_rs + k * a_ks];
            const float* bk = b + k * ldb;
            for (int n = 0; n < N; ++n) cr[n] += av * bk[n];
        }
    }
}

void exp_row(float* s, int n, float scale, float neg_lse) {
    for (int j = 0; j < n; ++j) {
        const float p = exp2poly::exp2_scalar((s[j] * scale + neg_lse) * kTileLog2e);
        s[j] = p > 1.0f ? 1.0f : p;  // P <= 1 (tile.hpp); NaN stays NaN
    }
}

void ds_row(const float* p, float* dp, int n, float D, float scale) {
    for (int j = 0; j < n; ++j) dp[j] = p[j] == 0.0f ? 0.0f : scale * p[j] * (dp[j] - D);
}

#include "tile_products_f32.inl"
#include "tile_body.inl"

}  // namespace

void backward_tile_portable(const TileArgs& t) { tile_body(t); }

void dropout_row_portable(const DropoutRowArgs& a) {
    for (int t = 0; t < a.n4; ++t) {
        const PhiloxCounter r = philox4x32_10({a.j4 + static_cast<std::uint32_t>(t), a.i, a.h, a.b}, {a.key0, a.key1});
        for (int w = 0; w < 4; ++w) a.out[4 * t + w] = r[static_cast<std::size_t>(w)] >= a.threshold ? a.scale : 0.0f;
    }
}

}  // namespace attn::detail
