// attn::sdpa_backward and sdpa_varlen_backward with float16 / bfloat16 tensors: the tiled
// kernel (every ISA row the CPU runs) against the double reference backward on the same
// 16-bit inputs (docs/conventions.md, "Backward with 16-bit tensors"); 16-bit gradients as
// one rounding of the float32 ones; thread-count independence; the dispatch and the errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <tuple>

#include "attn/error.hpp"
#include "attn/sdpa_varlen.hpp"
#include "attn/threads.hpp"
#include "common/util.hpp"
#include "grad/grad_util.hpp"
#include "kernels/isa.hpp"
#include "kernels/simd/convert.hpp"

namespace attn::test {
namespace {

// x rounded to bf16 (round to nearest even), as a double.
double float_to_bf16_value(double x) { return static_cast<double>(bf16_to_float(float_to_bf16(static_cast<float>(x)))); }

// The dtypes of one call: q; k and v; grad_out; out (the forward's output the backward
// reads for D = rowsum(dO∘O)); the gradients dq, dk, dv.
struct Dtypes {
    DType q, kv, dO, out, grad;
};

std::string name(DType t) { return std::string(dtype_name(t)); }

std::string str(const Dtypes& d) {
    return "q=" + name(d.q) + " kv=" + name(d.kv) + " dO=" + name(d.dO) + " out=" + name(d.out) + " grads=" + name(d.grad);
}

struct Case {
    std::int64_t B, Hq, Hkv, Lq, Lk, Dk, Dv;
    Causal causal = Causal::none;
    Window window{};
    int mask = 0;  // 0 none, 1 bool (Lq, Lk), 2 additive float32 (B, 1, Lq, Lk) with −inf
    bool key_lengths = false, strided = false, softcap = false, sinks = false;
    double dropout = 0.0;
    std::string str() const {
        char buf[256];
        std::snprintf(buf, sizeof buf,
                      "B=%ld Hq=%ld Hkv=%ld Lq=%ld Lk=%ld Dk=%ld Dv=%ld causal=%d win=(%ld,%ld) mask=%d kl=%d strided=%d "
                      "softcap=%d sinks=%d p=%.2f",
                      (long)B, (long)Hq, (long)Hkv, (long)Lq, (long)Lk, (long)Dk, (long)Dv, (int)causal,
                      (long)window.left, (long)window.right, mask, (int)key_lengths, (int)strided, (int)softcap,
                      (int)sinks, dropout);
        return buf;
    }
};

std::vector<Case> random_cases(int n, std::uint64_t seed) {
    std::mt19937_64 rng(seed);
    auto pick = [&](std::initializer_list<std::int64_t> xs) { return *(xs.begin() + rng() % xs.size()); };
    std::vector<Case> cases;
    for (int t = 0; t < n; ++t) {
        Case c;
        c.B = pick({1, 2});
        c.Hkv = pick({1, 2});
        c.Hq = c.Hkv * pick({1, 2, 3});
        c.Lq = pick({1, 7, 63, 65, 100});
        c.Lk = pick({1, 5, 64, 65, 129});
        c.Dk = pick({1, 8, 13, 32, 64});
        c.Dv = rng() % 3 == 0 ? pick({1, 8, 20}) : c.Dk;
        c.causal = static_cast<Causal>(rng() % 3);
        if (rng() % 5 == 0) c.window = Window{static_cast<std::int64_t>(rng() % 20), static_cast<std::int64_t>(rng() % 4) - 1,
                                              rng() % 2 ? Align::top_left : Align::bottom_right};
        c.mask = static_cast<int>(rng() % 3);
        c.key_lengths = rng() % 4 == 0;
        c.strided = rng() % 3 == 0;
        c.softcap = rng() % 4 == 0;
        c.sinks = rng() % 4 == 0;
        c.dropout = rng() % 4 == 0 ? 0.25 : 0.0;
        cases.push_back(c);
    }
    return cases;
}

// One case's tensors in their dtypes (random normal values rounded once into the dtype);
// masks, key lengths and sinks are owned here and the options point at them.
struct Inputs {
    Tensor q_buf, dO_buf, k, v, mask, kl, sinks;
    TensorView q, dO;
    SdpaOptions opt;
};

Inputs make_inputs(const Case& c, const Dtypes& dt, std::uint64_t seed) {
    std::mt19937_64 rng(seed);
    Inputs in;
    if (c.strided) {  // q and dO as transposed (B, L, H, D) buffers
        in.q_buf = randn(dt.q, Shape{c.B, c.Lq, c.Hq, c.Dk}, rng);
        in.dO_buf = randn(dt.dO, Shape{c.B, c.Lq, c.Hq, c.Dv}, rng);
        in.q = in.q_buf.view().transpose(1, 2);
        in.dO = in.dO_buf.view().transpose(1, 2);
    } else {
        in.q_buf = randn(dt.q, Shape{c.B, c.Hq, c.Lq, c.Dk}, rng);
        in.dO_buf = randn(dt.dO, Shape{c.B, c.Hq, c.Lq, c.Dv}, rng);
        in.q = in.q_buf.view();
        in.dO = in.dO_buf.view();
    }
    in.k = randn(dt.kv, Shape{c.B, c.Hkv, c.Lk, c.Dk}, rng);
    in.v = randn(dt.kv, Shape{c.B, c.Hkv, c.Lk, c.Dv}, rng);
    if (c.mask == 1) {
        in.mask = random_bool(Shape{c.Lq, c.Lk}, rng, 0.7);
        in.opt.bool_mask = in.mask.view();
    } else if (c.mask == 2) {
        in.mask = randn(DType::f32, Shape{c.B, 1, c.Lq, c.Lk}, rng);
        std::uniform_real_distribution<double> u(0.0, 1.0);
        for (std::int64_t i = 0; i < in.mask.numel(); ++i)
            if (u(rng) < 0.2) in.mask.data_as<float>()[i] = -INFINITY;
        in.opt.additive_mask = in.mask.view();
    }
    if (c.key_lengths) {
        in.kl = Tensor(DType::i64, Shape{c.B});
        for (std::int64_t b = 0; b < c.B; ++b) in.kl.data_as<std::int64_t>()[b] = static_cast<std::int64_t>(rng() % (c.Lk + 1));
        in.opt.key_lengths = in.kl.view();
    }
    if (c.softcap) in.opt.softcap = 3.0;
    if (c.sinks) {
        in.sinks = randn(DType::f32, Shape{c.Hq}, rng);
        in.opt.sinks = in.sinks.view();
    }
    in.opt.causal = c.causal;
    in.opt.window = c.window;
    in.opt.dropout_p = c.dropout;
    in.opt.dropout_seed = seed * 7919 + 1;
    return in;
}

struct Result {
    Tensor out, lse, dq, dk, dv, dsinks;
    std::string kernel;
};

// Forward by `forward` (the reference unless given; out in dt.out, lse float32: both backward
// kernels read the same ones), then the backward with `impl` into poisoned gradients of dtype `grad`.
Result run(const Inputs& in, const Dtypes& dt, Impl impl, DType grad, Impl forward = Impl::reference) {
    Result r;
    const std::int64_t B = in.q.dim(0), Hq = in.q.dim(1), Lq = in.q.dim(2);
    r.out = poisoned(dt.out, Shape{B, Hq, Lq, in.v.shape()[3]});
    r.lse = poisoned(DType::f32, Shape{B, Hq, Lq});
    SdpaOptions o = in.opt;
    o.impl = forward;
    TensorView lv = r.lse.view();
    sdpa(in.q, in.k, in.v, o, r.out, &lv);
    r.dq = poisoned(grad, in.q.shape());
    r.dk = poisoned(grad, in.k.shape());
    r.dv = poisoned(grad, in.v.shape());
    r.dsinks = poisoned(DType::f64, Shape{Hq});
    const TensorView ds = r.dsinks.view();
    o.impl = impl;
    SdpaReport rep;
    sdpa_backward(in.q, in.k, in.v, r.out, r.lse, in.dO, o, r.dq, r.dk, r.dv, &rep, in.opt.sinks ? &ds : nullptr);
    r.kernel = rep.kernel;
    return r;
}

// The bound (docs/conventions.md, "Backward with 16-bit tensors"). The 16-bit inputs are
// exact float32 values, so the tiled kernel's float32 error budget is the float32 one
// (tests/grad/test_backward.cpp): 2e-5 of the largest reference gradient. A 16-bit out adds
// its own rounding through Dᵢ = rowsum(dO∘O): |ΔDᵢ| <= u_out·Σ_d|dO·O| =: δ, which moves
// dS by scale·P·ΔD, so dQᵢ by at most scale·δ·max|K| (Σ_j P = 1) and dKⱼ by at most
// scale·δ·max|Q|·(group·Lq) (Σ over the rows reading key j of P <= group·Lq); dV not at all.
// A 16-bit gradient adds one rounding of the float32 value (tested exactly below).
constexpr double kTol = 2e-5;

struct Bounds {
    double dq, dk, dv;
    double dsinks;  // per head: B·Lq rows, each term e^{σ−lse}·Dᵢ with weight <= 1, D off by kTol·S + ΔD
};

Bounds bounds(const Case& c, const Inputs& in, const Result& got, double den, const Dtypes& dt) {
    double delta = 0.0;
    for (std::int64_t b = 0; b < c.B; ++b)
        for (std::int64_t h = 0; h < c.Hq; ++h)
            for (std::int64_t i = 0; i < c.Lq; ++i) {
                double s = 0.0;
                for (std::int64_t d = 0; d < c.Dv; ++d) s += std::fabs(at(in.dO, b, h, i, d) * at(got.out, b, h, i, d));
                delta = std::max(delta, s);
            }
    const double S = delta;  // max over rows of Σ_d |dO·O|
    delta *= dt.out == DType::f32 ? 0.0 : unit_roundoff(dt.out);
    const double scale = std::fabs(in.opt.scale.value_or(1.0 / std::sqrt(static_cast<double>(c.Dk))));
    const double base = kTol * den;
    return {base + scale * delta * max_abs(in.k), base + scale * delta * max_abs(in.q) * static_cast<double>(c.Hq / c.Hkv * c.Lq),
            base, static_cast<double>(c.B * c.Lq) * (kTol * S + delta)};
}

const std::vector<Dtypes>& dtype_mixes() {
    using D = DType;
    static const std::vector<Dtypes> mixes = {
        {D::bf16, D::bf16, D::bf16, D::f32, D::f32},   // all-bf16 inputs, f32 out and gradients: the tight bound
        {D::f16, D::f16, D::f16, D::f32, D::f32},      // all-f16
        {D::f32, D::f16, D::f32, D::f32, D::f32},      // f32 queries against an f16 cache
        {D::bf16, D::f32, D::f16, D::f32, D::f32},     // every storage type at once
        {D::bf16, D::bf16, D::bf16, D::bf16, D::f32},  // bf16 out: D carries its rounding
        {D::f16, D::f16, D::f16, D::f16, D::f32},      // f16 out
    };
    return mixes;
}

void check_against_reference(detail::Isa isa, int ncases, std::uint64_t seed) {
    const detail::KernelSet* row = detail::kernel_set_for(isa);
    if (row == nullptr) GTEST_SKIP() << "skipped: CPU lacks " << detail::missing_features(isa);
    const detail::ScopedKernelSet use(*row);
    int n = 0;
    for (const Dtypes& dt : dtype_mixes()) {
        double worst = 0.0, worst_rel = 0.0;  // error / bound; error / largest reference gradient
        for (const Case& c : random_cases(ncases, seed++)) {
            SCOPED_TRACE(str(dt) + " " + c.str());
            const Inputs in = make_inputs(c, dt, seed * 131 + static_cast<std::uint64_t>(n++));
            const Result got = run(in, dt, Impl::flash, DType::f32);
            ASSERT_EQ(got.kernel, std::string("flash-backward/") + detail::isa_name(isa));
            const Result ref = run(in, dt, Impl::reference, DType::f64);
            const double den = std::max({max_abs(ref.dq), max_abs(ref.dk), max_abs(ref.dv)}) + 1e-30;
            const Bounds bd = bounds(c, in, got, den, dt);
            for (auto [g, r, name, bound] : {std::tuple{&got.dq, &ref.dq, "dq", bd.dq}, std::tuple{&got.dk, &ref.dk, "dk", bd.dk},
                                             std::tuple{&got.dv, &ref.dv, "dv", bd.dv}}) {
                const double e = max_abs_diff(*g, *r);
                worst = std::max(worst, e / bound);
                worst_rel = std::max(worst_rel, e / den);
                EXPECT_LE(e, bound) << name << " (largest reference gradient " << den << ")";
            }
            if (c.sinks) {  // dσ: a sum over rows of e^{σ−lse}·D, float32 D against the reference's double
                EXPECT_LE(max_abs_diff(got.dsinks, ref.dsinks), bd.dsinks) << "dsinks";
            }
        }
        std::printf("[ info ] %s, %d cases, %s tile: worst error / bound %.3g, / largest gradient %.3g\n", str(dt).c_str(),
                    ncases, detail::isa_name(isa), worst, worst_rel);
    }
}

TEST(HalfBackward, MatchesReferenceAvx512) { check_against_reference(detail::Isa::avx512, 20, 11); }
TEST(HalfBackward, MatchesReferenceAvx2) { check_against_reference(detail::Isa::avx2, 20, 21); }
TEST(HalfBackward, MatchesReferencePortable) { check_against_reference(detail::Isa::portable, 8, 31); }

// A 16-bit gradient is the float32 gradient rounded once (round to nearest even): bit for
// bit the float32 run's values through half.hpp's rounding, on every ISA row, 1 and 2 threads.
// (out is float32: with Q, K, V, O, dO and the gradients all bf16 the avx512 row would run
// the bf16 products instead — Bf16ComputeMatchesReference below.)
TEST(HalfBackward, SixteenBitGradientsAreOneRoundingOfFloat32) {
    const Dtypes dt{DType::bf16, DType::bf16, DType::bf16, DType::f32, DType::f32};
    for (const detail::KernelSet* row : detail::runnable_kernel_sets()) {
        const detail::ScopedKernelSet use(*row);
        int n = 0;
        for (const Case& c : random_cases(6, 41)) {
            SCOPED_TRACE(std::string(detail::isa_name(row->isa)) + " " + c.str());
            const Inputs in = make_inputs(c, dt, 4100 + static_cast<std::uint64_t>(n++));
            const Result f32 = run(in, dt, Impl::flash, DType::f32);
            for (DType g : {DType::bf16, DType::f16}) {
                for (int threads : {1, 2}) {
                    const ScopedNumThreads nt(threads);
                    const Result r16 = run(in, dt, Impl::flash, g);
                    for (auto [got, want] : {std::pair{&r16.dq, &f32.dq}, std::pair{&r16.dk, &f32.dk}, std::pair{&r16.dv, &f32.dv}}) {
                        const Tensor rounded = to_storage(*want, g);
                        ASSERT_TRUE(bit_equal(*got, rounded)) << name(g) << " gradients, " << threads << " threads";
                    }
                }
            }
        }
    }
}

// The kernel row that runs bf16 compute (avx512, on a CPU with AVX-512 BF16), or null.
const detail::KernelSet* bf16_compute_row() {
    const detail::KernelSet* row = detail::kernel_set_for(detail::Isa::avx512);
    return row != nullptr && detail::cpu_features().has_avx512_bf16() ? row : nullptr;
}

// The report's kernel for bf16 compute's backward on this CPU: the AMX tile where the CPU has
// AMX-BF16 (and ATTN_CPU_HIDE does not hide it), else the vdpbf16ps one (backward_compute).
std::string bf16_backward_kernel() {
    return detail::cpu_features().has_amx_bf16() ? "flash-backward/avx512_amx_bf16" : "flash-backward/avx512_bf16";
}

// bf16 compute (docs/conventions.md "bf16 compute"): Q, K, V, O, dO and the gradients all
// bf16 on a CPU with AVX-512 BF16 run the five products on bf16 pairs. Against the double
// reference on the same inputs, per element, on top of the bound above (float32 budget +
// bf16 O through D) and the gradient's own rounding u·|x| (u = 2⁻⁸):
//   dV_jd: u·Σ_i P̂_ij·|dO_id|          (P̂ rounded to bf16)
//   dK_jd: u·scale·Σ_i |dS_ij|·|Q_id|   (dS rounded)       dQ_id: u·scale·Σ_j |dS_ij|·|K_jd|
// each times (1 + 2⁻⁷) for the rounding of the float32 operand itself, with |dS_ij| bounded
// by P_ij·(Σ_d |dO_id·V_jd| + |D_i|) (softcap only shrinks it) — with dropout by
// P̂_ij·Σ_d |dO_id·V_jd| + P_ij·|D_i|. P and P̂ from the reference forward's weights.
struct Bf16Worst {
    double ratio = 0.0, products = 0.0;  // error / bound; the products' share of the bound
};

// Expects every gradient of `got` (a bf16-compute run on all-bf16 `in`) within that bound, plus
// `extra` per gradient, of the reference's `ref`; with f32 (the float32 products on the same
// inputs) sets *differs when a gradient is not f32's rounded to bf16.
void expect_bf16_compute_bound(const Case& c, const Inputs& in, const Result& got, const Result& ref, Bf16Worst& worst,
                               const Bounds& extra = {}, const Result* f32 = nullptr, bool* differs = nullptr) {
    const Dtypes dt{DType::bf16, DType::bf16, DType::bf16, DType::bf16, DType::bf16};
    const double u = unit_roundoff(DType::bf16), uu = u * (1.0 + std::ldexp(1.0, -7));
    // P from the reference forward (the same options; float64 weights). With dropout its weights
    // are P̂ = P∘Z/(1−p) (what multiplies V: attn/reference.hpp) and P comes from a second call
    // without dropout; the tile's dS = P∘(dP∘Z/(1−p) − D) = P̂·dP − P·D.
    Tensor w(DType::f64, Shape{c.B, c.Hq, c.Lq, c.Lk}), o64(DType::f64, Shape{c.B, c.Hq, c.Lq, c.Dv});
    SdpaOptions ow = in.opt;
    ow.impl = Impl::reference;
    const TensorView wv = w.view();
    sdpa(in.q, in.k, in.v, ow, o64, nullptr, &wv);
    Tensor w_plain;  // P, when it is not w
    if (c.dropout > 0.0) {
        w_plain = Tensor(DType::f64, w.shape());
        Tensor o_plain(DType::f64, o64.shape());
        SdpaOptions op = ow;
        op.dropout_p = 0.0;
        const TensorView pv = w_plain.view();
        sdpa(in.q, in.k, in.v, op, o_plain, nullptr, &pv);
    }
    const Tensor& p_plain = c.dropout > 0.0 ? w_plain : w;
    const double den = std::max({max_abs(ref.dq), max_abs(ref.dk), max_abs(ref.dv)}) + 1e-300;
    Bounds bd = bounds(c, in, got, den, dt);
    bd.dq += extra.dq;
    bd.dk += extra.dk;
    bd.dv += extra.dv;
    const double scale = std::fabs(in.opt.scale.value_or(1.0 / std::sqrt(static_cast<double>(c.Dk))));
    const std::int64_t G = c.Hq / c.Hkv;
    // |dS| bound per (b, h, i, j)
    std::vector<double> ds(static_cast<std::size_t>(c.B * c.Hq * c.Lq * c.Lk));
    for (std::int64_t b = 0; b < c.B; ++b)
        for (std::int64_t h = 0; h < c.Hq; ++h)
            for (std::int64_t i = 0; i < c.Lq; ++i) {
                double D = 0.0;
                for (std::int64_t d = 0; d < c.Dv; ++d) D += at(in.dO, b, h, i, d) * at(o64, b, h, i, d);
                for (std::int64_t j = 0; j < c.Lk; ++j) {
                    double dp = 0.0;
                    for (std::int64_t d = 0; d < c.Dv; ++d) dp += std::fabs(at(in.dO, b, h, i, d) * at(in.v, b, h / G, j, d));
                    ds[static_cast<std::size_t>(((b * c.Hq + h) * c.Lq + i) * c.Lk + j)] =
                        at(w, b, h, i, j) * dp + at(p_plain, b, h, i, j) * std::fabs(D);
                }
            }
    const auto dsb = [&](std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j) {
        return ds[static_cast<std::size_t>(((b * c.Hq + h) * c.Lq + i) * c.Lk + j)];
    };
    const auto check = [&](const Tensor& g, const Tensor& r, const Tensor* f, double base, auto products, const char* name) {
        for (std::int64_t b = 0; b < g.shape()[0]; ++b)
            for (std::int64_t h = 0; h < g.shape()[1]; ++h)
                for (std::int64_t x = 0; x < g.shape()[2]; ++x)
                    for (std::int64_t d = 0; d < g.shape()[3]; ++d) {
                        const double e = std::fabs(at(g, b, h, x, d) - at(r, b, h, x, d));
                        const double pr = uu * products(b, h, x, d);
                        const double bound = base + pr + u * (std::fabs(at(r, b, h, x, d)) + base + pr);
                        worst.ratio = std::max(worst.ratio, e / bound);
                        worst.products = std::max(worst.products, pr / bound);
                        if (f) *differs |= at(g, b, h, x, d) != float_to_bf16_value(at(*f, b, h, x, d));
                        if (!(e <= bound)) {
                            ADD_FAILURE() << name << "[" << b << "," << h << "," << x << "," << d << "] error " << e
                                          << " > bound " << bound;
                            return;
                        }
                    }
    };
    check(got.dv, ref.dv, f32 ? &f32->dv : nullptr, bd.dv, [&](std::int64_t b, std::int64_t hk, std::int64_t j, std::int64_t d) {
        double acc = 0.0;
        for (std::int64_t h = hk * G; h < (hk + 1) * G; ++h)
            for (std::int64_t i = 0; i < c.Lq; ++i) acc += at(w, b, h, i, j) * std::fabs(at(in.dO, b, h, i, d));
        return acc;
    }, "dv");
    check(got.dk, ref.dk, f32 ? &f32->dk : nullptr, bd.dk, [&](std::int64_t b, std::int64_t hk, std::int64_t j, std::int64_t d) {
        double acc = 0.0;
        for (std::int64_t h = hk * G; h < (hk + 1) * G; ++h)
            for (std::int64_t i = 0; i < c.Lq; ++i) acc += dsb(b, h, i, j) * std::fabs(at(in.q, b, h, i, d));
        return scale * acc;
    }, "dk");
    check(got.dq, ref.dq, f32 ? &f32->dq : nullptr, bd.dq, [&](std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t d) {
        double acc = 0.0;
        for (std::int64_t j = 0; j < c.Lk; ++j) acc += dsb(b, h, i, j) * std::fabs(at(in.k, b, h / G, j, d));
        return scale * acc;
    }, "dq");
}

// The run must differ from the float32 products somewhere, or this test would not be testing them.
TEST(HalfBackward, Bf16ComputeMatchesReference) {
    const detail::KernelSet* row = bf16_compute_row();
    if (row == nullptr) GTEST_SKIP() << "skipped: CPU lacks avx512_bf16";
    const detail::ScopedKernelSet use(*row);
    const Dtypes dt{DType::bf16, DType::bf16, DType::bf16, DType::bf16, DType::bf16};
    Bf16Worst worst;
    bool differs = false;
    int n = 0;
    for (Case c : random_cases(30, 81)) {
        c.dropout = 0.0;
        SCOPED_TRACE(c.str());
        const Inputs in = make_inputs(c, dt, 8100 + static_cast<std::uint64_t>(n++));
        const Result got = run(in, dt, Impl::flash, DType::bf16);
        ASSERT_EQ(got.kernel, bf16_backward_kernel());
        if (n % 3 == 0) {  // the bf16 products do not depend on the thread count either
            const ScopedNumThreads one(1);
            const Result r1 = run(in, dt, Impl::flash, DType::bf16);
            EXPECT_TRUE(bit_equal(r1.dq, got.dq) && bit_equal(r1.dk, got.dk) && bit_equal(r1.dv, got.dv)) << "1 thread";
        }
        const Result ref = run(in, dt, Impl::reference, DType::f64);
        const Result f32 = run(in, Dtypes{dt.q, dt.kv, dt.dO, dt.out, DType::f32}, Impl::flash, DType::f32);
        expect_bf16_compute_bound(c, in, got, ref, worst, {}, &f32, &differs);
    }
    EXPECT_TRUE(differs) << "every gradient equals the float32 products' rounded: the bf16 products did not run";
    std::printf("[ info ] bf16 compute backward, 30 cases: worst error / bound %.3g (the products' terms up to %.3g of a bound)\n",
                worst.ratio, worst.products);
}

// bf16 compute at tiny and huge scales, as FlashBackward.TinyAndHugeScales (tests/grad/
// test_backward.cpp) checks the float32 rows: Q times 2^q, K times 2^k, dO times 2^o at scale
// s0·2^-(q+k) (pow2_splits); the gradients it does not shrink, brought back to s0's (undo_split),
// bit for bit the run at s0, and all three within the bound above for the problem at s0 — plus a
// shrunk gradient's rounding where it is a bf16 subnormal (|x| < 2^-126 at the tiny scales: a grid
// of 2^-133, so ≤ 2^-134, times 2^(q-o) or 2^(k-o)). dS was rounded to bf16 with the scale in it,
// a bf16 subnormal wherever |scale·P∘(dP − D)| < 2^-126, which vdpbf16ps reads as 0: dQ = 0 at
// scale 2^-126; and past FLT_MAX at 2^99 with dO times 2^40: inf, NaN gradients.
TEST(HalfBackward, Bf16ComputeTinyAndHugeScales) {
    const detail::KernelSet* row = bf16_compute_row();
    if (row == nullptr) GTEST_SKIP() << "skipped: CPU lacks avx512_bf16";
    const detail::ScopedKernelSet use(*row);
    const Dtypes dt{DType::bf16, DType::bf16, DType::bf16, DType::bf16, DType::bf16};
    Bf16Worst worst;
    int n = 0;
    for (Case c : random_cases(6, 83)) {
        c.dropout = 0.0;
        SCOPED_TRACE(c.str());
        const std::uint64_t seed = 8300 + static_cast<std::uint64_t>(n++);
        Inputs at_s0 = make_inputs(c, dt, seed);
        at_s0.opt.scale = std::ldexp(1.0, kBaseScaleExponent);
        const Result base = run(at_s0, dt, Impl::flash, DType::bf16);
        for (const int e : kScaleExponents)
            for (const Pow2Split sp : pow2_splits(kBaseScaleExponent - e)) {
                SCOPED_TRACE("scale 2^" + std::to_string(e) + ", Q times 2^" + std::to_string(sp.q) + ", K times 2^" +
                             std::to_string(sp.k) + ", dO times 2^" + std::to_string(sp.o));
                Inputs in = make_inputs(c, dt, seed);
                apply_split(in, sp);
                in.opt.scale = std::ldexp(1.0, e);
                Result got = run(in, dt, Impl::flash, DType::bf16);
                ASSERT_EQ(got.kernel, bf16_backward_kernel());
                Result ref = run(in, dt, Impl::reference, DType::f64);
                undo_split(got, sp);
                undo_split(ref, sp);
                expect_twin_bits(got, base, sp);
                Bounds subnormal{};
                if (sp.q > sp.o) subnormal.dq = std::ldexp(1.0, sp.q - sp.o - 134);
                if (sp.k > sp.o) subnormal.dk = std::ldexp(1.0, sp.k - sp.o - 134);
                expect_bf16_compute_bound(c, at_s0, got, ref, worst, subnormal);
            }
    }
    std::printf("[ info ] bf16 compute backward, scales 2^-126 .. 2^99: worst error / bound %.3g\n", worst.ratio);
}

// bf16 compute at huge scales with unit-scale Q and K, as FlashBackward.HugeScalesWithUnitScores
// GiveFiniteGradients (tests/grad/test_backward.cpp) checks the float32 rows: the recomputed P,
// off by the scores' rounding in its exponent, came out far above 1 (dV 3872 at 10^7, inf and NaN
// gradients from 10^9); clamped to 1, every gradient is finite and |dV_jd| <= Σ_i |dO_id| (plus
// bf16's rounding of P̂ and of dV).
TEST(HalfBackward, Bf16ComputeHugeScalesWithUnitScoresGiveFiniteGradients) {
    const detail::KernelSet* row = bf16_compute_row();
    if (row == nullptr) GTEST_SKIP() << "skipped: CPU lacks avx512_bf16";
    const detail::ScopedKernelSet use(*row);
    // P̂ and dV rounded to bf16 (2^-8 each) and the float32 sum of 65 terms
    const double slack = (1.0 + 0x1p-8) * (1.0 + 0x1p-8) * (1.0 + 65 * 0x1p-24) - 1.0;
    for (const double scale : {3e6, 1e7, 1e9, 1e10, 1e15, 1e20, 1e30, 3e36})
        EXPECT_EQ(expect_finite_gradients_at_huge_scale(DType::bf16, scale, slack), bf16_backward_kernel());
}

// The natural training step on bf16 tensors: an all-bf16 forward (bf16 compute where the CPU has
// it), then the backward with float32 gradients (float32 products) from that forward's out and
// lse. Two more terms than above (docs/conventions.md, "Backward with 16-bit tensors"): the
// forward's lse is within ε (the bf16 exp2's bound) of the double one, so every weight the
// backward rebuilds carries a relative ε: + ε·max|g| for each gradient; and its out carries
// bf16 compute's error as well as its rounding, which D = rowsum(dO∘O) reads:
// |ΔO_id| <= (2^-8 + 2ε)(1 + 2^-7)·max_j |V_jd| more, added to δ. The reference backward uses
// neither out nor lse (the softmax Jacobian), so it is the exact gradient of these inputs.
TEST(HalfBackward, Bf16ComputeForwardThenFloat32Backward) {
    const detail::KernelSet* row = bf16_compute_row();
    if (row == nullptr) GTEST_SKIP() << "skipped: CPU lacks avx512_bf16";
    const detail::ScopedKernelSet use(*row);
    const Dtypes dt{DType::bf16, DType::bf16, DType::bf16, DType::bf16, DType::f32};
    constexpr double kEps = 1.05e-4;  // exp2_bf16's relative error (conventions.md, "bf16 compute")
    const double u = unit_roundoff(DType::bf16);
    double worst = 0.0;
    int n = 0;
    for (Case c : random_cases(30, 91)) {
        c.dropout = 0.0;
        SCOPED_TRACE(c.str());
        const Inputs in = make_inputs(c, dt, 9100 + static_cast<std::uint64_t>(n++));
        SdpaOptions probe = in.opt;
        probe.impl = Impl::flash;  // decode would take a case with few rows: it keeps float32 weights
        SdpaReport forward_report;
        Tensor probe_out(DType::bf16, Shape{c.B, c.Hq, c.Lq, c.Dv});
        sdpa(in.q, in.k, in.v, probe, probe_out, nullptr, nullptr, &forward_report);
        // the forward whose lse this is about: bf16 compute, on AMX tiles where the CPU has them
        ASSERT_EQ(forward_report.kernel, detail::cpu_features().has_amx_bf16() ? "flash/avx512_amx_bf16" : "flash/avx512_bf16");
        const Result got = run(in, dt, Impl::flash, DType::f32, Impl::flash);
        const Result ref = run(in, dt, Impl::reference, DType::f64);
        const double den = std::max({max_abs(ref.dq), max_abs(ref.dk), max_abs(ref.dv)}) + 1e-30;
        Bounds bd = bounds(c, in, got, den, dt);
        double extra = 0.0;  // max over rows of Σ_d |dO_id|·(2^-8 + 2ε)(1 + 2^-7)·max_j |V_jd|
        for (std::int64_t b = 0; b < c.B; ++b)
            for (std::int64_t h = 0; h < c.Hq; ++h)
                for (std::int64_t i = 0; i < c.Lq; ++i) {
                    double s = 0.0;
                    for (std::int64_t d = 0; d < c.Dv; ++d) {
                        double vmax = 0.0;
                        for (std::int64_t j = 0; j < c.Lk; ++j) vmax = std::max(vmax, std::fabs(at(in.v, b, h / (c.Hq / c.Hkv), j, d)));
                        s += std::fabs(at(in.dO, b, h, i, d)) * (u + 2 * kEps) * (1 + std::ldexp(1.0, -7)) * vmax;
                    }
                    extra = std::max(extra, s);
                }
        const double scale = 1.0 / std::sqrt(static_cast<double>(c.Dk));
        bd.dq += scale * extra * max_abs(in.k) + kEps * den;
        bd.dk += scale * extra * max_abs(in.q) * static_cast<double>(c.Hq / c.Hkv * c.Lq) + kEps * den;
        bd.dv += kEps * den;
        for (auto [g, r, name, bound] : {std::tuple{&got.dq, &ref.dq, "dq", bd.dq}, std::tuple{&got.dk, &ref.dk, "dk", bd.dk},
                                         std::tuple{&got.dv, &ref.dv, "dv", bd.dv}}) {
            const double e = max_abs_diff(*g, *r);
            worst = std::max(worst, e / bound);
            EXPECT_LE(e, bound) << name << " (largest reference gradient " << den << ")";
        }
    }
    std::printf("[ info ] bf16-compute forward, float32 backward, 30 cases: worst error / bound %.3g\n", worst);
}

// bf16 compute reads unit-stride bf16 Q/dO rows in place and makes every pair word from the
// bf16 words (prepare_rows, query_heads.hpp); other rows (here: every second element of a wider buffer)
// and heads holding a NaN/±inf go through float32 rows rounded back. Both routes must give
// the same operands, so the same bits — also with a NaN in Q and an inf in dO.
TEST(HalfBackward, Bf16ComputeInPlaceOperandsMatchPacked) {
    const detail::KernelSet* row = bf16_compute_row();
    if (row == nullptr) GTEST_SKIP() << "skipped: CPU lacks avx512_bf16";
    const detail::ScopedKernelSet use(*row);
    const Dtypes dt{DType::bf16, DType::bf16, DType::bf16, DType::bf16, DType::bf16};
    // t's values in a (B, H, L, 2·D) buffer, viewed as every second element of its rows
    const auto spread = [](const TensorView& t, Tensor& buf) {
        const Shape s = t.shape();
        buf = Tensor(DType::bf16, Shape{s[0], s[1], s[2], 2 * s[3]});
        const auto* x = t.data_as<const std::uint16_t>();
        auto* y = buf.data_as<std::uint16_t>();
        for (std::int64_t b = 0; b < s[0]; ++b)
            for (std::int64_t h = 0; h < s[1]; ++h)
                for (std::int64_t i = 0; i < s[2]; ++i)
                    for (std::int64_t d = 0; d < s[3]; ++d) y[buf.view().offset(b, h, i, 2 * d)] = x[t.offset(b, h, i, d)];
        const Strides bs = buf.view().strides();
        return TensorView(buf.data(), DType::bf16, s, Strides{bs[0], bs[1], bs[2], 2});
    };
    int n = 0, in_place = 0;
    for (Case c : random_cases(16, 91)) {
        c.strided = n % 2 == 0;  // (B, L, H, D) rows: in place with a row stride H·D
        if (n % 4 != 3) {        // widths the in-place route takes (a multiple of 8), else the random ones
            c.Dk = n % 3 ? 64 : 32;
            c.Dv = n % 5 ? c.Dk : 8;
        }
        SCOPED_TRACE(c.str());
        Inputs in = make_inputs(c, dt, 9100 + static_cast<std::uint64_t>(n));
        if (n++ % 3 == 1) {  // a NaN in one Q head, an inf in one dO head (those heads take the float32 route)
            auto* q = in.q.data_as<std::uint16_t>();
            q[in.q.offset(0, 0, c.Lq - 1, 0)] = 0x7fc1;
            auto* d = in.dO.data_as<std::uint16_t>();
            d[in.dO.offset(c.B - 1, c.Hq - 1, 0, c.Dv - 1)] = 0x7f80;
        }
        in_place += c.Dk % 8 == 0 && c.Dv % 8 == 0;
        const Result direct = run(in, dt, Impl::flash, DType::bf16);
        ASSERT_EQ(direct.kernel, bf16_backward_kernel());
        Tensor qb, db;
        Inputs packed = make_inputs(c, dt, 0);  // its masks etc. replaced by in's below
        packed.opt = in.opt;
        packed.k = Tensor(DType::bf16, in.k.shape());
        packed.v = Tensor(DType::bf16, in.v.shape());
        std::memcpy(packed.k.data(), in.k.data(), in.k.nbytes());
        std::memcpy(packed.v.data(), in.v.data(), in.v.nbytes());
        packed.q = spread(in.q, qb);
        packed.dO = spread(in.dO, db);
        const Result other = run(packed, dt, Impl::flash, DType::bf16);
        EXPECT_TRUE(bit_equal(direct.dq, other.dq)) << "dq";
        EXPECT_TRUE(bit_equal(direct.dk, other.dk)) << "dk";
        EXPECT_TRUE(bit_equal(direct.dv, other.dv)) << "dv";
    }
    EXPECT_GE(in_place, 4);  // the cases reach the in-place route
}

// K and V pairs come from the bf16 words with K's NaN/±inf entries 0 for dQ += dS·K: a NaN
// in K and an inf in V at keys the key lengths hide leave every gradient as the clean run's.
TEST(HalfBackward, Bf16ComputeHiddenNonFiniteKeys) {
    const detail::KernelSet* row = bf16_compute_row();
    if (row == nullptr) GTEST_SKIP() << "skipped: CPU lacks avx512_bf16";
    const detail::ScopedKernelSet use(*row);
    const Dtypes dt{DType::bf16, DType::bf16, DType::bf16, DType::bf16, DType::bf16};
    for (std::int64_t Lk : {5, 64, 129}) {
        Case c{2, 2, 2, 65, Lk, 64, 64};
        c.key_lengths = true;
        SCOPED_TRACE(c.str());
        Inputs in = make_inputs(c, dt, 9300 + static_cast<std::uint64_t>(Lk));
        for (std::int64_t b = 0; b < c.B; ++b) in.kl.data_as<std::int64_t>()[b] = Lk - 2 - b;  // keys Lk-2-b.. hidden
        const Result clean = run(in, dt, Impl::flash, DType::bf16);
        for (std::int64_t b = 0; b < c.B; ++b)
            for (std::int64_t h = 0; h < c.Hkv; ++h) {
                in.k.data_as<std::uint16_t>()[in.k.view().offset(b, h, Lk - 1, 3)] = 0x7fc0;  // NaN
                in.v.data_as<std::uint16_t>()[in.v.view().offset(b, h, Lk - 1, 5)] = 0xff80;  // −inf
            }
        const Result got = run(in, dt, Impl::flash, DType::bf16);
        ASSERT_EQ(got.kernel, bf16_backward_kernel());
        EXPECT_TRUE(bit_equal(got.dq, clean.dq)) << "dq";
        EXPECT_TRUE(bit_equal(got.dk, clean.dk)) << "dk";
        EXPECT_TRUE(bit_equal(got.dv, clean.dv)) << "dv";
    }
}

// On a CPU with AMX-BF16 bf16 compute's backward runs its products on AMX tiles
// (backward/tile_amx_bf16.cpp): the report says so. (ctest runs this file's bf16-compute
// tests a second time with ATTN_CPU_HIDE=amx_bf16, on vdpbf16ps: tests/half/CMakeLists.txt.)
TEST(HalfBackward, Bf16ComputeRunsOnAmxTiles) {
    const detail::KernelSet* row = bf16_compute_row();
    if (row == nullptr || !detail::cpu_features().has_amx_bf16()) GTEST_SKIP() << "skipped: CPU lacks amx_bf16";
    const detail::ScopedKernelSet use(*row);
    const Dtypes dt{DType::bf16, DType::bf16, DType::bf16, DType::bf16, DType::bf16};
    const Inputs in = make_inputs(Case{1, 2, 1, 64, 64, 64, 64}, dt, 9500);
    EXPECT_EQ(run(in, dt, Impl::flash, DType::bf16).kernel, "flash-backward/avx512_amx_bf16");
}

// The shapes around the AMX tile's 16 × 16 × 32 blocks, whose remainders run on the vector
// micro-kernel (tile_amx_bf16.cpp): head dims 1, 3, 33, 80, 96, 130 (reduction and column
// edges: Dkp % 16 == 8 at 80 − 8·…, 33 → 40, 130 → 136), query and key counts off 16, 32 and 64
// (row edges, short last tiles), with every mask kind, GQA, dropout, softcap and sinks, within
// the bf16-compute bound of the double reference. Every third case then puts an inf or a NaN
// into one dO entry: each gradient the reference leaves finite is bit for bit the run with that
// entry 0 (the products read a copy with it 0 and the tile adds P̂·x back into dV:
// flash_backward.cpp), and the reference's non-finite ones are non-finite.
TEST(HalfBackward, Bf16ComputeBlockEdgesMatchReference) {
    const detail::KernelSet* row = bf16_compute_row();
    if (row == nullptr) GTEST_SKIP() << "skipped: CPU lacks avx512_bf16";
    const detail::ScopedKernelSet use(*row);
    const Dtypes dt{DType::bf16, DType::bf16, DType::bf16, DType::bf16, DType::bf16};
    std::mt19937_64 rng(97);
    auto pick = [&](std::initializer_list<std::int64_t> xs) { return *(xs.begin() + rng() % xs.size()); };
    Bf16Worst worst;
    int n = 0, poisoned_cases = 0;
    for (Case c : random_cases(24, 97)) {
        c.B = 1;  // the bound's sums are O(Hq·Lq·Lk·D) in double: small batches, large blocks
        c.Dk = pick({1, 3, 33, 64, 80, 96, 130});
        c.Dv = rng() % 2 ? c.Dk : pick({3, 16, 33, 80, 130});
        c.Lq = pick({17, 63, 65, 100, 130});
        c.Lk = pick({16, 33, 64, 65, 129, 200});
        SCOPED_TRACE(c.str());
        const std::uint64_t seed = 9700 + static_cast<std::uint64_t>(n++);
        const Inputs in = make_inputs(c, dt, seed);
        const Result got = run(in, dt, Impl::flash, DType::bf16);
        ASSERT_EQ(got.kernel, bf16_backward_kernel());
        const Result ref = run(in, dt, Impl::reference, DType::f64);
        expect_bf16_compute_bound(c, in, got, ref, worst);
        if (n % 3 != 0 || c.dropout > 0.0) continue;
        // One dO entry inf or NaN; its twin holds 0 there.
        ++poisoned_cases;
        Inputs bad = make_inputs(c, dt, seed), zero = make_inputs(c, dt, seed);
        const std::int64_t h = static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(c.Hq)),
                           i = static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(c.Lq)),
                           d = static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(c.Dv));
        bad.dO.data_as<std::uint16_t>()[bad.dO.offset(0, h, i, d)] = n % 2 ? 0x7f80 : 0x7fc0;  // +inf, NaN
        zero.dO.data_as<std::uint16_t>()[zero.dO.offset(0, h, i, d)] = 0;
        SCOPED_TRACE("dO[0," + std::to_string(h) + "," + std::to_string(i) + "," + std::to_string(d) + "] non-finite");
        const Result g_bad = run(bad, dt, Impl::flash, DType::bf16), g_zero = run(zero, dt, Impl::flash, DType::bf16);
        const Result r_bad = run(bad, dt, Impl::reference, DType::f64);
        for (auto [g, z, r, name] : {std::tuple{&g_bad.dq, &g_zero.dq, &r_bad.dq, "dq"}, std::tuple{&g_bad.dk, &g_zero.dk, &r_bad.dk, "dk"},
                                     std::tuple{&g_bad.dv, &g_zero.dv, &r_bad.dv, "dv"}}) {
            const Shape s = g->shape();
            int mismatches = 0;
            for (std::int64_t b = 0; b < s[0]; ++b)
                for (std::int64_t hh = 0; hh < s[1]; ++hh)
                    for (std::int64_t x = 0; x < s[2]; ++x)
                        for (std::int64_t e = 0; e < s[3] && mismatches < 3; ++e) {
                            const double gv = at(*g, b, hh, x, e), zv = at(*z, b, hh, x, e), rv = at(*r, b, hh, x, e);
                            const bool ok = std::isfinite(rv) ? gv == zv : !std::isfinite(gv);
                            if (!ok && ++mismatches)
                                ADD_FAILURE() << name << "[" << b << "," << hh << "," << x << "," << e << "] = " << gv
                                              << ", the run with dO 0 there " << zv << ", reference " << rv;
                        }
        }
    }
    EXPECT_GE(poisoned_cases, 3);
    std::printf("[ info ] bf16 compute backward, block edges, 24 cases (%s): worst error / bound %.3g\n",
                bf16_backward_kernel().c_str(), worst.ratio);
}

// The tiled backward's result does not depend on the thread count with 16-bit inputs either
// (the per-tile widening is inside each task).
TEST(HalfBackward, ThreadCountIndependent) {
    const Dtypes dt{DType::f16, DType::bf16, DType::f16, DType::f32, DType::f32};
    for (const Case& c : random_cases(6, 51)) {
        SCOPED_TRACE(c.str());
        const Inputs in = make_inputs(c, dt, 51);
        Result one, two;
        {
            const ScopedNumThreads nt(1);
            one = run(in, dt, Impl::flash, DType::f32);
        }
        {
            const ScopedNumThreads nt(2);
            two = run(in, dt, Impl::flash, DType::f32);
        }
        EXPECT_TRUE(bit_equal(one.dq, two.dq) && bit_equal(one.dk, two.dk) && bit_equal(one.dv, two.dv));
    }
}

// Automatic dispatch picks the tiled kernel for 16-bit inputs (it declines only float64).
TEST(HalfBackward, AutoRunsFlashFor16Bit) {
    Case c{1, 2, 1, 9, 11, 8, 8};
    const Dtypes dt{DType::bf16, DType::f16, DType::bf16, DType::bf16, DType::bf16};
    const Inputs in = make_inputs(c, dt, 61);
    const Result r = run(in, dt, Impl::automatic, DType::bf16);
    EXPECT_EQ(r.kernel.rfind("flash-backward/", 0), 0u) << r.kernel;
}

// sdpa_varlen_backward with bf16 packed tensors and bf16 gradients: per sequence the same
// as sdpa_backward on that sequence's (1, H, L, D) view — against the double reference.
TEST(HalfBackward, VarlenBf16MatchesReference) {
    std::mt19937_64 rng(71);
    // Three sequences; the last has no key (its dq rows are written as 0 in bf16).
    const std::int64_t Hq = 2, Hkv = 1, D = 16, Tq = 3 + 70 + 2, Tk = 5 + 80;
    const Tensor q = randn(DType::bf16, Shape{Tq, Hq, D}, rng), k = randn(DType::bf16, Shape{Tk, Hkv, D}, rng),
                 v = randn(DType::bf16, Shape{Tk, Hkv, D}, rng), dO = randn(DType::bf16, Shape{Tq, Hq, D}, rng);
    Tensor cq(DType::i32, Shape{4}), ck(DType::i32, Shape{4});
    const std::int32_t cqv[] = {0, 3, 73, 75}, ckv[] = {0, 5, 85, 85};
    std::copy(cqv, cqv + 4, cq.data_as<std::int32_t>());
    std::copy(ckv, ckv + 4, ck.data_as<std::int32_t>());
    SdpaOptions o;
    o.causal = Causal::bottom_right;
    const Tensor out = poisoned(DType::f32, Shape{Tq, Hq, D}), lse = poisoned(DType::f32, Shape{Tq, Hq});
    TensorView lv = lse.view();
    // The forward on float32 copies (the same values: bf16 widens exactly); the packed
    // forward's 16-bit inputs are not this test's subject.
    sdpa_varlen(to_storage(q, DType::f32), to_storage(k, DType::f32), to_storage(v, DType::f32), cq, ck, o, out, &lv);
    auto grads = [&](Impl impl, DType g, std::string* kernel) {
        std::vector<Tensor> t;
        for (const Tensor* like : {&q, &k, &v}) t.push_back(poisoned(g, like->shape()));
        SdpaOptions ob = o;
        ob.impl = impl;
        SdpaReport rep;
        sdpa_varlen_backward(q, k, v, cq, ck, out, lse, dO, ob, t[0], t[1], t[2], &rep);
        *kernel = rep.kernel;
        return t;
    };
    std::string kf, kr;
    const std::vector<Tensor> got = grads(Impl::flash, DType::bf16, &kf), ref = grads(Impl::reference, DType::f64, &kr);
    EXPECT_EQ(kf.rfind("flash-backward/", 0), 0u) << kf;
    const double den = std::max({max_abs(ref[0]), max_abs(ref[1]), max_abs(ref[2])});
    for (int i = 0; i < 3; ++i) {
        // the float32 bound plus one bf16 rounding of each gradient (|x|·2⁻⁸ <= den·2⁻⁸)
        EXPECT_LE(max_abs_diff(got[static_cast<std::size_t>(i)], ref[static_cast<std::size_t>(i)]),
                  (kTol + unit_roundoff(DType::bf16)) * den)
            << "gradient " << i;
    }
    for (std::int64_t t = 73; t < 75; ++t)
        for (std::int64_t d = 0; d < D; ++d) ASSERT_EQ(at(got[0], t, 0, d), 0.0);
    // dtype errors name the argument and the four accepted dtypes; nothing is written.
    const Tensor dk_i32(DType::i32, k.shape()), dq = poisoned(DType::bf16, q.shape()), dv = poisoned(DType::bf16, v.shape());
    try {
        sdpa_varlen_backward(q, k, v, cq, ck, out, lse, dO, o, dq, dk_i32, dv);
        ADD_FAILURE() << "no error";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find(
                      "sdpa_varlen_backward: dk: dtype must be float32, float64, float16 or bfloat16 but got int32"),
                  std::string::npos)
            << e.what();
    }
    EXPECT_TRUE(still_poisoned(dq) && still_poisoned(dv));
}

// The packers' widening (kernels/simd/convert.hpp) against half.hpp's conversions: every
// float16 and bfloat16 bit pattern, contiguous and strided.
TEST(HalfBackward, WidenRowIsExact) {
    for (DType dt : {DType::f16, DType::bf16}) {
        Tensor t(dt, Shape{65536});
        for (std::int64_t e = 0; e < 65536; ++e) t.data_as<std::uint16_t>()[e] = static_cast<std::uint16_t>(e);
        std::vector<float> got(65536);
        for (std::int64_t stride : {1, 3}) {
            const std::int64_t n = 65536 / stride;
            detail::widen_row(t, 0, stride, n, got.data());
            for (std::int64_t e = 0; e < n; ++e) {
                const std::uint16_t h = static_cast<std::uint16_t>(e * stride);
                const float want = dt == DType::f16 ? f16_to_float(h) : bf16_to_float(h);
                if (std::isnan(want)) ASSERT_TRUE(std::isnan(got[static_cast<std::size_t>(e)])) << std::hex << h;
                else ASSERT_EQ(std::memcmp(&got[static_cast<std::size_t>(e)], &want, 4), 0) << name(dt) << " " << std::hex << h;
            }
        }
    }
}

void expect_error(const std::function<void()>& f, const std::string& text) {
    try {
        f();
        ADD_FAILURE() << "no error; expected: " << text;
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
    }
}

// The dtype checks name the argument, the four accepted dtypes and what was given; lse
// stays float32/float64; nothing is written.
TEST(HalfBackward, DtypeErrors) {
    std::mt19937_64 rng(81);
    const Tensor q = randn(DType::bf16, Shape{1, 1, 4, 8}, rng), k = randn(DType::bf16, Shape{1, 1, 5, 8}, rng);
    const Tensor v = randn(DType::bf16, Shape{1, 1, 5, 8}, rng), dO = randn(DType::bf16, Shape{1, 1, 4, 8}, rng);
    const Tensor out = randn(DType::bf16, Shape{1, 1, 4, 8}, rng), lse = randn(DType::f32, Shape{1, 1, 4}, rng);
    const Tensor lse16 = randn(DType::f16, Shape{1, 1, 4}, rng), dO_i32(DType::i32, Shape{1, 1, 4, 8});
    const Tensor q64 = randn(DType::f64, Shape{1, 1, 4, 8}, rng);
    const Tensor dq = poisoned(DType::bf16, q.shape()), dk = poisoned(DType::bf16, k.shape()), dv = poisoned(DType::bf16, v.shape());
    const Tensor dv_i32(DType::i32, v.shape());
    SdpaOptions o;
    expect_error([&] { sdpa_backward(q, k, v, out, lse, dO_i32, o, dq, dk, dv); },
                 "sdpa_backward: grad_out: dtype must be float32, float64, float16 or bfloat16 but got int32");
    expect_error([&] { sdpa_backward(q, k, v, out, lse, dO, o, dq, dk, dv_i32); },
                 "sdpa_backward: dv: dtype must be float32, float64, float16 or bfloat16 but got int32");
    expect_error([&] { sdpa_backward(q, k, v, out, lse16, dO, o, dq, dk, dv); },
                 "sdpa_backward: lse: dtype must be float32 or float64 but got float16");
    o.impl = Impl::flash;
    expect_error([&] { sdpa_backward(q64, k, v, out, lse, dO, o, dq, dk, dv); },
                 "sdpa_backward: impl: the flash backward cannot run this call: it needs q, k, v, out and grad_out in float32, float16 or bfloat16");
    EXPECT_TRUE(still_poisoned(dq) && still_poisoned(dk) && still_poisoned(dv));
}

}  // namespace
}  // namespace attn::test
