// varlen lab: where sdpa_varlen loses against the padded batch on V1 (bench/serving_cases.cpp).
// Times, on the V1 sequences (16 causal, lengths uniform in 64..4096, H = 16, D = 64):
//   varlen   sdpa_varlen on the packed tensors (the bench's row)
//   padded   sdpa on (N, H, Lmax, D) with key_lengths (the bench's other row)
//   seq_hm   one sdpa call per sequence on contiguous head-major (1, H, L, D) tensors: the
//            per-sequence structure of varlen without its layout or copy costs
//   seq_pk   one sdpa call per sequence on strided views of the packed tensors (no copy)
//   bwd_hm   sdpa_backward per sequence on contiguous head-major tensors (all of them)
//   bwd_pk   sdpa_backward per sequence on strided views of packed tensors (sdpa_varlen_backward)
//   bwd_kv   bwd_pk with K and V (the inputs and dK, dV) head-major, Q, O, dO, dQ packed
//   bwd_qo   bwd_pk with Q, O, dO, dQ head-major, K, V, dK, dV packed
//   bwd_vl   sdpa_varlen_backward on the packed tensors
//   copy     the head-major K/V copy of every sequence of >= 256 tokens (head_major.cpp's work)
//   vl_dec   sdpa_varlen with one query per sequence on the same keys: the decode kernel, each
//            sequence a call of its own (its rows staged: src/varlen/staging.hpp)
// Wall and process CPU time per call (min and median of --runs); run with OMP_WAIT_POLICY=passive
// on a loaded machine so that idle threads do not burn CPU time.
// Usage: varlen_lab [threads=2] [runs=5] [only: the names to run, e.g. bwd_vl,vl_dec]
#include <sys/resource.h>
#include <time.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "attn/sdpa.hpp"
#include "attn/sdpa_backward.hpp"
#include "attn/sdpa_varlen.hpp"
#include "attn/tensor.hpp"
#include "attn/threads.hpp"
#include "lab_util.hpp"
#ifndef LAB_PUBLIC_ONLY  // -DLAB_PUBLIC_ONLY: build against an older libattn (A/B of varlen and padded)
#include "kernels/flash/flash.hpp"
#include "kernels/isa.hpp"
#include "sdpa/problem.hpp"
#include "varlen/head_major.hpp"
#endif

using namespace attn;

namespace {

using lab::fill;
using lab::now;

// System CPU seconds and minor page faults of the process so far (the kernel's share: page
// faults and zeroing of fresh buffers show here, not in the user time).
std::pair<double, long> sys_faults() {
    rusage u{};
    getrusage(RUSAGE_SELF, &u);
    return {static_cast<double>(u.ru_stime.tv_sec) + 1e-6 * static_cast<double>(u.ru_stime.tv_usec), u.ru_minflt};
}

void time_it(const char* name, int runs, const std::function<void()>& fn) {
    fn();  // warm-up
    std::vector<double> wall, cpu;
    const auto [s0, f0] = sys_faults();
    for (int r = 0; r < runs; ++r) {
        const double w0 = now(CLOCK_MONOTONIC), c0 = now(CLOCK_PROCESS_CPUTIME_ID);
        fn();
        wall.push_back(now(CLOCK_MONOTONIC) - w0);
        cpu.push_back(now(CLOCK_PROCESS_CPUTIME_ID) - c0);
    }
    const auto [s1, f1] = sys_faults();
    std::sort(wall.begin(), wall.end());
    std::sort(cpu.begin(), cpu.end());
    std::printf("%-8s wall min %8.1f med %8.1f ms | cpu min %8.1f med %8.1f ms | per call: sys %6.1f ms, %ld faults\n",
                name, 1e3 * wall.front(), 1e3 * wall[wall.size() / 2], 1e3 * cpu.front(), 1e3 * cpu[cpu.size() / 2],
                1e3 * (s1 - s0) / runs, (f1 - f0) / runs);
    std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
    const int threads = argc > 1 ? std::atoi(argv[1]) : 2;
    const int runs = argc > 2 ? std::atoi(argv[2]) : 5;
    const std::string only = argc > 3 ? argv[3] : "";
    set_num_threads(threads);
    constexpr std::int64_t N = 16, H = 16, D = 64;
    std::mt19937_64 rng(18);  // the bench's lengths
    std::vector<std::int64_t> len(N);
    for (auto& l : len) l = 64 + static_cast<std::int64_t>(rng() % (4096 - 64 + 1));
    std::vector<std::int64_t> start(N + 1, 0);
    for (std::int64_t b = 0; b < N; ++b) start[b + 1] = start[b] + len[b];
    const std::int64_t T = start[N], Lmax = *std::max_element(len.begin(), len.end());
    std::printf("threads %d, T %lld, Lmax %lld, lengths", threads, static_cast<long long>(T), static_cast<long long>(Lmax));
    for (auto l : len) std::printf(" %lld", static_cast<long long>(l));
    std::printf("\n");

    const Tensor q(DType::f32, Shape{T, H, D}), k(DType::f32, Shape{T, H, D}), v(DType::f32, Shape{T, H, D});
    fill(q, 1);
    fill(k, 2);
    fill(v, 3);
    Tensor o(DType::f32, Shape{T, H, D}), cq(DType::i64, Shape{N + 1});
    std::copy(start.begin(), start.end(), cq.data_as<std::int64_t>());
    SdpaOptions opt;
    opt.causal = Causal::top_left;
    auto want = [&](const char* n) { return only.empty() || only.find(n) != std::string::npos; };

    if (want("varlen")) time_it("varlen", runs, [&] { sdpa_varlen(q, k, v, cq, cq, opt, o, nullptr, nullptr); });
    if (want("vl_dec")) {  // one new token per sequence after its keys: decode (auto), with lse
        Tensor q1(DType::f32, Shape{N, H, D}), o1(DType::f32, Shape{N, H, D}), l1(DType::f32, Shape{N, H}), c1(DType::i64, Shape{N + 1});
        fill(q1, 4);
        for (std::int64_t b = 0; b <= N; ++b) c1.data_as<std::int64_t>()[b] = b;
        SdpaOptions step;
        step.causal = Causal::bottom_right;
        const TensorView lv = l1.view();
        time_it("vl_dec", runs, [&] { sdpa_varlen(q1, k, v, c1, cq, step, o1, &lv, nullptr); });
    }

    // Head-major per-sequence copies (also the padded batch's source).
    std::vector<Tensor> hq, hk, hv, ho;
    for (std::int64_t b = 0; b < N; ++b) {
        hq.emplace_back(DType::f32, Shape{1, H, len[b], D});
        hk.emplace_back(DType::f32, Shape{1, H, len[b], D});
        hv.emplace_back(DType::f32, Shape{1, H, len[b], D});
        ho.emplace_back(DType::f32, Shape{1, H, len[b], D});
        for (auto [src, dst] : {std::pair{&q, &hq[b]}, std::pair{&k, &hk[b]}, std::pair{&v, &hv[b]}})
            for (std::int64_t t = 0; t < len[b]; ++t)
                for (std::int64_t h = 0; h < H; ++h)
                    std::memcpy(dst->data_as<float>() + (h * len[b] + t) * D, src->data_as<float>() + ((start[b] + t) * H + h) * D,
                                sizeof(float) * D);
    }
    if (want("seq_hm"))
        time_it("seq_hm", runs, [&] {
            for (std::int64_t b = 0; b < N; ++b) sdpa(hq[b], hk[b], hv[b], opt, ho[b], nullptr, nullptr, nullptr);
        });
#ifndef LAB_PUBLIC_ONLY
    if (want("batch_hm")) {  // flash_forward_batch on the contiguous head-major sequences
        std::vector<detail::SdpaProblem> ps;
        for (std::int64_t b = 0; b < N; ++b)
            ps.push_back(detail::make_problem(hq[b], hk[b], hv[b], opt, ho[b], nullptr, nullptr, "lab"));
        time_it("batch_hm", runs, [&] { detail::flash_forward_batch(ps.data(), ps.size(), detail::kernel_set()); });
    }
#endif
    auto rows = [&](const Tensor& t, std::int64_t b) {
        return TensorView(t.data_as<float>() + start[b] * H * D, DType::f32, Shape{1, H, len[b], D},
                          Strides{len[b] * H * D, D, H * D, 1});
    };
    if (want("seq_pk"))
        time_it("seq_pk", runs, [&] {
            for (std::int64_t b = 0; b < N; ++b)
                sdpa(rows(q, b), rows(k, b), rows(v, b), opt, rows(o, b), nullptr, nullptr, nullptr);
        });
#ifndef LAB_PUBLIC_ONLY
    if (want("batch_pk") || want("hm_copy")) {  // the same on the packed views, without / with the copies
        std::vector<detail::SdpaProblem> ps;
        for (std::int64_t b = 0; b < N; ++b)
            ps.push_back(detail::make_problem(rows(q, b), rows(k, b), rows(v, b), opt, rows(o, b), nullptr, nullptr, "lab"));
        if (want("batch_pk")) time_it("batch_pk", runs, [&] { detail::flash_forward_batch(ps.data(), ps.size(), detail::kernel_set()); });
        if (want("hm_copy")) time_it("hm_copy", runs, [&] { std::vector<detail::SdpaProblem> c = ps; const auto t = detail::head_major_kv(c); });
    }
#endif
    if (want("bwd_")) {  // the backward: packed views against head-major tensors, per sequence
        std::vector<Tensor> lse, dO, dq, dk, dv;
        std::vector<TensorView> lsev;
        for (std::int64_t b = 0; b < N; ++b) {
            lse.emplace_back(DType::f32, Shape{1, H, len[b]});
            lsev.push_back(lse.back().view());
            dO.emplace_back(DType::f32, Shape{1, H, len[b], D});
            fill(dO.back(), 10 + static_cast<std::uint64_t>(b));
            dq.emplace_back(DType::f32, Shape{1, H, len[b], D});
            dk.emplace_back(DType::f32, Shape{1, H, len[b], D});
            dv.emplace_back(DType::f32, Shape{1, H, len[b], D});
            sdpa(hq[b], hk[b], hv[b], opt, ho[b], &lsev[b], nullptr, nullptr);
        }
        if (want("bwd_hm"))
            time_it("bwd_hm", runs, [&] {
                for (std::int64_t b = 0; b < N; ++b)
                    sdpa_backward(hq[b], hk[b], hv[b], ho[b], lsev[b], dO[b], opt, dq[b], dk[b], dv[b]);
            });
        // The same values in the packed layout (o, dO, dq, dk, dv packed (T, H, D)).
        const Tensor pdO(DType::f32, Shape{T, H, D}), pdq(DType::f32, Shape{T, H, D}), pdk(DType::f32, Shape{T, H, D}),
            pdv(DType::f32, Shape{T, H, D});
        for (std::int64_t b = 0; b < N; ++b)
            for (std::int64_t t = 0; t < len[b]; ++t)
                for (std::int64_t h = 0; h < H; ++h) {
                    std::memcpy(o.data_as<float>() + ((start[b] + t) * H + h) * D, ho[b].data_as<float>() + (h * len[b] + t) * D, sizeof(float) * D);
                    std::memcpy(pdO.data_as<float>() + ((start[b] + t) * H + h) * D, dO[b].data_as<float>() + (h * len[b] + t) * D, sizeof(float) * D);
                }
        if (want("bwd_pk"))
            time_it("bwd_pk", runs, [&] {
                for (std::int64_t b = 0; b < N; ++b)
                    sdpa_backward(rows(q, b), rows(k, b), rows(v, b), rows(o, b), lsev[b], rows(pdO, b), opt, rows(pdq, b),
                                  rows(pdk, b), rows(pdv, b));
            });
        if (want("bwd_kv"))
            time_it("bwd_kv", runs, [&] {
                for (std::int64_t b = 0; b < N; ++b)
                    sdpa_backward(rows(q, b), hk[b], hv[b], rows(o, b), lsev[b], rows(pdO, b), opt, rows(pdq, b), dk[b], dv[b]);
            });
        if (want("bwd_vl")) {
            const Tensor plse(DType::f32, Shape{T, H});
            for (std::int64_t b = 0; b < N; ++b)
                for (std::int64_t h = 0; h < H; ++h)
                    for (std::int64_t t = 0; t < len[b]; ++t)
                        plse.data_as<float>()[(start[b] + t) * H + h] = lse[b].data_as<float>()[h * len[b] + t];
            time_it("bwd_vl", runs, [&] { sdpa_varlen_backward(q, k, v, cq, cq, o, plse, pdO, opt, pdq, pdk, pdv); });
            std::printf("bwd_vl   kept buffer %.1f MiB\n", static_cast<double>(varlen_scratch_bytes()) / (1 << 20));
        }
        if (want("bwd_qo"))  // Q, O, dO, dQ head-major; K, V, dK, dV packed
            time_it("bwd_qo", runs, [&] {
                for (std::int64_t b = 0; b < N; ++b)
                    sdpa_backward(hq[b], rows(k, b), rows(v, b), ho[b], lsev[b], dO[b], opt, dq[b], rows(pdk, b), rows(pdv, b));
            });
    }
    if (want("copy")) {
        Tensor scratch(DType::f32, Shape{2 * H * Lmax * D});
        time_it("copy", runs, [&] {
            for (std::int64_t b = 0; b < N; ++b) {
                if (len[b] < 256) continue;
                const std::int64_t L = len[b], n = H * L;
                float* kd = scratch.data_as<float>();
                float* vd = kd + n * D;
#pragma omp parallel for schedule(static) num_threads(threads)
                for (std::int64_t r = 0; r < n; ++r) {
                    const std::int64_t h = r / L, j = r % L;
                    std::memcpy(kd + r * D, k.data_as<float>() + ((start[b] + j) * H + h) * D, sizeof(float) * D);
                    std::memcpy(vd + r * D, v.data_as<float>() + ((start[b] + j) * H + h) * D, sizeof(float) * D);
                }
            }
        });
    }
    if (want("padded")) {
        hq.clear(), hk.clear(), hv.clear(), ho.clear();
        const Tensor pq(DType::f32, Shape{N, H, Lmax, D}, true), pk(DType::f32, Shape{N, H, Lmax, D}, true),
            pv(DType::f32, Shape{N, H, Lmax, D}, true), po(DType::f32, Shape{N, H, Lmax, D});
        fill(pq, 1);
        fill(pk, 2);
        fill(pv, 3);
        Tensor kl(DType::i64, Shape{N});
        std::copy(len.begin(), len.end(), kl.data_as<std::int64_t>());
        SdpaOptions po_opt = opt;
        po_opt.key_lengths = kl.view();
        time_it("padded", runs, [&] { sdpa(pq, pk, pv, po_opt, po, nullptr, nullptr, nullptr); });
    }
    return 0;
}
