// float16 / bfloat16 Q, K, V and out on the forward kernels (flash, decode, the KV-cache and
// paged paths), against the bounds docs/conventions.md states ("16-bit inputs and outputs"):
//   * float32 out: within 1e-5·(1 + |ref|) of the double reference computed on the same
//     16-bit-rounded inputs (lse and weights too), for unit-scale inputs;
//   * float16 / bfloat16 out: exactly the float32 result of the same call rounded once
//     (round to nearest even) — hence within one rounding of it — and within the float32
//     bound plus half an ulp (u·|ref|) of the reference; float64 out: the float32 result widened.
// Independently of the bound, the conversion itself is checked bit for bit: a call on 16-bit
// inputs gives exactly the bits of the same kernel on float32 tensors (same layout) holding
// the widened values — including NaN/±inf inputs (16-bit inf/NaN behave like float32 ones)
// and huge bfloat16 V (the careful path of finite.hpp).
// Every case runs on every kernel row the CPU has (runnable_kernel_sets), with 1 and 2
// threads (bit-identical), every Q/K/V dtype combination and every output dtype; outputs
// are poisoned first.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "attn/decode.hpp"
#include "attn/error.hpp"
#include "attn/kv_cache.hpp"
#include "attn/paged_kv_cache.hpp"
#include "attn/sdpa.hpp"
#include "attn/sdpa_backward.hpp"
#include "attn/sdpa_varlen.hpp"
#include "attn/threads.hpp"
#include "common/util.hpp"
#include "kernels/flash/flash.hpp"
#include "kernels/isa.hpp"
#include "sdpa/problem.hpp"

namespace attn {
namespace {

using test::load;
using test::poison;
using test::store;

constexpr DType kIn[] = {DType::f32, DType::f16, DType::bf16};
constexpr double kTol = 1e-5;  // docs/conventions.md: float32 out vs the double reference

const char* dn(DType t) { return dtype_name(t).data(); }

// A (B, H, L, D) tensor of dtype dt holding `values` (rounded to dt), either contiguous or
// strided: a (B, L, H, 2D) buffer seen as (B, H, L, D) with head-dim stride 2.
struct Placed {
    Tensor storage;
    TensorView view;
};

Placed place(const TensorView& values, DType dt, bool strided) {
    const Shape s = values.shape();
    Placed p;
    if (!strided) {
        p.storage = test::to_storage(values, dt);
        p.view = p.storage.view();
        return p;
    }
    p.storage = Tensor(dt, Shape{s[0], s[2], s[1], 2 * s[3]});
    poison(p.storage);  // the gaps: a kernel reading them would see NaN
    const Strides c = contiguous_strides(p.storage.shape());
    p.view = TensorView(p.storage.data(), dt, s, Strides{c[0], c[2], c[1], 2});
    test::for_each_index(s, [&](const test::Index& i) {
        store(p.view, test::offset_of(p.view, i), load(values, test::offset_of(values, i)));
    });
    return p;
}

struct Case {
    std::string desc;
    std::int64_t B, Hq, Hkv, Lq, Lk, Dk, Dv;
    SdpaOptions opt;
    std::vector<Tensor> keep;  // masks, lengths, slopes, sinks the options view
    bool want_lse = false, want_weights = false, strided = false;
    bool nonfinite = false;  // NaN/±inf in Q, K, V: only the bit-identity checks apply
    bool huge_v = false;     // |V| ~ 1e37 (bf16/f32 finite; f16 inf): the careful path
};

Case random_case(std::mt19937_64& rng, int n) {
    auto pick = [&](std::int64_t lo, std::int64_t hi) {
        return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng);
    };
    Case c;
    c.B = pick(1, 2);
    c.Hkv = pick(1, 2);
    c.Hq = c.Hkv * pick(1, 3);
    // Short query blocks (the decode kernel) and long ones (flash), odd sizes.
    c.Lq = n % 3 == 0 ? pick(1, 16) : pick(17, 80);
    c.Lk = pick(1, 150);
    c.Dk = pick(1, 48);
    if (n % 4 == 3) c.Dk = 16 * pick(1, 3);  // 16 × 16 blocks: the avx512 row's Qᵀ pack (widen, transpose16)
    c.Dv = n % 2 ? c.Dk : pick(1, 40);
    if (n % 4 == 2) c.Dv = 16 * pick(1, 3);  // whole 16-column groups: the avx512 row's O store (transpose16, narrow16)
    c.strided = n % 4 == 1;
    c.want_lse = n % 2 == 0;
    c.want_weights = n % 5 == 2;
    std::ostringstream d;
    d << "case " << n << ": B=" << c.B << " Hq=" << c.Hq << " Hkv=" << c.Hkv << " Lq=" << c.Lq << " Lk=" << c.Lk
      << " Dk=" << c.Dk << " Dv=" << c.Dv << (c.strided ? " strided" : "");
    switch (pick(0, 5)) {  // the mask kinds, drawn independently of the key lengths below
        case 1: c.opt.causal = Causal::top_left, d << " causal=top-left"; break;
        case 2: c.opt.causal = Causal::bottom_right, d << " causal=bottom-right"; break;
        case 3: {
            const Align a = pick(0, 1) ? Align::bottom_right : Align::top_left;
            c.opt.window = Window{pick(-1, 20), pick(0, 10), a};
            d << " window=" << c.opt.window.left << "," << c.opt.window.right << (a == Align::top_left ? " top-left" : "");
            break;
        }
        case 4: {
            c.keep.push_back(test::random_bool(Shape{c.B, 1, c.Lq, c.Lk}, rng, 0.7));
            c.opt.bool_mask = c.keep.back().view();
            d << " bool-mask";
            break;
        }
        case 5: {
            c.keep.push_back(test::randn(DType::f32, Shape{1, c.Hq, c.Lq, c.Lk}, rng));
            for (std::int64_t e = 0; e < c.keep.back().numel(); ++e)  // about 10 % masked by −inf
                if (pick(0, 9) == 0) c.keep.back().data_as<float>()[e] = -INFINITY;
            c.opt.additive_mask = c.keep.back().view();
            d << " additive-mask";
            break;
        }
        default: break;
    }
    if (pick(0, 3) == 3) {  // key lengths
        Tensor kl(DType::i64, Shape{c.B});
        for (std::int64_t b = 0; b < c.B; ++b) kl.data_as<std::int64_t>()[b] = pick(0, c.Lk);
        c.keep.push_back(std::move(kl));
        c.opt.key_lengths = c.keep.back().view();
        d << " key-lengths";
    }
    switch (n % 7) {  // the modifiers
        case 1: c.opt.softcap = 5.0, d << " softcap"; break;
        case 2: {
            c.keep.push_back(alibi_slopes(c.Hq));
            c.opt.alibi_slopes = c.keep.back().view();
            d << " alibi";
            break;
        }
        case 3: {
            c.keep.push_back(test::randn(DType::f32, Shape{c.Hq}, rng));
            c.opt.sinks = c.keep.back().view();
            d << " sinks";
            break;
        }
        case 4: c.opt.dropout_p = 0.25, c.opt.dropout_seed = 1234 + n, d << " dropout"; break;
        default: break;
    }
    c.nonfinite = n % 8 == 5;
    c.huge_v = n % 8 == 6;
    d << (c.nonfinite ? " nonfinite" : "") << (c.huge_v ? " huge-V" : "") << (c.want_lse ? " +lse" : "")
      << (c.want_weights ? " +weights" : "");
    c.desc = d.str();
    return c;
}

struct Result {
    Tensor out, lse, weights;
    std::string kernel;
};

// One sdpa call with poisoned outputs; every output element must be written.
Result run(const Case& c, const TensorView& q, const TensorView& k, const TensorView& v, DType out_dt, Impl impl,
           DType stat_dt = DType::f32) {
    Result r;
    r.out = test::poisoned(out_dt, Shape{c.B, c.Hq, c.Lq, c.Dv});
    if (c.want_lse) r.lse = test::poisoned(stat_dt, Shape{c.B, c.Hq, c.Lq});
    if (c.want_weights) r.weights = test::poisoned(stat_dt, Shape{c.B, c.Hq, c.Lq, c.Lk});
    SdpaOptions o = c.opt;
    o.impl = impl;
    SdpaReport rep;
    const TensorView lse = r.lse.view(), w = r.weights.view();
    sdpa(q, k, v, o, r.out.view(), c.want_lse ? &lse : nullptr, c.want_weights ? &w : nullptr, &rep);
    r.kernel = rep.kernel;
    const auto written = [&](const Tensor& t, const char* name) {
        bool unwritten = false;
        test::for_each_offset(t.view(), [&](std::int64_t i) { unwritten = unwritten || test::is_poison(load(t, i)); });
        EXPECT_FALSE(unwritten) << name << " not written by " << rep.kernel;
    };
    written(r.out, "out");
    if (c.want_lse) written(r.lse, "lse");
    if (c.want_weights) written(r.weights, "weights");
    return r;
}

Impl impl_of(const std::string& kernel) { return kernel.rfind("decode", 0) == 0 ? Impl::decode : Impl::flash; }

// The float32 result of a kernel, rounded once to dt (the expected bits of a dt output).
Tensor rounded(const Tensor& f32, DType dt) { return test::to_storage(f32.view(), dt); }

struct Worst {
    double out = 0, lse = 0, weights = 0;  // worst |error| / bound
    void take(double& slot, const test::Diff& d) { slot = std::max(slot, d.worst_ratio); }
};

void check_case(Case& c, std::mt19937_64& rng, Worst& worst) {
    SCOPED_TRACE(c.desc);
    // Master values (double → rounded per dtype by place()).
    Tensor qm = test::randn(DType::f64, Shape{c.B, c.Hq, c.Lq, c.Dk}, rng);
    Tensor km = test::randn(DType::f64, Shape{c.B, c.Hkv, c.Lk, c.Dk}, rng);
    Tensor vm = test::randn(DType::f64, Shape{c.B, c.Hkv, c.Lk, c.Dv}, rng);
    if (c.huge_v)
        for (std::int64_t i = 0; i < vm.numel(); ++i) store(vm, i, load(vm, i) * 1e37);
    if (c.nonfinite) {  // a NaN/±inf in V at the first and last key, a NaN in K, +inf in Q
        store(vm, 0, INFINITY);
        store(vm, vm.numel() - 1, NAN);
        store(km, km.numel() / 2, NAN);
        if (c.Lq > 1) store(qm, qm.numel() - 1, -INFINITY);
    }
    const auto sets = detail::runnable_kernel_sets();
    // The bound's absolute part is in units of V: out is a weighted mean of V rows, and with
    // |V| ~ 1e37 its cancellation error is relative to |V|, not to |out|.
    const double vscale = c.huge_v ? 1e37 : 1.0;
    for (DType qt : kIn)
        for (DType kt : kIn)
            for (DType vt : kIn) {
                SCOPED_TRACE(std::string("Q ") + dn(qt) + ", K " + dn(kt) + ", V " + dn(vt));
                const Placed q = place(qm.view(), qt, c.strided), k = place(km.view(), kt, c.strided),
                             v = place(vm.view(), vt, c.strided);
                // The same values (exactly) in float32 tensors of the same layout.
                const Placed q32 = place(q.view, DType::f32, c.strided), k32 = place(k.view, DType::f32, c.strided),
                             v32 = place(v.view, DType::f32, c.strided);
                const bool compare_ref = !c.nonfinite && !(c.huge_v && vt == DType::f16);
                Result ref;
                if (compare_ref) ref = run(c, q.view, k.view, v.view, DType::f64, Impl::reference, DType::f64);
                for (const detail::KernelSet* ks : sets) {
                    detail::ScopedKernelSet scoped(*ks);
                    SCOPED_TRACE(std::string("isa ") + detail::isa_name(ks->isa));
                    Result first;
                    for (int threads : {1, 2}) {
                        ScopedNumThreads nt(threads);
                        Result r = run(c, q.view, k.view, v.view, DType::f32, Impl::automatic);
                        ASSERT_EQ(r.kernel.find("reference"), std::string::npos) << r.kernel;
                        if (threads == 2) {
                            EXPECT_TRUE(test::bit_equal(r.out, first.out)) << "1 vs 2 threads, " << r.kernel;
                        }
                        // The conversion: bit-identical to float32 tensors holding the same values.
                        const Result w32 = run(c, q32.view, k32.view, v32.view, DType::f32, impl_of(r.kernel));
                        EXPECT_TRUE(test::bit_equal(r.out, w32.out)) << "16-bit inputs vs their float32 values, " << r.kernel;
                        if (c.want_lse) {
                            EXPECT_TRUE(test::bit_equal(r.lse, w32.lse)) << "lse, " << r.kernel;
                        }
                        if (c.want_weights) {
                            EXPECT_TRUE(test::bit_equal(r.weights, w32.weights)) << "weights";
                        }
                        if (compare_ref) {
                            const test::Diff d = test::compare(r.out.view(), ref.out.view(), kTol * vscale, kTol);
                            EXPECT_EQ(d.bad, 0) << "out (float32) vs reference, " << r.kernel << ": " << d.message();
                            worst.take(worst.out, d);
                            if (c.want_lse) {
                                const test::Diff dl = test::compare(r.lse.view(), ref.lse.view(), kTol, kTol);
                                EXPECT_EQ(dl.bad, 0) << "lse vs reference: " << dl.message();
                                worst.take(worst.lse, dl);
                            }
                            if (c.want_weights) {
                                const test::Diff dw = test::compare(r.weights.view(), ref.weights.view(), kTol, kTol);
                                EXPECT_EQ(dw.bad, 0) << "weights vs reference: " << dw.message();
                                worst.take(worst.weights, dw);
                            }
                        }
                        if (threads == 1) first = std::move(r);
                    }
                    // Output dtypes: one rounding of the float32 result (bit for bit), float64 its widening.
                    for (DType ot : {DType::f16, DType::bf16, DType::f64}) {
                        SCOPED_TRACE(std::string("out ") + dn(ot));
                        const Result r = run(c, q.view, k.view, v.view, ot, Impl::automatic);
                        // All-bf16 with a bf16 out on a CPU with AVX-512 BF16 runs bf16 compute (P
                        // rounded to bf16; docs/conventions.md "bf16 compute", checked closely by
                        // tests/kernels/test_bf16_compute.cpp): not the float32 products rounded once,
                        // and its bound adds 2^-8·max|V|.
                        const bool bf16_products = r.kernel == "flash/avx512_bf16" || r.kernel == "flash/avx512_amx_bf16";
                        if (r.kernel.rfind("flash/", 0) == 0) {  // (the decode kernel has no bf16 compute)
                            EXPECT_EQ(bf16_products, ot == DType::bf16 && qt == DType::bf16 && kt == DType::bf16 &&
                                                         vt == DType::bf16 && ks->flash_forward_bf16 != nullptr &&
                                                         detail::cpu_features().has_avx512_bf16())
                                << r.kernel;
                        }
                        if (!bf16_products) {
                            EXPECT_TRUE(test::bit_equal(r.out, rounded(first.out, ot)))
                                << "not the float32 result rounded once, " << r.kernel;
                        }
                        // (huge V: a float16 out overflows to ±inf, which is then its correct rounding)
                        if (compare_ref && ot != DType::f64 && !(c.huge_v && ot == DType::f16)) {
                            // Bound: the float32 one plus half an ulp of the 16-bit format.
                            const double p_rounding =
                                bf16_products ? std::ldexp(1.0, -8) * (1 + std::ldexp(1.0, -7)) * test::max_abs(v.view) : 0.0;
                            const test::Diff d = test::compare(r.out.view(), ref.out.view(), kTol * vscale + p_rounding,
                                                               kTol + test::unit_roundoff(ot));
                            EXPECT_EQ(d.bad, 0) << "out (" << dn(ot) << ") vs reference: " << d.message();
                        }
                    }
                }
            }
}

TEST(HalfForward, RandomCasesEveryDtypeIsaAndThreadCount) {
    std::mt19937_64 rng(20261201);
    Worst worst;
    for (int n = 0; n < 24; ++n) {
        Case c = random_case(rng, n);
        check_case(c, rng, worst);
        if (HasFatalFailure() || HasFailure()) break;
    }
    std::printf("worst error / bound (1e-5·(1+|ref|)): out %.3g, lse %.3g, weights %.3g\n", worst.out, worst.lse,
                worst.weights);
}

// A call the decode kernel used to refuse with "only the decode kernel runs fast": chunked
// prefill (Lq = 64) against float16 K/V, and weights with bfloat16 K/V. Flash runs them, and
// the report names the dtypes.
TEST(HalfForward, FlashRunsSixteenBitCallsDecodeDeclines) {
    std::mt19937_64 rng(7);
    const Tensor q = test::randn(DType::f32, Shape{1, 4, 64, 32}, rng);
    const Tensor k = test::to_storage(test::randn(DType::f32, Shape{1, 4, 100, 32}, rng).view(), DType::f16);
    const Tensor v = test::to_storage(test::randn(DType::f32, Shape{1, 4, 100, 32}, rng).view(), DType::f16);
    Tensor out = test::poisoned(DType::f16, Shape{1, 4, 64, 32});
    SdpaReport rep;
    SdpaOptions o;
    o.causal = Causal::bottom_right;
    sdpa(q, k, v, o, out, nullptr, nullptr, &rep);
    EXPECT_EQ(rep.kernel.rfind("flash/", 0), 0u) << rep.kernel;
    EXPECT_NE(rep.explanation.find("Q float32, K float16, V float16, out float16"), std::string::npos)
        << rep.explanation;
    EXPECT_FALSE(test::still_poisoned(out));
    // Lq = 1 with weights: decode declines, flash takes it.
    const Tensor q1 = test::to_storage(test::randn(DType::f32, Shape{1, 4, 1, 32}, rng).view(), DType::bf16);
    Tensor out1 = test::poisoned(DType::bf16, Shape{1, 4, 1, 32});
    Tensor w1 = test::poisoned(DType::f32, Shape{1, 4, 1, 100});
    const TensorView wv = w1.view();
    sdpa(q1, k, v, SdpaOptions{}, out1, nullptr, &wv, &rep);
    EXPECT_EQ(rep.kernel.rfind("flash/", 0), 0u) << rep.kernel;
    EXPECT_NE(rep.explanation.find("decode: declined"), std::string::npos) << rep.explanation;
    // Lq = 3, bfloat16 Q and out, float16 K/V: the decode kernel, dtypes named.
    const Tensor q3 = test::to_storage(test::randn(DType::f32, Shape{1, 4, 3, 32}, rng).view(), DType::bf16);
    Tensor out3 = test::poisoned(DType::bf16, Shape{1, 4, 3, 32});
    sdpa(q3, k, v, SdpaOptions{}, out3, nullptr, nullptr, &rep);
    EXPECT_EQ(rep.kernel.rfind("decode/", 0), 0u) << rep.kernel;
    EXPECT_NE(rep.explanation.find("Q bfloat16, K float16, V float16, out bfloat16"), std::string::npos)
        << rep.explanation;
}

// A float16/bfloat16 additive mask (a 16-bit model's mask, as torch passes it) is its values:
// every kernel and the backward give the bits of the same values as a float32 mask. It was
// refused (a review found it: the common case of attn.torch with a bf16 model).
TEST(HalfForward, SixteenBitAdditiveMaskIsItsFloat32Values) {
    std::mt19937_64 rng(41);
    for (const DType mdt : {DType::f16, DType::bf16})
        for (const std::int64_t Lq : {1, 5, 70}) {  // decode (group·Lq below a flash panel) and flash
            SCOPED_TRACE(std::string(dtype_name(mdt)) + " Lq " + std::to_string(Lq));
            const Tensor q = test::randn(DType::f32, Shape{2, 4, Lq, 24}, rng);
            const Tensor k = test::randn(DType::f32, Shape{2, 2, 90, 24}, rng), v = test::randn(DType::f32, Shape{2, 2, 90, 24}, rng);
            // (2, 1, Lq, 90): broadcast over heads; with some −inf entries.
            Tensor m32 = test::randn(DType::f32, Shape{2, 1, Lq, 90}, rng);
            for (std::int64_t e = 0; e < m32.numel(); e += 7) m32.data_as<float>()[e] = -INFINITY;
            const Tensor m16 = test::to_storage(m32.view(), mdt);
            const Tensor same = test::to_storage(m16.view(), DType::f32);  // the 16-bit values, as float32
            for (const Impl impl : {Impl::automatic, Impl::reference, Impl::flash}) {
                SdpaOptions o16, o32;
                o16.impl = o32.impl = impl;
                o16.additive_mask = m16.view();
                o32.additive_mask = same.view();
                Tensor a = test::poisoned(DType::f32, Shape{2, 4, Lq, 24}), b = test::poisoned(DType::f32, Shape{2, 4, Lq, 24});
                Tensor la(DType::f32, Shape{2, 4, Lq}), lb(DType::f32, Shape{2, 4, Lq});
                const TensorView lav = la.view(), lbv = lb.view();
                sdpa(q, k, v, o16, a, &lav);
                sdpa(q, k, v, o32, b, &lbv);
                ASSERT_EQ(std::memcmp(a.data(), b.data(), a.nbytes()), 0) << "impl " << static_cast<int>(impl);
                if (impl == Impl::reference) continue;  // the backward reads lse of the float32 kernels
                const Tensor g = test::randn(DType::f32, Shape{2, 4, Lq, 24}, rng);
                Tensor dq1(DType::f32, q.shape()), dk1(DType::f32, k.shape()), dv1(DType::f32, v.shape());
                Tensor dq2(DType::f32, q.shape()), dk2(DType::f32, k.shape()), dv2(DType::f32, v.shape());
                sdpa_backward(q, k, v, a, la, g, o16, dq1, dk1, dv1);
                sdpa_backward(q, k, v, b, lb, g, o32, dq2, dk2, dv2);
                ASSERT_EQ(std::memcmp(dq1.data(), dq2.data(), dq1.nbytes()), 0);
                ASSERT_EQ(std::memcmp(dk1.data(), dk2.data(), dk1.nbytes()), 0);
                ASSERT_EQ(std::memcmp(dv1.data(), dv2.data(), dv1.nbytes()), 0);
            }
        }
}

// The KV-cache and paged paths (16-bit storage) with 16-bit Q and out: the out bits are the
// float32-Q call's, rounded once (but for bf16 compute), and the pages give the contiguous
// cache's bits; Lq = 20 > 16 runs flash on both, its key tiles across pages of 16.
TEST(HalfForward, CacheAndPagedPathsTakeSixteenBitQueryAndOut) {
    std::mt19937_64 rng(11);
    for (DType storage : {DType::f16, DType::bf16})
        for (DType qt : {DType::f16, DType::bf16})
            for (std::int64_t Lq : {1, 5, 20}) {
                SCOPED_TRACE(std::string("storage ") + dn(storage) + ", Q " + dn(qt) + ", Lq " + std::to_string(Lq));
                const std::int64_t Hkv = 2, Hq = 4, D = 24, T = 70;
                KVCacheConfig cfg;
                cfg.batch = 1, cfg.kv_heads = Hkv, cfg.head_dim = D, cfg.capacity = 128, cfg.storage = storage;
                KVCache cache(cfg);
                const Tensor kn = test::randn(DType::f32, Shape{Hkv, T, D}, rng);
                const Tensor vn = test::randn(DType::f32, Shape{Hkv, T, D}, rng);
                cache.append(TensorView(kn.data(), DType::f32, Shape{1, Hkv, T, D}),
                             TensorView(vn.data(), DType::f32, Shape{1, Hkv, T, D}));
                PagedKVCacheConfig pc;
                pc.kv_heads = Hkv, pc.head_dim = D, pc.page_size = 16, pc.num_pages = 8, pc.storage = storage;
                PagedKVCache paged(pc);
                const PagedKVCache::SeqId s = paged.add_sequence();
                paged.append(s, kn, vn);
                const Tensor q = test::to_storage(test::randn(DType::f32, Shape{1, Hq, Lq, D}, rng).view(), qt);
                const Tensor q32 = test::to_storage(q.view(), DType::f32);
                SdpaOptions o;
                o.causal = Causal::bottom_right;
                for (const detail::KernelSet* ks : detail::runnable_kernel_sets()) {
                    detail::ScopedKernelSet scoped(*ks);
                    Tensor want = test::poisoned(DType::f32, Shape{1, Hq, Lq, D});
                    decode_attention(q32, cache, o, want);
                    Tensor got = test::poisoned(qt, Shape{1, Hq, Lq, D});
                    decode_attention(q, cache, o, got);
                    // Where auto runs flash (Lq > 16, or group·Lq rows per KV head filling a flash
                    // panel: 32 queries on the avx512 row, 16 elsewhere), all-bf16 on a CPU with
                    // AVX-512 BF16 is flash's bf16 compute (P rounded to bf16, docs/conventions.md):
                    // within 2^-8·max|V| plus out's rounding.
                    const bool flash = Lq > 16 || (Hq / Hkv) * Lq >= (ks->isa == detail::Isa::avx512 ? 32 : 16);
                    if (qt == DType::bf16 && storage == DType::bf16 && flash && ks->flash_forward_bf16 != nullptr &&
                        detail::cpu_features().has_avx512_bf16()) {
                        const double atol = std::ldexp(1.0, -8) * (1 + std::ldexp(1.0, -7)) * test::max_abs(vn.view()) + 1e-5;
                        const test::Diff d = test::compare(got.view(), want.view(), atol, test::unit_roundoff(qt) + 1e-5);
                        EXPECT_EQ(d.bad, 0) << "decode_attention (bf16 compute): " << d.message();
                    } else {
                        EXPECT_TRUE(test::bit_equal(got, rounded(want, qt))) << "decode_attention, " << detail::isa_name(ks->isa);
                    }
                    // The pages give the bits of the contiguous cache: both make the same choice
                    // of decode or flash (bf16 compute included).
                    Tensor pwant = test::poisoned(DType::f32, Shape{1, Hq, Lq, D});
                    paged_attention(q32, paged, {s}, o, pwant);
                    EXPECT_TRUE(test::bit_equal(pwant, want)) << "paged vs contiguous cache, float32 Q";
                    Tensor pgot = test::poisoned(qt, Shape{1, Hq, Lq, D});
                    paged_attention(q, paged, {s}, o, pgot);
                    EXPECT_TRUE(test::bit_equal(pgot, got)) << "paged vs contiguous cache, " << dn(qt) << " Q";
                }
            }
}

// A group of query blocks (flash_query_groups.hpp) converts a key block's 16-bit K/V rows once
// for all its tasks (Workspace::gk/gv): the bits of each task converting its own, and of float32
// tensors holding the same values. V holds NaN/±inf: under a mask every task zeroes them in its
// own copy for the keys it does not see, while another task of the group sees them (NaN out).
TEST(HalfForward, FlashGroupsShareConvertedTiles) {
    std::mt19937_64 rng(14);
    const std::int64_t B = 1, Hq = 2, Hkv = 1, L = 70, D = 24;
    const detail::FlashTiles grouped{16, 7, 0, 3}, alone{16, 7, 0, 1};
    const Tensor qm = test::randn(DType::f64, Shape{B, Hq, L, D}, rng);
    const Tensor km = test::randn(DType::f64, Shape{B, Hkv, L, D}, rng);
    Tensor vm = test::randn(DType::f64, Shape{B, Hkv, L, D}, rng);
    store(vm, 3 * D, NAN);  // key 3, dim 0
    store(vm, 40 * D + 5, INFINITY);
    const Tensor bool_mask = test::random_bool(Shape{B, 1, L, L}, rng, 0.7);
    for (int mask = 0; mask < 3; ++mask)
        for (DType kv : {DType::f16, DType::bf16})
            for (bool strided : {false, true}) {
                SCOPED_TRACE(std::string("K/V ") + dn(kv) + (strided ? ", strided" : "") +
                             (mask == 1 ? ", causal" : mask == 2 ? ", bool mask" : ""));
                SdpaOptions o;
                if (mask == 1) o.causal = Causal::top_left;
                if (mask == 2) o.bool_mask = bool_mask.view();
                const Placed q = place(qm.view(), DType::f32, strided), k = place(km.view(), kv, strided),
                             v = place(vm.view(), kv, strided);
                const Placed k32 = place(k.view, DType::f32, strided), v32 = place(v.view, DType::f32, strided);
                for (const detail::KernelSet* ks : detail::runnable_kernel_sets()) {
                    SCOPED_TRACE(std::string("isa ") + detail::isa_name(ks->isa));
                    Tensor out[3], lse[3];
                    for (int r = 0; r < 3; ++r) {  // 16-bit grouped, 16-bit alone, float32 alone
                        out[r] = test::poisoned(DType::f32, Shape{B, Hq, L, D});
                        lse[r] = test::poisoned(DType::f32, Shape{B, Hq, L});
                        const TensorView lv = lse[r].view();
                        const detail::SdpaProblem p = detail::make_problem(q.view, r < 2 ? k.view : k32.view,
                                                                           r < 2 ? v.view : v32.view, o, out[r].view(), &lv, nullptr);
                        detail::flash_forward(p, *ks, 2, r == 0 ? &grouped : &alone);
                    }
                    EXPECT_TRUE(test::bit_equal(out[0], out[1]) && test::bit_equal(lse[0], lse[1])) << "grouped vs alone";
                    EXPECT_TRUE(test::bit_equal(out[1], out[2]) && test::bit_equal(lse[1], lse[2])) << "16-bit vs float32";
                    bool nan_out = false;  // the NaN reached a query that sees key 3
                    for (std::int64_t e = 0; e < out[0].numel(); ++e) nan_out = nan_out || std::isnan(out[0].data_as<float>()[e]);
                    EXPECT_TRUE(nan_out);
                }
            }
}

// The group tiles (run_group's shared KvTile) under everything else a task does with a key
// block: dropout (the keep rule at each task's rows and the block's keys), the weights pass and
// the scores output. 16-bit K/V and float32 K/V with a strided head dim (both convert their
// tiles), GQA (a group spans the query heads of one KV head), odd head dims and lengths (the
// last key block partial), causal both alignments and windows (one bounding the right side:
// the tasks' ranges start together, end apart; one bounding the left: groups whose ranges start
// apart run task by task). Grouped = alone = the same call on float32 tensors, bit for bit.
// V is finite: a task whose Oᵀ ends non-finite computes its keys again on its own tiles
// (finish_task's careful path), which would hide a wrong shared tile.
TEST(HalfForward, FlashGroupTilesWithDropoutWeightsScores) {
    std::mt19937_64 rng(15);
    const std::int64_t B = 1, Hq = 4, Hkv = 2, Lq = 70, Lk = 61, Dk = 13, Dv = 11;
    const detail::FlashTiles grouped{16, 7, 0, 4}, alone{16, 7, 0, 1};
    const Tensor qm = test::randn(DType::f64, Shape{B, Hq, Lq, Dk}, rng);
    const Tensor km = test::randn(DType::f64, Shape{B, Hkv, Lk, Dk}, rng);
    const Tensor vm = test::randn(DType::f64, Shape{B, Hkv, Lk, Dv}, rng);
    for (int mask = 0; mask < 5; ++mask)
        for (int extra = 0; extra < 3; ++extra)  // dropout; dropout and weights; scores
            for (const auto& [kv, strided] : {std::pair{DType::f16, false}, std::pair{DType::bf16, true},
                                              std::pair{DType::f32, true}}) {
                SdpaOptions o;
                if (mask == 1) o.causal = Causal::top_left;
                if (mask == 2) o.causal = Causal::bottom_right;
                if (mask == 3) o.window = Window{-1, 5, Align::bottom_right};
                if (mask == 4) o.window = Window{23, 3, Align::top_left};
                if (extra < 2) o.dropout_p = 0.3, o.dropout_seed = 77;
                SCOPED_TRACE(std::string("K/V ") + dn(kv) + (strided ? ", strided" : "") + ", mask " +
                             std::to_string(mask) + (extra == 0 ? ", dropout" : extra == 1 ? ", dropout, weights" : ", scores"));
                const Placed q = place(qm.view(), DType::f32, false), k = place(km.view(), kv, strided),
                             v = place(vm.view(), kv, strided);
                const Placed k32 = place(k.view, DType::f32, false), v32 = place(v.view, DType::f32, false);
                for (const detail::KernelSet* ks : detail::runnable_kernel_sets()) {
                    SCOPED_TRACE(std::string("isa ") + detail::isa_name(ks->isa));
                    Tensor out[3], lse[3], side[3];  // side: the weights or the scores
                    for (int r = 0; r < 3; ++r) {  // converted grouped, converted alone, float32 in place alone
                        out[r] = test::poisoned(DType::f32, Shape{B, Hq, Lq, Dv});
                        lse[r] = test::poisoned(DType::f32, Shape{B, Hq, Lq});
                        side[r] = test::poisoned(DType::f32, Shape{B, Hq, Lq, Lk});
                        const TensorView lv = lse[r].view(), wv = side[r].view();
                        detail::SdpaProblem p = detail::make_problem(q.view, r < 2 ? k.view : k32.view, r < 2 ? v.view : v32.view,
                                                                     o, out[r].view(), &lv, extra == 1 ? &wv : nullptr);
                        if (extra == 2) detail::attach_scores(p, ScoresOutput{wv, ScoreStage::masked});
                        detail::flash_forward(p, *ks, 2, r == 0 ? &grouped : &alone);
                    }
                    EXPECT_FALSE(test::any_poisoned(out[0]) || test::any_poisoned(lse[0]) || (extra > 0 && test::any_poisoned(side[0])));
                    EXPECT_TRUE(test::bit_equal(out[0], out[1]) && test::bit_equal(lse[0], lse[1])) << "grouped vs alone";
                    EXPECT_TRUE(test::bit_equal(out[1], out[2]) && test::bit_equal(lse[1], lse[2])) << "converted vs float32";
                    if (extra > 0) {
                        EXPECT_TRUE(test::bit_equal(side[0], side[1])) << "weights/scores: grouped vs alone";
                        EXPECT_TRUE(test::bit_equal(side[1], side[2])) << "weights/scores: converted vs float32";
                    }
                }
            }
}

// sdpa_varlen with 16-bit K/V and sequences longer than 16 queries: no refusal, the flash
// kernel runs every sequence, and each matches the reference within the float32 bound.
TEST(HalfForward, VarlenSixteenBitKeysAndValues) {
    std::mt19937_64 rng(5);
    const std::int64_t H = 2, D = 16, Tq = 40, Tk = 60;
    Tensor cq(DType::i64, Shape{3}), ck(DType::i64, Shape{3});
    const std::int64_t cuq[] = {0, 30, 40}, cuk[] = {0, 35, 60};
    for (int i = 0; i < 3; ++i) cq.data_as<std::int64_t>()[i] = cuq[i], ck.data_as<std::int64_t>()[i] = cuk[i];
    const Tensor q = test::randn(DType::f32, Shape{Tq, H, D}, rng);
    for (DType kv : {DType::f16, DType::bf16}) {
        const Tensor k = test::to_storage(test::randn(DType::f32, Shape{Tk, H, D}, rng).view(), kv);
        const Tensor v = test::to_storage(test::randn(DType::f32, Shape{Tk, H, D}, rng).view(), kv);
        SdpaOptions o;
        o.causal = Causal::bottom_right;
        Tensor got = test::poisoned(DType::f32, Shape{Tq, H, D});
        sdpa_varlen(q, k, v, cq, ck, o, got);
        o.impl = Impl::reference;
        Tensor want = test::poisoned(DType::f64, Shape{Tq, H, D});
        sdpa_varlen(q, k, v, cq, ck, o, want);
        EXPECT_TRUE(test::all_close(got, want, kTol, kTol)) << dn(kv);
        o.impl = Impl::flash;  // explicitly: no "K/V are 16-bit" refusal any more
        Tensor got2 = test::poisoned(DType::f32, Shape{Tq, H, D});
        sdpa_varlen(q, k, v, cq, ck, o, got2);
        EXPECT_TRUE(test::all_close(got2, want, kTol, kTol)) << dn(kv) << ", impl flash";
    }
}

}  // namespace
}  // namespace attn
