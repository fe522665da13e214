// Kernel lab for bf16 compute (docs/kernels-lab.md, "bf16 compute, measured"): what vdpbf16ps buys over the
// float32 FMA path of the avx512 row, measured at three levels on this machine.
//
//   bf16_lab [--peak] [--iters N] [--reps N] [--threads N] [--shapes S2,S3] [--no-flash] [--help]
//
//  1. with --peak: 12 independent chains of vfmadd (zmm, 32 FLOP) vs vdpbf16ps (zmm, 64 FLOP:
//     16 lanes × 2 products × 2) — the instruction throughputs, 1 thread (`attn bench`'s own
//     loops, bench/peaks.hpp), --iters iterations a rep. Opt-in, as flash_lab's: the slowest
//     part, and on a shared machine the noisiest;
//  2. micro-kernels, hot in L1, 1 thread, on the driver's tiles (8 rows × 32 queries):
//     qk over a 64-key block (Dk = 64, 128) and pv over 64 keys (Dv = 64, 128) — the f32 tile
//     (a copy of flash_avx512.cpp's qk_tile/pv_tile, which live in that file's anonymous
//     namespace) vs the bf16 pair tiles the library runs (kernels/flash/bf16_dot.hpp), the
//     latter with and without packing Pᵀ and V (pack_pairs_bf16, once per key block);
//  3. the whole flash forward on S2 / S3 (bench/shapes.md): float32 Q, K, V vs all-bf16 on the
//     avx512 row (which picks bf16 compute), `--threads` threads.
// GFLOP/s are per CPU-second (process CPU time / threads): the machine is shared, so wall
// time says what we got, CPU time what the code does when it runs. Repeat and report ranges.
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "attn/half.hpp"
#include "attn/tensor.hpp"
#include "core/cpu_features.hpp"
#include "kernels/flash/bf16_dot.hpp"
#include "kernels/flash/flash.hpp"
#include "kernels/isa.hpp"
#include "machine.hpp"
#include "peaks.hpp"
#include "sdpa/problem.hpp"

using namespace attn;
using namespace attn::detail;
namespace bk = attn::detail::flash_bf16_avx512_ns;

namespace {

// Best-of-reps GFLOP per CPU-second of fn() doing `flop` FLOPs.
template <class Fn>
double rate(Fn&& fn, double flop, int reps, double* worst = nullptr) {
    double best = 0, low = 1e300;
    for (int r = 0; r < reps; ++r) {
        const double c0 = bench::process_cpu_seconds();
        fn();
        const double g = flop / (bench::process_cpu_seconds() - c0) / 1e9;
        best = std::max(best, g);
        low = std::min(low, g);
    }
    if (worst != nullptr) *worst = low;
    return best;
}

// The float32 8 × 32 tiles of flash_avx512.cpp (qk_tile<8>, pv_tile<8>), for comparison.
__attribute__((target("avx512f"))) void qk_f32(const float* qt, const float* k, std::int64_t ldk, int Dk, float* s,
                                               int ldS) {
    __m512 a[8][2];
    for (auto& r : a) r[0] = r[1] = _mm512_setzero_ps();
    for (int d = 0; d < Dk; ++d) {
        const __m512 q0 = _mm512_load_ps(qt + d * 32), q1 = _mm512_load_ps(qt + d * 32 + 16);
        for (int r = 0; r < 8; ++r) {
            const __m512 kb = _mm512_set1_ps(k[r * ldk + d]);
            a[r][0] = _mm512_fmadd_ps(kb, q0, a[r][0]);
            a[r][1] = _mm512_fmadd_ps(kb, q1, a[r][1]);
        }
    }
    for (int r = 0; r < 8; ++r) {
        _mm512_store_ps(s + r * ldS, a[r][0]);
        _mm512_store_ps(s + r * ldS + 16, a[r][1]);
    }
}

__attribute__((target("avx512f"))) void pv_f32(const float* p, int ldP, const float* v, std::int64_t ldv, int nk,
                                               float* ot, int ldO) {
    __m512 a[8][2];
    for (int r = 0; r < 8; ++r) {
        a[r][0] = _mm512_load_ps(ot + r * ldO);
        a[r][1] = _mm512_load_ps(ot + r * ldO + 16);
    }
    for (int j = 0; j < nk; ++j) {
        const __m512 p0 = _mm512_load_ps(p + j * ldP), p1 = _mm512_load_ps(p + j * ldP + 16);
        for (int r = 0; r < 8; ++r) {
            const __m512 vb = _mm512_set1_ps(v[j * ldv + r]);
            a[r][0] = _mm512_fmadd_ps(vb, p0, a[r][0]);
            a[r][1] = _mm512_fmadd_ps(vb, p1, a[r][1]);
        }
    }
    for (int r = 0; r < 8; ++r) {
        _mm512_store_ps(ot + r * ldO, a[r][0]);
        _mm512_store_ps(ot + r * ldO + 16, a[r][1]);
    }
}

template <class T>
T* aligned(std::size_t n) {
    return static_cast<T*>(std::aligned_alloc(64, (n * sizeof(T) + 63) / 64 * 64));
}

// One task's products for a 64-query × 64-key block: qk over 2 panels × 8 row tiles, pv over
// 2 panels × D/8 row tiles — what the driver calls per key block.
void micro(int D, long blocks, int reps) {
    const int Mb = 64, Nb = 64, Dp = D / 2;
    std::mt19937 g(1);
    std::normal_distribution<float> n(0.f, 1.f);
    float* qt = aligned<float>(static_cast<std::size_t>(Mb) * D);
    float* k = aligned<float>(static_cast<std::size_t>(Nb) * D);
    float* s = aligned<float>(static_cast<std::size_t>(Nb) * Mb);
    float* v = aligned<float>(static_cast<std::size_t>(Nb) * D);
    float* ot = aligned<float>(static_cast<std::size_t>(D) * Mb);
    auto* qp = aligned<std::uint32_t>(static_cast<std::size_t>(Mb) * Dp);
    auto* k16 = aligned<std::uint16_t>(static_cast<std::size_t>(Nb) * D);
    auto* pp = aligned<std::uint32_t>(static_cast<std::size_t>(Nb / 2) * Mb);
    auto* vp = aligned<std::uint32_t>(static_cast<std::size_t>(Nb / 2) * D);
    for (int i = 0; i < Mb * D; ++i) qt[i] = n(g);
    for (int i = 0; i < Nb * D; ++i) k[i] = n(g), v[i] = n(g), k16[i] = float_to_bf16(k[i]);
    for (int i = 0; i < Nb * Mb; ++i) s[i] = std::fabs(n(g)) * 0.1f;
    for (int i = 0; i < D * Mb; ++i) ot[i] = 0.f;
    for (int i = 0; i < Mb * Dp; ++i) qp[i] = float_to_bf16(qt[2 * i]) | std::uint32_t{float_to_bf16(qt[2 * i + 1])} << 16;
    bk::pack_pairs_bf16(s, Mb, Nb, Mb, pp, Mb);
    bk::pack_pairs_bf16(v, D, Nb, D, vp, D);
    const float one[32] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
    alignas(64) float alpha[32];
    std::memcpy(alpha, one, sizeof alpha);
    const double flop = 2.0 * Mb * Nb * D * static_cast<double>(blocks);  // one product
    double lo = 0;
    auto line = [&](const char* what, double best) {
        std::printf("  D=%-3d %-34s %7.1f GFLOP/s (worst rep %.1f)\n", D, what, best, lo);
    };
    line("qk f32 (8x32 tile, fmadd)", rate([&] {
             for (long b = 0; b < blocks; ++b)
                 for (int pn = 0; pn < 2; ++pn)
                     for (int r = 0; r < Nb; r += 8) qk_f32(qt + pn * D * 32, k + r * D, D, D, s + r * Mb + pn * 32, Mb);
         }, flop, reps, &lo));
    line("qk bf16 pairs (8x32 tile, dpbf16)", rate([&] {
             for (long b = 0; b < blocks; ++b)
                 for (int pn = 0; pn < 2; ++pn)
                     for (int r = 0; r < Nb; r += 8)
                         bk::qk_bf16(qp + pn * Dp * 32, k16 + r * D, D, 8, Dp, 1.0f, s + r * Mb + pn * 32, Mb);
         }, flop, reps, &lo));
    line("pv f32 (8x32 tile, fmadd)", rate([&] {
             for (long b = 0; b < blocks; ++b)
                 for (int pn = 0; pn < 2; ++pn)
                     for (int d = 0; d < D; d += 8) pv_f32(s + pn * 32, Mb, v + d, D, Nb, ot + d * Mb + pn * 32, Mb);
         }, flop, reps, &lo));
    line("pv bf16 pairs, packed (dpbf16)", rate([&] {
             for (long b = 0; b < blocks; ++b)
                 for (int pn = 0; pn < 2; ++pn)
                     for (int d = 0; d < D; d += 8)
                         bk::pv_bf16(pp + pn * 32, Mb, vp + d, D, Nb / 2, 8, ot + d * Mb + pn * 32, Mb, alpha);
         }, flop, reps, &lo));
    line("pv bf16 incl. packing P and V", rate([&] {
             for (long b = 0; b < blocks; ++b) {
                 bk::pack_pairs_bf16(s, Mb, Nb, Mb, pp, Mb);
                 bk::pack_pairs_bf16(v, D, Nb, D, vp, D);
                 for (int pn = 0; pn < 2; ++pn)
                     for (int d = 0; d < D; d += 8)
                         bk::pv_bf16(pp + pn * 32, Mb, vp + d, D, Nb / 2, 8, ot + d * Mb + pn * 32, Mb, alpha);
             }
         }, flop, reps, &lo));
    for (void* p : {(void*)qt, (void*)k, (void*)s, (void*)v, (void*)ot, (void*)qp, (void*)k16, (void*)pp, (void*)vp})
        std::free(p);
}

void flash(const std::string& shape, int threads, int reps) {
    std::int64_t H = 16, L = 4096, D = 64;
    bool causal = false;
    if (shape == "S3") D = 128, causal = true;
    else if (shape == "S1") L = 1024;
    else if (shape != "S2") {
        std::fprintf(stderr, "shape %s: S1, S2 or S3\n", shape.c_str());
        std::exit(2);
    }
    const KernelSet& row = *kernel_set_for(Isa::avx512);
    std::mt19937 g(2);
    std::normal_distribution<float> n(0.f, 1.f);
    Tensor q(DType::f32, Shape{1, H, L, D}), k(DType::f32, Shape{1, H, L, D}), v(DType::f32, Shape{1, H, L, D});
    for (Tensor* t : {&q, &k, &v})
        for (std::int64_t i = 0; i < t->view().numel(); ++i) t->data_as<float>()[i] = n(g);
    Tensor qb(DType::bf16, Shape{1, H, L, D}), kb(DType::bf16, Shape{1, H, L, D}), vb(DType::bf16, Shape{1, H, L, D});
    for (auto [src, dst] : {std::pair{&q, &qb}, std::pair{&k, &kb}, std::pair{&v, &vb}})
        for (std::int64_t i = 0; i < src->view().numel(); ++i)
            dst->data_as<std::uint16_t>()[i] = float_to_bf16(src->data_as<float>()[i]);
    // bf16 compute needs a bf16 out too (SdpaProblem::bf16_products): a float32 out keeps f32 products.
    Tensor o(DType::f32, Shape{1, H, L, D}), ob(DType::bf16, Shape{1, H, L, D});
    SdpaOptions opt;
    opt.causal = causal ? Causal::top_left : Causal::none;
    const double flop = 4.0 * H * static_cast<double>(L) * L * D * (causal ? 0.5 : 1.0);
    const SdpaProblem pf = make_problem(q, k, v, opt, o, nullptr, nullptr);
    const SdpaProblem pb = make_problem(qb, kb, vb, opt, ob, nullptr, nullptr);
    for (const auto& [name, p] : {std::pair{"f32", &pf}, std::pair{"bf16", &pb}}) {
        flash_forward(*p, row, threads, nullptr);  // warm-up
        std::vector<double> wall, cpu;
        for (int r = 0; r < reps; ++r) {
            const auto t0 = std::chrono::steady_clock::now();
            const double c0 = bench::process_cpu_seconds();
            flash_forward(*p, row, threads, nullptr);
            wall.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
            cpu.push_back((bench::process_cpu_seconds() - c0) / threads);
        }
        std::sort(wall.begin(), wall.end());
        std::sort(cpu.begin(), cpu.end());
        std::printf("  %s %-4s (%s, %d threads): wall min %.3f s median %.3f s (%.1f GFLOP/s); per CPU-second x "
                    "threads %.1f–%.1f GFLOP/s\n",
                    shape.c_str(), name, flash_compute(row, *p) != Compute::f32 ? "bf16 compute" : "f32 compute", threads,
                    wall.front(), wall[wall.size() / 2], flop / wall.front() / 1e9, flop / cpu.back() / 1e9,
                    flop / cpu.front() / 1e9);
    }
}

}  // namespace

constexpr const char* kUsage =
    "bf16_lab [--peak] [--iters N] [--reps N] [--threads N] [--shapes S2,S3] [--no-flash] [--help]\n"
    "--peak: first the vfmadd / vdpbf16ps peaks (1 thread, --iters iterations a rep; off by default).\n"
    "The comment at the top of dev/bf16_lab.cpp says what each part measures.\n";

int run(int argc, char** argv) {
    long iters = 20'000'000;
    int reps = 5, threads = 2;
    bool peak = false, run_flash = true;
    std::string shapes = "S2,S3";
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        auto next = [&] {
            if (i + 1 >= argc) throw std::invalid_argument(a + " needs a value");
            return std::string(argv[++i]);
        };
        if (a == "--help" || a == "-h") {
            std::fputs(kUsage, stdout);
            return 0;
        } else if (a == "--peak") peak = true;
        else if (a == "--iters") iters = std::stol(next());
        else if (a == "--reps") reps = std::stoi(next());
        else if (a == "--threads") threads = std::stoi(next());
        else if (a == "--shapes") shapes = next();
        else if (a == "--no-flash") run_flash = false;
        else {
            std::fprintf(stderr, "unknown option %s\n%s", a.c_str(), kUsage);
            return 2;
        }
    }
    if (!cpu_features().has_avx512_bf16()) {
        std::fprintf(stderr, "skipped: CPU lacks avx512_bf16\n");
        return 0;
    }
    if (peak) {
        std::printf("peaks (1 thread, best of %d):\n", reps);
        double lo = 0;
        const double fma =
            rate([&] { (void)bench::detail::fma_chains_avx512(iters); }, 12.0 * 32 * static_cast<double>(iters), reps, &lo);
        std::printf("  vfmadd231ps zmm    %7.1f GFLOP/s (worst rep %.1f)\n", fma, lo);
        const double dp =
            rate([&] { (void)bench::detail::dpbf16_chains_avx512(iters); }, 12.0 * 64 * static_cast<double>(iters), reps, &lo);
        std::printf("  vdpbf16ps zmm      %7.1f GFLOP/s (worst rep %.1f)  ratio %.2f\n", dp, lo, dp / fma);
    }
    std::printf("micro-kernels (1 thread, hot in L1, one 64-query x 64-key block per call, best of %d):\n", reps);
    for (int D : {64, 128}) micro(D, 20000, reps);
    if (!run_flash) return 0;
    std::printf("flash forward, avx512 row:\n");
    for (std::size_t b = 0; b < shapes.size();) {
        const std::size_t e = std::min(shapes.find(',', b), shapes.size());
        flash(shapes.substr(b, e - b), threads, reps);
        b = e + 1;
    }
    return 0;
}

int main(int argc, char** argv) {
    try {
        return run(argc, argv);
    } catch (const std::exception& e) {  // a missing or malformed value (std::stoi)
        std::fprintf(stderr, "bf16_lab: %s\n%s", e.what(), kUsage);
        return 2;
    }
}
