// ring_backward_check — attn::dist::ring_attention_backward against single-process
// attn::sdpa_backward (the reference kernel, in double), run by ctest under `mpirun -np P`
// for P = 1..4. Every rank builds the same random global Q, K, V, dO (same seed), takes its
// rows, runs the ring forward (O, lse) and the ring backward into NaN-poisoned dQ, dK, dV and
// compares its rows with the double-precision gradients of the whole sequence:
//     max |g − g_ref| <= 1e-5 · max(max |g_ref|, m_g)      for g = dQ, dK, dV (per tensor, all ranks)
// m_g is the size of the terms whose difference g is: dS_ij = P_ij·(dP_ij − D_i) cancels exactly
// when a row sees one key (P = 1, dP = D), so dQ and dK are then 0 in exact arithmetic and any
// float32 kernel leaves ~1e-7 of m; relative to max |g_ref| ≈ 1e-16 no float32 result passes.
//     m_dQ = scale · max_ij P_ij·(|dP_ij| + |D_i|) · max |K|,   m_dK likewise with max |Q|,  m_dV = 0
// (from the double reference's weights; in the other cases m is of the order of max |g_ref|).
// Both the forward and the backward compute in float32 and the ring adds at most P float32
// additions per dK/dV element and a double sum for dQ: measured errors (printed) sit one to two
// orders below the bound.
// Also: a second run gives bit-identical gradients (the ring's fixed accumulation order) — for
// the dropout cases a second forward and backward on 3 threads where the first ran on 1 give
// bit-identical O, lse and gradients (kernels whose bits do not depend on the thread count,
// include/attn/threads.hpp; the keep mask must not move with it either); the ranks
// together score exactly the visible pairs; bad arguments make every rank throw the same
// attn::Error and leave the gradients unwritten. Rank 0 prints "N passed, M failed".
#include <mpi.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "attn/error.hpp"
#include "attn/ring.hpp"
#include "attn/sdpa.hpp"
#include "attn/sdpa_backward.hpp"
#include "attn/threads.hpp"
#include "ring_test_util.hpp"

using namespace attn;
using namespace ring_test;

namespace {

struct Global {
    Tensor q, k, v, dout;
    Tensor lengths{DType::i64, Shape{1}}, offsets{DType::i64, Shape{1}}, sinks{DType::f32, Shape{1}}, slopes{DType::f32, Shape{1}};
    SdpaOptions so;  // the single-process options
};

Global make_global(const Case& c) {
    Global g;
    std::mt19937 gen(4321);  // the same on every rank
    // 16-bit cases: the inputs rounded once (dO in out's dtype); the oracle reads them exactly.
    g.q = in_dtype(random_tensor(gen, Shape{c.B, c.Hq, c.Lq, c.Dk}, 2.0f), c.q_dtype);
    g.k = in_dtype(random_tensor(gen, Shape{c.B, c.Hkv, c.Lk, c.Dk}, 2.0f), c.kv_dtype);
    g.v = in_dtype(random_tensor(gen, Shape{c.B, c.Hkv, c.Lk, c.Dv}, 4.0f), c.v_of());
    g.dout = in_dtype(random_tensor(gen, Shape{c.B, c.Hq, c.Lq, c.Dv}, 1.0f), c.out_dtype);
    g.so.causal = c.causal;
    g.so.window = c.window;
    g.so.scale = c.scale;
    g.so.softcap = c.softcap;
    g.so.dropout_p = c.dropout_p;
    g.so.dropout_seed = c.dropout_seed;
    g.sinks = sink_tensor(c.Hq);
    if (c.sinks) g.so.sinks = g.sinks.view();
    g.slopes = slope_tensor(c);
    if (c.alibi) g.so.alibi_slopes = g.slopes.view();
    g.lengths = Tensor(DType::i64, Shape{c.B});
    g.offsets = Tensor(DType::i64, Shape{c.B});
    if (!c.key_lengths.empty()) {
        for (std::int64_t b = 0; b < c.B; ++b) g.lengths.data_as<std::int64_t>()[b] = c.key_lengths[static_cast<std::size_t>(b)];
        g.so.key_lengths = g.lengths.view();
    }
    if (!c.query_offsets.empty()) {
        for (std::int64_t b = 0; b < c.B; ++b) g.offsets.data_as<std::int64_t>()[b] = c.query_offsets[static_cast<std::size_t>(b)];
        g.so.query_offset = g.offsets.view();
    } else if (c.query_offset) {
        g.so.query_offset = *c.query_offset;
    }
    return g;
}

dist::RingOptions ring_options(const Case& c, const Global& g, Impl impl) {
    dist::RingOptions ro;
    ro.causal = c.causal;
    ro.window = c.window;
    ro.query_offset = g.so.query_offset;
    ro.scale = c.scale;
    ro.layout = c.layout;
    ro.impl = impl;
    ro.softcap = g.so.softcap;
    ro.sinks = g.so.sinks;
    ro.alibi_slopes = g.so.alibi_slopes;
    ro.dropout_p = c.dropout_p;
    ro.dropout_seed = c.dropout_seed;
    if (!c.key_lengths.empty()) ro.key_lengths = g.lengths.view();
    return ro;
}

// max |x − r| over this rank's rows and max |r| over the whole reference; NaN counts as infinite.
struct Err {
    double err = 0, ref = 0;
};
Err compare(const Tensor& mine, const Tensor& ref_global, const std::vector<dist::Segment>& segs) {
    Err e;
    const Tensor ref_f64 = to_dtype(ref_global, DType::f64);
    for (std::int64_t i = 0; i < ref_f64.numel(); ++i) e.ref = std::max(e.ref, std::fabs(ref_f64.data_as<double>()[i]));
    std::int64_t row = 0;
    const std::int64_t B = ref_global.shape()[0], H = ref_global.shape()[1], L = ref_global.shape()[2], D = ref_global.shape()[3];
    const std::int64_t n = mine.shape()[2];
    for (const auto& s : segs) {
        for (std::int64_t i = 0; i < s.length; ++i, ++row)
            for (std::int64_t b = 0; b < B; ++b)
                for (std::int64_t h = 0; h < H; ++h)
                    for (std::int64_t d = 0; d < D; ++d) {
                        const double x = mine.view().load_as_double(((b * H + h) * n + row) * D + d);
                        const double r = ref_f64.data_as<double>()[((b * H + h) * L + s.start + i) * D + d];
                        const double diff = std::fabs(x - r);
                        e.err = std::isnan(diff) ? INFINITY : std::max(e.err, diff);
                        if (std::isnan(diff)) break;
                    }
    }
    return e;
}

void run_case(const Case& c, Impl impl = Impl::automatic) {
    const Global g = make_global(c);
    // The oracle: the textbook gradient in double on the whole sequence.
    Tensor q64 = to_dtype(g.q, DType::f64), k64 = to_dtype(g.k, DType::f64), v64 = to_dtype(g.v, DType::f64),
           do64 = to_dtype(g.dout, DType::f64);
    Tensor o64(DType::f64, Shape{c.B, c.Hq, c.Lq, c.Dv}), l64(DType::f64, Shape{c.B, c.Hq, c.Lq});
    SdpaOptions so = g.so;
    so.impl = Impl::reference;
    const TensorView l64v = l64.view();
    sdpa(q64, k64, v64, so, o64, &l64v);
    Tensor rdq = poisoned(DType::f64, q64.shape()), rdk = poisoned(DType::f64, k64.shape()), rdv = poisoned(DType::f64, v64.shape());
    Tensor rds(DType::f64, Shape{c.Hq}, true);
    const TensorView rdsv = rds.view();
    sdpa_backward(q64, k64, v64, o64, l64, do64, so, rdq, rdk, rdv, nullptr, c.sinks ? &rdsv : nullptr);
    // The sink gradient's terms: m_σ = max_h Σ_{b,i} e^{σ_h − lse}·|D_i| (dσ is their signed sum).
    double mag_sink = 0;
    if (c.sinks) {
        for (std::int64_t h = 0; h < c.Hq; ++h) {
            double m = 0;
            for (std::int64_t b = 0; b < c.B; ++b)
                for (std::int64_t i = 0; i < c.Lq; ++i) {
                    double D = 0;
                    for (std::int64_t d = 0; d < c.Dv; ++d) {
                        const std::int64_t x = ((b * c.Hq + h) * c.Lq + i) * c.Dv + d;
                        D += do64.data_as<double>()[x] * o64.data_as<double>()[x];
                    }
                    m += std::exp(sink_logit(h) - l64.data_as<double>()[(b * c.Hq + h) * c.Lq + i]) * std::fabs(D);
                }
            mag_sink = std::max(mag_sink, m);
        }
    }
    double mag[3] = {0, 0, 0}, out_term[3] = {0, 0, 0}, grad_u = 0;
    {
        Tensor a64(DType::f64, Shape{c.B, c.Hq, c.Lq, c.Lk});
        const TensorView av = a64.view();
        sdpa(q64, k64, v64, so, o64, nullptr, &av);
        const double scale = c.scale.value_or(1.0 / std::sqrt(static_cast<double>(c.Dk)));
        double qmax = 0, kmax = 0, term = 0;
        for (std::int64_t i = 0; i < q64.numel(); ++i) qmax = std::max(qmax, std::fabs(q64.data_as<double>()[i]));
        for (std::int64_t i = 0; i < k64.numel(); ++i) kmax = std::max(kmax, std::fabs(k64.data_as<double>()[i]));
        auto at = [](const Tensor& t, std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t d) {
            const Shape& s = t.shape();
            return t.data_as<double>()[((b * s[1] + h) * s[2] + i) * s[3] + d];
        };
        for (std::int64_t b = 0; b < c.B; ++b)
            for (std::int64_t h = 0; h < c.Hq; ++h)
                for (std::int64_t i = 0; i < c.Lq; ++i) {
                    double D = 0;
                    for (std::int64_t d = 0; d < c.Dv; ++d) D += at(do64, b, h, i, d) * at(o64, b, h, i, d);
                    for (std::int64_t j = 0; j < c.Lk; ++j) {
                        double dP = 0;
                        for (std::int64_t d = 0; d < c.Dv; ++d) dP += at(do64, b, h, i, d) * at(v64, b, h / (c.Hq / c.Hkv), j, d);
                        term = std::max(term, at(a64, b, h, i, j) * (std::fabs(dP) + std::fabs(D)));
                    }
                }
        mag[0] = scale * term * kmax;
        mag[1] = scale * term * qmax;
        // A 16-bit O (docs/conventions.md, "Backward with 16-bit tensors"): D = rowsum(dO∘O) reads
        // the rounded O, |ΔD| <= δ = u·max_i Σ_d |dO·O|, which moves dQ by scale·δ·max|K| and dK by
        // scale·δ·max|Q|·(group·Lq) more; 16-bit gradients add one rounding, u·|value|.
        const double u = c.out_dtype == DType::bf16 ? std::ldexp(1.0, -8) : c.out_dtype == DType::f16 ? std::ldexp(1.0, -11) : 0.0;
        double delta = 0;
        for (std::int64_t b = 0; b < c.B; ++b)
            for (std::int64_t h = 0; h < c.Hq; ++h)
                for (std::int64_t i = 0; i < c.Lq; ++i) {
                    double sum = 0;
                    for (std::int64_t d = 0; d < c.Dv; ++d) sum += std::fabs(at(do64, b, h, i, d) * at(o64, b, h, i, d));
                    delta = std::max(delta, u * sum);
                }
        out_term[0] = scale * delta * kmax;
        out_term[1] = scale * delta * qmax * static_cast<double>(c.Hq / c.Hkv * c.Lq);
        grad_u = u;
    }

    const auto qseg = dist::rank_segments(c.Lq, P, rank, c.layout);
    const auto kseg = dist::rank_segments(c.Lk, P, rank, c.layout);
    const Tensor ql = dist::take_rows(g.q, qseg), kl = dist::take_rows(g.k, kseg), vl = dist::take_rows(g.v, kseg),
                 dol = dist::take_rows(g.dout, qseg);
    std::vector<float> sq, sk, sv, sdo;
    const TensorView qv = c.strided ? restride(ql, sq) : ql.view();
    const TensorView kv = c.strided ? restride(kl, sk) : kl.view();
    const TensorView vv = c.strided ? restride(vl, sv) : vl.view();
    const TensorView dov = c.strided ? restride(dol, sdo) : dol.view();
    const std::int64_t nq = ql.shape()[2], nk = kl.shape()[2];
    const dist::RingOptions ro = ring_options(c, g, impl);

    std::string detail;
    bool ok = true;
    Tensor o(c.out_dtype, Shape{c.B, c.Hq, nq, c.Dv}), l(DType::f32, Shape{c.B, c.Hq, nq});
    // The second run's thread count: 3 for the dropout cases, 1 for the rest (every case on 3
    // threads tripled the test's time on 2 shared cores, in barriers of tiny problems).
    const int rerun_threads = c.dropout_p > 0 ? 3 : 1;
    Tensor o3(c.out_dtype, o.shape()), l3(DType::f32, l.shape());  // the forward again, on rerun_threads
    Tensor dq[2], dk[2], dv[2], ds[2];
    dist::RingStats stats;
    try {
        const TensorView lv = l.view(), l3v = l3.view();
        {
            const ScopedNumThreads one(1);
            dist::ring_attention(MPI_COMM_WORLD, qv, kv, vv, ro, o, &lv);
        }
        {
            const ScopedNumThreads rerun(rerun_threads);
            dist::ring_attention(MPI_COMM_WORLD, qv, kv, vv, ro, o3, &l3v);
        }
        for (int run = 0; run < 2; ++run) {
            const ScopedNumThreads threads(run == 0 ? 1 : rerun_threads);
            dq[run] = poisoned(c.out_dtype, Shape{c.B, c.Hq, nq, c.Dk});
            dk[run] = poisoned(c.out_dtype, Shape{c.B, c.Hkv, nk, c.Dk});
            dv[run] = poisoned(c.out_dtype, Shape{c.B, c.Hkv, nk, c.Dv});
            ds[run] = poisoned(DType::f64, Shape{c.Hq});
            const TensorView dsv = ds[run].view();
            dist::ring_attention_backward(MPI_COMM_WORLD, qv, kv, vv, o, l, dov, ro, dq[run], dk[run], dv[run], &stats,
                                          c.sinks ? &dsv : nullptr);
        }
    } catch (const std::exception& e) {
        ok = false;
        detail = std::string("threw: ") + e.what();
    }
    double errs[6] = {0, 0, 0, 0, 0, 0}, worst[6];
    if (ok) {
        const Err eq = compare(dq[0], rdq, qseg), ek = compare(dk[0], rdk, kseg), ev = compare(dv[0], rdv, kseg);
        errs[0] = eq.err, errs[1] = ek.err, errs[2] = ev.err, errs[3] = eq.ref, errs[4] = ek.ref, errs[5] = ev.ref;
        if (std::memcmp(o.data(), o3.data(), o.nbytes()) != 0 || std::memcmp(l.data(), l3.data(), l.nbytes()) != 0) {
            ok = false;
            detail = "a second forward (" + std::to_string(rerun_threads) + " threads, the first on 1) gave other bits; ";
        }
        for (int run = 1; run < 2; ++run) {
            const bool same = std::memcmp(dq[0].data(), dq[run].data(), dq[0].nbytes()) == 0 &&
                              std::memcmp(dk[0].data(), dk[run].data(), dk[0].nbytes()) == 0 &&
                              std::memcmp(dv[0].data(), dv[run].data(), dv[0].nbytes()) == 0;
            if (!same) {
                ok = false;
                detail += "a second run (" + std::to_string(rerun_threads) + " threads, the first on 1) gave other bits; ";
            }
        }
        // dσ: the whole sequence's gradient on every rank, bit-identical in a second run.
        if (c.sinks) {
            double err = 0, ref = 0;
            for (std::int64_t h = 0; h < c.Hq; ++h) {
                const double x = ds[0].data_as<double>()[h], r = rds.data_as<double>()[h];
                err = std::isnan(x) ? INFINITY : std::max(err, std::fabs(x - r));
                ref = std::max(ref, std::fabs(r));
                if (std::memcmp(&x, ds[1].data_as<double>() + h, sizeof x) != 0) {
                    ok = false;
                    detail += "dsinks: a second run gave other bits; ";
                }
            }
            const double denominator = std::max(ref, mag_sink);
            if (!(err <= 1e-5 * denominator) && !(err == 0)) {
                ok = false;
                detail += "dsinks: max error " + std::to_string(err) + " of max |ref| " + std::to_string(ref) + ", m " +
                          std::to_string(mag_sink) + "; ";
            }
        }
    } else {
        errs[0] = errs[1] = errs[2] = INFINITY;
    }
    MPI_Allreduce(errs, worst, 6, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    const char* names[3] = {"dQ", "dK", "dV"};
    double rel[3];
    for (int t = 0; t < 3; ++t) {
        // The float32 bound 1e-5·max(max |ref|, m), plus the 16-bit terms (zero for float32 O).
        const double denominator = std::max(worst[3 + t], mag[t]);
        const double extra = out_term[t] + grad_u * (worst[3 + t] + 1e-5 * denominator);
        rel[t] = denominator > 0 ? (worst[t] - extra) / denominator : (worst[t] <= extra ? 0 : INFINITY);
        if (!(rel[t] <= 1e-5)) {
            ok = false;
            detail += std::string(names[t]) + ": max error " + std::to_string(worst[t]) + " of max |ref| " + std::to_string(worst[3 + t]) + ", m " + std::to_string(mag[t]) + "; ";
        }
    }
    std::int64_t entries = stats.score_entries, total = 0;
    MPI_Allreduce(&entries, &total, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
    const std::int64_t expected = c.Hq * visible_pairs(c);
    if (ok && total != expected) {
        ok = false;
        detail += "the ranks scored " + std::to_string(total) + " entries, the visible ones are " + std::to_string(expected);
    }
    // The ring runs exactly the steps some rank computes in (fewer than P under a narrow window).
    if (ok && stats.steps != expected_steps(c, P)) {
        ok = false;
        detail += "; the ring ran " + std::to_string(stats.steps) + " steps, the visible pairs need " +
                  std::to_string(expected_steps(c, P));
    }
    char buf[128];
    std::snprintf(buf, sizeof buf, "  (relative dQ %.1e, dK %.1e, dV %.1e)", rel[0], rel[1], rel[2]);
    verdict("backward " + c.name + " [" + std::string(dist::layout_name(c.layout)) + "]" + buf, ok, detail);
}

// Every rank must throw attn::Error containing `expect`, all with the same message, and the
// poisoned gradients must stay untouched.
struct Args {
    Tensor q, k, v, o, lse, dout, dq, dk, dv;
    dist::RingOptions opt;
    bool dv_is_v = false;  // pass V itself as dv
    bool dq_null = false;  // pass dq as a view of dq's shape with a null data pointer
    Tensor dsinks{DType::f32, Shape{1}};
    bool pass_dsinks = false;
    bool forward = false;         // this rank calls ring_attention (the others the backward)
    MPI_Comm comm = MPI_COMM_WORLD;
};
void run_error_case(const std::string& name, const std::string& expect, const std::function<void(Args&)>& breaker) {
    const std::int64_t B = 2, Hq = 2, Hkv = 1, L = 21, D = 4;
    std::mt19937 gen(99);
    const Tensor qg = random_tensor(gen, Shape{B, Hq, L, D}, 1.0f);
    const Tensor kg = random_tensor(gen, Shape{B, Hkv, L, D}, 1.0f);
    const Tensor vg = random_tensor(gen, Shape{B, Hkv, L, D}, 1.0f);
    const auto seg = dist::rank_segments(L, P, rank, dist::Layout::zigzag);
    Args a;
    a.q = dist::take_rows(qg, seg), a.k = dist::take_rows(kg, seg), a.v = dist::take_rows(vg, seg);
    const std::int64_t n = a.q.shape()[2];
    a.o = Tensor(DType::f32, Shape{B, Hq, n, D}, true);
    a.lse = Tensor(DType::f32, Shape{B, Hq, n}, true);
    a.dout = Tensor(DType::f32, Shape{B, Hq, n, D}, true);
    a.dq = poisoned(DType::f32, a.q.shape()), a.dk = poisoned(DType::f32, a.k.shape()), a.dv = poisoned(DType::f32, a.v.shape());
    breaker(a);
    std::string message;
    bool threw_error = false;
    try {
        const TensorView dsv = a.dsinks.view();
        if (a.forward) {
            a.dq = poisoned(DType::f32, a.o.shape());  // the forward's out: checked untouched below as dq
            dist::ring_attention(a.comm, a.q, a.k, a.v, a.opt, a.dq);
        } else {
            const TensorView dq = a.dq_null ? TensorView(nullptr, DType::f32, a.dq.shape()) : a.dq.view();
            dist::ring_attention_backward(a.comm, a.q, a.k, a.v, a.o, a.lse, a.dout, a.opt, dq, a.dk,
                                          a.dv_is_v ? a.v.view() : a.dv.view(), nullptr, a.pass_dsinks ? &dsv : nullptr);
        }
    } catch (const attn::Error& e) {
        threw_error = true;
        message = e.what();
    } catch (const std::exception& e) {
        message = std::string("not an attn::Error: ") + e.what();
    }
    bool untouched = true;
    for (const Tensor* t : {&a.dq, &a.dk, &a.dv})
        if (t->dtype() == DType::f32)
            for (std::int64_t i = 0; i < t->numel(); ++i) untouched &= std::isnan(t->data_as<float>()[i]);
    std::vector<char> m0(512, 0);
    if (rank == 0) std::strncpy(m0.data(), message.c_str(), m0.size() - 1);
    MPI_Bcast(m0.data(), static_cast<int>(m0.size()), MPI_CHAR, 0, MPI_COMM_WORLD);
    // The same after the op's name (a rank in ring_attention says "ring_attention: …").
    const auto body = [](const std::string& m) { return m.substr(m.find(": ") == std::string::npos ? 0 : m.find(": ")); };
    const bool same = body(message.substr(0, m0.size() - 1)) == body(std::string(m0.data()));
    const bool ok = threw_error && untouched && same && message.find(expect) != std::string::npos;
    if (rank == 0 && threw_error) std::printf("  message: %s\n", message.c_str());
    verdict("backward error: " + name, ok,
            "threw attn::Error: " + std::to_string(threw_error) + ", gradients untouched: " + std::to_string(untouched) +
                ", same message as rank 0: " + std::to_string(same) + ", message: '" + message + "', expected to contain '" +
                expect + "'");
}

}  // namespace

int main(int argc, char** argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_size(MPI_COMM_WORLD, &P);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank == 0) std::printf("ring_backward_check on P = %d ranks\n", P);

    std::vector<Case> cases;
    for (const auto layout : {dist::Layout::zigzag, dist::Layout::contiguous}) {
        for (Causal causal : {Causal::none, Causal::top_left}) {
            const std::string c = causal == Causal::top_left ? "causal" : "full";
            Case g;
            g.name = c + " GQA Hq=6 Hkv=2 B=2 Dk=12 Dv=5 L=37";
            g.B = 2, g.Hq = 6, g.Hkv = 2, g.Lq = 37, g.Lk = 37, g.Dk = 12, g.Dv = 5, g.causal = causal, g.layout = layout;
            cases.push_back(g);
            Case x;
            x.name = c + " cross Lq=23 Lk=41";
            x.Hq = 2, x.Hkv = 2, x.Lq = 23, x.Lk = 41, x.causal = causal, x.layout = layout;
            cases.push_back(x);
            Case p;
            p.name = c + " key padding B=3 key_lengths=(29, 11, 0) L=29";
            p.B = 3, p.Hq = 2, p.Lq = 29, p.Lk = 29, p.key_lengths = {29, 11, 0}, p.causal = causal, p.layout = layout;
            cases.push_back(p);
            Case w;
            w.name = c + " window (5, 0) MQA Hq=3 L=50 Dk=16 Dv=8 scale=0.3";
            w.Hq = 3, w.Lq = 50, w.Lk = 50, w.Dk = 16, w.Dv = 8, w.scale = 0.3, w.window = Window{5, 0, Align::top_left};
            w.causal = causal, w.layout = layout;
            cases.push_back(w);
            Case t;
            t.name = c + " tiny L=3 (ranks without rows)";
            t.Lq = 3, t.Lk = 3, t.causal = causal, t.layout = layout;
            cases.push_back(t);
            Case s;
            s.name = c + " strided (B, L, H, D) views, Hq=4 Hkv=2 L=33";
            s.B = 2, s.Hq = 4, s.Hkv = 2, s.Lq = 33, s.Lk = 33, s.Dk = 8, s.Dv = 10, s.strided = true, s.causal = causal;
            s.layout = layout;
            cases.push_back(s);
        }
        Case br;
        br.name = "bottom-right, key_lengths (5, 40, 12, 0) around Lq=20, Lk=40";
        br.B = 4, br.Hq = 2, br.Hkv = 1, br.Lq = 20, br.Lk = 40, br.key_lengths = {5, 40, 12, 0};
        br.causal = Causal::bottom_right, br.layout = layout;
        cases.push_back(br);
        Case mixed;
        mixed.name = "top-left causal + bottom-right window (3, 2) under key_lengths (31, 9, 17)";
        mixed.B = 3, mixed.Lq = 25, mixed.Lk = 31, mixed.key_lengths = {31, 9, 17}, mixed.causal = Causal::top_left;
        mixed.window = Window{3, 2, Align::bottom_right}, mixed.layout = layout;
        cases.push_back(mixed);
    }
    // Softcap (differentiated per block) and sinks (dσ summed over the ranks) on every named case.
    const std::size_t named = cases.size();
    for (std::size_t i = 0; i < named; ++i) cases.push_back(with_modifiers(cases[i], static_cast<int>(i % 3)));
    for (std::size_t i = 0; i < named; ++i) cases.push_back(with_alibi(cases[i], static_cast<int>(i % 2)));
    // Dropout: every block regenerates single-process sdpa's keep mask at its global origin.
    for (std::size_t i = 0; i < named; ++i) cases.push_back(with_dropout(cases[i], static_cast<int>(i)));
    cases.push_back(with_dropout(with_modifiers(cases[0], 2), 1));
    cases.push_back(with_dropout(with_alibi(cases[3], 1), 0));
    for (const Case& c : piece_cases()) cases.push_back(c);
    std::size_t n_random = 0;
    for (Case& r : random_cases(32, 77)) {
        cases.push_back(r);
        if (n_random++ % 2 == 1) cases.push_back(with_alibi(r, static_cast<int>(n_random / 2 % 2)));
    }
    // 16-bit Q/K/V, O, dO and gradients (K/V travel in 16 bits; dK/dV sums in float32): the named
    // cases over the dtype combinations, one with softcap, one with dropout, one strided.
    {
        const DType f32 = DType::f32, f16 = DType::f16, bf16 = DType::bf16;
        const DType combos[][3] = {{bf16, bf16, bf16}, {f16, f16, f16}, {f32, bf16, f32}, {f32, f16, f32}, {bf16, bf16, f32}};
        // Every third named case (the double-precision oracle dominates the test's time; the
        // forward's ring_check covers every named case in 16 bits).
        for (std::size_t i = 0; i < named; i += 3) {
            const DType* d = combos[i / 3 % std::size(combos)];
            cases.push_back(with_dtypes(cases[i], d[0], d[1], d[2]));
        }
        cases.push_back(with_dtypes(with_modifiers(cases[1], 0), bf16, bf16, bf16));
        cases.push_back(with_dtypes(with_dropout(cases[2], 1), f16, f16, f16));
        Case st = with_dtypes(cases[3], bf16, bf16, bf16);
        st.strided = true;
        st.name += " strided";
        cases.push_back(st);
        // K float16, V float32, odd sizes: V's start in the ring buffer must be float-aligned.
        Case m;
        m.name = "K float16, V float32: causal B=1 Hq=2 Hkv=1 L=13 Dk=5 Dv=3 [V float32]";
        m.Hq = 2, m.Lq = 13, m.Lk = 13, m.Dk = 5, m.Dv = 3, m.causal = Causal::top_left;
        m = with_dtypes(m, f32, f16, f32);
        m.v_dtype = f32;
        cases.push_back(m);
    }
    for (const Case& c : cases) run_case(c);

    const int last = P - 1;
    const std::string at_last = P > 1 ? "rank " + std::to_string(last) + ": " : "";
    run_error_case("grad_out with another shape on the last rank",
                   "ring_attention_backward: " + at_last + "grad_out: expected the shape of out", [&](Args& a) {
                       if (rank == last) a.dout = Tensor(DType::f32, Shape{2, 2, a.q.shape()[2], 3}, true);
                   });
    run_error_case("dk float64", "ring_attention_backward: dk: dtype must be float32",
                   [&](Args& a) { a.dk = poisoned(DType::f64, a.k.shape()); });
    run_error_case("dv aliases V", "dv", [&](Args& a) { a.dv_is_v = true; });
    // Rank 0 has rows (zigzag, L = 21), so its dq has elements: the null pointer is refused.
    run_error_case("dq with a null data pointer", "ring_attention_backward: dq: data pointer is null but its shape (2, 2, ",
                   [&](Args& a) { a.dq_null = true; });
    run_error_case("lse with a wrong shape", "lse", [&](Args& a) { a.lse = Tensor(DType::f32, Shape{2, 1, a.q.shape()[2]}, true); });
    run_error_case("dsinks without sinks", "ring_attention_backward: dsinks: given but options.sinks is not set",
                   [&](Args& a) {
                       a.dsinks = Tensor(DType::f32, Shape{2});
                       a.pass_dsinks = true;
                   });
    static float sinks[2] = {0.5f, -0.5f};
    run_error_case("dsinks of the wrong shape", "ring_attention_backward: dsinks", [&](Args& a) {
        a.opt.sinks = TensorView(sinks, DType::f32, Shape{2});
        a.dsinks = Tensor(DType::f32, Shape{3});
        a.pass_dsinks = true;
    });
    run_error_case("Impl::decode", "ring_attention_backward: impl: must be automatic or flash (",
                   [&](Args& a) { a.opt.impl = Impl::decode; });
    if (P >= 2) {
        run_error_case("causal on the last rank only", "was called with causal top_left but rank 0 with causal none",
                       [&](Args& a) {
                           if (rank == last) a.opt.causal = Causal::top_left;
                       });
        // dsinks on some ranks only: their sum is collective, and the ranks without them returned
        // while the others waited for ever (an exploratory test found the hang).
        run_error_case("dsinks on the last rank only", "was called with dsinks given but rank 0 with dsinks not given",
                       [&](Args& a) {
                           a.opt.sinks = TensorView(sinks, DType::f32, Shape{2});
                           a.dsinks = Tensor(DType::f32, Shape{2});
                           a.pass_dsinks = rank == last;
                       });
        // The last rank in the forward, the others in the backward: they ran the same collectives up
        // to the ring and waited there for ever (an adversarial test found the hang).
        run_error_case("the forward on the last rank, the backward on the others",
                       "rank " + std::to_string(last) + " called ring_attention but rank 0 called ring_attention_backward",
                       [&](Args& a) { a.forward = rank == last; });
        // An intercommunicator: its sends reach the other group, and the result was silently wrong.
        MPI_Comm half = MPI_COMM_NULL, inter = MPI_COMM_NULL;
        MPI_Comm_split(MPI_COMM_WORLD, rank % 2, rank, &half);
        MPI_Intercomm_create(half, 0, MPI_COMM_WORLD, rank % 2 == 0 ? 1 : 0, 17, &inter);
        run_error_case("an intercommunicator", "comm: an intercommunicator", [&](Args& a) { a.comm = inter; });
        MPI_Comm_free(&inter);
        MPI_Comm_free(&half);
    }

    if (rank == 0) std::printf("%d passed, %d failed\n", passed, failed);
    MPI_Finalize();
    return failed == 0 ? 0 : 1;
}
