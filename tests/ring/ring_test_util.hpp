// What the ring tests share (ring_check: forward, ring_backward_check: backward): the verdict
// agreed by all ranks, random and poisoned tensors, the case description, strided views, the
// visible-pair count from sdpa's stated rule, and the random cases.
#pragma once

#include <mpi.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "attn/half.hpp"
#include "attn/ring.hpp"
#include "attn/sdpa.hpp"

namespace ring_test {

using namespace attn;

inline int P = 1, rank = 0;
inline int passed = 0, failed = 0;

// Each rank reports its verdict; the case passes only if every rank agrees it passed.
inline void verdict(const std::string& name, bool ok_here, const std::string& detail) {
    int ok = ok_here ? 1 : 0, all_ok = 0;
    MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (!ok_here) std::fprintf(stderr, "  rank %d: %s: %s\n", rank, name.c_str(), detail.c_str());
    if (rank == 0) std::printf("%s %s\n", all_ok ? "PASS" : "FAIL", name.c_str());
    (all_ok ? passed : failed)++;
}

inline Tensor random_tensor(std::mt19937& gen, Shape s, float amplitude) {
    Tensor t(DType::f32, s);
    std::uniform_real_distribution<float> u(-amplitude, amplitude);
    for (std::int64_t i = 0; i < t.numel(); ++i) t.data_as<float>()[i] = u(gen);
    return t;
}

// A contiguous float32 tensor in dtype dt (16-bit: rounded to nearest even, attn/half.hpp), for
// the 16-bit cases. (tests/common/util.hpp's to_storage does this for gtest tests; the MPI tests
// do not link gtest.)
inline Tensor in_dtype(const Tensor& src, DType dt) {
    if (dt == DType::f32) return to_dtype(src, DType::f32);
    Tensor out(dt, src.shape());
    const float* x = src.data_as<const float>();
    auto* y = out.data_as<std::uint16_t>();
    for (std::int64_t i = 0; i < src.numel(); ++i) y[i] = dt == DType::f16 ? float_to_f16(x[i]) : float_to_bf16(x[i]);
    return out;
}

inline Tensor poisoned(DType dt, Shape s) {
    Tensor t(dt, s);
    for (std::int64_t i = 0; i < t.numel(); ++i) {
        if (dt == DType::f32) t.data_as<float>()[i] = std::numeric_limits<float>::quiet_NaN();
        else if (dt == DType::f16) t.data_as<std::uint16_t>()[i] = 0x7e00;   // quiet NaN
        else if (dt == DType::bf16) t.data_as<std::uint16_t>()[i] = 0x7fc0;  // quiet NaN
        else t.data_as<double>()[i] = std::numeric_limits<double>::quiet_NaN();
    }
    return t;
}

struct Case {
    std::string name;
    std::int64_t B = 1, Hq = 1, Hkv = 1, Lq = 16, Lk = 16, Dk = 8, Dv = 8;
    Causal causal = Causal::none;
    Window window{};
    std::optional<std::int64_t> query_offset;     // one value for every sequence
    std::vector<std::int64_t> query_offsets;      // per sequence (empty: none); wins over query_offset
    dist::Layout layout = dist::Layout::zigzag;
    std::vector<std::int64_t> key_lengths;  // empty: none
    std::optional<double> scale;
    bool strided = false;  // Q, K, V local views are (B, L, H, D) buffers seen through transpose(1, 2)
    double softcap = 0.0;  // score modifiers (0: off)
    bool sinks = false;    // σ_h = sink_logit(h)
    int alibi = 0;         // ALiBi slopes: 0 none, 1 (Hq,), 2 (B, Hq) (slope_tensor)
    double dropout_p = 0.0;  // dropout on the weights (0: off), keep rule on global positions
    std::uint64_t dropout_seed = 0;
    // 16-bit cases: Q, K/V and out dtypes (the reference reads the same 16-bit inputs exactly).
    DType q_dtype = DType::f32, kv_dtype = DType::f32, out_dtype = DType::f32;
    std::optional<DType> v_dtype;  // V's dtype when it is not K's (kv_dtype)
    DType v_of() const { return v_dtype.value_or(kv_dtype); }
    bool expect_bf16_kernel = false;  // all-bf16 blocks must run bf16 compute (flash/avx512_bf16 or
                                      // flash/avx512_amx_bf16, where the CPU has it)
    // The ring called under an attn::ScopedInterruptFlag whose flag is set: the ring must not stop
    // (a rank stopped alone would leave its peers waiting; attn/interrupt.hpp).
    bool under_set_interrupt_flag = false;
};

// A copy of `c` with Q in q, K/V in kv, out in o.
inline Case with_dtypes(Case c, DType q, DType kv, DType o) {
    c.q_dtype = q, c.kv_dtype = kv, c.out_dtype = o;
    c.name += std::string(" [Q ") + std::string(dtype_name(q)) + ", K/V " + std::string(dtype_name(kv)) + ", out " +
              std::string(dtype_name(o)) + "]";
    return c;
}

// The bound of an output in dtype dt against the double reference r of the same (16-bit)
// inputs: the float32 bound `abs` plus one rounding to dt (half an ulp: 2^-11·|r| for float16,
// 2^-8·|r| for bfloat16; float16's subnormal half-ulp 2^-25 is inside `abs`).
inline double output_bound(DType dt, double r, double abs) {
    if (dt == DType::f16) return abs + std::ldexp(std::fabs(r), -11);
    if (dt == DType::bf16) return abs + std::ldexp(std::fabs(r), -8);
    return abs;
}

// bf16 compute (docs/conventions.md, "bf16 compute"), on top of output_bound: each block's
// weights rounded to bf16 (u = 2^-8) from the path's exp2 (relative error ≤ kBf16ExpError,
// counted twice per block: P and the normaliser l, and twice more by the merge's lse weights),
// times (1 + 2^-7) for the second-order terms; wv = Σ_j w_ij·|v_jd| of the reference.
// lse moves by at most kBf16ExpError (l sums the approximate exponentials).
inline constexpr double kBf16ExpError = 1.05e-4;
inline double bf16_compute_bound(double wv) { return (std::ldexp(1.0, -8) + 4 * kBf16ExpError) * (1 + std::ldexp(1.0, -7)) * wv; }

// The sinks of the modifier cases: mixed signs, one large enough to dominate short rows.
inline float sink_logit(std::int64_t h) { return static_cast<float>(0.9 * static_cast<double>(h % 4) - 1.1); }
inline Tensor sink_tensor(std::int64_t Hq) {
    Tensor t(DType::f32, Shape{Hq});
    for (std::int64_t h = 0; h < Hq; ++h) t.data_as<float>()[h] = sink_logit(h);
    return t;
}

// ALiBi slopes large enough that |d − j| over a few dozen keys moves the weights a lot:
// (Hq,) m_h = 0.3·(h + 1)/Hq, or (B, Hq) m_bh = 0.05 + 0.2·((b + 2h) mod 4).
inline Tensor slope_tensor(const Case& c) {
    if (c.alibi == 2) {
        Tensor t(DType::f32, Shape{c.B, c.Hq});
        for (std::int64_t b = 0; b < c.B; ++b)
            for (std::int64_t h = 0; h < c.Hq; ++h) t.data_as<float>()[b * c.Hq + h] = 0.05f + 0.2f * static_cast<float>((b + 2 * h) % 4);
        return t;
    }
    Tensor t(DType::f32, Shape{c.Hq});
    for (std::int64_t h = 0; h < c.Hq; ++h) t.data_as<float>()[h] = 0.3f * static_cast<float>(h + 1) / static_cast<float>(c.Hq);
    return t;
}

// A copy of `c` with ALiBi: kind 0 (Hq,) slopes, 1 (B, Hq) slopes with softcap and sinks.
inline Case with_alibi(Case c, int kind) {
    c.alibi = kind == 0 ? 1 : 2;
    if (kind == 1) c.softcap = 4.0, c.sinks = true;
    c.name += kind == 0 ? " +alibi (Hq,)" : " +alibi (B, Hq) +softcap 4 +sinks";
    return c;
}

// A copy of `c` with score modifiers: kind 0 softcap, 1 sinks, 2 both.
inline Case with_modifiers(Case c, int kind) {
    c.softcap = kind == 1 ? 0.0 : 2.5;
    c.sinks = kind >= 1;
    c.name += kind == 0 ? " +softcap 2.5" : kind == 1 ? " +sinks" : " +softcap 2.5 +sinks";
    return c;
}

// A copy of `c` with dropout: p = 0.3 or 0.6 (by `kind`), a seed that sets high bits too.
inline Case with_dropout(Case c, int kind) {
    c.dropout_p = kind % 2 == 0 ? 0.3 : 0.6;
    c.dropout_seed = 0x9e3779b97f4a7c15ULL + static_cast<std::uint64_t>(kind);
    c.name += kind % 2 == 0 ? " +dropout 0.3" : " +dropout 0.6";
    return c;
}

// Cases long enough that the ring cuts its block calls into pieces of kPokeRows = 2048 rows
// (split_rows): L = 2600 with the contiguous layout gives P = 1 one segment of 2600 rows (pieces
// of 2048 and 552); at P >= 2 the same cases run unsplit. A window with causal, and again with
// dropout (the origin moves with the piece) and with ALiBi + softcap + sinks (so do the offsets).
// Kept to one layout and L = 2600: the double-precision oracle is O(L²) per case.
inline std::vector<Case> piece_cases() {
    Case c;
    c.name = "L=2600 causal window left 1500 (P = 1: calls cut into 2048 + 552 rows)";
    c.Lq = 2600, c.Lk = 2600, c.Dk = 8, c.Dv = 8, c.causal = Causal::top_left, c.window.left = 1500;
    c.layout = dist::Layout::contiguous;
    return {c, with_dropout(c, 0), with_alibi(c, 1)};
}

// A contiguous (B, H, n, D) tensor re-laid as a (B, n, H, D) buffer, returned as its (B, H, n, D) view.
inline TensorView restride(const Tensor& src, std::vector<float>& storage) {
    const std::int64_t B = src.shape()[0], H = src.shape()[1], n = src.shape()[2], D = src.shape()[3];
    storage.assign(static_cast<std::size_t>(std::max<std::int64_t>(1, src.numel())), 0.0f);  // >= the bytes of any dtype but f64
    TensorView blhd(storage.data(), src.dtype(), Shape{B, n, H, D});
    TensorView v = blhd.transpose(1, 2);
    const std::int64_t size = static_cast<std::int64_t>(dtype_size(src.dtype()));
    for (std::int64_t b = 0; b < B; ++b)
        for (std::int64_t h = 0; h < H; ++h)
            for (std::int64_t i = 0; i < n; ++i)
                for (std::int64_t d = 0; d < D; ++d)
                    std::memcpy(static_cast<char*>(v.data()) + v.offset(b, h, i, d) * size,
                                static_cast<const char*>(src.data()) + src.view().offset(b, h, i, d) * size,
                                static_cast<std::size_t>(size));
    return v;
}

// Whether query i of sequence b sees key j, from the rule as include/attn/sdpa.hpp states it:
// n_b valid keys; query i's diagonal is d_b(i) = i + o_b with o_b the query offset if given,
// else 0 (top-left) or n_b − Lq (bottom-right); causal keeps j <= d_b(i), the window
// d − left <= j <= d + right.
inline bool sees(const Case& c, std::int64_t b, std::int64_t i, std::int64_t j) {
    const std::int64_t keys = c.key_lengths.empty() ? c.Lk : c.key_lengths[static_cast<std::size_t>(b)];
    auto offset = [&](bool bottom_right) -> std::int64_t {
        if (!c.query_offsets.empty()) return c.query_offsets[static_cast<std::size_t>(b)];
        if (c.query_offset) return *c.query_offset;
        return bottom_right ? keys - c.Lq : 0;
    };
    bool see = j < keys;
    if (c.causal != Causal::none) see &= j <= i + offset(c.causal == Causal::bottom_right);
    const std::int64_t d = i + offset(c.window.align == Align::bottom_right);
    if (c.window.left >= 0) see &= j >= d - c.window.left;
    if (c.window.right >= 0) see &= j <= d + c.window.right;
    return see;
}

// The visible (b, i, j) triples of the global problem.
inline std::int64_t visible_pairs(const Case& c) {
    std::int64_t n = 0;
    for (std::int64_t b = 0; b < c.B; ++b)
        for (std::int64_t i = 0; i < c.Lq; ++i)
            for (std::int64_t j = 0; j < c.Lk; ++j) n += sees(c, b, i, j) ? 1 : 0;
    return n;
}

// The ring steps needed on P ranks: 1 + the largest s at which some rank r sees a key of the
// block of rank (r − s) mod P (brute force over every visible pair).
inline int expected_steps(const Case& c, int ranks) {
    std::vector<int> owner_q(static_cast<std::size_t>(c.Lq)), owner_k(static_cast<std::size_t>(c.Lk));
    for (int r = 0; r < ranks; ++r) {
        for (const auto& s : dist::rank_segments(c.Lq, ranks, r, c.layout))
            for (std::int64_t i = s.start; i < s.start + s.length; ++i) owner_q[static_cast<std::size_t>(i)] = r;
        for (const auto& s : dist::rank_segments(c.Lk, ranks, r, c.layout))
            for (std::int64_t j = s.start; j < s.start + s.length; ++j) owner_k[static_cast<std::size_t>(j)] = r;
    }
    int steps = 1;
    for (std::int64_t b = 0; b < c.B; ++b)
        for (std::int64_t i = 0; i < c.Lq; ++i)
            for (std::int64_t j = 0; j < c.Lk; ++j)
                if (sees(c, b, i, j)) {
                    const int s = (owner_q[static_cast<std::size_t>(i)] - owner_k[static_cast<std::size_t>(j)] + ranks) % ranks;
                    steps = std::max(steps, s + 1);
                }
    return steps;
}

// Random cases: every causal alignment, key lengths (often < Lq), windows, offsets, GQA,
// lengths below the number of chunks. The same seed gives the same cases on every rank.
inline std::vector<Case> random_cases(int count, unsigned seed) {
    std::vector<Case> cases;
    std::mt19937 rg(seed);
    auto pick = [&](int lo, int hi) { return static_cast<std::int64_t>(std::uniform_int_distribution<int>(lo, hi)(rg)); };
    const char* causal_names[] = {"none", "top-left", "bottom-right"};
    for (int n = 0; n < count; ++n) {
        Case r;
        r.B = pick(1, 3), r.Hkv = pick(1, 2), r.Hq = r.Hkv * pick(1, 2);
        r.Lq = pick(1, 40), r.Lk = pick(1, 40), r.Dk = pick(1, 9), r.Dv = pick(1, 9);
        r.causal = static_cast<Causal>(pick(0, 2));
        r.layout = pick(0, 1) ? dist::Layout::zigzag : dist::Layout::contiguous;
        std::string kl = "none", qo = "none", win = "none";
        if (pick(0, 2) > 0) {
            kl.clear();
            for (std::int64_t b = 0; b < r.B; ++b) {
                r.key_lengths.push_back(pick(0, static_cast<int>(r.Lk)));
                kl += std::string(b ? "," : "") + std::to_string(r.key_lengths.back());
            }
        }
        if (pick(0, 2) == 0) {
            r.window = Window{pick(-1, 8), pick(-1, 8), pick(0, 1) ? Align::bottom_right : Align::top_left};
            win = std::to_string(r.window.left) + "," + std::to_string(r.window.right) +
                  (r.window.align == Align::bottom_right ? ",bottom-right" : ",top-left");
        }
        const std::int64_t kind = pick(0, 3);
        if (kind == 1) {
            r.query_offset = pick(-10, 40);
            qo = std::to_string(*r.query_offset);
        } else if (kind == 2) {
            qo.clear();
            for (std::int64_t b = 0; b < r.B; ++b) {
                r.query_offsets.push_back(pick(-10, 40));
                qo += std::string(b ? "," : "") + std::to_string(r.query_offsets.back());
            }
        }
        r.name = "random " + std::to_string(n) + ": B=" + std::to_string(r.B) + " Hq/Hkv=" + std::to_string(r.Hq) + "/" +
                 std::to_string(r.Hkv) + " Lq=" + std::to_string(r.Lq) + " Lk=" + std::to_string(r.Lk) + " causal=" +
                 causal_names[static_cast<int>(r.causal)] + " key_lengths=(" + kl + ") window=(" + win +
                 ") query_offset=(" + qo + ")";
        cases.push_back(r);
    }
    return cases;
}

}  // namespace ring_test
