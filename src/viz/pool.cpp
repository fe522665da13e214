#include "pool.hpp"

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "attn/error.hpp"

namespace attn::viz {

std::int64_t block_for(std::int64_t n, std::int64_t cap) { return n <= cap ? 1 : (n + cap - 1) / cap; }

// weights: (P, Lq, Lk) → (P, ceil(Lq/kr), ceil(Lk/kc)) block means.
Pooled mean_pool(const TensorView& weights, std::int64_t kr, std::int64_t kc, const char* what) {
    const std::int64_t P = weights.dim(0), Lq = weights.dim(1), Lk = weights.dim(2);
    Pooled out;
    out.panels = P;
    out.block_rows = kr;
    out.block_cols = kc;
    out.rows = (Lq + kr - 1) / kr;
    out.cols = (Lk + kc - 1) / kc;
    out.values.assign(static_cast<std::size_t>(P * out.rows * out.cols), 0.0);
    // Sums first (row by row through the input, so strided reads stay sequential), then means.
    // The sums are long double (x87: exponent to 16383), so a block of finite weights near
    // DBL_MAX sums without overflow and its mean is finite, as the weights are (a double sum
    // went to inf, and the picture's scale with it).
    std::vector<long double> block_sums(out.values.size(), 0.0L);
    for (std::int64_t p = 0; p < P; ++p) {
        for (std::int64_t i = 0; i < Lq; ++i) {
            long double* sums = &block_sums[static_cast<std::size_t>((p * out.rows + i / kr) * out.cols)];
            for (std::int64_t j = 0; j < Lk; ++j) {
                const double w = weights.load_as_double(weights.offset(p, i, j));
                if (!std::isfinite(w) || w < 0.0) {  // (the check first: no message built per weight)
                    if (P > 1) require_drawable_weight(w, what, {p, i, j});
                    else require_drawable_weight(w, what, {i, j});
                }
                sums[j / kc] += w;
            }
        }
    }
    for (std::int64_t p = 0; p < P; ++p) {
        for (std::int64_t r = 0; r < out.rows; ++r) {
            const std::int64_t nr = std::min(kr, Lq - r * kr);
            for (std::int64_t c = 0; c < out.cols; ++c) {
                const std::int64_t nc = std::min(kc, Lk - c * kc);
                const auto at = static_cast<std::size_t>((p * out.rows + r) * out.cols + c);
                double& v = out.values[at];
                v = static_cast<double>(block_sums[at] / static_cast<long double>(nr * nc));
                if (v == 0.0) out.any_masked = true;
                if (v > out.max) out.max = v;
            }
        }
    }
    return out;
}

void require_drawable_weight(double w, const std::string& what, std::initializer_list<std::int64_t> index) {
    if (std::isfinite(w) && w >= 0.0) return;
    std::string msg = what + ": attention weights must be finite and >= 0, but element (";
    for (const std::int64_t n : index) msg += (msg.back() == '(' ? "" : ", ") + std::to_string(n);
    char value[32];
    std::snprintf(value, sizeof value, "%g", w);
    throw Error(msg + ") is " + value);
}

}  // namespace attn::viz
