// An independent naive attention in double that the unit tests compare attn::sdpa against,
// and the seeded random tensors those tests draw (the rest is common/util.hpp's).
//
// The naive attention deliberately shares no code with src/: it reads elements through its
// own stride arithmetic, and each test states its mask rule as a plain predicate
// keep(b, h, i, j) written from the documented semantics — so a wrong rule in
// SdpaProblem::key_range or a wrong broadcast cannot be hidden by the oracle repeating it.
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <random>
#include <vector>

#include "attn/sdpa.hpp"
#include "common/util.hpp"

namespace attn_test {

using attn::DType;
using attn::Shape;
using attn::Tensor;
using attn::TensorView;

inline constexpr double kInf = std::numeric_limits<double>::infinity();

using attn::test::at;  // element access by explicit stride arithmetic, no code from src/
using attn::test::is_poison;
using attn::test::poison;
using attn::test::still_poisoned;
using attn::test::written_nan;

// A float tensor with uniform values in [lo, hi), from a fixed seed.
inline Tensor random_tensor(DType dtype, Shape shape, std::uint32_t seed, double lo = -1.0, double hi = 1.0) {
    std::mt19937 gen(seed);
    return attn::test::rand_uniform(dtype, shape, gen, lo, hi);
}

// A bool tensor, each element true with probability p_true, from a fixed seed.
inline Tensor random_bool(Shape shape, std::uint32_t seed, double p_true) {
    std::mt19937 gen(seed);
    return attn::test::random_bool(shape, gen, p_true);
}

// numpy broadcasting written out: the C-order element offset, in a contiguous tensor of
// `shape` (rank ≤ 4, right-aligned against (B, Hq, Lq, Lk)), that index (b, h, i, j) reads.
inline std::int64_t broadcast_offset(const Shape& shape, std::int64_t b, std::int64_t h, std::int64_t i,
                                     std::int64_t j) {
    const std::int64_t idx[4] = {b, h, i, j};
    std::int64_t off = 0, stride = 1;
    for (int a = shape.rank - 1; a >= 0; --a) {
        const std::int64_t dim = shape[a];
        off += (dim == 1 ? 0 : idx[4 - shape.rank + a]) * stride;
        stride *= dim;
    }
    return off;
}

// Result of the naive attention, row-major (B, Hq, Lq, ·).
struct NaiveResult {
    std::int64_t B = 0, Hq = 0, Lq = 0, Lk = 0, Dv = 0;
    std::vector<double> out;      // (B, Hq, Lq, Dv)
    std::vector<double> weights;  // (B, Hq, Lq, Lk)
    std::vector<double> lse;      // (B, Hq, Lq)
    double o(std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t d) const {
        return out[static_cast<std::size_t>(((b * Hq + h) * Lq + i) * Dv + d)];
    }
    double w(std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j) const {
        return weights[static_cast<std::size_t>(((b * Hq + h) * Lq + i) * Lk + j)];
    }
    double l(std::int64_t b, std::int64_t h, std::int64_t i) const {
        return lse[static_cast<std::size_t>((b * Hq + h) * Lq + i)];
    }
};

// The structural mask rule as docs/conventions.md states it, for one sequence (written here
// again on purpose, not shared with src/): the sequence has n valid keys (key_lengths[b], or
// Lk without key lengths) and query i has its diagonal at
//     d(i) = i + offset      when query_offset is given (either alignment),
//     d(i) = i               top-left,
//     d(i) = i + n − Lq      bottom-right (per sequence: n is this sequence's own length).
// Query i sees key j when j < n, j <= d(i) under causal, and d(i) − left <= j <= d(i) + right
// under a window (−1 = unbounded on that side; causal and window.align may differ).
struct SequenceRule {
    attn::Causal causal = attn::Causal::none;
    attn::Window window{};
    std::int64_t n = 0, Lq = 0;
    std::optional<std::int64_t> offset;

    std::int64_t diagonal(attn::Align a, std::int64_t i) const {
        if (offset) return i + *offset;
        return a == attn::Align::top_left ? i : i + n - Lq;
    }
    bool keep(std::int64_t i, std::int64_t j) const {
        if (j >= n) return false;
        if (causal != attn::Causal::none &&
            j > diagonal(causal == attn::Causal::top_left ? attn::Align::top_left : attn::Align::bottom_right, i))
            return false;
        const std::int64_t d = diagonal(window.align, i);
        if (window.left >= 0 && j < d - window.left) return false;
        if (window.right >= 0 && j > d + window.right) return false;
        return true;
    }
};

using KeepFn = std::function<bool(std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j)>;
using BiasFn = std::function<double(std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j)>;

// The textbook, one row at a time:
//   s_j = scale · Σ_d q[i][d]·k[j][d] + bias(i, j), or −inf where keep(i, j) is false
//   w_j = exp(s_j − max s) / Σ exp(s − max s);  o = Σ_j w_j v[j];  lse = max s + log Σ exp(s − max s)
// A row with no kept key (or only −inf scores): o = 0, w = 0, lse = −inf.
// q: (B, Hq, Lq, Dk)  k: (B, Hkv, Lk, Dk)  v: (B, Hkv, Lk, Dv); query head h reads KV head h / (Hq / Hkv).
inline NaiveResult naive_attention(const TensorView& q, const TensorView& k, const TensorView& v, double scale,
                                   const KeepFn& keep = nullptr, const BiasFn& bias = nullptr) {
    NaiveResult r;
    r.B = q.dim(0);
    r.Hq = q.dim(1);
    r.Lq = q.dim(2);
    r.Lk = k.dim(2);
    r.Dv = v.dim(3);
    const std::int64_t Dk = q.dim(3), group = q.dim(1) / k.dim(1);
    r.out.assign(static_cast<std::size_t>(r.B * r.Hq * r.Lq * r.Dv), 0.0);
    r.weights.assign(static_cast<std::size_t>(r.B * r.Hq * r.Lq * r.Lk), 0.0);
    r.lse.assign(static_cast<std::size_t>(r.B * r.Hq * r.Lq), -kInf);
    std::vector<double> s(static_cast<std::size_t>(r.Lk));
    for (std::int64_t b = 0; b < r.B; ++b)
        for (std::int64_t h = 0; h < r.Hq; ++h)
            for (std::int64_t i = 0; i < r.Lq; ++i) {
                const std::int64_t hk = h / group;
                double mx = -kInf;
                for (std::int64_t j = 0; j < r.Lk; ++j) {
                    double dot = 0.0;
                    for (std::int64_t d = 0; d < Dk; ++d) dot += at(q, b, h, i, d) * at(k, b, hk, j, d);
                    double x = dot * scale + (bias ? bias(b, h, i, j) : 0.0);
                    if (keep && !keep(b, h, i, j)) x = -kInf;
                    s[static_cast<std::size_t>(j)] = x;
                    mx = std::max(mx, x);
                }
                const std::size_t row = static_cast<std::size_t>((b * r.Hq + h) * r.Lq + i);
                if (mx == -kInf) continue;  // nothing visible: zeros, lse −inf
                double sum = 0.0;
                for (std::int64_t j = 0; j < r.Lk; ++j) sum += std::exp(s[static_cast<std::size_t>(j)] - mx);
                r.lse[row] = mx + std::log(sum);
                for (std::int64_t j = 0; j < r.Lk; ++j) {
                    const double wj = std::exp(s[static_cast<std::size_t>(j)] - mx) / sum;
                    r.weights[row * static_cast<std::size_t>(r.Lk) + static_cast<std::size_t>(j)] = wj;
                    if (wj == 0.0) continue;
                    for (std::int64_t d = 0; d < r.Dv; ++d)
                        r.out[row * static_cast<std::size_t>(r.Dv) + static_cast<std::size_t>(d)] += wj * at(v, b, hk, j, d);
                }
            }
    return r;
}

}  // namespace attn_test
