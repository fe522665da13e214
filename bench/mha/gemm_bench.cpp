// attn_gemm_bench: attn's packed GEMM (src/gemm) on every ISA row this CPU runs, beside
// OpenBLAS (one multi-threaded cblas_sgemm, the library's former path's BLAS) in the same
// process, on S6's projection GEMMs and a square one. Alternating rounds (each round times
// every contender once), so a busy machine slows them alike; prints min / median / max.
//
//   attn_gemm_bench [--rounds R] [--threads T] [--clock wall|cpu] [--half yes|no]
// "attn ISA packed B": the float32 GEMM with op(B) packed once beforehand (PackedB, the MHA
// layer's pre-packed weights); --half no skips the 16-bit rows.
// The 16-bit rows ("attn ISA bf16" / "f16"): the same GEMM with A and B stored in 16 bits,
// widened while packing (GemmArgs::a16/b16: the MHA layer's 16-bit weights and activations) —
// except "attn avx512 bf16" on a CPU with AVX-512 BF16, which runs the pair kernel
// (gemm_avx512_bf16.cpp: vdpbf16ps, up to twice the float32 rate). "… bf16 packed B" / "… f16
// packed B": the 16-bit weight packed once (bf16 pair panels where the CPU has them), as the
// layer runs it.
// OpenBLAS's cblas_sbgemm would be their yardstick, but Debian's 0.3.21 is built without it
// (the header declares it; libopenblas.so exports no sbgemm symbol), so it is not timed.
// --clock cpu: the process's CPU seconds instead of wall seconds — on a shared machine, with
// --threads 1, the rate of the core while it ran this (spinning thread pools make it
// meaningless for more threads).
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "attn/half.hpp"
#include "gemm/gemm.hpp"
#include "kernels/isa.hpp"

namespace {

using attn::detail::GemmArgs;

struct Case {
    const char* name;
    bool ta, tb;
    std::int64_t M, N, K;
};

bool g_cpu_clock = false;

double now() {
    if (!g_cpu_clock) return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
    timespec ts{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

double seconds(const std::function<void()>& f) {
    const double t0 = now();
    f();
    return now() - t0;
}

}  // namespace

int main(int argc, char** argv) {
    int rounds = 15, threads = omp_get_max_threads();
    bool half_rows = true;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (std::strcmp(argv[i], "--rounds") == 0) rounds = std::atoi(argv[i + 1]);
        if (std::strcmp(argv[i], "--threads") == 0) threads = std::atoi(argv[i + 1]);
        if (std::strcmp(argv[i], "--clock") == 0) g_cpu_clock = std::strcmp(argv[i + 1], "cpu") == 0;
        if (std::strcmp(argv[i], "--half") == 0) half_rows = std::strcmp(argv[i + 1], "no") != 0;
    }
    omp_set_num_threads(threads);
    openblas_set_num_threads(threads);
    // S6 (B·L = 2048 rows, E = 768): the QKV and output projections as linear() runs them
    // (x · Wᵀ: B transposed), and n = 1536 (2n³ ≈ the QKV GEMM's FLOPs) without transposes.
    const Case cases[] = {{"S6 qkv 2048x2304x768 (B^T)", false, true, 2048, 2304, 768},
                          {"S6 out 2048x768x768 (B^T)", false, true, 2048, 768, 768},
                          {"square 1536^3", false, false, 1536, 1536, 1536},
                          // A decode step of S6's layer (B = 1 and 4 sequences, one token each).
                          {"decode qkv 1x2304x768 (B^T)", false, true, 1, 2304, 768},
                          {"decode qkv 4x2304x768 (B^T)", false, true, 4, 2304, 768}};
    std::mt19937 rng(1);
    std::normal_distribution<float> nd;
    std::printf("threads %d, %d rounds, %s clock; GFLOP/s min / median / max\n", threads, rounds, g_cpu_clock ? "cpu" : "wall");
    for (const Case& c : cases) {
        std::vector<float> a(static_cast<std::size_t>(c.M * c.K)), b(static_cast<std::size_t>(c.K * c.N)),
            out(static_cast<std::size_t>(c.M * c.N));
        for (float& x : a) x = nd(rng);
        for (float& x : b) x = nd(rng);
        GemmArgs g;
        g.ta = c.ta;
        g.tb = c.tb;
        g.M = c.M;
        g.N = c.N;
        g.K = c.K;
        g.A = a.data();
        g.lda = c.ta ? c.M : c.K;
        g.B = b.data();
        g.ldb = c.tb ? c.K : c.N;
        g.C = out.data();
        g.ldc = c.N;
        std::vector<std::uint16_t> a16(a.size()), b16(b.size()), a_bf(a.size()), b_bf(b.size());
        for (std::size_t i = 0; i < a.size(); ++i) a16[i] = attn::float_to_f16(a[i]), a_bf[i] = attn::float_to_bf16(a[i]);
        for (std::size_t i = 0; i < b.size(); ++i) b16[i] = attn::float_to_f16(b[i]), b_bf[i] = attn::float_to_bf16(b[i]);
        std::vector<std::string> names;
        std::vector<std::function<void()>> runs;
        for (const attn::detail::KernelSet* row : attn::detail::runnable_kernel_sets()) {
            if (row->isa == attn::detail::Isa::portable) continue;  // minutes, and nobody's target
            names.push_back(std::string("attn ") + attn::detail::isa_name(row->isa));
            runs.push_back([row, g] { attn::detail::sgemm(*row, g); });
            // op(B) packed once (a constant weight: MultiHeadAttention::pack_weights), then read in place.
            auto packed = std::make_shared<attn::detail::PackedB>(attn::detail::pack_b(*row, g));
            names.push_back(std::string("attn ") + attn::detail::isa_name(row->isa) + " packed B");
            runs.push_back([row, g, packed] {
                GemmArgs p = g;
                p.packed = packed.get();
                attn::detail::sgemm(*row, p);
            });
            if (!half_rows) continue;
            for (const auto half : {attn::detail::GemmHalf::bf16, attn::detail::GemmHalf::f16}) {
                GemmArgs h = g;
                const bool bf = half == attn::detail::GemmHalf::bf16;
                h.a16 = h.b16 = half;
                h.A16 = bf ? a_bf.data() : a16.data();
                h.B16 = bf ? b_bf.data() : b16.data();
                names.push_back(std::string("attn ") + attn::detail::isa_name(row->isa) + (bf ? " bf16" : " f16"));
                runs.push_back([row, h] { attn::detail::sgemm(*row, h); });
                // The 16-bit weight packed once, as the layer does (bf16 pairs where the CPU has them).
                auto packed16 = std::make_shared<attn::detail::PackedB>(attn::detail::pack_b(*row, h));
                names.push_back(std::string("attn ") + attn::detail::isa_name(row->isa) + (bf ? " bf16" : " f16") + " packed B");
                runs.push_back([row, h, packed16] {
                    GemmArgs p = h;
                    p.packed = packed16.get();
                    attn::detail::sgemm(*row, p);
                });
            }
        }
        names.push_back("OpenBLAS");
        runs.push_back([&] {
            cblas_sgemm(CblasRowMajor, c.ta ? CblasTrans : CblasNoTrans, c.tb ? CblasTrans : CblasNoTrans,
                        static_cast<int>(c.M), static_cast<int>(c.N), static_cast<int>(c.K), 1.0f, g.A,
                        static_cast<int>(g.lda), g.B, static_cast<int>(g.ldb), 0.0f, g.C, static_cast<int>(g.ldc));
        });
        std::vector<std::vector<double>> t(runs.size());
        for (auto& r : runs) r();  // warm-up: packing buffers, thread pools, page faults
        for (int i = 0; i < rounds; ++i)
            for (std::size_t j = 0; j < runs.size(); ++j) t[j].push_back(seconds(runs[j]));
        const double flop = 2.0 * static_cast<double>(c.M) * c.N * c.K;
        std::printf("%s\n", c.name);
        for (std::size_t j = 0; j < runs.size(); ++j) {
            std::sort(t[j].begin(), t[j].end());
            std::printf("  %-18s %7.1f / %7.1f / %7.1f\n", names[j].c_str(), flop / t[j].back() * 1e-9,
                        flop / t[j][t[j].size() / 2] * 1e-9, flop / t[j].front() * 1e-9);
        }
    }
}
