// sdpa_varlen / sdpa_varlen_backward against two oracles:
//   1. each sequence run on its own through attn::sdpa / sdpa_backward on contiguous copies:
//      must agree bit for bit (varlen is that computation on strided views; the kernels'
//      results depend on neither the strides nor the thread count — docs/kernels.md, "Parallel
//      split and scaling");
//   2. the padded batch (N, H, Lmax, D) with key_lengths = Lk_b (and query_offset = Lk_b − Lq_b
//      for bottom-right, which in a padded batch would be Lk_b − Lmax) through the double
//      reference, within docs/conventions.md's bounds: forward 1e-5·(1 + |ref|) per element,
//      gradients 2e-5 of the largest reference gradient (tests/grad/test_backward.cpp's budget).
// Lengths include 0 (a sequence without queries or without keys), GQA, every causal
// alignment, windows, query offsets (one and per sequence), dropout (one-by-one oracle only:
// its stream is per sequence), on every kernel-table row the CPU has (runnable_kernel_sets).
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "attn/error.hpp"
#include "common/address_space.hpp"
#include "attn/sdpa_backward.hpp"
#include "attn/sdpa_varlen.hpp"
#include "kernels/isa.hpp"
#include "sdpa/problem.hpp"
#include "varlen/head_major.hpp"
#include "varlen/packed.hpp"
#include "varlen/varlen_util.hpp"

namespace attn::test {
namespace {

constexpr double kForwardTol = 1e-5, kTol = 2e-5;  // see the header

struct Packed {
    VarlenCase c;
    Tensor q, k, v, cq, ck, offsets, sinks, slopes;
    SdpaOptions opt;
};

Packed make_packed(const VarlenCase& c, std::uint64_t seed) {
    std::mt19937_64 rng(seed);
    Packed p;
    p.c = c;
    p.q = randn(DType::f32, Shape{c.Tq(), c.Hq, c.Dk}, rng);
    p.k = randn(DType::f32, Shape{c.Tk(), c.Hkv, c.Dk}, rng);
    p.v = randn(DType::f32, Shape{c.Tk(), c.Hkv, c.Dv}, rng);
    p.cq = cu_seqlens(c.lq, rng() % 2 ? DType::i32 : DType::i64);
    p.ck = cu_seqlens(c.lk, rng() % 2 ? DType::i32 : DType::i64);
    p.opt.causal = c.causal;
    p.opt.window = c.window;
    p.opt.dropout_p = c.dropout;
    p.opt.dropout_seed = seed * 31 + 7;
    if (c.offsets == 1) p.opt.query_offset = QueryOffset(c.offset_value);
    if (c.offsets == 2) {
        p.offsets = Tensor(DType::i64, Shape{c.N()});
        for (std::int64_t b = 0; b < c.N(); ++b) p.offsets.data_as<std::int64_t>()[b] = static_cast<std::int64_t>(rng() % 9) - 2;
        p.opt.query_offset = QueryOffset(p.offsets.view());
    }
    if (c.sinks) {
        p.sinks = randn(DType::f32, Shape{c.Hq}, rng);
        p.opt.sinks = p.sinks.view();
    }
    p.opt.softcap = c.softcap;
    if (c.alibi != 0) {  // positive slopes, different per head (and per sequence)
        p.slopes = Tensor(DType::f32, c.alibi == 1 ? Shape{c.Hq} : Shape{c.N(), c.Hq});
        for (std::int64_t i = 0; i < p.slopes.numel(); ++i)
            p.slopes.data_as<float>()[i] = 0.05f + 0.3f * static_cast<float>(rng() % 1000) / 1000.0f;
        p.opt.alibi_slopes = p.slopes.view();
    }
    return p;
}

// Sequence b's options for the one-by-one oracle: its offset, its dropout seed, its row of
// per-sequence ALiBi slopes ((1, Hq): a batch of one).
SdpaOptions options_of_sequence(const Packed& p, std::int64_t b);

// Sequence b's diagonal offset as one number (what the per-sequence oracles pass).
std::optional<QueryOffset> offset_of_sequence(const Packed& p, std::int64_t b) {
    if (p.c.offsets == 1) return QueryOffset(p.c.offset_value);
    if (p.c.offsets == 2) return QueryOffset(p.offsets.data_as<std::int64_t>()[b]);
    return std::nullopt;
}

SdpaOptions options_of_sequence(const Packed& p, std::int64_t b) {
    SdpaOptions o = p.opt;
    o.query_offset = offset_of_sequence(p, b);
    o.dropout_seed = varlen_dropout_seed(*p.opt.dropout_seed, b);
    if (p.c.alibi == 2) o.alibi_slopes = p.slopes.view().slice(0, b, 1);
    return o;
}

// Rows [start, start + len) of packed (T, H[, D]) equal, bit for bit, to a (1, H, len[, D]) tensor.
::testing::AssertionResult rows_bit_equal(const TensorView& packed, std::int64_t start, const TensorView& seq) {
    const std::int64_t D = seq.rank() == 4 ? seq.dim(3) : 1;
    for (std::int64_t h = 0; h < seq.dim(1); ++h)
        for (std::int64_t t = 0; t < seq.dim(2); ++t)
            for (std::int64_t d = 0; d < D; ++d) {
                const float got = static_cast<float>(load(packed, offset_of(packed, Index{start + t, h, seq.rank() == 4 ? d : 0, 0})));
                const float want = static_cast<float>(load(seq, offset_of(seq, Index{0, h, t, d})));
                if (std::memcmp(&got, &want, 4) != 0) {
                    return ::testing::AssertionFailure() << "row " << start + t << " head " << h << " d " << d << ": got "
                                                         << got << ", one-by-one " << want;
                }
            }
    return ::testing::AssertionSuccess();
}

// Every element of rows [start, start + len) of a packed view equals x.
bool rows_equal(const TensorView& packed, std::int64_t start, std::int64_t len, double x) {
    bool ok = true;
    for_each_offset(packed.slice(0, start, len), [&](std::int64_t off) {
        ok = ok && load(packed.slice(0, start, len), off) == x;
    });
    return ok;
}

struct Forward {
    Tensor out, lse_storage;
    TensorView lse;
};

// The varlen forward, outputs poisoned; lse in FlashAttention's (H, T) buffer seen transposed
// when `transposed_lse`.
Forward run_varlen(const Packed& p, bool transposed_lse, SdpaReport* report = nullptr) {
    Forward f;
    f.out = poisoned(DType::f32, Shape{p.c.Tq(), p.c.Hq, p.c.Dv});
    if (transposed_lse) {
        f.lse_storage = poisoned(DType::f32, Shape{p.c.Hq, p.c.Tq()});
        f.lse = f.lse_storage.view().transpose(0, 1);
    } else {
        f.lse_storage = poisoned(DType::f32, Shape{p.c.Tq(), p.c.Hq});
        f.lse = f.lse_storage.view();
    }
    sdpa_varlen(p.q, p.k, p.v, p.cq, p.ck, p.opt, f.out, &f.lse, report);
    return f;
}

void check_one_by_one(const Packed& p, const Forward& f) {
    std::int64_t q0 = 0, k0 = 0;
    for (std::int64_t b = 0; b < p.c.N(); ++b) {
        const std::int64_t lq = p.c.lq[b], lk = p.c.lk[b];
        SCOPED_TRACE("sequence " + std::to_string(b));
        if (lq > 0 && lk == 0) {
            EXPECT_TRUE(rows_equal(f.out, q0, lq, 0.0));
            for (std::int64_t h = 0; h < p.c.Hq; ++h)  // no key: the sink is the only logit
                EXPECT_TRUE(rows_equal(f.lse.slice(1, h, 1), q0, lq, p.c.sinks ? at(p.sinks, h) : -INFINITY)) << "head " << h;
        } else if (lq > 0) {
            const SdpaOptions o = options_of_sequence(p, b);
            const Tensor out = poisoned(DType::f32, Shape{1, p.c.Hq, lq, p.c.Dv});
            const Tensor lse = poisoned(DType::f32, Shape{1, p.c.Hq, lq});
            const TensorView lv = lse.view();
            sdpa(rows_of(p.q, q0, lq), rows_of(p.k, k0, lk), rows_of(p.v, k0, lk), o, out, &lv);
            EXPECT_TRUE(rows_bit_equal(f.out, q0, out));
            EXPECT_TRUE(rows_bit_equal(f.lse, q0, lse));
        }
        q0 += lq, k0 += lk;
    }
}

// The padded batch's options: key_lengths = Lk_b; bottom-right (and any given offsets) as
// query_offset per sequence, since a padded batch aligns to Lk_b − Lmax.
struct Padded {
    Tensor q, k, v, kl, off;
    SdpaOptions opt;
    std::int64_t Lq = 0, Lk = 0;
};

Padded make_padded(const Packed& p) {
    Padded d;
    const VarlenCase& c = p.c;
    for (std::int64_t b = 0; b < c.N(); ++b) d.Lq = std::max(d.Lq, c.lq[b]), d.Lk = std::max(d.Lk, c.lk[b]);
    d.q = Tensor(DType::f64, Shape{c.N(), c.Hq, d.Lq, c.Dk}, true);
    d.k = Tensor(DType::f64, Shape{c.N(), c.Hkv, d.Lk, c.Dk}, true);
    d.v = Tensor(DType::f64, Shape{c.N(), c.Hkv, d.Lk, c.Dv}, true);
    d.kl = Tensor(DType::i64, Shape{c.N()});
    d.off = Tensor(DType::i64, Shape{c.N()});
    std::int64_t q0 = 0, k0 = 0;
    for (std::int64_t b = 0; b < c.N(); ++b) {
        copy_rows_into(p.q, q0, c.lq[b], d.q, b);
        copy_rows_into(p.k, k0, c.lk[b], d.k, b);
        copy_rows_into(p.v, k0, c.lk[b], d.v, b);
        d.kl.data_as<std::int64_t>()[b] = c.lk[b];
        const auto given = offset_of_sequence(p, b);
        const bool bottom_right = c.causal == Causal::bottom_right || (c.window.active() && c.window.align == Align::bottom_right);
        d.off.data_as<std::int64_t>()[b] = given ? given->value : bottom_right ? c.lk[b] - c.lq[b] : 0;
        q0 += c.lq[b], k0 += c.lk[b];
    }
    d.opt = p.opt;
    d.opt.key_lengths = d.kl.view();
    d.opt.query_offset = QueryOffset(d.off.view());
    d.opt.impl = Impl::reference;
    return d;
}

void check_padded(const Packed& p, const Forward& f) {
    const Padded d = make_padded(p);
    const Tensor out = poisoned(DType::f64, Shape{p.c.N(), p.c.Hq, d.Lq, p.c.Dv});
    const Tensor lse = poisoned(DType::f64, Shape{p.c.N(), p.c.Hq, d.Lq});
    const TensorView lv = lse.view();
    sdpa(d.q, d.k, d.v, d.opt, out, &lv);
    std::int64_t q0 = 0;
    for (std::int64_t b = 0; b < p.c.N(); ++b) {
        for (std::int64_t h = 0; h < p.c.Hq; ++h)
            for (std::int64_t t = 0; t < p.c.lq[b]; ++t) {
                for (std::int64_t e = 0; e < p.c.Dv; ++e) {
                    const double got = at(f.out, q0 + t, h, e), want = at(out, b, h, t, e);
                    ASSERT_LE(std::fabs(got - want), kForwardTol * (1.0 + std::fabs(want)))
                        << "out seq " << b << " head " << h << " row " << t;
                }
                const double got = at(f.lse, q0 + t, h), want = at(lse, b, h, t);
                if (std::isinf(want)) ASSERT_EQ(got, want) << "lse seq " << b << " row " << t;
                else ASSERT_LE(std::fabs(got - want), kForwardTol * (1.0 + std::fabs(want))) << "lse seq " << b << " row " << t;
            }
        q0 += p.c.lq[b];
    }
}

const std::vector<std::int64_t> kLens = {0, 1, 3, 7, 16, 17, 63, 64, 65, 130};

void forward_cases(const detail::KernelSet& row, int n, std::uint64_t seed, bool modifiers = false) {
    const detail::ScopedKernelSet use(row);
    std::mt19937_64 rng(seed);
    for (int t = 0; t < n; ++t) {
        const VarlenCase c = modifiers ? random_modifier_case(rng, kLens, true) : random_varlen_case(rng, kLens, true);
        SCOPED_TRACE(c.str());
        const Packed p = make_packed(c, seed + static_cast<std::uint64_t>(t));
        const Forward f = run_varlen(p, t % 2 == 1);
        check_one_by_one(p, f);
        if (c.dropout == 0.0) check_padded(p, f);
        if (::testing::Test::HasFatalFailure()) return;
    }
}

// Every kernel-table row this CPU has (portable, AVX2, and any row added later).
TEST(Varlen, ForwardEveryKernelRow) {
    std::uint64_t seed = 1;
    for (const detail::KernelSet* row : detail::runnable_kernel_sets()) {
        SCOPED_TRACE(std::string("kernel row ") + detail::isa_name(row->isa));
        forward_cases(*row, 60, seed++);
        if (::testing::Test::HasFatalFailure()) return;
    }
}

// Many short sequences take the across-sequences path (run_sequences.hpp); 1 and 2 threads
// must give the same bits, equal to one by one.
TEST(Varlen, ShortSequencesSideBySide) {
    std::mt19937_64 rng(3);
    VarlenCase c;
    for (int b = 0; b < 40; ++b) c.lq.push_back(static_cast<std::int64_t>(rng() % 12)), c.lk.push_back(static_cast<std::int64_t>(1 + rng() % 90));
    c.causal = Causal::bottom_right;
    c.Dk = c.Dv = 16;
    const Packed p = make_packed(c, 3);
    const int saved = omp_get_max_threads();
    omp_set_num_threads(1);
    const Forward one = run_varlen(p, false);
    omp_set_num_threads(2);
    const Forward two = run_varlen(p, false);
    omp_set_num_threads(saved);
    EXPECT_TRUE(bit_equal(one.out, two.out));
    EXPECT_TRUE(bit_equal(one.lse_storage, two.lse_storage));
    check_one_by_one(p, two);
    check_padded(p, two);
}

// Sequences of >= 256 queries and keys run on head-major copies of their K/V
// (src/varlen/head_major.hpp): the same bits as each sequence alone, on every kernel row, with
// GQA, causal alignments and a window, one and two threads; sequences of different sizes
// reuse one scratch (the 300-key sequence after the 520-key one).
TEST(Varlen, LongSequencesHeadMajor) {
    std::uint64_t seed = 40;
    for (const detail::KernelSet* row : detail::runnable_kernel_sets()) {
        SCOPED_TRACE(std::string("kernel row ") + detail::isa_name(row->isa));
        const detail::ScopedKernelSet use(*row);
        VarlenCase c;
        c.lq = {520, 40, 300, 257};
        c.lk = {520, 300, 300, 600};
        c.Hq = 4;
        c.Hkv = 2;
        c.Dk = 32;
        c.Dv = 16;
        for (const Causal causal : {Causal::top_left, Causal::bottom_right, Causal::none}) {
            c.causal = causal;
            c.window = causal == Causal::none ? Window{100, 50, Align::top_left} : Window{};
            SCOPED_TRACE(c.str());
            const Packed p = make_packed(c, seed++);
            const int saved = omp_get_max_threads();
            omp_set_num_threads(1);
            const Forward one = run_varlen(p, false);
            omp_set_num_threads(2);
            const Forward two = run_varlen(p, false);
            omp_set_num_threads(saved);
            EXPECT_TRUE(bit_equal(one.out, two.out));
            check_one_by_one(p, two);
            check_padded(p, two);
            if (::testing::Test::HasFatalFailure()) return;
        }
    }
}

// head_major_kv's budget (head_major.hpp): the longest sequences are copied while their K and V
// fit, the rest read in place. Each cut-off copies exactly that prefix of the longest-first
// order (checked on head_major_kv itself: which problems' K/V moved, with the same values),
// and sdpa_varlen gives the same bits under every budget, equal to one by one.
TEST(Varlen, HeadMajorBudgetCutOff) {
    VarlenCase c;
    c.lq = {520, 40, 300, 257};  // copied: 3 (600 keys), 0 (520), 2 (300); 1 has too few queries
    c.lk = {520, 300, 300, 600};
    c.Hq = 4;
    c.Hkv = 2;
    c.Dk = 32;
    c.Dv = 16;
    c.causal = Causal::bottom_right;
    const Packed p = make_packed(c, 77);
    const auto bytes = [&](std::size_t b) { return c.Hkv * c.lk[b] * (c.Dk + c.Dv) * std::int64_t{sizeof(float)}; };
    struct Cut {
        std::int64_t budget;
        std::vector<bool> copied;
    };
    const Cut cuts[] = {
        {detail::kHeadMajorBudget, {true, false, true, true}},
        {0, {false, false, false, false}},
        {bytes(3) - 1, {false, false, false, false}},
        {bytes(3), {false, false, false, true}},
        {bytes(3) + bytes(0), {true, false, false, true}},
        {bytes(3) + bytes(0) + bytes(2) - 1, {true, false, false, true}},
        {bytes(3) + bytes(0) + bytes(2), {true, false, true, true}},
    };
    const Forward all = run_varlen(p, false);
    check_one_by_one(p, all);
    std::int64_t q0 = 0, k0 = 0;
    std::vector<detail::SdpaProblem> ps;
    const Tensor out = poisoned(DType::f32, Shape{c.Tq(), c.Hq, c.Dv});
    for (std::size_t b = 0; b < c.lq.size(); ++b) {
        ps.push_back(detail::make_problem(detail::sequence_rows(p.q, q0, c.lq[b]), detail::sequence_rows(p.k, k0, c.lk[b]),
                                          detail::sequence_rows(p.v, k0, c.lk[b]), p.opt,
                                          detail::sequence_rows(out, q0, c.lq[b]), nullptr, nullptr, "test"));
        q0 += c.lq[b], k0 += c.lk[b];
    }
    for (const Cut& cut : cuts) {
        SCOPED_TRACE("budget " + std::to_string(cut.budget));
        const detail::ScopedHeadMajorBudget budget(cut.budget);
        std::vector<detail::SdpaProblem> moved = ps;
        const auto copies = detail::head_major_kv(moved);
        EXPECT_EQ(copies != nullptr, cut.copied != std::vector<bool>(4, false));
        for (std::size_t b = 0; b < ps.size(); ++b) {
            SCOPED_TRACE("sequence " + std::to_string(b));
            const bool was_copied = moved[b].k.data() != ps[b].k.data();
            EXPECT_EQ(was_copied, cut.copied[b]);
            EXPECT_EQ(moved[b].v.data() != ps[b].v.data(), cut.copied[b]);
            if (was_copied) {
                EXPECT_EQ(moved[b].k.stride(2), c.Dk);  // head-major: adjacent keys
                for (std::int64_t h = 0; h < c.Hkv; ++h)
                    for (std::int64_t j = 0; j < c.lk[b]; j += 7)
                        for (std::int64_t e = 0; e < c.Dk; ++e)
                            ASSERT_EQ(moved[b].k.data_as<const float>()[moved[b].k.offset(0, h, j, e)],
                                      ps[b].k.data_as<const float>()[ps[b].k.offset(0, h, j, e)]);
            }
        }
        const Forward f = run_varlen(p, false);
        EXPECT_TRUE(bit_equal(f.out, all.out));
        EXPECT_TRUE(bit_equal(f.lse_storage, all.lse_storage));
    }
}

// The head-major copies are the call's largest allocation (up to 256 MiB): they are made before
// anything is written, so out of memory there leaves out and lse as they were (the rows of
// keyless and decode/reference sequences were written first). Run in a child process (a
// "threadsafe" death test: a fresh exec) under an address-space limit that the inputs and the
// thread pool fit but the copies do not. Exit codes: 0 as expected; 3 out or lse written;
// 4 no out-of-memory; 5 no limit; 6 the retry without a limit differs from the first call.
#if !defined(ATTN_TEST_SANITIZED_MEMORY)
[[noreturn]] void varlen_under_an_address_space_limit() {
    VarlenCase c;
    c.lq = {256, 256, 8, 0};  // sequence 2 runs decode-sized rows, 3 has no queries
    c.lk = {2048, 2048, 40, 0};
    c.Hq = c.Hkv = 8;
    c.Dk = c.Dv = 64;  // copies of K and V: 2 × 2048 × 8 × 128 floats = 16 MiB
    c.causal = Causal::none;
    const Packed p = make_packed(c, 19);
    const Forward first = run_varlen(p, false);  // the thread pool exists before the limit
    release_varlen_scratch();                     // the kept copy buffer would be reused
    Forward f;
    f.out = poisoned(DType::f32, Shape{c.Tq(), c.Hq, c.Dv});
    f.lse_storage = poisoned(DType::f32, Shape{c.Tq(), c.Hq});
    f.lse = f.lse_storage.view();
    const rlimit was = attn::test::limit_address_space(8ul << 20);
    try {
        sdpa_varlen(p.q, p.k, p.v, p.cq, p.ck, p.opt, f.out, &f.lse);
        std::exit(4);
    } catch (const OutOfMemory&) {
    }
    if (setrlimit(RLIMIT_AS, &was) != 0) std::exit(5);
    if (!still_poisoned(f.out) || !still_poisoned(f.lse_storage)) std::exit(3);
    const Forward again = run_varlen(p, false);
    std::exit(bit_equal(again.out, first.out) && bit_equal(again.lse_storage, first.lse_storage) ? 0 : 6);
}

TEST(VarlenDeathTest, OutOfMemoryForTheCopiesWritesNothing) {
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    EXPECT_EXIT(varlen_under_an_address_space_limit(), ::testing::ExitedWithCode(0), "");
}
#endif

// Broadcast (stride-0) K/V can have more elements than a 64-bit byte count holds: such a
// sequence is never copied. The budget check (total + need)·4 wrapped to a small number, and
// head_major_kv then wrote 2^62 floats into the buffer it had sized from it (a review found it).
TEST(Varlen, HeadMajorCopyOfUncountableBroadcastKVIsNotMade) {
    const std::int64_t Tq = 256, Tk = std::int64_t{1} << 34, H = std::int64_t{1} << 14, Dk = H - 1, Dv = 1;
    std::vector<float> krow(static_cast<std::size_t>(Dk), 0.25f);
    float one = 1.0f;
    const TensorView q(&one, DType::f32, Shape{Tq, H, Dk}, Strides{0, 0, 0, 0});
    const TensorView k(krow.data(), DType::f32, Shape{Tk, H, Dk}, Strides{0, 0, 1, 0});
    const TensorView v(&one, DType::f32, Shape{Tk, H, Dv}, Strides{0, 0, 1, 0});
    const Tensor out(DType::f32, Shape{Tq, H, Dv});  // 16 MiB: an output cannot be a broadcast view
    SdpaOptions o;
    std::vector<detail::SdpaProblem> ps{detail::make_problem(detail::sequence_rows(q, 0, Tq), detail::sequence_rows(k, 0, Tk),
                                                             detail::sequence_rows(v, 0, Tk), o,
                                                             detail::sequence_rows(out.view(), 0, Tq), nullptr, nullptr, "test")};
    ASSERT_TRUE(detail::head_major_pays(ps[0]));  // a long strided float32 sequence: copied if it could be counted
    const detail::ScopedHeadMajorBudget unlimited(std::numeric_limits<std::int64_t>::max());
    EXPECT_EQ(detail::head_major_kv(ps), nullptr);
    EXPECT_EQ(ps[0].k.data(), static_cast<void*>(krow.data()));  // read in place
}

// The head-major buffer is kept after a call (its page faults are paid once), and
// release_varlen_scratch() frees it; a call after the release allocates again, same bits.
TEST(Varlen, KeptScratchIsReleasedOnRequest) {
    VarlenCase c;
    c.lq = {300, 40, 260};
    c.lk = {300, 500, 260};
    c.Hq = 2;
    c.Hkv = 2;
    c.Dk = 32;
    c.Dv = 32;
    c.causal = Causal::top_left;
    const Packed p = make_packed(c, 91);
    release_varlen_scratch();
    ASSERT_EQ(varlen_scratch_bytes(), 0);
    const Forward first = run_varlen(p, false);
    const std::int64_t kept = varlen_scratch_bytes();
    // Sequences 0 and 2 are long enough to be copied: at least their K and V.
    EXPECT_GE(kept, c.Hkv * (c.lk[0] + c.lk[2]) * (c.Dk + c.Dv) * std::int64_t{sizeof(float)});
    const Forward again = run_varlen(p, false);  // reuses the kept buffer
    EXPECT_EQ(varlen_scratch_bytes(), kept);
    release_varlen_scratch();
    EXPECT_EQ(varlen_scratch_bytes(), 0);
    const Forward after = run_varlen(p, false);
    EXPECT_TRUE(bit_equal(again.out, first.out));
    EXPECT_TRUE(bit_equal(after.out, first.out));
    EXPECT_TRUE(bit_equal(after.lse_storage, first.lse_storage));
    release_varlen_scratch();
}

TEST(Varlen, ReportCountsKernels) {
    VarlenCase c;
    c.lq = {1, 100, 0};
    c.lk = {50, 100, 4};
    const Packed p = make_packed(c, 4);
    SdpaReport rep;
    run_varlen(p, false, &rep);
    EXPECT_NE(rep.kernel.find("decode/"), std::string::npos) << rep.kernel;
    EXPECT_NE(rep.kernel.find("flash/"), std::string::npos) << rep.kernel;
}

// The panel rule reaches varlen: a GQA sequence (group 8, float32 K/V) runs decode while
// group·lq is below two flash panels and joins the flash batch from there on.
TEST(Varlen, ReportCountsRowsPerKvHead) {
    VarlenCase c;
    c.Hq = 8;
    c.Hkv = 1;
    c.lq = {1, 8, 4};  // 8, 64 and 32 rows per KV head: avx512 (panel 32) 2 decode, avx2 1
    c.lk = {30, 30, 30};
    const Packed p = make_packed(c, 5);
    SdpaReport rep;
    run_varlen(p, false, &rep);
    const std::string isa = detail::isa_name(detail::kernel_set().isa);
    const std::int64_t panel = detail::kernel_set().flash_panel;
    int flash = 0;
    for (const std::int64_t lq : c.lq) flash += c.Hq / c.Hkv * lq >= 2 * panel ? 1 : 0;  // float32 K/V: two panels
    const int decode = static_cast<int>(c.lq.size()) - flash;
    EXPECT_NE(rep.kernel.find("decode/" + isa + " x" + std::to_string(decode)), std::string::npos) << rep.kernel;
    EXPECT_NE(rep.kernel.find("flash/" + isa + " x" + std::to_string(flash)), std::string::npos) << rep.kernel;
}

// ---- backward ----------------------------------------------------------------------------

struct Backward {
    Tensor dq, dk, dv;
};

// sdpa_varlen_backward on case c: bit for bit against each sequence alone (sdpa_backward on
// contiguous copies), and without dropout against the padded batch through the double reference.
void backward_case(const VarlenCase& c, std::uint64_t seed, std::mt19937_64& rng) {
    const Packed p = make_packed(c, seed);
    const Forward f = run_varlen(p, false);
    const Tensor dO = randn(DType::f32, Shape{c.Tq(), c.Hq, c.Dv}, rng);
    Backward g{poisoned(DType::f32, p.q.shape()), poisoned(DType::f32, p.k.shape()), poisoned(DType::f32, p.v.shape())};
    // dsinks: the sum over sequences of their own dsinks (float64, in sequence order).
    const Tensor dsinks = poisoned(DType::f64, Shape{c.Hq});
    const TensorView dsv = dsinks.view();
    std::vector<double> dsinks_want(static_cast<std::size_t>(c.Hq), 0.0);
    sdpa_varlen_backward(p.q, p.k, p.v, p.cq, p.ck, f.out, f.lse, dO, p.opt, g.dq, g.dk, g.dv, nullptr,
                         c.sinks ? &dsv : nullptr);

    // One by one, bit for bit.
    std::int64_t q0 = 0, k0 = 0;
    for (std::int64_t b = 0; b < c.N(); ++b) {
        const std::int64_t lq = c.lq[b], lk = c.lk[b];
        SCOPED_TRACE("sequence " + std::to_string(b));
        if (lk == 0) {
            EXPECT_TRUE(rows_equal(g.dq, q0, lq, 0.0));
        } else if (lq == 0) {
            EXPECT_TRUE(rows_equal(g.dk, k0, lk, 0.0));
            EXPECT_TRUE(rows_equal(g.dv, k0, lk, 0.0));
        } else {
            const SdpaOptions o = options_of_sequence(p, b);
            const Tensor lse(DType::f32, Shape{1, c.Hq, lq});
            for (std::int64_t h = 0; h < c.Hq; ++h)
                for (std::int64_t i = 0; i < lq; ++i) store(lse, offset_of(lse, Index{0, h, i, 0}), at(f.lse, q0 + i, h));
            const Tensor dq = poisoned(DType::f32, Shape{1, c.Hq, lq, c.Dk});
            const Tensor dk = poisoned(DType::f32, Shape{1, c.Hkv, lk, c.Dk});
            const Tensor dv = poisoned(DType::f32, Shape{1, c.Hkv, lk, c.Dv});
            const Tensor ds = poisoned(DType::f64, Shape{c.Hq});
            const TensorView dsb = ds.view();
            sdpa_backward(rows_of(p.q, q0, lq), rows_of(p.k, k0, lk), rows_of(p.v, k0, lk), rows_of(f.out, q0, lq), lse,
                          rows_of(dO, q0, lq), o, dq, dk, dv, nullptr, c.sinks ? &dsb : nullptr);
            if (c.sinks)
                for (std::int64_t h = 0; h < c.Hq; ++h) dsinks_want[static_cast<std::size_t>(h)] += at(ds, h);
            EXPECT_TRUE(rows_bit_equal(g.dq, q0, dq));
            EXPECT_TRUE(rows_bit_equal(g.dk, k0, dk));
            EXPECT_TRUE(rows_bit_equal(g.dv, k0, dv));
        }
        q0 += lq, k0 += lk;
    }
    if (c.sinks) {
        for (std::int64_t h = 0; h < c.Hq; ++h) EXPECT_EQ(at(dsinks, h), dsinks_want[static_cast<std::size_t>(h)]) << "dsinks " << h;
    }
    if (c.dropout > 0.0) return;

    // The padded batch through the double reference (forward and backward); padding
    // queries get dO = 0, so they add nothing to dK, dV.
    const Padded d = make_padded(p);
    const Tensor pout = poisoned(DType::f64, Shape{c.N(), c.Hq, d.Lq, c.Dv});
    const Tensor plse = poisoned(DType::f64, Shape{c.N(), c.Hq, d.Lq});
    const TensorView plv = plse.view();
    sdpa(d.q, d.k, d.v, d.opt, pout, &plv);
    const Tensor pdO(DType::f64, pout.shape(), true);
    q0 = 0;
    for (std::int64_t b = 0; b < c.N(); ++b) copy_rows_into(dO, q0, c.lq[b], pdO, b), q0 += c.lq[b];
    const Tensor pdq = poisoned(DType::f64, d.q.shape()), pdk = poisoned(DType::f64, d.k.shape()),
                 pdv = poisoned(DType::f64, d.v.shape());
    const Tensor pds = poisoned(DType::f64, Shape{c.Hq});
    const TensorView pdsv = pds.view();
    sdpa_backward(d.q, d.k, d.v, pout, plse, pdO, d.opt, pdq, pdk, pdv, nullptr, c.sinks ? &pdsv : nullptr);
    const double den = std::max({max_abs(pdq), max_abs(pdk), max_abs(pdv)}) + 1e-30;
    if (c.sinks) {
        const double dden = max_abs(pds) + 1e-30;
        for (std::int64_t h = 0; h < c.Hq; ++h)
            ASSERT_LE(std::fabs(at(dsinks, h) - at(pds, h)) / dden, kTol) << "dsinks " << h << " vs the padded reference";
    }
    q0 = 0, k0 = 0;
    for (std::int64_t b = 0; b < c.N(); ++b) {
        for (auto [got, want, start, len, H, D, name] :
             {std::tuple{&g.dq, &pdq, q0, c.lq[b], c.Hq, c.Dk, "dq"}, std::tuple{&g.dk, &pdk, k0, c.lk[b], c.Hkv, c.Dk, "dk"},
              std::tuple{&g.dv, &pdv, k0, c.lk[b], c.Hkv, c.Dv, "dv"}})
            for (std::int64_t h = 0; h < H; ++h)
                for (std::int64_t r = 0; r < len; ++r)
                    for (std::int64_t e = 0; e < D; ++e)
                        ASSERT_LE(std::fabs(at(*got, start + r, h, e) - at(*want, b, h, r, e)) / den, kTol)
                            << name << " seq " << b << " head " << h << " row " << r << " col " << e;
        q0 += c.lq[b], k0 += c.lk[b];
    }
}

void backward_cases(const detail::KernelSet& row, int n, std::uint64_t seed, bool modifiers = false) {
    const detail::ScopedKernelSet use(row);
    std::mt19937_64 rng(seed);
    for (int t = 0; t < n; ++t) {
        const VarlenCase c = modifiers ? random_modifier_case(rng, kLens, true) : random_varlen_case(rng, kLens, true);
        SCOPED_TRACE(c.str());
        backward_case(c, seed + static_cast<std::uint64_t>(t), rng);
        if (::testing::Test::HasFatalFailure()) return;
    }
}

// Sinks, softcap and ALiBi (per head and per sequence) on packed sequences.
TEST(VarlenModifiers, ForwardEveryKernelRow) {
    std::uint64_t seed = 300;
    for (const detail::KernelSet* row : detail::runnable_kernel_sets()) {
        SCOPED_TRACE(std::string("kernel row ") + detail::isa_name(row->isa));
        forward_cases(*row, 40, seed++, true);
        if (::testing::Test::HasFatalFailure()) return;
    }
}

TEST(VarlenModifiers, BackwardEveryKernelRow) {
    std::uint64_t seed = 400;
    for (const detail::KernelSet* row : detail::runnable_kernel_sets()) {
        SCOPED_TRACE(std::string("kernel row ") + detail::isa_name(row->isa));
        backward_cases(*row, 25, seed++, true);
        if (::testing::Test::HasFatalFailure()) return;
    }
}

TEST(VarlenModifiers, DsinksChecksBeforeWriting) {
    VarlenCase c;
    c.lq = {3, 5};
    c.lk = {4, 6};
    c.sinks = true;
    const Packed p = make_packed(c, 6);
    const Forward f = run_varlen(p, false);
    std::mt19937_64 rng(6);
    const Tensor dO = randn(DType::f32, Shape{8, 1, 8}, rng);
    const Tensor dq = poisoned(DType::f32, p.q.shape()), dk = poisoned(DType::f32, p.k.shape()),
                 dv = poisoned(DType::f32, p.v.shape()), ds2 = poisoned(DType::f32, Shape{2}), ds = poisoned(DType::f32, Shape{1});
    const TensorView ds2v = ds2.view(), dsv = ds.view();
    auto message = [&](const SdpaOptions& o, const TensorView* d) -> std::string {
        try {
            sdpa_varlen_backward(p.q, p.k, p.v, p.cq, p.ck, f.out, f.lse, dO, o, dq, dk, dv, nullptr, d);
        } catch (const Error& e) {
            return e.what();
        }
        return "no error";
    };
    EXPECT_NE(message(p.opt, &ds2v).find("sdpa_varlen_backward: dsinks: expected shape (Hq,) = (1,) but got (2,)"),
              std::string::npos);
    SdpaOptions no_sinks = p.opt;
    no_sinks.sinks.reset();
    EXPECT_NE(message(no_sinks, &dsv).find("sdpa_varlen_backward: dsinks: given but options.sinks is not set"),
              std::string::npos);
    for (const Tensor* t : {&dq, &dk, &dv, &ds2, &ds}) EXPECT_TRUE(still_poisoned(*t));
}

TEST(VarlenBackward, EveryKernelRow) {
    std::uint64_t seed = 11;
    for (const detail::KernelSet* row : detail::runnable_kernel_sets()) {
        SCOPED_TRACE(std::string("kernel row ") + detail::isa_name(row->isa));
        backward_cases(*row, 30, seed++);
        if (::testing::Test::HasFatalFailure()) return;
    }
}

// Sequences of >= 256 queries and keys run their backward on head-major copies of Q, dO, K, V
// (varlen_backward.cpp, head_major.hpp), every sequence writing dQ, dK, dV head-major to staged
// views copied into the packed gradients at the end (staging.hpp): bit for bit against each
// sequence alone, on every kernel row, with GQA and both causal alignments, under the default
// budget and under one that fits the copies of sequence 0 (345600 bytes) but not those of
// sequence 2 (399360 bytes), which then reads its packed views in place.
TEST(VarlenBackward, LongSequencesHeadMajor) {
    std::uint64_t seed = 90;
    for (const detail::KernelSet* row : detail::runnable_kernel_sets()) {
        SCOPED_TRACE(std::string("kernel row ") + detail::isa_name(row->isa));
        const detail::ScopedKernelSet use(*row);
        VarlenCase c;
        c.lq = {300, 40, 260};
        c.lk = {300, 280, 520};
        c.Hq = 4;
        c.Hkv = 2;
        c.Dk = 32;
        c.Dv = 16;
        for (const Causal causal : {Causal::top_left, Causal::bottom_right})
            for (const std::int64_t budget : {detail::kHeadMajorBudget, std::int64_t{370000}}) {
                c.causal = causal;
                SCOPED_TRACE(c.str() + " budget " + std::to_string(budget));
                const detail::ScopedHeadMajorBudget scoped(budget);
                std::mt19937_64 rng(seed);
                backward_case(c, seed++, rng);
                if (::testing::Test::HasFatalFailure()) return;
            }
    }
}

// ---- bad input: a clear error, nothing written --------------------------------------------

TEST(VarlenErrors, BadCuSeqlensAndTensors) {
    VarlenCase c;
    c.lq = {3, 5};
    c.lk = {4, 6};
    const Packed p = make_packed(c, 5);
    auto i32 = [](std::initializer_list<std::int32_t> xs) {
        Tensor t(DType::i32, Shape{static_cast<std::int64_t>(xs.size())});
        std::int64_t i = 0;
        for (auto x : xs) t.data_as<std::int32_t>()[i++] = x;
        return t;
    };
    const Tensor non_monotonic = i32({0, 5, 3}), first_not_zero = i32({1, 3, 8}), short_last = i32({0, 3, 7}),
                 beyond = i32({0, 9, 8}), three_seqs = i32({0, 3, 5, 10}), empty = Tensor(DType::i32, Shape{0});
    const Tensor as_float(DType::f32, Shape{3}), as_2d(DType::i32, Shape{1, 3});
    const Tensor kl(DType::i32, Shape{2}), bad_offsets(DType::i64, Shape{3});
    const Tensor q_2d(DType::f32, Shape{8, 4}), k_bad_d(DType::f32, Shape{10, 1, 9}), q_int(DType::i32, Shape{8, 1, 8});
    const Tensor q_heads3(DType::f32, Shape{8, 3, 8}), k_heads2(DType::f32, Shape{10, 2, 8});
    const Tensor slopes_3(DType::f32, Shape{3}, true);
    const Tensor slopes_3x1(DType::f32, Shape{3, 1}, true), slopes_3d(DType::f32, Shape{2, 1, 1}, true),
        sinks_2(DType::f32, Shape{2}, true), sinks_f64(DType::f64, Shape{1}, true), sinks_nan(DType::f32, Shape{1});
    sinks_nan.data_as<float>()[0] = NAN;
    struct Bad {
        std::string expect;
        std::function<void(TensorView&, TensorView&, TensorView&, TensorView&, TensorView&, SdpaOptions&, TensorView&)> edit;
    };
    using TV = TensorView;
    const std::vector<Bad> cases = {
        {"cu_seqlens_q: must be non-decreasing but entry 2 = 3 < entry 1 = 5",
         [&](TV&, TV&, TV&, TV& cq, TV&, SdpaOptions&, TV&) { cq = non_monotonic; }},
        {"cu_seqlens_k: entry 0 must be 0 but got 1", [&](TV&, TV&, TV&, TV&, TV& ck, SdpaOptions&, TV&) { ck = first_not_zero; }},
        {"cu_seqlens_q: last entry must equal q's token count 8 but got 7",
         [&](TV&, TV&, TV&, TV& cq, TV&, SdpaOptions&, TV&) { cq = short_last; }},
        {"cu_seqlens_q: entry 1 = 9 is beyond q's 8 tokens", [&](TV&, TV&, TV&, TV& cq, TV&, SdpaOptions&, TV&) { cq = beyond; }},
        {"cu_seqlens_k: has 4 entries (3 sequences) but cu_seqlens_q has 3 (2 sequences)",
         [&](TV&, TV&, TV&, TV&, TV& ck, SdpaOptions&, TV&) { ck = TensorView(three_seqs); }},
        {"cu_seqlens_q: expected shape (N+1,)", [&](TV&, TV&, TV&, TV& cq, TV&, SdpaOptions&, TV&) { cq = empty; }},
        {"cu_seqlens_q: expected shape (N+1,)", [&](TV&, TV&, TV&, TV& cq, TV&, SdpaOptions&, TV&) { cq = as_2d; }},
        {"cu_seqlens_k: dtype must be int32 or int64 but got float32",
         [&](TV&, TV&, TV&, TV&, TV& ck, SdpaOptions&, TV&) { ck = as_float; }},
        {"q: expected a rank-3 tensor (Tq, Hq, Dk)", [&](TV& q, TV&, TV&, TV&, TV&, SdpaOptions&, TV&) { q = q_2d; }},
        {"k: head dim 9 does not match q's head dim 8", [&](TV&, TV& k, TV&, TV&, TV&, SdpaOptions&, TV&) { k = k_bad_d; }},
        {"q: heads 3 must be a multiple of k/v's heads 2",
         [&](TV& q, TV& k, TV& v, TV&, TV&, SdpaOptions&, TV&) { q = q_heads3, k = k_heads2, v = k_heads2; }},
        {"v: heads 2 do not match k's heads 1", [&](TV&, TV&, TV& v, TV&, TV&, SdpaOptions&, TV&) { v = k_heads2; }},
        {"q: dtype must be float32, float64, float16 or bfloat16", [&](TV& q, TV&, TV&, TV&, TV&, SdpaOptions&, TV&) { q = q_int; }},
        {"key_lengths: not accepted for packed sequences",
         [&](TV&, TV&, TV&, TV&, TV&, SdpaOptions& o, TV&) { o.key_lengths = kl.view(); }},
        {"bool_mask: not supported", [&](TV&, TV&, TV&, TV&, TV&, SdpaOptions& o, TV&) { o.bool_mask = kl.view(); }},
        {"additive_mask: not supported", [&](TV&, TV&, TV&, TV&, TV&, SdpaOptions& o, TV&) { o.additive_mask = kl.view(); }},
        {"query_offset: expected shape (N,) = (2,)",  // one per sequence: N, not a batch
         [&](TV&, TV&, TV&, TV&, TV&, SdpaOptions& o, TV&) { o.query_offset = QueryOffset(bad_offsets.view()); }},
        {"alibi_slopes: packed sequences take (Hq,) = (1,) or (N, Hq) = (2, 1) slopes (one row per sequence) but got (3, 1)",
         [&](TV&, TV&, TV&, TV&, TV&, SdpaOptions& o, TV&) { o.alibi_slopes = slopes_3x1.view(); }},
        {"alibi_slopes: packed sequences take (Hq,) = (1,) or (N, Hq) = (2, 1) slopes (one row per sequence) but got (2, 1, 1)",
         [&](TV&, TV&, TV&, TV&, TV&, SdpaOptions& o, TV&) { o.alibi_slopes = slopes_3d.view(); }},
        // A (Hq,) of the wrong length was checked per sequence, which named (B, Hq) = (1, Hq).
        {"alibi_slopes: packed sequences take (Hq,) = (1,) or (N, Hq) = (2, 1) slopes (one row per sequence) but got (3,)",
         [&](TV&, TV&, TV&, TV&, TV&, SdpaOptions& o, TV&) { o.alibi_slopes = slopes_3.view(); }},
        {"sinks: shape must be (Hq,) = (1,) but got (2,)",
         [&](TV&, TV&, TV&, TV&, TV&, SdpaOptions& o, TV&) { o.sinks = sinks_2.view(); }},
        {"sinks: dtype must be float32 but got float64",
         [&](TV&, TV&, TV&, TV&, TV&, SdpaOptions& o, TV&) { o.sinks = sinks_f64.view(); }},
        {"sinks: values must be finite but entry 0 is nan",
         [&](TV&, TV&, TV&, TV&, TV&, SdpaOptions& o, TV&) { o.sinks = sinks_nan.view(); }},
        // dropout_origin was passed on unchanged to every sequence's call, so each drew its keep
        // mask from the origin's rows of its own seed: a meaning nobody had given it.
        {"dropout_origin: not accepted for packed sequences (sequence b draws from its own seed, "
         "varlen_dropout_seed(dropout_seed, b), at (0, 0, 0, 0)) but got (0, 0, 5, 0)",
         [&](TV&, TV&, TV&, TV&, TV&, SdpaOptions& o, TV&) { o.dropout_origin = {0, 0, 5, 0}; }},
        {"dropout_origin: not accepted for packed sequences",
         [&](TV&, TV&, TV&, TV&, TV&, SdpaOptions& o, TV&) { o.dropout_origin = {1, 0, 0, 0}; }},
        {"dropout_origin: not accepted for packed sequences",
         [&](TV&, TV&, TV&, TV&, TV&, SdpaOptions& o, TV&) { o.dropout_origin = {0, 1, 0, 0}; }},
        {"dropout_origin: not accepted for packed sequences",
         [&](TV&, TV&, TV&, TV&, TV&, SdpaOptions& o, TV&) { o.dropout_origin = {0, 0, 0, 3}; }},
        {"out: expected shape (Tq, Hq, Dv) = (8, 1, 8) but got (7, 1, 8)",
         [&](TV&, TV&, TV&, TV&, TV&, SdpaOptions&, TV& out) { out = out.slice(0, 0, 7); }},
    };
    for (const Bad& bad : cases) {
        SCOPED_TRACE(bad.expect);
        TV q = p.q, k = p.k, v = p.v, cq = p.cq, ck = p.ck;
        SdpaOptions o = p.opt;
        const Tensor out_t = poisoned(DType::f32, Shape{8, 1, 8});
        TV out = out_t;
        bad.edit(q, k, v, cq, ck, o, out);
        const Tensor lse = poisoned(DType::f32, Shape{8, 1});
        const TensorView lv = lse.view();
        try {
            sdpa_varlen(q, k, v, cq, ck, o, out, &lv);
            ADD_FAILURE() << "no error";
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find("sdpa_varlen: " + bad.expect), std::string::npos) << e.what();
        }
        EXPECT_TRUE(still_poisoned(out_t));
        EXPECT_TRUE(still_poisoned(lse));
    }
}

// An explicit kernel that cannot run a later sequence is an error before the first is run.
TEST(VarlenErrors, KernelDeclinesLaterSequence) {
    VarlenCase c;
    c.lq = {3, 40};
    c.lk = {9, 40};
    const Packed p = make_packed(c, 6);
    SdpaOptions o = p.opt;
    o.impl = Impl::decode;
    const Tensor out = poisoned(DType::f32, Shape{43, 1, 8});
    try {
        sdpa_varlen(p.q, p.k, p.v, p.cq, p.ck, o, out);
        ADD_FAILURE() << "no error";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("sdpa_varlen: impl: the decode kernel cannot run sequence 1"), std::string::npos)
            << e.what();
    }
    EXPECT_TRUE(still_poisoned(out));
}

// impl = flash on inputs flash never reads (float64) is refused whatever cu_seqlens hold: a batch
// whose sequences all lack keys (or queries) built no problem, so nothing checked the kernel and
// the call wrote its keyless rows — where sdpa_varlen_backward refuses the same call.
TEST(VarlenErrors, FlashOnFloat64RefusedWhenNoSequenceRuns) {
    const Tensor q = poisoned(DType::f64, Shape{3, 1, 8});
    const Tensor k(DType::f64, Shape{0, 1, 8});
    const Tensor cq = cu_seqlens({3}), ck = cu_seqlens({0});
    SdpaOptions o;
    o.impl = Impl::flash;
    const Tensor out = poisoned(DType::f32, Shape{3, 1, 8});
    try {
        sdpa_varlen(q, k, k, cq, ck, o, out);
        ADD_FAILURE() << "no error";
    } catch (const Error& e) {
        EXPECT_EQ(std::string(e.what()),
                  "sdpa_varlen: impl: flash cannot run this call: Q is float64: the flash kernel reads float32, "
                  "float16 or bfloat16 Q, K, V; use auto or reference");
    }
    EXPECT_TRUE(still_poisoned(out));
}

// impl = decode is refused alike whether or not the call's sequences hold work. A reason every
// sequence shares (a float64 q, dropout, K and V of two dtypes, K strided along the head dim)
// was checked only on the problems of sequences with queries and keys: a batch without one ran
// its keyless rows (or nothing) where the same call with data was refused. And a sequence
// without keys is refused for its 20 queries as it is with keys.
TEST(VarlenErrors, DecodeRefusedAlikeWhenNoSequenceRuns) {
    struct Reason {
        const char* why;
        DType q = DType::f32, k = DType::f32, v = DType::f32;
        double dropout = 0.0;
        bool strided_k = false;
    };
    // One sequence of lq queries and lk keys (Hq = Hkv = 1, D = 8): the message, "no error" if none.
    const auto message = [](const Reason& r, std::int64_t lq, std::int64_t lk) {
        const Tensor q(r.q, Shape{lq, 1, 8}, true), v(r.v, Shape{lk, 1, 8}, true);
        const Tensor k_rows(r.k, Shape{lk, 1, r.strided_k ? 16 : 8}, true);
        const TensorView k = r.strided_k ? TensorView(k_rows.data(), r.k, Shape{lk, 1, 8}, Strides{16, 16, 2}) : k_rows.view();
        SdpaOptions o;
        o.impl = Impl::decode;
        o.dropout_p = r.dropout;
        if (r.dropout > 0.0) o.dropout_seed = 7;
        const Tensor out = poisoned(DType::f32, Shape{lq, 1, 8});
        std::string m = "no error";
        try {
            sdpa_varlen(q, k, v, cu_seqlens({lq}), cu_seqlens({lk}), o, out);
        } catch (const Error& e) {
            m = e.what();
        }
        if (m != "no error") {
            EXPECT_TRUE(still_poisoned(out)) << m;  // refused: nothing written
        }
        return m;
    };
    const std::string call = "sdpa_varlen: impl: the decode kernel cannot run this call: ";
    const Reason reasons[] = {
        {"Q is float64, decode reads float32, float16 or bfloat16", DType::f64},
        {"dropout was requested (decode applies none)", DType::f32, DType::f32, DType::f32, 0.25},
        {"K is float32 and V is float16, decode needs both float32, both float16 or both bfloat16", DType::f32,
         DType::f32, DType::f16},
        {"K or V is strided along the head dim (decode needs unit stride)", DType::f32, DType::f32, DType::f32, 0.0,
         true},
    };
    for (const Reason& r : reasons) {
        SCOPED_TRACE(r.why);
        EXPECT_EQ(message(r, 3, 4), call + r.why);  // with data
        EXPECT_EQ(message(r, 0, 4), call + r.why);  // no queries
        // No keys: K is empty, so its strides mean nothing (decode_call_declines) — no reason there.
        if (!r.strided_k) {
            EXPECT_EQ(message(r, 3, 0), call + r.why);
        }
    }
    const std::string lq20 = "sdpa_varlen: impl: the decode kernel cannot run sequence 0: Lq = 20 > 16 (decode is for a few new queries)";
    EXPECT_EQ(message(Reason{}, 20, 4), lq20);
    EXPECT_EQ(message(Reason{}, 20, 0), lq20);
    // What decode takes stays taken, with or without work.
    EXPECT_EQ(message(Reason{}, 0, 4), "no error");
    EXPECT_EQ(message(Reason{}, 16, 0), "no error");
}

// Outputs sharing memory with an input or with each other: refused, nothing written.
TEST(VarlenErrors, OutputsOverlappingInputsOrEachOther) {
    VarlenCase c;
    c.lq = {3, 5};
    c.lk = {4, 6};
    const Packed p = make_packed(c, 8);
    const Tensor out = poisoned(DType::f32, Shape{8, 1, 8});
    const TensorView lse_in_out(out.data(), DType::f32, Shape{8, 1}), out_over_q(p.q.data(), DType::f32, Shape{8, 1, 8});
    const auto message = [&](const TensorView& o, const TensorView* l) {
        try {
            sdpa_varlen(p.q, p.k, p.v, p.cq, p.ck, p.opt, o, l);
        } catch (const Error& e) {
            return std::string(e.what());
        }
        return std::string("no error");
    };
    EXPECT_EQ(message(out, &lse_in_out), "sdpa_varlen: out: must not share memory with lse (both are outputs: one would overwrite the other)");
    EXPECT_NE(message(out_over_q, nullptr).find("sdpa_varlen: out: must not share memory with q"), std::string::npos);
    EXPECT_TRUE(still_poisoned(out));
}

TEST(VarlenErrors, BackwardChecksBeforeWriting) {
    VarlenCase c;
    c.lq = {3, 5};
    c.lk = {4, 6};
    const Packed p = make_packed(c, 7);
    const Forward f = run_varlen(p, false);
    const Tensor dO = poisoned(DType::f32, f.out.shape());
    const Tensor dq = poisoned(DType::f32, p.q.shape()), dk = poisoned(DType::f32, p.k.shape()),
                 dv_bad = poisoned(DType::f32, Shape{10, 1, 7});
    const Tensor bad_cu(DType::i64, Shape{3});
    bad_cu.data_as<std::int64_t>()[0] = 0, bad_cu.data_as<std::int64_t>()[1] = 6, bad_cu.data_as<std::int64_t>()[2] = 4;
    const Tensor dv = poisoned(DType::f32, p.v.shape());
    EXPECT_THROW(
        {
            try {
                sdpa_varlen_backward(p.q, p.k, p.v, p.cq, p.ck, f.out, f.lse, dO, p.opt, dq, dk, dv_bad);
            } catch (const Error& e) {
                EXPECT_NE(std::string(e.what()).find("sdpa_varlen_backward: dv: expected the shape of v"), std::string::npos)
                    << e.what();
                throw;
            }
        },
        Error);
    EXPECT_THROW(sdpa_varlen_backward(p.q, p.k, p.v, p.cq, bad_cu, f.out, f.lse, dO, p.opt, dq, dk, dv), Error);
    SdpaOptions origin = p.opt;  // refused as by the forward (VarlenErrors.BadCuSeqlensAndTensors)
    origin.dropout_origin = {0, 0, 5, 0};
    try {
        sdpa_varlen_backward(p.q, p.k, p.v, p.cq, p.ck, f.out, f.lse, dO, origin, dq, dk, dv);
        ADD_FAILURE() << "no error";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("sdpa_varlen_backward: dropout_origin: not accepted for packed sequences"),
                  std::string::npos)
            << e.what();
    }
    EXPECT_TRUE(still_poisoned(dq));
    EXPECT_TRUE(still_poisoned(dk));
    EXPECT_TRUE(still_poisoned(dv));
}

// out and lse are the backward's inputs: broadcast views are read as any input is, with the
// bits of contiguous copies (they were refused as outputs: "out: dimension 0 has stride 0").
TEST(VarlenBackward, ReadsBroadcastOutAndLse) {
    VarlenCase c;
    c.lq = {3, 5};
    c.lk = {4, 6};
    c.Hq = 2;  // grouped-query: two heads read one K/V head
    c.causal = Causal::bottom_right;
    const Packed p = make_packed(c, 9);
    std::mt19937_64 rng(10);
    const Tensor one_out = randn(DType::f32, Shape{1, c.Hq, c.Dv}, rng), one_lse = randn(DType::f32, Shape{1, c.Hq}, rng);
    const TensorView out = one_out.view().broadcast_to(Shape{c.Tq(), c.Hq, c.Dv}, "out");
    const TensorView lse = one_lse.view().broadcast_to(Shape{c.Tq(), c.Hq}, "lse");
    const Tensor out_c = to_dtype(out, DType::f32), lse_c = to_dtype(lse, DType::f32);
    const Tensor dO = randn(DType::f32, out.shape(), rng);
    Backward g{poisoned(DType::f32, p.q.shape()), poisoned(DType::f32, p.k.shape()), poisoned(DType::f32, p.v.shape())};
    Backward want{poisoned(DType::f32, p.q.shape()), poisoned(DType::f32, p.k.shape()), poisoned(DType::f32, p.v.shape())};
    sdpa_varlen_backward(p.q, p.k, p.v, p.cq, p.ck, out, lse, dO, p.opt, g.dq, g.dk, g.dv);
    sdpa_varlen_backward(p.q, p.k, p.v, p.cq, p.ck, out_c, lse_c, dO, p.opt, want.dq, want.dk, want.dv);
    EXPECT_TRUE(bit_equal(g.dq, want.dq));
    EXPECT_TRUE(bit_equal(g.dk, want.dk));
    EXPECT_TRUE(bit_equal(g.dv, want.dv));
}

// A batch whose sequences all lack queries or keys builds no per-sequence problem; its options
// are checked all the same, before anything is written (a bad scale, dropout_p, window or
// softcap passed, and out / dq were written: an exploratory test found it).
TEST(VarlenErrors, OptionsCheckedWhenNoSequenceHasWork) {
    const Tensor q(DType::f32, Shape{3, 2, 4}, true), k(DType::f32, Shape{0, 2, 4}, true), v(DType::f32, Shape{0, 2, 4}, true);
    const Tensor cq(DType::i32, Shape{3}), ck(DType::i32, Shape{3});
    const std::int32_t cqs[3] = {0, 1, 3}, cks[3] = {0, 0, 0};
    std::memcpy(cq.data(), cqs, sizeof cqs);
    std::memcpy(ck.data(), cks, sizeof cks);
    const Tensor lse_in(DType::f32, Shape{3, 2}, true), out_in(DType::f32, Shape{3, 2, 4}, true), dO(DType::f32, Shape{3, 2, 4}, true);
    const struct {
        const char* expect;
        void (*edit)(SdpaOptions&);
    } bad[] = {
        {"scale: must be finite in float32", [](SdpaOptions& o) { o.scale = NAN; }},
        {"dropout_p: must be in [0, 1) but got 7", [](SdpaOptions& o) { o.dropout_p = 7; }},
        {"dropout_seed: dropout_p = 0.5 needs a seed", [](SdpaOptions& o) { o.dropout_p = 0.5; }},
        {"window: left and right must be >= 0, or -1", [](SdpaOptions& o) { o.window.left = -9; }},
        {"softcap: must be 0 (off) or a finite float32", [](SdpaOptions& o) { o.softcap = -3; }},
        {"query_offset: must be in [-2^60, 2^60]", [](SdpaOptions& o) { o.query_offset = QueryOffset(std::int64_t{1} << 62); }},
        // Per-sequence values, every entry (a reviewer found them checked only for sequences with
        // queries and keys, and named as entry 0 of a one-sequence problem).
        {"query_offset: entry 1 must be in [-2^60, 2^60] but got 4611686018427387904",
         [](SdpaOptions& o) {
             static const Tensor offsets = [] {
                 Tensor t(DType::i64, Shape{2});
                 const std::int64_t values[2] = {0, std::int64_t{1} << 62};
                 std::memcpy(t.data(), values, sizeof values);
                 return t;
             }();
             o.query_offset = QueryOffset(offsets.view());
         }},
        {"alibi_slopes: values must be finite but entry (1, 0) is nan",
         [](SdpaOptions& o) {
             static const Tensor slopes = [] {
                 Tensor t(DType::f32, Shape{2, 2}, true);
                 t.data_as<float>()[2] = NAN;
                 return t;
             }();
             o.alibi_slopes = slopes.view();
         }},
    };
    const auto expect_error = [](const std::function<void()>& call, const std::string& want) {
        try {
            call();
            ADD_FAILURE() << "no error; expected " << want;
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
        }
    };
    const Tensor dk(DType::f32, Shape{0, 2, 4}), dv(DType::f32, Shape{0, 2, 4});
    for (const auto& b : bad) {
        SCOPED_TRACE(b.expect);
        SdpaOptions o;
        b.edit(o);
        const Tensor out = poisoned(DType::f32, Shape{3, 2, 4});
        expect_error([&] { sdpa_varlen(q, k, v, cq, ck, o, out); }, std::string("sdpa_varlen: ") + b.expect);
        EXPECT_TRUE(still_poisoned(out));
        const Tensor dq = poisoned(DType::f32, q.shape());
        expect_error([&] { sdpa_varlen_backward(q, k, v, cq, ck, out_in, lse_in, dO, o, dq, dk, dv); },
                     std::string("sdpa_varlen_backward: ") + b.expect);
        EXPECT_TRUE(still_poisoned(dq));
    }
}

// The tensors' dtypes are checked for every batch: one whose sequences all lack keys built no
// problem, and an int32 k and a bool v were accepted (an exploratory test found it).
TEST(VarlenErrors, TensorDtypesCheckedWhenNoSequenceHasWork) {
    const Tensor q(DType::f32, Shape{2, 2, 4}, true);
    const Tensor cq(DType::i32, Shape{2}), ck(DType::i32, Shape{2});
    const std::int32_t cqs[2] = {0, 2}, cks[2] = {0, 0};
    std::memcpy(cq.data(), cqs, sizeof cqs);
    std::memcpy(ck.data(), cks, sizeof cks);
    const Tensor k_int(DType::i32, Shape{0, 2, 4}), v_bool(DType::boolean, Shape{0, 2, 4});
    const Tensor k(DType::f32, Shape{0, 2, 4}), v(DType::f32, Shape{0, 2, 4});
    const Tensor out = poisoned(DType::f32, Shape{2, 2, 4});
    for (const auto& [kk, vv, want] : {std::tuple{&k_int, &v, "sdpa_varlen: k: dtype must be"},
                                       std::tuple{&k, &v_bool, "sdpa_varlen: v: dtype must be"}}) {
        try {
            sdpa_varlen(q, *kk, *vv, cq, ck, SdpaOptions{}, out);
            ADD_FAILURE() << "no error; expected " << want;
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
        }
        EXPECT_TRUE(still_poisoned(out));
    }
}

// The header writes the seed mix out so another implementation can reproduce varlen's dropout
// mask (it said "seed + b·golden ratio", one φ short of the code's (b + 1)·φ): its formula, computed
// here independently, and splitmix64's known first output for seed 0.
TEST(VarlenDropoutSeed, IsTheHeadersFormula) {
    EXPECT_EQ(varlen_dropout_seed(0, 0), 0xE220A8397B1DCDAFull);
    for (const std::uint64_t seed : {std::uint64_t{0}, std::uint64_t{12345}, ~std::uint64_t{0}})
        for (const std::int64_t b : {0, 1, 2, 7, 1000}) {
            std::uint64_t z = seed + (static_cast<std::uint64_t>(b) + 1) * 0x9E3779B97F4A7C15ull;
            z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
            z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
            EXPECT_EQ(varlen_dropout_seed(seed, b), z ^ (z >> 31)) << "seed " << seed << ", b " << b;
        }
}

}  // namespace
}  // namespace attn::test
