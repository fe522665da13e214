// ring_check — attn::dist::ring_attention against single-process attn::sdpa (reference kernel),
// run by ctest under `mpirun -np P` for P = 1..4. Every rank builds the same random global
// Q, K, V (same seed), takes its rows, runs the ring into NaN-poisoned outputs and compares
// its rows with the single-process result:  |O − O_ref| <= 1e-5 and lse likewise (−inf exactly).
// The bound: O is a convex combination of V rows (|V| < 4), computed in float32 on both sides;
// float32 rounding of the merge weights and the outputs stays near 1e-7 · |O|, two orders below.
// Then the error cases: a bad argument on one rank must make every rank throw attn::Error with
// the same message and leave the outputs unwritten; an interrupted call on one rank inside
// run_collectively must make every rank throw attn::Interrupted. Rank 0 prints "N passed, M failed".
#include <mpi.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <functional>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "attn/error.hpp"
#include "attn/interrupt.hpp"
#include "attn/ring.hpp"
#include "attn/sdpa.hpp"
#include "kernels/flash/flash.hpp"
#include "ring_test_util.hpp"

using namespace attn;
using namespace ring_test;

namespace {

void run_case(const Case& c, Impl impl = Impl::automatic) {
    std::mt19937 gen(1234);  // the same on every rank: every rank builds the same global tensors
    // 16-bit cases round the random inputs once; the oracle reads the rounded values exactly.
    const Tensor q = in_dtype(random_tensor(gen, Shape{c.B, c.Hq, c.Lq, c.Dk}, 2.0f), c.q_dtype);
    const Tensor k = in_dtype(random_tensor(gen, Shape{c.B, c.Hkv, c.Lk, c.Dk}, 2.0f), c.kv_dtype);
    const Tensor v = in_dtype(random_tensor(gen, Shape{c.B, c.Hkv, c.Lk, c.Dv}, 4.0f), c.v_of());

    // Single-process result, the oracle kernel.
    SdpaOptions so;
    so.causal = c.causal;
    so.window = c.window;
    so.scale = c.scale;
    so.impl = Impl::reference;
    so.softcap = c.softcap;
    so.dropout_p = c.dropout_p;
    so.dropout_seed = c.dropout_seed;
    const Tensor sinks = sink_tensor(c.Hq);
    if (c.sinks) so.sinks = sinks.view();
    const Tensor slopes = slope_tensor(c);
    if (c.alibi) so.alibi_slopes = slopes.view();
    Tensor lengths(DType::i64, Shape{c.B}), offsets(DType::i32, Shape{c.B});
    if (!c.key_lengths.empty()) {
        for (std::int64_t b = 0; b < c.B; ++b) lengths.data_as<std::int64_t>()[b] = c.key_lengths[static_cast<std::size_t>(b)];
        so.key_lengths = lengths.view();
    }
    if (!c.query_offsets.empty()) {
        for (std::int64_t b = 0; b < c.B; ++b) {
            offsets.data_as<std::int32_t>()[b] = static_cast<std::int32_t>(c.query_offsets[static_cast<std::size_t>(b)]);
        }
        so.query_offset = offsets.view();
    } else if (c.query_offset) {
        so.query_offset = *c.query_offset;
    }
    Tensor ref_o = poisoned(DType::f32, Shape{c.B, c.Hq, c.Lq, c.Dv});
    Tensor ref_l = poisoned(DType::f64, Shape{c.B, c.Hq, c.Lq});
    TensorView ref_lv = ref_l.view();
    sdpa(q, k, v, so, ref_o, &ref_lv);
    // Whether the blocks run bf16 compute (docs/conventions.md, "bf16 compute"): as single-process
    // sdpa would run this call's flash forward — the library's own rule (flash_compute: the
    // dtypes, the row it runs, which ATTN_ISA may force, and the CPU it believes it has, which
    // ATTN_CPU_HIDE may hide). Each block's P is then rounded to bf16 and its exp the cheaper one,
    // merged with lse. Their bound needs Σ_j w_ij·|v_jd|: the same reference on |V| (exact in
    // bf16), dropout included.
    const Tensor out_like(c.out_dtype, Shape{c.B, c.Hq, c.Lq, c.Dv});  // never written
    const detail::Compute compute =
        detail::flash_compute(detail::kernel_set(), detail::make_problem(q, k, v, so, out_like, nullptr, nullptr));
    const bool bf16_compute = compute != detail::Compute::f32;
    // The kernel the blocks must report when they run bf16 compute: vdpbf16ps or AMX tiles.
    const std::string bf16_kernel = detail::kernel_name("flash", detail::kernel_set(), compute);
    Tensor ref_wv;
    if (bf16_compute) {
        Tensor va(v.dtype(), v.shape());
        for (std::int64_t i = 0; i < v.numel(); ++i) va.data_as<std::uint16_t>()[i] = v.data_as<const std::uint16_t>()[i] & 0x7fff;
        Tensor wv = poisoned(DType::f32, Shape{c.B, c.Hq, c.Lq, c.Dv});
        sdpa(q, k, va, so, wv);
        ref_wv = dist::take_rows(wv, dist::rank_segments(c.Lq, P, rank, c.layout));
    }

    const auto qseg = dist::rank_segments(c.Lq, P, rank, c.layout);
    const auto kseg = dist::rank_segments(c.Lk, P, rank, c.layout);
    const Tensor ql = dist::take_rows(q, qseg), kl = dist::take_rows(k, kseg), vl = dist::take_rows(v, kseg);
    std::vector<float> sq, sk, sv;
    const TensorView qv = c.strided ? restride(ql, sq) : ql.view();
    const TensorView kv = c.strided ? restride(kl, sk) : kl.view();
    const TensorView vv = c.strided ? restride(vl, sv) : vl.view();
    const Tensor ref_mine = dist::take_rows(ref_o, qseg);
    const std::int64_t nq = ql.shape()[2];

    dist::RingOptions ro;
    ro.causal = c.causal;
    ro.window = c.window;
    ro.query_offset = so.query_offset;
    ro.scale = c.scale;
    ro.layout = c.layout;
    ro.impl = impl;
    ro.softcap = c.softcap;
    ro.sinks = so.sinks;
    ro.alibi_slopes = so.alibi_slopes;
    ro.dropout_p = c.dropout_p;
    ro.dropout_seed = c.dropout_seed;
    if (!c.key_lengths.empty()) ro.key_lengths = lengths.view();
    Tensor o = poisoned(c.out_dtype, Shape{c.B, c.Hq, nq, c.Dv});
    Tensor l = poisoned(DType::f64, Shape{c.B, c.Hq, nq});
    TensorView lv = l.view();
    std::string detail;
    bool ok = true;
    dist::RingStats stats;
    // The K/V bytes on the wire: each travelling block in its own dtypes (half of float32's for
    // 16-bit), V starting at K's end rounded up to V's element size.
    std::int64_t expected_bytes = 0;
    const auto ksz = static_cast<std::int64_t>(dtype_size(c.kv_dtype)), vsz = static_cast<std::int64_t>(dtype_size(c.v_of()));
    for (int s = 0; s + 1 < expected_steps(c, P); ++s) {
        const std::int64_t rows = dist::rank_length(c.Lk, P, (rank - s + P) % P, c.layout) * c.B * c.Hkv;
        expected_bytes += (rows * c.Dk * ksz + vsz - 1) / vsz * vsz + rows * c.Dv * vsz;
    }
    try {
        const std::atomic<bool> stop{c.under_set_interrupt_flag};
        std::optional<ScopedInterruptFlag> watch;
        if (c.under_set_interrupt_flag) watch.emplace(stop);
        dist::ring_attention(MPI_COMM_WORLD, qv, kv, vv, ro, o, &lv, &stats);
    } catch (const std::exception& e) {
        ok = false;
        detail = std::string("threw: ") + e.what();
    }
    double worst_o = 0, worst_l = 0;
    if (ok) {
        for (std::int64_t i = 0; i < o.numel(); ++i) {
            const double x = o.view().load_as_double(i), r = ref_mine.data_as<float>()[i];
            const double e = std::fabs(x - r);
            const double extra = bf16_compute ? bf16_compute_bound(ref_wv.data_as<float>()[i]) : 0.0;
            if (!(e <= output_bound(c.out_dtype, r, 1e-5) + extra)) ok = false;  // NaN (an unwritten element) fails too
            if (e > worst_o || std::isnan(e)) worst_o = std::isnan(e) ? INFINITY : e;
        }
        // lse: local row i of segment s is global row s.start + i.
        std::int64_t local = 0;
        for (const auto& s : qseg) {
            for (std::int64_t i = 0; i < s.length; ++i, ++local)
                for (std::int64_t bh = 0; bh < c.B * c.Hq; ++bh) {
                    const double x = l.data_as<double>()[bh * nq + local];
                    const double r = ref_l.data_as<double>()[bh * c.Lq + s.start + i];
                    const double tol = 1e-5 * std::max(1.0, std::fabs(r)) + (bf16_compute ? kBf16ExpError : 0.0);
                    const bool same = (std::isinf(r) && x == r) || std::fabs(x - r) <= tol;
                    if (!same) {
                        ok = false;
                        worst_l = INFINITY;
                    } else if (!std::isinf(r)) {
                        worst_l = std::max(worst_l, std::fabs(x - r));
                    }
                }
        }
        detail = "max |O - O_ref| = " + std::to_string(worst_o) + ", max |lse - lse_ref| = " + std::to_string(worst_l);
    }
    // The ranks together score exactly the visible (query, key) pairs: a block nobody sees is
    // skipped, and no visible pair is left out or scored twice.
    std::int64_t entries = stats.score_entries, total = 0;
    MPI_Allreduce(&entries, &total, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
    const std::int64_t expected = c.Hq * visible_pairs(c);
    if (ok && total != expected) {
        ok = false;
        detail += "; the ranks scored " + std::to_string(total) + " entries, the visible ones are " + std::to_string(expected);
    }
    if (ok && stats.bytes_sent != expected_bytes) {
        ok = false;
        detail += "; sent " + std::to_string(stats.bytes_sent) + " K/V bytes, expected " + std::to_string(expected_bytes);
    }
    // The ring runs exactly the steps some rank computes in (fewer than P under a narrow window).
    // A case that asks for it ran its blocks on bf16 compute where the library's rule gives it.
    if (ok && c.expect_bf16_kernel && bf16_compute && stats.kernel != bf16_kernel) {
        ok = false;
        detail += "; the blocks ran " + stats.kernel + ", not " + bf16_kernel;
    }
    if (ok && stats.steps != expected_steps(c, P)) {
        ok = false;
        detail += "; the ring ran " + std::to_string(stats.steps) + " steps, the visible pairs need " +
                  std::to_string(expected_steps(c, P));
    }
    double w[2] = {worst_o, worst_l}, wmax[2];
    MPI_Allreduce(w, wmax, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    char buf[96];
    std::snprintf(buf, sizeof buf, "  (max |dO| %.2e, max |dlse| %.2e)", wmax[0], wmax[1]);
    verdict(c.name + " [" + std::string(dist::layout_name(c.layout)) + "]" + buf, ok, detail);
}

// The ring's keep mask bit for bit: with V one-hot (Dv = Lk, V[j] = e_j) the output is the
// dropped weights themselves, O[i][j] = A_ij·Z_ij/(1 − p), so O[i][j] == 0 exactly where a key
// is dropped or masked (A_ij > 0 where visible: the scores are small). The ring's zero pattern
// must equal single-process sdpa's (reference) at every element, and differ from the pattern of
// another seed (so that the comparison can fail).
void check_keep_mask(Case c) {
    c.Dv = c.Lk;
    std::mt19937 gen(555);
    const Tensor q = random_tensor(gen, Shape{c.B, c.Hq, c.Lq, c.Dk}, 0.5f);
    const Tensor k = random_tensor(gen, Shape{c.B, c.Hkv, c.Lk, c.Dk}, 0.5f);
    Tensor v(DType::f32, Shape{c.B, c.Hkv, c.Lk, c.Dv}, true);
    for (std::int64_t bh = 0; bh < c.B * c.Hkv; ++bh)
        for (std::int64_t j = 0; j < c.Lk; ++j) v.data_as<float>()[(bh * c.Lk + j) * c.Dv + j] = 1.0f;
    Tensor lengths(DType::i64, Shape{c.B});
    SdpaOptions so;
    so.causal = c.causal;
    so.window = c.window;
    so.impl = Impl::reference;
    if (!c.key_lengths.empty()) {
        for (std::int64_t b = 0; b < c.B; ++b) lengths.data_as<std::int64_t>()[b] = c.key_lengths[static_cast<std::size_t>(b)];
        so.key_lengths = lengths.view();
    }
    so.dropout_p = c.dropout_p;
    so.dropout_seed = c.dropout_seed;
    auto zeros_of = [&](std::uint64_t seed) {
        SdpaOptions s = so;
        s.dropout_seed = seed;
        Tensor o = poisoned(DType::f32, Shape{c.B, c.Hq, c.Lq, c.Dv});
        sdpa(q, k, v, s, o);
        return dist::take_rows(o, dist::rank_segments(c.Lq, P, rank, c.layout));
    };
    const Tensor ref = zeros_of(c.dropout_seed), other = zeros_of(c.dropout_seed + 1);
    const auto qseg = dist::rank_segments(c.Lq, P, rank, c.layout);
    const auto kseg = dist::rank_segments(c.Lk, P, rank, c.layout);
    const Tensor ql = dist::take_rows(q, qseg), kl = dist::take_rows(k, kseg), vl = dist::take_rows(v, kseg);
    dist::RingOptions ro;
    ro.causal = c.causal;
    ro.window = c.window;
    ro.layout = c.layout;
    ro.dropout_p = c.dropout_p;
    ro.dropout_seed = c.dropout_seed;
    if (!c.key_lengths.empty()) ro.key_lengths = lengths.view();
    Tensor o = poisoned(DType::f32, ref.shape());
    bool ok = true;
    std::string detail;
    try {
        dist::ring_attention(MPI_COMM_WORLD, ql, kl, vl, ro, o);
    } catch (const std::exception& e) {
        ok = false;
        detail = std::string("threw: ") + e.what();
    }
    std::int64_t counts[3] = {0, 0, 0}, totals[3];  // mismatches vs ref, zeros in ref, mismatches ref vs other seed
    for (std::int64_t e = 0; ok && e < o.numel(); ++e) {
        const float x = o.data_as<float>()[e], r = ref.data_as<float>()[e], s = other.data_as<float>()[e];
        counts[0] += std::isnan(x) || (x == 0.0f) != (r == 0.0f);
        counts[1] += r == 0.0f;
        counts[2] += (s == 0.0f) != (r == 0.0f);
    }
    MPI_Allreduce(counts, totals, 3, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
    if (totals[0] != 0 || totals[2] == 0) ok = false;
    detail += std::to_string(totals[0]) + " elements differ from sdpa's keep pattern; another seed changes " +
              std::to_string(totals[2]);
    verdict(c.name + " [" + std::string(dist::layout_name(c.layout)) + "]  (" + std::to_string(totals[1]) +
                " zeros, bit-for-bit; seed+1 differs in " + std::to_string(totals[2]) + ")",
            ok, detail);
}

// Every rank must throw attn::Error containing `expect`, all with the same message, and the
// poisoned outputs must stay untouched. `breaker` spoils the arguments on the ranks it chooses.
void run_error_case(const std::string& name, const std::string& expect,
                    const std::function<void(Tensor& q, Tensor& k, Tensor& v, dist::RingOptions& o, Tensor& kl)>& breaker) {
    const std::int64_t B = 2, Hq = 2, Hkv = 1, L = 21, D = 4;
    std::mt19937 gen(99);
    const Tensor qg = random_tensor(gen, Shape{B, Hq, L, D}, 1.0f);
    const Tensor kg = random_tensor(gen, Shape{B, Hkv, L, D}, 1.0f);
    const Tensor vg = random_tensor(gen, Shape{B, Hkv, L, D}, 1.0f);
    const auto seg = dist::rank_segments(L, P, rank, dist::Layout::zigzag);
    Tensor q = dist::take_rows(qg, seg), k = dist::take_rows(kg, seg), v = dist::take_rows(vg, seg);
    Tensor kl(DType::i64, Shape{B});
    for (std::int64_t b = 0; b < B; ++b) kl.data_as<std::int64_t>()[b] = L;
    dist::RingOptions o;
    o.key_lengths = kl.view();
    breaker(q, k, v, o, kl);
    Tensor out = poisoned(DType::f32, Shape{B, Hq, q.shape()[2], D});
    std::string message;
    bool threw_error = false;
    try {
        dist::ring_attention(MPI_COMM_WORLD, q, k, v, o, out);
    } catch (const attn::Error& e) {
        threw_error = true;
        message = e.what();
    } catch (const std::exception& e) {
        message = std::string("not an attn::Error: ") + e.what();
    }
    bool untouched = true;
    for (std::int64_t i = 0; i < out.numel(); ++i) untouched &= std::isnan(out.data_as<float>()[i]);
    // Compare with rank 0's message.
    std::vector<char> m0(512, 0);
    if (rank == 0) std::strncpy(m0.data(), message.c_str(), m0.size() - 1);
    MPI_Bcast(m0.data(), static_cast<int>(m0.size()), MPI_CHAR, 0, MPI_COMM_WORLD);
    const bool same = message.substr(0, m0.size() - 1) == std::string(m0.data());
    const bool ok = threw_error && untouched && same && message.find(expect) != std::string::npos;
    if (rank == 0 && threw_error) std::printf("  message: %s\n", message.c_str());
    verdict("error: " + name, ok,
            "threw attn::Error: " + std::to_string(threw_error) + ", outputs untouched: " + std::to_string(untouched) +
                ", same message as rank 0: " + std::to_string(same) + ", message: '" + message + "', expected to contain '" +
                expect + "'");
}

// A communicator that is no group of ranks — MPI_COMM_NULL on every rank, and for P >= 2 an
// intercommunicator — is an attn::Error naming comm from each collective entry point, thrown on
// the rank that passed it before any MPI call on it (run_collectively aborted the job in
// MPI_Comm_size on MPI_COMM_NULL) and before anything runs or is written.
void check_communicator_refused() {
    Tensor q(DType::f32, Shape{1, 1, 4, 4}, true), lse(DType::f32, Shape{1, 1, 4}, true);
    Tensor out = poisoned(DType::f32, Shape{1, 1, 4, 4}), dq = poisoned(DType::f32, Shape{1, 1, 4, 4});
    const auto refused = [&](const std::string& name, const std::string& expect, const std::function<void()>& call) {
        std::string message = "(no error)";
        try {
            call();
        } catch (const attn::Error& e) {
            message = e.what();
        } catch (const std::exception& e) {
            message = std::string("not an attn::Error: ") + e.what();
        }
        bool untouched = true;
        for (const Tensor* t : {&out, &dq})
            for (std::int64_t i = 0; i < t->numel(); ++i) untouched &= std::isnan(t->data_as<float>()[i]);
        verdict("error: " + name, untouched && message.find(expect) != std::string::npos,
                "outputs untouched: " + std::to_string(untouched) + ", message: '" + message + "', expected to contain '" +
                    expect + "'");
    };
    const auto each_call = [&](MPI_Comm comm, const std::string& what, const std::string& expect) {
        refused("ring_attention on " + what, "ring_attention: comm: " + expect,
                [&] { dist::ring_attention(comm, q, q, q, dist::RingOptions{}, out); });
        refused("ring_attention_backward on " + what, "ring_attention_backward: comm: " + expect, [&] {
            dist::ring_attention_backward(comm, q, q, q, q, lse, q, dist::RingOptions{}, dq, dq, dq);
        });
        bool ran = false;
        refused("run_collectively on " + what, "run_collectively: comm: " + expect, [&] {
            dist::run_collectively(comm, [&] { ran = true; });
        });
        verdict("run_collectively on " + what + " does not run the function", !ran, "it ran");
    };
    each_call(MPI_COMM_NULL, "MPI_COMM_NULL", "MPI_COMM_NULL is not a communicator");
    if (P >= 2) {
        MPI_Comm half = MPI_COMM_NULL, inter = MPI_COMM_NULL;
        MPI_Comm_split(MPI_COMM_WORLD, rank % 2, rank, &half);
        MPI_Intercomm_create(half, 0, MPI_COMM_WORLD, rank % 2 == 0 ? 1 : 0, 17, &inter);
        each_call(inter, "an intercommunicator", "an intercommunicator");
        MPI_Comm_free(&inter);
        MPI_Comm_free(&half);
    }
}

// An interrupt stays an interrupt across ranks: in run_collectively the last rank's attn::sdpa
// runs under a set interrupt flag (it throws attn::Interrupted, docs/errors.md). Every rank must
// throw attn::Interrupted — not an attn::Error, which turned Ctrl-C into Python's ValueError —
// whose message names that rank, and return (a rank left waiting would time the test out). With
// P >= 2, rank 0 throws an attn::Error in the same call: the interrupt still comes first, on
// every rank, the interrupted one included.
void check_interrupt_agreed() {
    const int stopped = P - 1;
    const auto outcome = [&](bool rank0_error) -> std::string {
        try {
            dist::run_collectively(MPI_COMM_WORLD, [&] {
                if (rank0_error && rank == 0) throw attn::Error("rank 0's own error");
                if (rank != stopped) return;
                const std::atomic<bool> stop{true};
                const ScopedInterruptFlag watch(stop);
                const Tensor x(DType::f32, Shape{1, 1, 64, 8}, true);
                Tensor o = poisoned(DType::f32, Shape{1, 1, 64, 8});
                sdpa(x, x, x, SdpaOptions{}, o);
            });
        } catch (const attn::Interrupted& e) {
            return std::string("attn::Interrupted: ") + e.what();
        } catch (const std::exception& e) {
            return std::string("not attn::Interrupted: ") + e.what();
        }
        return "no exception";
    };
    const std::string want = "attn::Interrupted: interrupted: rank " + std::to_string(stopped) + " was interrupted";
    for (const bool rank0_error : {false, true}) {
        if (rank0_error && P < 2) continue;
        const std::string got = outcome(rank0_error);
        verdict(std::string("interrupt: rank ") + std::to_string(stopped) + "'s interrupted call is attn::Interrupted on every rank" +
                    (rank0_error ? ", before rank 0's error" : ""),
                got.rfind(want, 0) == 0, "got '" + got + "', expected it to start with '" + want + "'");
    }
}

// The layouts cover every row exactly once, in increasing order within a segment.
void check_partition() {
    bool ok = true;
    std::string detail;
    for (const auto layout : {dist::Layout::contiguous, dist::Layout::zigzag})
        for (int p = 1; p <= 9; ++p)
            for (std::int64_t L = 0; L <= 40; ++L) {
                std::vector<int> seen(static_cast<std::size_t>(L), 0);
                std::int64_t lo = L, hi = 0;
                for (int r = 0; r < p; ++r) {
                    const std::int64_t n = dist::rank_length(L, p, r, layout);
                    lo = std::min(lo, n);
                    hi = std::max(hi, n);
                    for (const auto& s : dist::rank_segments(L, p, r, layout))
                        for (std::int64_t i = s.start; i < s.start + s.length; ++i) seen[static_cast<std::size_t>(i)]++;
                }
                for (int x : seen) ok &= x == 1;
                // Balanced: rank lengths differ by at most the number of segments per rank.
                ok &= hi - lo <= (layout == dist::Layout::zigzag ? 2 : 1);
                if (!ok && detail.empty()) detail = "L = " + std::to_string(L) + ", P = " + std::to_string(p);
            }
    const auto z = dist::rank_segments(16, 4, 1, dist::Layout::zigzag);  // chunks 1 and 6 of 8
    ok &= z.size() == 2 && z[0].start == 2 && z[0].length == 2 && z[1].start == 12 && z[1].length == 2;
    // Lengths near 2^63: c·L/n overflowed (chunk 1 of 8 of 2^62 started at −2^59).
    for (const std::int64_t L : {std::int64_t{1} << 62, std::numeric_limits<std::int64_t>::max()}) {
        std::int64_t next = 0;
        for (int r = 0; r < 4; ++r)
            for (const auto& s : dist::rank_segments(L, 4, r, dist::Layout::contiguous)) {
                if (s.start != next || s.length < L / 4 || s.length > L / 4 + 1) ok = false;
                next = s.start + s.length;
            }
        if (next != L) ok = false;
        if (!ok && detail.empty()) detail = "contiguous chunks of L = " + std::to_string(L);
    }
    verdict("partition: every row once, balanced, zigzag rank 1 of 4 holds chunks 1 and 6, L up to 2^63 - 1", ok, detail);

    // Segments that do not fit, or whose lengths overflow together, are errors (take_rows
    // sized its tensor from the wrapped sum and wrote INT64_MAX rows into it).
    const Tensor g(DType::f32, Shape{1, 1, 8, 4}, true);
    const std::int64_t M = std::numeric_limits<std::int64_t>::max();
    std::string messages;
    for (const std::vector<dist::Segment>& bad : {std::vector<dist::Segment>{{1, M}, {1, M}, {0, 3}},
                                                  std::vector<dist::Segment>{{M, 1}}, std::vector<dist::Segment>{{7, 2}}}) {
        try {
            (void)dist::take_rows(g, bad);
            messages += "(accepted) ";
        } catch (const attn::Error& e) {
            messages += std::string(e.what()) + " | ";
        }
    }
    const bool refused = messages.find("(accepted)") == std::string::npos &&
                         messages.find("take_rows: segment (start 1, length 9223372036854775807) does not fit a sequence of length 8") !=
                             std::string::npos;
    verdict("partition: take_rows refuses segments outside the sequence, without overflow", refused, messages);
}

}  // namespace

int main(int argc, char** argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_size(MPI_COMM_WORLD, &P);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank == 0) std::printf("ring_check on P = %d ranks\n", P);

    check_partition();

    std::vector<Case> cases;
    for (const auto layout : {dist::Layout::zigzag, dist::Layout::contiguous}) {
        for (Causal causal : {Causal::none, Causal::top_left}) {
            const std::string c = causal == Causal::top_left ? "causal" : "full";
            Case a;
            a.name = c + " L=16 D=8";
            a.causal = causal;
            a.layout = layout;
            cases.push_back(a);
            Case g;
            g.name = c + " GQA Hq=6 Hkv=2 B=2 Dk=12 Dv=5 L=37";
            g.B = 2, g.Hq = 6, g.Hkv = 2, g.Lq = 37, g.Lk = 37, g.Dk = 12, g.Dv = 5, g.causal = causal, g.layout = layout;
            cases.push_back(g);
            Case m;
            m.name = c + " MQA Hq=3 Hkv=1 L=50 Dk=7 Dv=9 scale=0.3";
            m.Hq = 3, m.Lq = 50, m.Lk = 50, m.Dk = 7, m.Dv = 9, m.scale = 0.3, m.causal = causal, m.layout = layout;
            cases.push_back(m);
            Case x;
            x.name = c + " cross Lq=23 Lk=41 (top-left on global positions)";
            x.Hq = 2, x.Hkv = 2, x.Lq = 23, x.Lk = 41, x.causal = causal, x.layout = layout;
            cases.push_back(x);
            Case y;
            y.name = c + " cross Lq=45 Lk=19";
            y.Lq = 45, y.Lk = 19, y.Dk = 5, y.Dv = 3, y.causal = causal, y.layout = layout;
            cases.push_back(y);
            Case p;
            p.name = c + " key padding B=3 key_lengths=(29, 11, 0) L=29";
            p.B = 3, p.Hq = 2, p.Lq = 29, p.Lk = 29, p.key_lengths = {29, 11, 0}, p.causal = causal, p.layout = layout;
            cases.push_back(p);
            Case t;
            t.name = c + " tiny L=3 (ranks without rows)";
            t.Lq = 3, t.Lk = 3, t.causal = causal, t.layout = layout;
            cases.push_back(t);
            Case s;
            s.name = c + " strided (B, L, H, D) views, Hq=4 Hkv=2 L=33";
            s.B = 2, s.Hq = 4, s.Hkv = 2, s.Lq = 33, s.Lk = 33, s.Dk = 6, s.Dv = 10, s.strided = true, s.causal = causal;
            s.layout = layout;
            cases.push_back(s);
        }
    }
    // The per-sequence alignment rule on global positions, named cases.
    for (const auto layout : {dist::Layout::zigzag, dist::Layout::contiguous}) {
        Case br;
        br.name = "bottom-right, key_lengths (5, 40, 12, 0) around Lq=20, Lk=40";
        br.B = 4, br.Hq = 2, br.Hkv = 1, br.Lq = 20, br.Lk = 40, br.key_lengths = {5, 40, 12, 0};
        br.causal = Causal::bottom_right, br.layout = layout;
        cases.push_back(br);
        Case mixed;
        mixed.name = "top-left causal + bottom-right window (3, 2) under key_lengths (31, 9, 17): per-sequence band widths";
        mixed.B = 3, mixed.Lq = 25, mixed.Lk = 31, mixed.key_lengths = {31, 9, 17}, mixed.causal = Causal::top_left;
        mixed.window = Window{3, 2, Align::bottom_right}, mixed.layout = layout;
        cases.push_back(mixed);
        Case win;
        win.name = "causal sliding window left 5, L=64 (the ring stops after 2 steps when contiguous)";
        win.B = 2, win.Hq = 2, win.Lq = 64, win.Lk = 64, win.causal = Causal::top_left, win.window.left = 5, win.layout = layout;
        cases.push_back(win);
        Case far;
        far.name = "query_offset 2^60 with causal and window left 2^60+5 (bounds far from the block)";
        far.B = 2, far.Lq = 19, far.Lk = 23, far.causal = Causal::top_left, far.query_offset = std::int64_t{1} << 60;
        far.window.left = (std::int64_t{1} << 60) + 5, far.window.right = std::int64_t{1} << 62, far.layout = layout;
        cases.push_back(far);
        Case per;
        per.name = "per-sequence query_offset (-4, 7, 30), bottom-right causal, window left 6";
        per.B = 3, per.Lq = 22, per.Lk = 27, per.query_offsets = {-4, 7, 30}, per.causal = Causal::bottom_right;
        per.window.left = 6, per.key_lengths = {27, 20, 3}, per.layout = layout;
        cases.push_back(per);
    }
    // Score modifiers (softcap per block, sinks once per row in the merge) on every named case:
    // the blocks, alignments and rows without keys (lse = σ_h) above, against single-process sdpa.
    const std::size_t named = cases.size();
    for (std::size_t i = 0; i < named; ++i) cases.push_back(with_modifiers(cases[i], static_cast<int>(i % 3)));
    // Random cases: every causal alignment, key lengths (often < Lq), windows, offsets, GQA,
    // lengths below the number of chunks. The same seed on every rank.
    // ALiBi on the named cases, except query_offset 2^60: there |d − j| ≈ 2^60 is not
    // representable to the key in float or double, so single-process sdpa's scores all round to
    // the same value (uniform weights) while the ring's blocks measure the exact distances from
    // the band's edge: no oracle to compare with.
    for (std::size_t i = 0; i < named; ++i)
        if (!cases[i].query_offset || std::llabs(*cases[i].query_offset) < (std::int64_t{1} << 20))
            cases.push_back(with_alibi(cases[i], static_cast<int>(i % 2)));
    // ALiBi on the random cases too: its diagonal (bottom-right or query_offset) against every
    // causal/window alignment, key lengths and offsets the blocks meet.
    std::size_t n_random = 0;
    for (Case& r : random_cases(48, 2024)) {
        cases.push_back(r);
        if (n_random++ % 2 == 1) cases.push_back(with_alibi(r, static_cast<int>(n_random / 2 % 2)));
    }
    // Dropout on every named case (and with modifiers): the blocks drop what sdpa drops.
    for (std::size_t i = 0; i < named; ++i) cases.push_back(with_dropout(cases[i], static_cast<int>(i)));
    cases.push_back(with_dropout(with_modifiers(cases[1], 2), 1));
    cases.push_back(with_dropout(with_alibi(cases[1], 1), 0));
    for (const Case& c : piece_cases()) cases.push_back(c);
    // 16-bit Q/K/V and out (K/V travel in 16 bits, kernels read them directly): named cases,
    // a few with modifiers and dropout, and strided views, over the dtype combinations.
    {
        const DType f32 = DType::f32, f16 = DType::f16, bf16 = DType::bf16;
        const DType combos[][3] = {{bf16, bf16, bf16}, {f16, f16, f16}, {f32, f16, f32}, {f32, bf16, f32},
                                   {bf16, bf16, f32}, {f16, f16, bf16}};
        for (std::size_t i = 0; i < named; ++i) {
            const DType* d = combos[i % std::size(combos)];
            cases.push_back(with_dtypes(cases[i], d[0], d[1], d[2]));
        }
        for (std::size_t i = 0; i < 4; ++i) {
            Case m = i % 2 == 0 ? with_modifiers(cases[i + 1], 2) : with_dropout(with_alibi(cases[i + 1], 1), 1);
            m.strided = i >= 2;
            if (m.strided) m.name += " strided";
            const DType* d = combos[i];
            cases.push_back(with_dtypes(m, d[0], d[1], d[2]));
        }
    }
    // K float16, V float32, odd sizes: V starts 2 bytes past a float boundary unless the buffer
    // aligns it (it was read through a misaligned float*; sdpa now refuses such a pointer).
    for (const auto layout : {dist::Layout::zigzag, dist::Layout::contiguous}) {
        Case m;
        m.name = "K float16, V float32: causal B=1 Hq=2 Hkv=1 L=13 Dk=5 Dv=3";
        m.Hq = 2, m.Lq = 13, m.Lk = 13, m.Dk = 5, m.Dv = 3, m.causal = Causal::top_left, m.layout = layout;
        m = with_dtypes(m, DType::f32, DType::f16, DType::f32);
        m.v_dtype = DType::f32;
        m.name += " [V float32]";
        cases.push_back(m);
    }
    // bf16 compute in the blocks (all bf16, blocks of more than 16 rows: flash, not decode),
    // against the double reference on the same bf16 inputs with the bf16-compute bound.
    for (const auto layout : {dist::Layout::zigzag, dist::Layout::contiguous}) {
        Case b;
        b.name = "bf16 compute: causal GQA B=1 Hq=4 Hkv=2 L=320 D=64";
        b.Hq = 4, b.Hkv = 2, b.Lq = 320, b.Lk = 320, b.Dk = 64, b.Dv = 64, b.causal = Causal::top_left;
        b.layout = layout, b.expect_bf16_kernel = true;
        cases.push_back(with_dtypes(b, DType::bf16, DType::bf16, DType::bf16));
        Case m = with_modifiers(b, 2);
        m.expect_bf16_kernel = true;
        cases.push_back(with_dtypes(m, DType::bf16, DType::bf16, DType::bf16));
        Case n;
        n.name = "bf16 compute: no mask, key_lengths (200, 77), B=2 Lq=256 Lk=200 Dk=40 Dv=24";
        n.B = 2, n.Hq = 2, n.Lq = 256, n.Lk = 200, n.Dk = 40, n.Dv = 24, n.key_lengths = {200, 77};
        n.causal = Causal::bottom_right, n.layout = layout;
        cases.push_back(with_dtypes(with_dropout(n, 1), DType::bf16, DType::bf16, DType::bf16));
    }
    for (const auto layout : {dist::Layout::zigzag, dist::Layout::contiguous}) {
        Case u = cases[1];
        u.name += " under a set interrupt flag (the ring does not read it)";
        u.layout = layout;
        u.under_set_interrupt_flag = true;
        cases.push_back(u);
    }
    for (const Case& c : cases) run_case(c);
    // The keep mask itself, bit for bit, read through one-hot values.
    for (const auto layout : {dist::Layout::zigzag, dist::Layout::contiguous}) {
        Case m;
        m.name = "dropout keep mask: causal GQA B=2 Hq=4 Hkv=2 Lq=Lk=45";
        m.B = 2, m.Hq = 4, m.Hkv = 2, m.Lq = 45, m.Lk = 45, m.causal = Causal::top_left, m.layout = layout;
        check_keep_mask(with_dropout(m, 0));
        Case x;
        x.name = "dropout keep mask: window (7, 3) bottom-right, key_lengths (38, 20), Lq=29 Lk=38";
        x.B = 2, x.Hq = 2, x.Lq = 29, x.Lk = 38, x.key_lengths = {38, 20}, x.window = Window{7, 3, Align::bottom_right};
        x.layout = layout;
        check_keep_mask(with_dropout(x, 1));
    }

    const int last = P - 1;
    using dist::RingOptions;
    run_error_case("Q float64 on the last rank", std::string(P > 1 ? "ring_attention: rank " + std::to_string(P - 1) + ": Q: " : "ring_attention: Q: ") + "dtype must be float32",
                   [&](Tensor& q, Tensor&, Tensor&, RingOptions&, Tensor&) {
                       if (rank == last) q = to_dtype(q, DType::f64);
                   });
    run_error_case("K head dim differs on the last rank", "K: head dim 3 does not match Q's head dim 4",
                   [&](Tensor&, Tensor& k, Tensor&, RingOptions&, Tensor&) {
                       if (rank == last) k = Tensor(DType::f32, Shape{2, 1, k.shape()[2], 3});
                   });
    run_error_case("Q heads not a multiple of K/V heads", "Q: heads 3 must be a multiple of K/V's heads 2",
                   [&](Tensor& q, Tensor& k, Tensor& v, RingOptions&, Tensor&) {
                       q = Tensor(DType::f32, Shape{2, 3, q.shape()[2], 4});
                       k = Tensor(DType::f32, Shape{2, 2, k.shape()[2], 4});
                       v = Tensor(DType::f32, Shape{2, 2, v.shape()[2], 4});
                   });
    run_error_case("infinite scale", "scale: must be finite",
                   [&](Tensor&, Tensor&, Tensor&, RingOptions& o, Tensor&) {
                       if (rank == last) o.scale = INFINITY;
                   });
    run_error_case("key_lengths entry above Lk", "key_lengths: entry 1 must be in [0, Lk=21] but got 22",
                   [&](Tensor&, Tensor&, Tensor&, RingOptions&, Tensor& kl) { kl.data_as<std::int64_t>()[1] = 22; });
    run_error_case("window left below -1", "ring_attention: window: left and right must be >= 0, or -1",
                   [&](Tensor&, Tensor&, Tensor&, RingOptions& o, Tensor&) { o.window.left = -2; });
    run_error_case("negative softcap", "ring_attention: softcap",
                   [&](Tensor&, Tensor&, Tensor&, RingOptions& o, Tensor&) { o.softcap = -1.0; });
    static float sinks3[3] = {0, 0, 0};
    run_error_case("sinks of the wrong shape", "ring_attention: sinks",
                   [&](Tensor&, Tensor&, Tensor&, RingOptions& o, Tensor&) { o.sinks = TensorView(sinks3, DType::f32, Shape{3}); });
    run_error_case("dropout_p = 1", "ring_attention: dropout_p: must be in [0, 1)",
                   [&](Tensor&, Tensor&, Tensor&, RingOptions& o, Tensor&) { o.dropout_p = 1.0; });
    run_error_case("dropout without a seed on the last rank", "dropout_seed: dropout_p = 0.5 needs a seed",
                   [&](Tensor&, Tensor&, Tensor&, RingOptions& o, Tensor&) {
                       o.dropout_p = 0.5;
                       if (rank != last) o.dropout_seed = 7;
                   });
    run_error_case("Impl::decode", "ring_attention: impl: must be automatic, reference or flash",
                   [&](Tensor&, Tensor&, Tensor&, RingOptions& o, Tensor&) { o.impl = Impl::decode; });
    if (P >= 2) {
        run_error_case("window on the last rank only", "was called with window (3, -1) but rank 0 with window (-1, -1)",
                       [&](Tensor&, Tensor&, Tensor&, RingOptions& o, Tensor&) {
                           if (rank == last) o.window.left = 3;
                       });
        // A (B,) offset view that outlives the call: the breaker's own storage.
        static std::int64_t offsets[2] = {0, 0};
        run_error_case("per-sequence query_offset differs across ranks", "query_offset: rank " + std::to_string(last) + " has entry 1",
                       [&](Tensor&, Tensor&, Tensor&, RingOptions& o, Tensor&) {
                           offsets[1] = rank == last ? 4 : 0;
                           o.query_offset = TensorView(offsets, DType::i64, Shape{2});
                       });
        run_error_case("softcap on the last rank only", "was called with softcap 2 but rank 0 with softcap 0",
                       [&](Tensor&, Tensor&, Tensor&, RingOptions& o, Tensor&) {
                           if (rank == last) o.softcap = 2.0;
                       });
        static float sinks[2] = {0.5f, 0.5f};
        run_error_case("sinks differ across ranks", "sinks: rank " + std::to_string(last) + " has entry 1",
                       [&](Tensor&, Tensor&, Tensor&, RingOptions& o, Tensor&) {
                           sinks[1] = rank == last ? 1.5f : 0.5f;
                           o.sinks = TensorView(sinks, DType::f32, Shape{2});
                       });
        run_error_case("dropout seed differs on the last rank", "was called with dropout_seed 8 but rank 0 with dropout_seed 7",
                       [&](Tensor&, Tensor&, Tensor&, RingOptions& o, Tensor&) {
                           o.dropout_p = 0.5;
                           o.dropout_seed = rank == last ? 8 : 7;
                       });
        run_error_case("causal on the last rank only", "was called with causal top_left but rank 0 with causal none",
                       [&](Tensor&, Tensor&, Tensor&, RingOptions& o, Tensor&) {
                           if (rank == last) o.causal = Causal::top_left;
                       });
        run_error_case("last rank holds one K/V row too few", "rows of K/V (Lk = 20) but the zigzag layout over",
                       [&](Tensor&, Tensor& k, Tensor& v, RingOptions&, Tensor&) {
                           if (rank == last) {
                               k = dist::take_rows(k, {{0, k.shape()[2] - 1}});
                               v = dist::take_rows(v, {{0, v.shape()[2] - 1}});
                           }
                       });
        run_error_case("key_lengths differ across ranks", "key_lengths: rank",
                       [&](Tensor&, Tensor&, Tensor&, RingOptions&, Tensor& kl) {
                           if (rank == last) kl.data_as<std::int64_t>()[0] = 5;
                       });
    }

    // Broadcast (stride-0) K/V whose block has more elements than 64 bits count: the MPI-count
    // check wrapped to 0 and passed, and the ring buffer was sized from the wrapped count (a
    // review found it: a heap overflow in pack). Every rank must refuse before anything moves.
    {
        const std::int64_t H = std::int64_t{1} << 12, nk = std::int64_t{1} << 34, Dk = (std::int64_t{1} << 18) - 1;
        float one = 1.0f;
        std::vector<float> out_rows(static_cast<std::size_t>(H), std::numeric_limits<float>::quiet_NaN());
        const TensorView q(&one, DType::f32, Shape{1, H, 1, Dk}, Strides{0, 0, 0, 0});
        const TensorView k(&one, DType::f32, Shape{1, H, nk, Dk}, Strides{0, 0, 0, 0});
        const TensorView v(&one, DType::f32, Shape{1, H, nk, 1}, Strides{0, 0, 0, 0});
        const TensorView o(out_rows.data(), DType::f32, Shape{1, H, 1, 1});
        std::string message;
        try {
            dist::ring_attention(MPI_COMM_WORLD, q, k, v, dist::RingOptions{}, o);
            message = "(no error)";
        } catch (const attn::Error& e) {
            message = e.what();
        }
        bool untouched = true;
        for (float x : out_rows) untouched &= std::isnan(x);
        verdict("error: a broadcast K/V block beyond a 64-bit count", untouched &&
                    message.find("more than 2^63 elements, more than one MPI message holds") != std::string::npos,
                message);
    }

    // Impl::flash: if single-process sdpa refuses it (a build without the flash kernel), the
    // ring must refuse it on every rank with the same message, not abort inside the ring;
    // otherwise it must give the single-process result.
    {
        std::string sdpa_message;
        try {
            Tensor z(DType::f32, Shape{1, 1, 1, 4}, true), zo(DType::f32, Shape{1, 1, 1, 4});
            SdpaOptions so;
            so.impl = Impl::flash;
            sdpa(z, z, z, so, zo);
        } catch (const attn::Error& e) {
            sdpa_message = e.what();
        }
        if (sdpa_message.empty()) {
            if (rank == 0) std::printf("  (this build has the flash kernel: Impl::flash checked for results)\n");
            Case f;
            f.name = "Impl::flash, causal GQA L=37";
            f.B = 2, f.Hq = 4, f.Hkv = 2, f.Lq = 37, f.Lk = 37, f.causal = Causal::top_left;
            run_case(f, Impl::flash);
        } else {
            run_error_case("Impl::flash refused by sdpa in this build", sdpa_message,
                           [&](Tensor&, Tensor&, Tensor&, RingOptions& o, Tensor&) { o.impl = Impl::flash; });
        }
    }

    check_communicator_refused();
    check_interrupt_agreed();

    if (rank == 0) std::printf("%d passed, %d failed\n", passed, failed);
    MPI_Finalize();
    return failed == 0 ? 0 : 1;
}
