// ring_scale — one large ring attention run with per-rank timings, checked on sampled rows.
//
//   mpirun -np 4 ring_scale --length 131072 [--heads 1] [--kv-heads 1] [--dim 64] [--batch 1]
//                           [--full] [--layout zigzag|contiguous] [--samples 16] [--impl auto]
//                           [--transfer-reps 5] [--reps 1] [--backward]
//
// With --reps R the ring runs R times and every time printed is a per-rank median.
// Every rank generates its own rows of Q, K, V from a counter-based hash of (tensor, b, h, row, d),
// so no rank ever holds the whole sequence and no data is scattered. After the ring:
//   * per-rank compute (wall and CPU) / wait / total times and visible score entries, and the
//     compute max/min ratio (the load balance);
//   * the K/V transfer of one ring step alone (all ranks Isend/Irecv a block at once, as in the
//     ring, no compute): median of --transfer-reps, giving the link bandwidth used in docs/ring.md;
//   * sampled query rows (first, last, chunk edges, spread) checked against single-process
//     attn::sdpa (reference kernel, on rank 0, keys 0..i for a causal row i):
//     |O − O_ref| <= 1e-5 per element (kTolerance below says why).
// With --backward, the ring forward keeps lse and ring_attention_backward runs on a generated
// dO (tensor 3 of the hash), with per-rank times; then sampled gradient rows are checked:
//   * dQ rows against single-process attn::sdpa_backward (reference kernel, in double, keys 0..i);
//   * dK/dV rows j: the sums over every query i that sees key j, computed here in double from
//     the ring's O and lse (gathered on rank 0; the forward rows themselves are checked above):
//       P_ij = exp(scale·q_i·k_j − lse_i), dV_j = Σ_i P_ij·dO_i, dK_j = scale·Σ_i P_ij·(dO_i·v_j − dO_i·O_i)·q_i
//   per gradient over the sampled rows: max |g − g_ref| <= 1e-5 · max |g_ref|.
// Exit status 0 when every sampled row matches, 1 otherwise; "N passed, M failed" on the last line.
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <vector>

#include "attn/error.hpp"
#include "attn/ring.hpp"
#include "attn/sdpa.hpp"
#include "attn/sdpa_backward.hpp"

using namespace attn;

namespace {

// Absolute bound on |O − O_ref| per element. O is a convex combination of V rows (|V| < 1);
// float32 rounding in the kernel's sums and in the log-sum-exp merge stays near 1e-6 even for
// 131072 keys, so 1e-5 leaves a margin without hiding a wrong block (an error there is ≈ |O|).
constexpr double kTolerance = 1e-5;

struct Args {
    std::int64_t L = 4096, B = 1, H = 1, Hkv = 1, D = 64;
    bool causal = true;
    dist::Layout layout = dist::Layout::zigzag;
    int samples = 16;
    int transfer_reps = 5;
    int reps = 1;
    Impl impl = Impl::automatic;
    bool backward = false;
};

std::uint64_t splitmix64(std::uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

// Element (b, h, row, d) of tensor `which` (0 = Q, 1 = K, 2 = V, 3 = dO), uniform in [−1, 1).
float value(int which, std::int64_t b, std::int64_t h, std::int64_t row, std::int64_t d) {
    const std::uint64_t key = ((((static_cast<std::uint64_t>(which) * 1000003u + b) * 1000003u + h) << 32) ^
                               (static_cast<std::uint64_t>(row) << 8)) + static_cast<std::uint64_t>(d);
    return static_cast<float>(splitmix64(key) >> 40) * (2.0f / 16777216.0f) - 1.0f;
}

// The rows of `segments` of tensor `which`: (B, H, Σ lengths, D).
Tensor generate(int which, std::int64_t B, std::int64_t H, std::int64_t D, const std::vector<dist::Segment>& segments) {
    std::int64_t n = 0;
    for (const auto& s : segments) n += s.length;
    Tensor t(DType::f32, Shape{B, H, n, D});
    float* p = t.data_as<float>();
    for (std::int64_t b = 0; b < B; ++b)
        for (std::int64_t h = 0; h < H; ++h)
            for (const auto& s : segments)
                for (std::int64_t i = 0; i < s.length; ++i)
                    for (std::int64_t d = 0; d < D; ++d) *p++ = value(which, b, h, s.start + i, d);
    return t;
}

Args parse(int argc, char** argv) {
    Args a;
    for (int i = 1; i < argc; ++i) {
        const std::string f = argv[i];
        auto next = [&]() -> std::string {
            if (i + 1 >= argc) throw Error(f + ": expected a value");
            return argv[++i];
        };
        if (f == "--length") a.L = std::stoll(next());
        else if (f == "--batch") a.B = std::stoll(next());
        else if (f == "--heads") a.H = std::stoll(next());
        else if (f == "--kv-heads") a.Hkv = std::stoll(next());
        else if (f == "--dim") a.D = std::stoll(next());
        else if (f == "--full") a.causal = false;
        else if (f == "--layout") a.layout = dist::parse_layout(next());
        else if (f == "--samples") a.samples = std::stoi(next());
        else if (f == "--transfer-reps") a.transfer_reps = std::stoi(next());
        else if (f == "--reps") a.reps = std::max(1, std::stoi(next()));
        else if (f == "--impl") a.impl = parse_impl(next());
        else if (f == "--backward") a.backward = true;
        else throw Error("ring_scale: unknown argument '" + f + "'");
    }
    return a;
}

// --backward: run ring_attention_backward on a generated dO, print per-rank times, check sampled
// gradient rows (see the top of the file). Returns the number of failed checks (on rank 0).
int check_backward(const Args& a, int P, int rank, const std::vector<dist::Segment>& seg, const Tensor& q, const Tensor& k,
                   const Tensor& v, const Tensor& o, const Tensor& lse, const dist::RingOptions& opt,
                   const std::vector<std::int64_t>& rows, double forward_cpu) {
    const Tensor dout = generate(3, a.B, a.H, a.D, seg);
    const std::int64_t n = q.shape()[2];
    Tensor dq(DType::f32, q.shape()), dk(DType::f32, k.shape()), dv(DType::f32, v.shape());
    dist::RingStats st;
    MPI_Barrier(MPI_COMM_WORLD);
    dist::ring_attention_backward(MPI_COMM_WORLD, q, k, v, o, lse, dout, opt, dq, dk, dv, &st);
    constexpr int kStats = 6;
    const double mine[kStats] = {st.compute_seconds, st.compute_cpu_seconds, st.wait_seconds, st.total_seconds,
                                 static_cast<double>(st.bytes_sent), static_cast<double>(st.steps)};
    std::vector<double> all(static_cast<std::size_t>(kStats * P));
    MPI_Gather(mine, kStats, MPI_DOUBLE, all.data(), kStats, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    double forward_cpus = 0;
    MPI_Reduce(&forward_cpu, &forward_cpus, 1, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
    if (rank == 0) {
        std::printf("backward: kernel %s, %d steps\n", st.kernel.c_str(), st.steps);
        double cpus = 0, lo = 1e300, hi = 0;
        for (int r = 0; r < P; ++r) {
            const double* s = &all[static_cast<std::size_t>(kStats * r)];
            std::printf("  rank %d: compute %.4g s (cpu %.4g s), wait %.3g s, total %.4g s, sent %.1f MB\n", r, s[0], s[1], s[2],
                        s[3], s[4] * 1e-6);
            cpus += s[1];
            lo = std::min(lo, s[1]), hi = std::max(hi, s[1]);
        }
        std::printf("  backward/forward compute cpu = %.2f (the model: 2.5), cpu max/min = %.3f\n", cpus / forward_cpus, hi / lo);
    }

    // Global O and lse, and the sampled rows of dQ (query rows) and dK/dV (the same indices as
    // key rows): summed over ranks onto rank 0 (each rank fills only what it owns).
    const std::int64_t L = a.L, B = a.B, H = a.H, Hkv = a.Hkv, D = a.D, S = static_cast<std::int64_t>(rows.size());
    std::vector<double> og(static_cast<std::size_t>(B * H * L * D), 0.0), lg(static_cast<std::size_t>(B * H * L), 0.0);
    std::vector<double> gq(static_cast<std::size_t>(S * B * H * D), 0.0), gk(static_cast<std::size_t>(S * B * Hkv * D), 0.0),
        gv(gk.size(), 0.0);
    std::int64_t local = 0;
    for (const auto& sg : seg) {
        for (std::int64_t i = 0; i < sg.length; ++i)
            for (std::int64_t b = 0; b < B; ++b)
                for (std::int64_t h = 0; h < H; ++h) {
                    lg[static_cast<std::size_t>((b * H + h) * L + sg.start + i)] = lse.data_as<float>()[(b * H + h) * n + local + i];
                    for (std::int64_t d = 0; d < D; ++d)
                        og[static_cast<std::size_t>(((b * H + h) * L + sg.start + i) * D + d)] =
                            o.data_as<float>()[((b * H + h) * n + local + i) * D + d];
                }
        for (std::int64_t s = 0; s < S; ++s) {
            const std::int64_t r = rows[static_cast<std::size_t>(s)];
            if (r < sg.start || r >= sg.start + sg.length) continue;
            const std::int64_t at = local + r - sg.start;
            for (std::int64_t b = 0; b < B; ++b)
                for (std::int64_t d = 0; d < D; ++d) {
                    for (std::int64_t h = 0; h < H; ++h)
                        gq[static_cast<std::size_t>(((s * B + b) * H + h) * D + d)] = dq.data_as<float>()[((b * H + h) * n + at) * D + d];
                    for (std::int64_t h = 0; h < Hkv; ++h) {
                        gk[static_cast<std::size_t>(((s * B + b) * Hkv + h) * D + d)] = dk.data_as<float>()[((b * Hkv + h) * n + at) * D + d];
                        gv[static_cast<std::size_t>(((s * B + b) * Hkv + h) * D + d)] = dv.data_as<float>()[((b * Hkv + h) * n + at) * D + d];
                    }
                }
        }
        local += sg.length;
    }
    auto reduce = [&](std::vector<double>& x) {
        std::vector<double> sum(rank == 0 ? x.size() : 1);
        MPI_Reduce(x.data(), sum.data(), static_cast<int>(x.size()), MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
        if (rank == 0) x.swap(sum);
    };
    reduce(og), reduce(lg), reduce(gq), reduce(gk), reduce(gv);
    if (rank != 0) return 0;

    const double scale = 1.0 / std::sqrt(static_cast<double>(D));
    const Tensor qf = generate(0, B, H, D, {{0, L}}), kf = generate(1, B, Hkv, D, {{0, L}}), vf = generate(2, B, Hkv, D, {{0, L}}),
                 df = generate(3, B, H, D, {{0, L}});
    auto row = [](const Tensor& t, std::int64_t b, std::int64_t h, std::int64_t i) {
        const Shape& s = t.shape();
        return t.data_as<float>() + ((b * s[1] + h) * s[2] + i) * s[3];
    };
    double err[3] = {0, 0, 0}, ref_max[3] = {0, 0, 0};
    for (std::int64_t s = 0; s < S; ++s) {
        const std::int64_t r = rows[static_cast<std::size_t>(s)];
        // dQ row r: single-process sdpa_backward (reference, double) on query r and its keys.
        const std::int64_t keys = a.causal ? r + 1 : L;
        Tensor q1 = to_dtype(generate(0, B, H, D, {{r, 1}}), DType::f64), d1 = to_dtype(generate(3, B, H, D, {{r, 1}}), DType::f64);
        Tensor kk = to_dtype(kf.view().slice(2, 0, keys), DType::f64), vv = to_dtype(vf.view().slice(2, 0, keys), DType::f64);
        Tensor o1(DType::f64, Shape{B, H, 1, D}), l1(DType::f64, Shape{B, H, 1}), g1(DType::f64, Shape{B, H, 1, D}),
            gk1(DType::f64, kk.shape()), gv1(DType::f64, vv.shape());
        SdpaOptions so;
        so.impl = Impl::reference;
        const TensorView l1v = l1.view();
        sdpa(q1, kk, vv, so, o1, &l1v);
        sdpa_backward(q1, kk, vv, o1, l1, d1, so, g1, gk1, gv1);
        for (std::int64_t i = 0; i < B * H * D; ++i) {
            const double x = gq[static_cast<std::size_t>(s * B * H * D + i)], ref = g1.data_as<double>()[i];
            err[0] = std::isnan(x) ? INFINITY : std::max(err[0], std::fabs(x - ref));
            ref_max[0] = std::max(ref_max[0], std::fabs(ref));
        }
        // dK/dV row r (as a key): every query i that sees it, from the ring's O and lse.
        const std::int64_t group = H / Hkv;
        for (std::int64_t b = 0; b < B; ++b)
            for (std::int64_t hk = 0; hk < Hkv; ++hk) {
                std::vector<double> rk(static_cast<std::size_t>(D), 0.0), rv(static_cast<std::size_t>(D), 0.0);
                const float* kj = row(kf, b, hk, r);
                const float* vj = row(vf, b, hk, r);
                for (std::int64_t h = hk * group; h < (hk + 1) * group; ++h)
                    for (std::int64_t i = a.causal ? r : 0; i < L; ++i) {
                        const float* qi = row(qf, b, h, i);
                        const float* di = row(df, b, h, i);
                        const double* oi = og.data() + ((b * H + h) * L + i) * D;
                        double sc = 0, dp = 0, dd = 0;
                        for (std::int64_t d = 0; d < D; ++d) sc += double(qi[d]) * kj[d], dp += double(di[d]) * vj[d], dd += di[d] * oi[d];
                        const double pij = std::exp(sc * scale - lg[static_cast<std::size_t>((b * H + h) * L + i)]);
                        const double ds = pij * (dp - dd) * scale;
                        for (std::int64_t d = 0; d < D; ++d) rk[static_cast<std::size_t>(d)] += ds * qi[d], rv[static_cast<std::size_t>(d)] += pij * di[d];
                    }
                for (std::int64_t d = 0; d < D; ++d) {
                    const std::size_t at = static_cast<std::size_t>(((s * B + b) * Hkv + hk) * D + d);
                    err[1] = std::isnan(gk[at]) ? INFINITY : std::max(err[1], std::fabs(gk[at] - rk[static_cast<std::size_t>(d)]));
                    err[2] = std::isnan(gv[at]) ? INFINITY : std::max(err[2], std::fabs(gv[at] - rv[static_cast<std::size_t>(d)]));
                    ref_max[1] = std::max(ref_max[1], std::fabs(rk[static_cast<std::size_t>(d)]));
                    ref_max[2] = std::max(ref_max[2], std::fabs(rv[static_cast<std::size_t>(d)]));
                }
            }
    }
    int failed = 0;
    const char* names[3] = {"dQ", "dK", "dV"};
    for (int t = 0; t < 3; ++t) {
        const double rel = err[t] / ref_max[t];
        std::printf("  sampled %s rows: %lld, max |g - g_ref| = %.3g of max |g_ref| %.3g: relative %.2e (<= 1e-5: %s)\n", names[t],
                    static_cast<long long>(S), err[t], ref_max[t], rel, rel <= 1e-5 ? "pass" : "FAIL");
        failed += rel <= 1e-5 ? 0 : 1;
    }
    std::printf("backward: %d passed, %d failed\n", 3 - failed, failed);
    return failed;
}

}  // namespace

int main(int argc, char** argv) {
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
    int P = 1, rank = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &P);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    Args a;
    try {
        dist::run_collectively(MPI_COMM_WORLD, [&] { a = parse(argc, argv); });
    } catch (const Error& e) {
        if (rank == 0) std::fprintf(stderr, "ring_scale: error: %s\n", e.what());
        MPI_Finalize();
        return 2;
    }

    const auto qseg = dist::rank_segments(a.L, P, rank, a.layout);
    const Tensor q = generate(0, a.B, a.H, a.D, qseg);
    const Tensor k = generate(1, a.B, a.Hkv, a.D, qseg);
    const Tensor v = generate(2, a.B, a.Hkv, a.D, qseg);
    const std::int64_t n = q.shape()[2];
    Tensor o(DType::f32, Shape{a.B, a.H, n, a.D});
    for (std::int64_t i = 0; i < o.numel(); ++i) o.data_as<float>()[i] = std::nanf("");

    Tensor lse(DType::f32, Shape{a.B, a.H, n});

    dist::RingOptions opt;
    opt.causal = a.causal ? Causal::top_left : Causal::none;
    opt.layout = a.layout;
    opt.impl = a.impl;
    // --reps R: R rings; the times reported are per-rank medians (noisy shared machines).
    std::vector<dist::RingStats> runs;
    std::vector<double> ring_times;  // per run: the slowest rank's total
    for (int rep = 0; rep < a.reps; ++rep) {
        dist::RingStats one;
        MPI_Barrier(MPI_COMM_WORLD);
        const TensorView lse_view = lse.view();
        dist::ring_attention(MPI_COMM_WORLD, q, k, v, opt, o, &lse_view, &one);
        double slowest = 0;
        MPI_Allreduce(&one.total_seconds, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        runs.push_back(one);
        ring_times.push_back(slowest);
    }
    auto median = [](std::vector<double> x) {
        std::sort(x.begin(), x.end());
        return x[x.size() / 2];
    };
    auto median_of = [&](double dist::RingStats::*field) {
        std::vector<double> x;
        for (const auto& r : runs) x.push_back(r.*field);
        return median(x);
    };
    dist::RingStats st = runs.back();
    st.compute_seconds = median_of(&dist::RingStats::compute_seconds);
    st.compute_cpu_seconds = median_of(&dist::RingStats::compute_cpu_seconds);
    st.wait_seconds = median_of(&dist::RingStats::wait_seconds);
    st.total_seconds = median_of(&dist::RingStats::total_seconds);
    const double cpu = st.compute_cpu_seconds;

    // ---- per-rank statistics ----
    constexpr int kStats = 7;
    const double mine[kStats] = {st.compute_seconds, cpu, st.wait_seconds, st.total_seconds,
                                 static_cast<double>(st.score_entries), static_cast<double>(st.bytes_sent),
                                 static_cast<double>(st.sdpa_calls)};
    std::vector<double> all(static_cast<std::size_t>(kStats * P));
    MPI_Gather(mine, kStats, MPI_DOUBLE, all.data(), kStats, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    const double flops_per_entry = 2.0 * static_cast<double>(a.D) + 2.0 * static_cast<double>(a.D);  // QKᵀ + PV
    if (rank == 0) {
        std::printf("ring_scale: L = %lld, B = %lld, H = %lld, Hkv = %lld, D = %lld, %s, layout %s, P = %d, kernel %s\n",
                    static_cast<long long>(a.L), static_cast<long long>(a.B), static_cast<long long>(a.H),
                    static_cast<long long>(a.Hkv), static_cast<long long>(a.D), a.causal ? "causal" : "full",
                    std::string(dist::layout_name(a.layout)).c_str(), P, st.kernel.c_str());
        double lo = 1e300, hi = 0, lo_e = 1e300, hi_e = 0, lo_c = 1e300, hi_c = 0;
        for (int r = 0; r < P; ++r) {
            const double* s = &all[static_cast<std::size_t>(kStats * r)];
            std::printf("  rank %d: compute %.4g s (cpu %.4g s), wait %.3g s, total %.4g s, %.4g score entries, %d sdpa calls, "
                        "%.3g GFLOP/s, sent %.1f MB\n",
                        r, s[0], s[1], s[2], s[3], s[4], static_cast<int>(s[6]), s[4] * flops_per_entry / s[0] * 1e-9,
                        s[5] * 1e-6);
            lo = std::min(lo, s[0]), hi = std::max(hi, s[0]);
            lo_c = std::min(lo_c, s[1]), hi_c = std::max(hi_c, s[1]);
            lo_e = std::min(lo_e, s[4]), hi_e = std::max(hi_e, s[4]);
        }
        std::printf("  ring time (slowest rank's total, median of %d runs): %.6f s\n", a.reps, median(ring_times));
        std::printf("  load balance: compute wall max/min = %.3f, cpu max/min = %.3f, score entries max/min = %.3f\n",
                    hi / lo, hi_c / lo_c, lo_e > 0 ? hi_e / lo_e : 0.0);
    }

    // ---- one ring step's K/V transfer alone (as in the ring: everyone sends right, receives left) ----
    if (P > 1 && a.transfer_reps > 0) {
        const std::int64_t words = a.B * a.Hkv * dist::rank_length(a.L, P, 0, a.layout) * 2 * a.D;
        std::vector<float> send(static_cast<std::size_t>(words), 1.0f), recv(static_cast<std::size_t>(words));
        std::vector<double> times;
        for (int rep = 0; rep < a.transfer_reps; ++rep) {
            MPI_Barrier(MPI_COMM_WORLD);
            const double t0 = MPI_Wtime();
            MPI_Request req[2];
            MPI_Irecv(recv.data(), static_cast<int>(words), MPI_FLOAT, (rank - 1 + P) % P, 11, MPI_COMM_WORLD, &req[0]);
            MPI_Isend(send.data(), static_cast<int>(words), MPI_FLOAT, (rank + 1) % P, 11, MPI_COMM_WORLD, &req[1]);
            MPI_Waitall(2, req, MPI_STATUSES_IGNORE);
            double t = MPI_Wtime() - t0, tmax = 0;
            MPI_Allreduce(&t, &tmax, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
            times.push_back(tmax);
        }
        std::sort(times.begin(), times.end());
        const double med = times[times.size() / 2];
        if (rank == 0) {
            const double bytes = static_cast<double>(words) * 4.0;
            double step = 0;  // the slowest rank's compute per ring step
            for (int r = 0; r < P; ++r) step = std::max(step, all[static_cast<std::size_t>(kStats * r)] / P);
            std::printf("  transfer of one K/V block (%.2f MB) around the ring: median %.4g s over %d reps = %.3g GB/s per link; "
                        "ring-step compute (slowest rank) = %.4g s\n",
                        bytes * 1e-6, med, a.transfer_reps, bytes / med * 1e-9, step);
        }
    }

    // ---- the model's unit of work, timed alone: one full chunk pair (c = L/2P queries × c keys,
    // no mask) through single-process attn::sdpa on rank 0, median CPU time of 3. A causal zigzag
    // rank computes 2P − 1 such pairs and 2 half-diagonals per ring (≈ 2P pairs), a full one 4P.
    if (a.layout == dist::Layout::zigzag) {
        double unit_cpu = 0;
        const std::int64_t c = a.L / (2 * P);
        if (rank == 0 && c > 0) {
            const Tensor qc = generate(0, a.B, a.H, a.D, {{0, c}});
            const Tensor kc = generate(1, a.B, a.Hkv, a.D, {{0, c}}), vc = generate(2, a.B, a.Hkv, a.D, {{0, c}});
            Tensor oc(DType::f32, Shape{a.B, a.H, c, a.D}), lc(DType::f32, Shape{a.B, a.H, c});
            const TensorView lcv = lc.view();
            SdpaOptions so;
            so.impl = a.impl;
            std::vector<double> t;
            for (int rep = 0; rep < 3; ++rep) {
                timespec t0{}, t1{};
                clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t0);
                sdpa(qc, kc, vc, so, oc, &lcv);
                clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t1);
                t.push_back(static_cast<double>(t1.tv_sec - t0.tv_sec) + 1e-9 * static_cast<double>(t1.tv_nsec - t0.tv_nsec));
            }
            std::sort(t.begin(), t.end());
            unit_cpu = t[1];
        }
        MPI_Barrier(MPI_COMM_WORLD);
        if (rank == 0 && c > 0) {
            const double pairs = a.causal ? 2.0 * P : 4.0 * P;
            double hi = 0;
            for (int r = 0; r < P; ++r) hi = std::max(hi, all[static_cast<std::size_t>(kStats * r + 1)]);
            const double flops = static_cast<double>(a.B * a.H * c * c) * flops_per_entry;
            std::printf("  model: one chunk pair (%lld x %lld) alone: %.4g s CPU = %.3g GFLOP/s; predicted compute per rank "
                        "%.0f pairs x that = %.4g s CPU; measured (slowest rank) %.4g s CPU, ratio %.3f\n",
                        static_cast<long long>(c), static_cast<long long>(c), unit_cpu, flops / unit_cpu * 1e-9, pairs,
                        pairs * unit_cpu, hi, hi / (pairs * unit_cpu));
        }
    }

    // ---- sampled rows against single-process attn::sdpa ----
    std::vector<std::int64_t> rows = {0, a.L - 1};
    for (int c = 1; c < 2 * P; ++c) rows.push_back(c * a.L / (2 * P)), rows.push_back(c * a.L / (2 * P) - 1);
    for (int s = 0; s < a.samples; ++s) rows.push_back(static_cast<std::int64_t>(splitmix64(777 + s) % static_cast<std::uint64_t>(a.L)));
    std::sort(rows.begin(), rows.end());
    rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
    rows.erase(std::remove_if(rows.begin(), rows.end(), [&](std::int64_t r) { return r < 0 || r >= a.L; }), rows.end());
    const std::int64_t S = static_cast<std::int64_t>(rows.size());
    // Each rank fills the sampled rows it owns; a sum over ranks gathers them on rank 0.
    std::vector<double> got(static_cast<std::size_t>(S * a.B * a.H * a.D), 0.0), sum(got.size(), 0.0);
    {
        std::int64_t local = 0;
        for (const auto& seg : qseg) {
            for (std::int64_t s = 0; s < S; ++s) {
                const std::int64_t r = rows[static_cast<std::size_t>(s)];
                if (r < seg.start || r >= seg.start + seg.length) continue;
                for (std::int64_t b = 0; b < a.B; ++b)
                    for (std::int64_t h = 0; h < a.H; ++h)
                        for (std::int64_t d = 0; d < a.D; ++d)
                            got[static_cast<std::size_t>(((s * a.B + b) * a.H + h) * a.D + d)] =
                                o.data_as<float>()[o.view().offset(b, h, local + r - seg.start, d)];
            }
            local += seg.length;
        }
    }
    MPI_Reduce(got.data(), sum.data(), static_cast<int>(got.size()), MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
    int passed = 0, failed = 0;
    if (rank == 0) {
        const std::int64_t last = a.causal ? rows.back() + 1 : a.L;
        const dist::Segment prefix{0, last};
        const Tensor kf = generate(1, a.B, a.Hkv, a.D, {prefix});
        const Tensor vf = generate(2, a.B, a.Hkv, a.D, {prefix});
        double worst = 0;
        for (std::int64_t s = 0; s < S; ++s) {
            const std::int64_t r = rows[static_cast<std::size_t>(s)];
            const std::int64_t keys = a.causal ? r + 1 : a.L;  // causal row r sees keys 0..r
            const Tensor qr = generate(0, a.B, a.H, a.D, {{r, 1}});
            Tensor ref(DType::f32, Shape{a.B, a.H, 1, a.D});
            SdpaOptions so;
            so.impl = Impl::reference;
            sdpa(qr, kf.view().slice(2, 0, keys), vf.view().slice(2, 0, keys), so, ref);
            double err = 0;
            for (std::int64_t b = 0; b < a.B; ++b)
                for (std::int64_t h = 0; h < a.H; ++h)
                    for (std::int64_t d = 0; d < a.D; ++d) {
                        const double x = sum[static_cast<std::size_t>(((s * a.B + b) * a.H + h) * a.D + d)];
                        const double e = std::fabs(x - ref.data_as<float>()[(b * a.H + h) * a.D + d]);
                        err = std::isnan(e) ? INFINITY : std::max(err, e);
                    }
            worst = std::max(worst, err);
            (err <= kTolerance ? passed : failed)++;
            if (err > kTolerance) std::printf("  row %lld: max |O - O_ref| = %.3g > %.0e\n", static_cast<long long>(r), err, kTolerance);
        }
        std::printf("  sampled rows: %lld checked against single-process attn::sdpa (reference), max |O - O_ref| = %.3g\n",
                    static_cast<long long>(S), worst);
        std::printf("%d passed, %d failed\n", passed, failed);
    }
    if (a.backward) failed += check_backward(a, P, rank, qseg, q, k, v, o, lse, opt, rows, st.compute_cpu_seconds);
    MPI_Bcast(&failed, 1, MPI_INT, 0, MPI_COMM_WORLD);
    MPI_Finalize();
    return failed == 0 ? 0 : 1;
}
