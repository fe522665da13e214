// Non-finite values against the contract (docs/conventions.md, "Non-finite values"), on
// every kernel: flash forward (each kernel-table row, 1 and 2 threads), decode (each row,
// split and unsplit), the tiled backward (each row), and the reference.
//
// The oracle is the mechanism-free statement of the contract: a key whose weight is 0
// contributes nothing, whatever it holds. So for every poisoned problem (NaN, +inf or
// −inf in V or K at some key) the test also runs the *clean* problem — the same inputs
// with the poison replaced by 0 — and requires, element by element:
//   the reference of the poisoned problem is finite  →  the kernel's result is within
//       the tolerance of it and, for poison in V, bit-identical to the kernel's result on
//       the clean problem (rows that cannot see the poison must not notice it; the clean
//       run is checked against the reference). Poison in K changes the scores of rows that
//       see it (+inf·q_d < 0 is a score of −inf: weight 0, a finite row), so there only
//       the reference decides,
//   the reference is NaN / ±inf  →  the kernel gives NaN / the same ±inf (forward), or
//       some non-finite value (backward: its fp32 sums may turn inf into NaN).
// Poison sits at keys that some rows see and others do not, under every mask kind.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "attn/error.hpp"
#include "attn/reference.hpp"
#include "attn/sdpa.hpp"
#include "attn/tensor.hpp"
#include "common/util.hpp"
#include "kernels/backward/backward.hpp"
#include "kernels/decode/decode.hpp"
#include "kernels/flash/flash.hpp"
#include "kernels/isa.hpp"
#include "kernels/reference/reference.hpp"
#include "sdpa/problem.hpp"

namespace attn {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// float32 normal(0, 1), drawn in float: the stream these cases were written with.
Tensor randn(const Shape& s, std::mt19937& rng) { return test::randn<float>(DType::f32, s, rng); }

Tensor clone(const Tensor& t) {
    Tensor c(t.dtype(), t.shape());
    std::memcpy(c.data(), t.data(), t.nbytes());
    return c;
}

Tensor poisoned_f32(const Shape& s) {
    Tensor t(DType::f32, s);
    for (std::int64_t e = 0; e < t.numel(); ++e) t.data_as<float>()[e] = 12345.0f;  // never a result
    return t;
}

// Where the poison goes: tensor ('v' or 'k'), (b, kv head, key, dim) and value.
struct Poison {
    char tensor;
    std::int64_t b, h, j, d;
    float value;
};

struct Problem {
    std::string name;
    std::int64_t B = 1, Hq = 2, Hkv = 1, Lq = 100, Lk = 100, Dk = 16, Dv = 12;
    SdpaOptions opt;
    std::vector<Poison> poison;
    // mask storage; opts() points the options into it (after any copy of the Problem)
    std::vector<std::uint8_t> bools;
    std::vector<float> add;
    std::vector<std::int64_t> lens;
    SdpaOptions opts() const {
        SdpaOptions o = opt;
        if (!bools.empty()) o.bool_mask = TensorView(const_cast<std::uint8_t*>(bools.data()), DType::boolean, Shape{Lq, Lk});
        if (!add.empty()) o.additive_mask = TensorView(const_cast<float*>(add.data()), DType::f32, Shape{Lq, Lk});
        if (!lens.empty()) o.key_lengths = TensorView(const_cast<std::int64_t*>(lens.data()), DType::i64, Shape{B});
        return o;
    }
};

void put(Tensor& t, std::int64_t b, std::int64_t h, std::int64_t j, std::int64_t d, float x) {
    t.data_as<float>()[t.view().offset(b, h, j, d)] = x;
}

enum class Cls { finite, nan, pinf, ninf };
Cls cls(double x) { return std::isnan(x) ? Cls::nan : x == INFINITY ? Cls::pinf : x == -INFINITY ? Cls::ninf : Cls::finite; }

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

// got vs clean vs reference, element by element (see the top). `exact_class`: forward;
// `exact_clean`: the poison is in V only.
std::string compare(const char* what, const Tensor& got, const Tensor& clean, const Tensor& ref, bool exact_class,
                    bool exact_clean, double tol) {
    const float* g = got.data_as<const float>();
    const float* c = clean.data_as<const float>();
    for (std::int64_t e = 0; e < got.numel(); ++e) {
        const double r = ref.view().load_as_double(e);
        const Cls want = cls(r);
        bool ok;
        if (want == Cls::finite)
            ok = std::fabs(g[e] - r) <= tol * (1.0 + std::fabs(r)) && (!exact_clean || same_bits(g[e], c[e]));
        else ok = exact_class ? cls(g[e]) == want : cls(g[e]) != Cls::finite;
        if (!ok)
            return std::string(what) + "[" + std::to_string(e) + "] = " + std::to_string(g[e]) + ", clean run " +
                   std::to_string(c[e]) + ", reference " + std::to_string(r);
    }
    return {};
}

// Clean run against the reference: |Δ| ≤ tol·(1 + |ref|), tol the bound docs/conventions.md
// states for unit-scale inputs (kForwardTol, kBackwardTol).
constexpr double kForwardTol = 1e-5;   // out and lse ("16-bit inputs and outputs": the float32 bound)
constexpr double kBackwardTol = 2e-5;  // gradients ("Backward with 16-bit tensors": the float32 budget)

std::string close(const char* what, const Tensor& got, const Tensor& ref, double tol) {
    for (std::int64_t e = 0; e < got.numel(); ++e) {
        const double g = got.view().load_as_double(e), r = ref.view().load_as_double(e);
        if (cls(r) != Cls::finite ? cls(g) != cls(r) : !(std::fabs(g - r) <= tol * (1.0 + std::fabs(r))))
            return std::string(what) + "[" + std::to_string(e) + "] = " + std::to_string(g) + ", reference " + std::to_string(r);
    }
    return {};
}

struct Inputs {
    Tensor q, k, v, kc, vc;  // kc, vc: clean (poison → 0)
};

Inputs make_inputs(const Problem& P, std::uint32_t seed) {
    std::mt19937 rng(seed);
    Inputs in{randn({P.B, P.Hq, P.Lq, P.Dk}, rng), randn({P.B, P.Hkv, P.Lk, P.Dk}, rng), randn({P.B, P.Hkv, P.Lk, P.Dv}, rng), {}, {}};
    in.kc = clone(in.k);
    in.vc = clone(in.v);
    for (const Poison& x : P.poison) {
        put(x.tensor == 'v' ? in.v : in.k, x.b, x.h, x.j, x.d, x.value);
        put(x.tensor == 'v' ? in.vc : in.kc, x.b, x.h, x.j, x.d, 0.0f);
    }
    return in;
}

struct Fwd {
    Tensor out, lse;
};

// The reference of (q, k, v) as float32 outputs, through the same problem builder.
Fwd reference(const Problem& P, const Tensor& q, const Tensor& k, const Tensor& v) {
    Fwd f{Tensor(DType::f64, {P.B, P.Hq, P.Lq, P.Dv}), Tensor(DType::f64, {P.B, P.Hq, P.Lq})};
    const TensorView lse = f.lse.view();
    detail::reference_forward(detail::make_problem(q.view(), k.view(), v.view(), P.opts(), f.out.view(), &lse, nullptr));
    return f;
}

using Runner = std::function<void(const detail::SdpaProblem&)>;

Fwd run(const Problem& P, const Tensor& q, const Tensor& k, const Tensor& v, const Runner& kernel) {
    Fwd f{poisoned_f32({P.B, P.Hq, P.Lq, P.Dv}), poisoned_f32({P.B, P.Hq, P.Lq})};
    const TensorView lse = f.lse.view();
    kernel(detail::make_problem(q.view(), k.view(), v.view(), P.opts(), f.out.view(), &lse, nullptr));
    return f;
}

// One forward kernel on one problem: poisoned vs clean vs reference.
void check_forward(const Problem& P, const Runner& kernel, const std::string& tag) {
    const Inputs in = make_inputs(P, 7);
    const Fwd ref = reference(P, in.q, in.k, in.v), ref_clean = reference(P, in.q, in.kc, in.vc);
    const Fwd got = run(P, in.q, in.k, in.v, kernel), clean = run(P, in.q, in.kc, in.vc, kernel);
    const double tol = kForwardTol;
    const std::string where = P.name + " [" + tag + "]: ";
    EXPECT_EQ(close("clean out", clean.out, ref_clean.out, tol), "") << where;
    EXPECT_EQ(close("clean lse", clean.lse, ref_clean.lse, tol), "") << where;
    const bool v_only = std::all_of(P.poison.begin(), P.poison.end(), [](const Poison& x) { return x.tensor == 'v'; });
    EXPECT_EQ(compare("out", got.out, clean.out, ref.out, true, v_only, tol), "") << where;
    EXPECT_EQ(compare("lse", got.lse, clean.lse, ref.lse, true, v_only, tol), "") << where;
}

// The problems: every mask kind, poison at keys some rows see and others do not.
std::vector<Problem> problems(std::int64_t Lq, std::int64_t Lk) {
    std::vector<Problem> out;
    auto base = [&](const std::string& name) {
        Problem P;
        P.name = name;
        P.B = 2;
        P.Lq = Lq;
        P.Lk = Lk;
        return P;
    };
    const std::int64_t jl = Lk - 1, jm = Lk / 2 + 3;  // the last key; one inside the range
    for (float x : {kNaN, kInf, -kInf}) {
        const std::string xs = std::isnan(x) ? "NaN" : x > 0 ? "+inf" : "-inf";
        for (char t : {'v', 'k'}) {
            const std::string ts = std::string(1, t) + "=" + xs;
            const std::int64_t d = 3;
            {  // causal (bottom-right: with Lq < Lk the last keys are seen by the last rows only)
                Problem P = base("causal " + ts);
                P.opt.causal = Causal::bottom_right;
                P.poison = {{t, 0, 0, jl, d, x}, {t, 1, 0, jm, d, x}};
                out.push_back(P);
            }
            {  // window: key jm is seen by a band of rows only
                Problem P = base("window " + ts);
                P.opt.window = Window{5, 2, Align::bottom_right};
                P.poison = {{t, 0, 0, jm, d, x}};
                out.push_back(P);
            }
            {  // key lengths: keys past 1/3 of Lk are padding in sequence 0, visible in 1
                Problem P = base("key lengths " + ts);
                P.lens = {Lk / 3, Lk};
                P.poison = {{t, 0, 0, jm, d, x}, {t, 1, 0, jm, d, x}, {t, 0, 0, jl, d, x}};
                out.push_back(P);
            }
            {  // bool mask: key jm hidden from even rows
                Problem P = base("bool " + ts);
                P.bools.assign(static_cast<std::size_t>(Lq * Lk), 1);
                for (std::int64_t i = 0; i < Lq; i += 2) P.bools[static_cast<std::size_t>(i * Lk + jm)] = 0;
                P.poison = {{t, 0, 0, jm, d, x}, {t, 1, 0, jm, d, x}};
                out.push_back(P);
            }
            {  // additive −inf hides key jm from rows i % 3 == 0; +inf on a bool-masked key
                Problem P = base("additive -inf " + ts);
                P.add.assign(static_cast<std::size_t>(Lq * Lk), 0.25f);
                P.bools.assign(static_cast<std::size_t>(Lq * Lk), 1);
                for (std::int64_t i = 0; i < Lq; i += 3) P.add[static_cast<std::size_t>(i * Lk + jm)] = -kInf;
                for (std::int64_t i = 0; i < Lq; ++i) {
                    P.add[static_cast<std::size_t>(i * Lk + 1)] = kInf;
                    P.bools[static_cast<std::size_t>(i * Lk + 1)] = 0;
                }
                P.poison = {{t, 0, 0, jm, d, x}, {t, 1, 0, 1, d, x}};
                out.push_back(P);
            }
            {  // rows with no visible key: sequence 0 has no keys at all, all its V/K poisoned
                Problem P = base("no visible key " + ts);
                P.lens = {0, Lk / 2};
                for (std::int64_t j = 0; j < Lk; j += 7) P.poison.push_back({t, 0, 0, j, d, x});
                P.poison.push_back({t, 1, 0, Lk / 2 + 1, d, x});
                out.push_back(P);
            }
        }
    }
    return out;
}

// The default tiles, odd ones, and a forced key split (a chunk's non-finite partial: the merge recomputes).
const detail::FlashTiles kTileSets[] = {{64, 64}, {16, 7}, {32, 16, 3}, {16, 7, 0, 4}};

TEST(NonFinite, FlashEveryRowAndThreads) {
    for (const Problem& P : problems(130, 130))
        for (const detail::KernelSet* row : detail::runnable_kernel_sets())
            for (int threads : {1, 2})
                for (const detail::FlashTiles& t : kTileSets) {
                    const std::string tag = std::string(detail::isa_name(row->isa)) + ", " + std::to_string(threads) +
                                            " threads, tiles " + std::to_string(t.Mb) + "x" + std::to_string(t.Nb);
                    check_forward(P, [&](const detail::SdpaProblem& p) { detail::flash_forward(p, *row, threads, &t); }, tag);
                    if (HasFailure()) return;
                }
}

TEST(NonFinite, FlashShortQueries) {  // Lq < Mb: several heads share one block
    for (const Problem& P : problems(20, 150))
        for (const detail::KernelSet* row : detail::runnable_kernel_sets()) {
            check_forward(P, [&](const detail::SdpaProblem& p) { detail::flash_forward(p, *row, 2, nullptr); },
                          detail::isa_name(row->isa));
            if (HasFailure()) return;
        }
}

// One-panel tasks (2 heads × 8 queries = 16 rows) whose heads pass the L2 (9500 keys × 28
// floats: 1.01 MiB) copy their float32 tiles (flash_pack_one_panel): the selecting and careful
// paths then read and split V in the workspace, as for 16-bit K/V.
TEST(NonFinite, FlashOnePanelLargeHeads) {
    ASSERT_TRUE(detail::flash_pack_one_panel(9500 * 28 * 4));
    for (const Problem& P : problems(8, 9500))
        for (const detail::KernelSet* row : detail::runnable_kernel_sets()) {
            check_forward(P, [&](const detail::SdpaProblem& p) { detail::flash_forward(p, *row, 2, nullptr); },
                          detail::isa_name(row->isa));
            if (HasFailure()) return;
        }
}

TEST(NonFinite, DecodeEveryRowAndSplit) {
    for (Problem P : problems(4, 300)) {
        P.Hq = 4;
        P.Hkv = 2;
        for (const detail::KernelSet* row : detail::runnable_kernel_sets())
            for (std::int64_t split : {1, 3}) {
                check_forward(P, [&](const detail::SdpaProblem& p) { detail::decode_forward(p, *row, split); },
                              std::string(detail::isa_name(row->isa)) + ", split " + std::to_string(split));
                if (HasFailure()) return;
            }
    }
}

// With dropout, a dropped weight is 0 too: a NaN in V at a dropped key must not reach the row.
TEST(NonFinite, FlashDropout) {
    for (Problem P : problems(70, 70)) {
        P.opt.dropout_p = 0.4;
        P.opt.dropout_seed = 99;
        for (const detail::KernelSet* row : detail::runnable_kernel_sets()) {
            check_forward(P, [&](const detail::SdpaProblem& p) { detail::flash_forward(p, *row, 1, nullptr); },
                          detail::isa_name(row->isa));
            if (HasFailure()) return;
        }
    }
}

// The tiled backward: gradients of the poisoned problem vs the clean one vs the reference
// backward (out/lse from the reference forward of each problem).
TEST(NonFinite, BackwardEveryRow) {
    for (const Problem& P : problems(70, 70)) {
        const Inputs in = make_inputs(P, 11);
        std::mt19937 rng(5);
        const Tensor dO = randn({P.B, P.Hq, P.Lq, P.Dv}, rng);
        auto grads = [&](const Tensor& k, const Tensor& v, bool reference_kernel, const detail::KernelSet* row) {
            const Fwd f = reference(P, in.q, k, v);
            Tensor out32 = test::to_storage(f.out, DType::f32), lse32 = test::to_storage(f.lse, DType::f32);
            std::vector<Tensor> g;
            for (const Tensor* t : {&in.q, &k, &v}) g.push_back(poisoned_f32(t->shape()));
            const TensorView lse = lse32.view();
            detail::BackwardProblem bp{detail::make_problem(in.q.view(), k.view(), v.view(), P.opts(), out32.view(), &lse, nullptr),
                                       dO.view(), g[0].view(), g[1].view(), g[2].view(), std::nullopt};
            if (reference_kernel) detail::reference_backward(bp);
            else detail::flash_backward(bp, *row);
            return g;
        };
        const auto ref = grads(in.k, in.v, true, nullptr);
        const bool v_only = std::all_of(P.poison.begin(), P.poison.end(), [](const Poison& x) { return x.tensor == 'v'; });
        const double tol = kBackwardTol;
        for (const detail::KernelSet* row : detail::runnable_kernel_sets()) {
            const auto got = grads(in.k, in.v, false, row), clean = grads(in.kc, in.vc, false, row);
            const char* names[] = {"dq", "dk", "dv"};
            for (int x = 0; x < 3; ++x)
                EXPECT_EQ(compare(names[x], got[static_cast<std::size_t>(x)], clean[static_cast<std::size_t>(x)],
                                  ref[static_cast<std::size_t>(x)], false, v_only, tol), "")
                    << P.name << " [" << detail::isa_name(row->isa) << "]";
            if (HasFailure()) return;
        }
    }
}

// A NaN score a row can see: out and lse NaN (not lse −inf, the "no visible key" marker).
TEST(NonFinite, VisibleNaNScoreGivesNaNLse) {
    Problem P;
    P.name = "visible NaN in K";
    P.Lq = 3;
    P.Lk = 90;
    P.poison = {{'k', 0, 0, 80, 0, kNaN}};
    const Inputs in = make_inputs(P, 3);
    const std::vector<std::pair<std::string, Runner>> kernels = {
        {"flash", [](const detail::SdpaProblem& p) { detail::flash_forward(p, detail::kernel_set(), 1, nullptr); }},
        {"decode", [](const detail::SdpaProblem& p) { detail::decode_forward(p, detail::kernel_set(), 2); }},
        {"reference", [](const detail::SdpaProblem& p) { detail::reference_forward(p); }}};
    for (const auto& [name, kernel] : kernels) {
        const Fwd f = run(P, in.q, in.k, in.v, kernel);
        for (std::int64_t r = 0; r < P.Hq * P.Lq; ++r) {
            EXPECT_TRUE(std::isnan(f.lse.data_as<float>()[r])) << name << " row " << r;
            EXPECT_TRUE(std::isnan(f.out.data_as<float>()[r * P.Dv])) << name << " row " << r;
        }
    }
}

// Hugging Face's convention: a finite −FLT_MAX bias is a score, not a mask. A row whose
// every key carries it gets uniform weights over its key interval (out = mean of V, as in
// torch), a row where it covers some keys ignores those; float64 masks below −FLT_MAX too.
TEST(NonFinite, MinusFltMaxIsAFiniteScore) {
    for (DType mdt : {DType::f32, DType::f64}) {
        Problem P;
        P.name = std::string("-FLT_MAX bias ") + std::string(dtype_name(mdt));
        P.Lq = 6;
        P.Lk = 80;
        P.B = 1;
        P.Hq = P.Hkv = 1;
        const double big = mdt == DType::f32 ? -static_cast<double>(FLT_MAX) : -1e300;
        std::vector<double> m64(static_cast<std::size_t>(P.Lq * P.Lk), 0.0);
        for (std::int64_t j = 0; j < P.Lk; ++j) {
            m64[static_cast<std::size_t>(0 * P.Lk + j)] = big;                        // row 0: all keys
            if (j % 2) m64[static_cast<std::size_t>(1 * P.Lk + j)] = big;             // row 1: odd keys
        }
        std::vector<float> m32(m64.begin(), m64.end());
        for (std::size_t e = 0; e < m32.size(); ++e) m32[e] = static_cast<float>(std::max(m64[e], -static_cast<double>(FLT_MAX)));
        P.opt.additive_mask = mdt == DType::f32 ? TensorView(m32.data(), DType::f32, Shape{P.Lq, P.Lk})
                                                : TensorView(m64.data(), DType::f64, Shape{P.Lq, P.Lk});
        P.opt.causal = Causal::bottom_right;  // row i sees keys 0 .. Lk − Lq + i
        const Inputs in = make_inputs(P, 9);
        std::vector<std::pair<std::string, Runner>> kernels;
        for (const detail::KernelSet* row : detail::runnable_kernel_sets()) {
            kernels.push_back({std::string("flash ") + detail::isa_name(row->isa),
                               [row](const detail::SdpaProblem& p) { detail::flash_forward(p, *row, 1, nullptr); }});
            kernels.push_back({std::string("decode ") + detail::isa_name(row->isa),
                               [row](const detail::SdpaProblem& p) { detail::decode_forward(p, *row, 1); }});
        }
        kernels.push_back({"reference", [](const detail::SdpaProblem& p) { detail::reference_forward(p); }});
        const std::int64_t n0 = P.Lk - P.Lq + 1;  // keys row 0 sees
        for (const auto& [name, kernel] : kernels) {
            const Fwd f = run(P, in.q, in.k, in.v, kernel);
            for (std::int64_t d = 0; d < P.Dv; ++d) {
                double mean = 0.0;
                for (std::int64_t j = 0; j < n0; ++j) mean += in.v.data_as<float>()[in.v.view().offset(0, 0, j, d)];
                mean /= static_cast<double>(n0);
                EXPECT_NEAR(f.out.data_as<float>()[d], mean, 1e-5 * (1.0 + std::fabs(mean))) << P.name << " " << name << " d " << d;
            }
            // row 1: only the even keys count (the odd ones carry −FLT_MAX next to finite scores)
            const Fwd ref = reference(P, in.q, in.k, in.v);
            EXPECT_EQ(close("out", f.out, ref.out, kForwardTol), "") << P.name << " " << name;
            if (name == "reference") continue;
            EXPECT_TRUE(std::isfinite(f.lse.data_as<float>()[0]) && f.lse.data_as<float>()[0] < -3e38)
                << P.name << " " << name << ": lse " << f.lse.data_as<float>()[0];
        }
    }
}

// The backward of such rows, on every tiled-backward row: a row whose every key carries a
// huge finite bias has lse ≈ the bias. The tile took P = 2^(s·log2 e − lse·log2 e) with the
// first product exact (an fma) and the second rounded: at −1e10 … −1e30 the two differ by
// 2^(≥ 190), P = inf, and a padded row (grad_out 0, as a training loss gives it) poisoned
// every dK/dV with inf·0 = NaN; at −FLT_MAX P was 0. With lse subtracted first P stays
// finite: the padded row adds exactly nothing and the other rows match the reference.
TEST(NonFinite, HugeFiniteBiasBackwardOfAPaddedRow) {
    for (const float big : {-1e10f, -1e30f, -FLT_MAX}) {
        Problem P;
        P.name = "bias " + std::to_string(big);
        P.B = 1;
        P.Lq = 70;  // two query tiles
        P.Lk = 70;
        P.Hq = 2;
        P.Hkv = 1;
        P.add.assign(static_cast<std::size_t>(P.Lq * P.Lk), 0.0f);
        for (std::int64_t j = 0; j < P.Lk; ++j) {
            P.add[static_cast<std::size_t>(3 * P.Lk + j)] = big;              // row 3: every key (padding)
            if (j % 3 == 0) P.add[static_cast<std::size_t>(5 * P.Lk + j)] = big;  // row 5: some keys
        }
        const Inputs in = make_inputs(P, 21);
        std::mt19937 rng(8);
        Tensor dO = randn({P.B, P.Hq, P.Lq, P.Dv}, rng);
        for (std::int64_t h = 0; h < P.Hq; ++h)
            for (std::int64_t d = 0; d < P.Dv; ++d) dO.data_as<float>()[dO.view().offset(0, h, 3, d)] = 0.0f;
        const Fwd f = reference(P, in.q, in.k, in.v);
        Tensor out32 = test::to_storage(f.out, DType::f32), lse32 = test::to_storage(f.lse, DType::f32);
        ASSERT_LT(lse32.data_as<float>()[3], 0.5f * big) << P.name;  // the padded row's lse is the bias
        auto grads = [&](const detail::KernelSet* row) {
            std::vector<Tensor> g;
            for (const Tensor* t : {&in.q, &in.k, &in.v}) g.push_back(poisoned_f32(t->shape()));
            const TensorView lse = lse32.view();
            detail::BackwardProblem bp{detail::make_problem(in.q.view(), in.k.view(), in.v.view(), P.opts(), out32.view(), &lse, nullptr),
                                       dO.view(), g[0].view(), g[1].view(), g[2].view(), std::nullopt};
            if (row == nullptr) detail::reference_backward(bp);
            else detail::flash_backward(bp, *row);
            return g;
        };
        const auto ref = grads(nullptr);
        for (const detail::KernelSet* row : detail::runnable_kernel_sets()) {
            const auto got = grads(row);
            const char* names[] = {"dq", "dk", "dv"};
            for (std::size_t x = 0; x < 3; ++x)
                EXPECT_EQ(close(names[x], got[x], ref[x], kBackwardTol), "") << P.name << " [" << detail::isa_name(row->isa) << "]";
            if (HasFailure()) return;
        }
    }
}

// ── Large finite V ──────────────────────────────────────────────────────────────────
// V near ±FLT_MAX: the output is a weighted mean of V rows (at most max|v|), so it must be
// finite and as accurate as for ordinary V, although the kernels' unnormalised Σ p·v
// overflows fp32. The error scale of each element is the reference run on |V| (Σ p·|v|):
// rows that see only tiny V next to a block of huge V (masked for them) must keep their
// relative accuracy, so scaling all of V down to avoid the overflow would fail here.

// How V is filled: huge magnitudes at keys ≥ first_large (random sign unless positive),
// tiny ones (1e-30·randn) before it.
struct LargeV {
    std::string name;
    std::int64_t first_large;
    bool positive;
    float tiny;
    float constant = 0.0f;  // not 0: every huge entry is exactly this
};

Tensor make_large_v(const Problem& P, const LargeV& how, std::uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> n(0.0f, 1.0f);
    std::uniform_real_distribution<float> mag(0.5f, 0.99f);
    Tensor v(DType::f32, {P.B, P.Hkv, P.Lk, P.Dv});
    for (std::int64_t b = 0; b < P.B; ++b)
        for (std::int64_t h = 0; h < P.Hkv; ++h)
            for (std::int64_t j = 0; j < P.Lk; ++j)
                for (std::int64_t d = 0; d < P.Dv; ++d) {
                    float x = how.tiny * n(rng);
                    if (j >= how.first_large) {
                        x = mag(rng) * FLT_MAX;
                        if (!how.positive && n(rng) < 0.0f) x = -x;
                        if (how.constant != 0.0f) x = how.constant;
                    }
                    put(v, b, h, j, d, x);
                }
    return v;
}

void check_large_v(const Problem& P, const LargeV& how, const Runner& kernel, const std::string& tag) {
    std::mt19937 rng(21);
    const Tensor q = randn({P.B, P.Hq, P.Lq, P.Dk}, rng), k = randn({P.B, P.Hkv, P.Lk, P.Dk}, rng);
    const Tensor v = make_large_v(P, how, 5);
    Tensor vabs = clone(v);
    for (std::int64_t e = 0; e < vabs.numel(); ++e) vabs.data_as<float>()[e] = std::fabs(vabs.data_as<float>()[e]);
    const Fwd ref = reference(P, q, k, v), ref_abs = reference(P, q, k, vabs);
    const Fwd got = run(P, q, k, v, kernel);
    const double tol = kForwardTol;  // relative to Σ_j w_ij·|v_jd|: V's scale here is huge
    const std::string where = P.name + " " + how.name + " [" + tag + "]: ";
    for (std::int64_t e = 0; e < got.out.numel(); ++e) {
        const double g = got.out.data_as<float>()[e], r = ref.out.data_as<double>()[e];
        const double bound = tol * ref_abs.out.data_as<double>()[e];
        if (!(std::isfinite(g) && std::fabs(g - r) <= bound)) {
            ADD_FAILURE() << where << "out[" << e << "] = " << g << ", reference " << r << ", allowed error " << bound;
            return;
        }
    }
    EXPECT_EQ(close("lse", got.lse, ref.lse, tol), "") << where;  // V does not enter lse
}

std::vector<std::pair<Problem, LargeV>> large_v_problems(std::int64_t Lq, std::int64_t Lk) {
    std::vector<std::pair<Problem, LargeV>> out;
    Problem P;
    P.B = 2;
    P.Lq = Lq;
    P.Lk = Lk;
    P.name = "no mask";
    out.push_back({P, {"all huge, random signs", 0, false, 1e-30f}});
    out.push_back({P, {"all huge, positive", 0, true, 1e-30f}});
    // The mean of equal values is that value: exactly ±FLT_MAX, not a rounding past it to ±inf.
    out.push_back({P, {"all = FLT_MAX", 0, true, 0.0f, FLT_MAX}});
    out.push_back({P, {"all = -FLT_MAX", 0, true, 0.0f, -FLT_MAX}});
    P.name = "causal bottom-right";
    P.opt.causal = Causal::bottom_right;  // the last keys are seen by the last rows only
    out.push_back({P, {"huge last keys, tiny others", Lk - 5, false, 1e-30f}});
    out.push_back({P, {"huge last keys, positive", Lk - 5, true, 1.0f}});
    P.name = "causal top-left";
    P.opt.causal = Causal::top_left;
    out.push_back({P, {"huge keys from the middle", Lk / 2, true, 1e-30f}});
    // Rows that see only tiny V next to rows that see huge V, in every task (decode too).
    P.name = "bool mask hides the huge keys from even rows";
    P.opt.causal = Causal::none;
    P.bools.assign(static_cast<std::size_t>(Lq * Lk), 1);
    for (std::int64_t i = 0; i < Lq; i += 2)
        for (std::int64_t j = Lk - 40; j < Lk; ++j) P.bools[static_cast<std::size_t>(i * Lk + j)] = 0;
    out.push_back({P, {"huge last 40 keys, tiny others", Lk - 40, false, 1e-30f}});
    return out;
}

TEST(LargeV, FlashEveryRowAndThreads) {
    for (const auto& [P, how] : large_v_problems(130, 150))
        for (const detail::KernelSet* row : detail::runnable_kernel_sets())
            for (int threads : {1, 2})
                for (const detail::FlashTiles& t : kTileSets) {
                    const std::string tag = std::string(detail::isa_name(row->isa)) + ", " + std::to_string(threads) +
                                            " threads, tiles " + std::to_string(t.Mb) + "x" + std::to_string(t.Nb);
                    check_large_v(P, how, [&](const detail::SdpaProblem& p) { detail::flash_forward(p, *row, threads, &t); }, tag);
                    if (HasFailure()) return;
                }
}

TEST(LargeV, FlashShortQueriesAndDropout) {
    for (auto [P, how] : large_v_problems(20, 150)) {
        for (const detail::KernelSet* row : detail::runnable_kernel_sets()) {
            check_large_v(P, how, [&](const detail::SdpaProblem& p) { detail::flash_forward(p, *row, 2, nullptr); },
                          detail::isa_name(row->isa));
            if (HasFailure()) return;
        }
        if (how.positive) continue;  // dropout's 1/(1−p) may take a mean of huge positives past FLT_MAX
        P.opt.dropout_p = 0.3;
        P.opt.dropout_seed = 4;
        P.name += ", dropout";
        check_large_v(P, how, [&](const detail::SdpaProblem& p) { detail::flash_forward(p, detail::kernel_set(), 1, nullptr); },
                      "dropout");
        if (HasFailure()) return;
    }
}

// The careful path on one-panel tasks whose float32 tiles are copied (NonFinite.FlashOnePanelLargeHeads).
TEST(LargeV, FlashOnePanelLargeHeads) {
    for (const auto& [P, how] : large_v_problems(8, 9500))
        for (const detail::KernelSet* row : detail::runnable_kernel_sets()) {
            check_large_v(P, how, [&](const detail::SdpaProblem& p) { detail::flash_forward(p, *row, 2, nullptr); },
                          detail::isa_name(row->isa));
            if (HasFailure()) return;
        }
}

TEST(LargeV, DecodeEveryRowAndSplit) {
    for (auto [P, how] : large_v_problems(3, 700)) {
        P.Hq = 4;
        P.Hkv = 2;
        for (const detail::KernelSet* row : detail::runnable_kernel_sets())
            for (std::int64_t split : {1, 3}) {
                check_large_v(P, how, [&](const detail::SdpaProblem& p) { detail::decode_forward(p, *row, split); },
                              std::string(detail::isa_name(row->isa)) + ", split " + std::to_string(split));
                if (HasFailure()) return;
            }
    }
}

// scale must be finite as a float32: 1e39 is finite as a double only.
TEST(NonFinite, ScaleMustBeFiniteInFloat32) {
    Tensor q(DType::f32, {1, 1, 2, 4}), k(DType::f32, {1, 1, 3, 4}), v(DType::f32, {1, 1, 3, 4}), o(DType::f32, {1, 1, 2, 4});
    for (double s : {1e39, -1e39, 3.5e38, static_cast<double>(INFINITY), std::nan("")}) {
        SdpaOptions opt;
        opt.scale = s;
        try {
            detail::make_problem(q.view(), k.view(), v.view(), opt, o.view(), nullptr, nullptr);
            ADD_FAILURE() << "scale " << s << " accepted";
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find("scale: must be finite in float32"), std::string::npos) << e.what();
        }
    }
    SdpaOptions ok;
    ok.scale = 3.0e38;  // finite in float32: accepted
    EXPECT_NO_THROW(detail::make_problem(q.view(), k.view(), v.view(), ok, o.view(), nullptr, nullptr));
}

}  // namespace
}  // namespace attn
