// Kernel lab for the flash forward (docs/design.md, "The kernel lab"): validate a slice against the
// reference, then time. Not a benchmark (that is `attn bench`); a tool to choose tiles.
//
//   flash_lab [--shape S1..S5|S7|S8] [B H Lq Lk D causal] [--hkv N] [--mb N] [--nb N] [--splits N] [--group N] [--pass N]
//             [--isa portable|avx2|avx512] [--threads N] [--reps N] [--peak] [--no-check] [--no-warmup] [--paired N] [--mha-layout]
//             [--head-major] [--seq-first] [--seq-first-heads] [--huge] [--kv f16|bf16] [--qkv bf16] [--ab N]
//             [--variant V] [--ab-threads M] [--run-variant V]
//
// --splits N: each task's keys in N chunks (1: none); --group N: N query blocks per group, which
// take turns over their keys (1: none; flash_query_groups.hpp); --pass N: N keys per turn
// (rounded up to whole key blocks; flash_group_pass). Without
// them the kernel's own policy decides, as in a real call.
// --mha-layout: Q, K, V and out are the stride views the MHA layer hands to sdpa (S6): rows
// b·L + l of one (B·L, 3·H·D) QKV buffer (out: (B·L, H·D)), columns (which, head, d); needs Lq = Lk.
// (The layer's layout until 2026-12-07.)
// --head-major: the same, but Q, K, V are the head-major views the MHA layer hands to sdpa since
// 2026-12-07 (src/mha/head_layout.hpp): 3·H matrices of (B·L, D), head k's at k·B·L·D; out as above.
// --seq-first: rows (l, b) at l·B + b, PyTorch's default batch_first=False: out's rows and
// --mha-layout's QKV rows; --head-major's heads keep their rows b·L + l (the layer since fwd-27).
// --seq-first-heads: --head-major --seq-first with the heads' rows l·B + b too (the layer's
// seq-first Q, K, V before fwd-27: a head's rows of one batch item B·D floats apart).
// --huge: Q, K, V and out in 2 MiB-aligned buffers advised MADV_HUGEPAGE (transparent huge
// pages), to see what 4 KiB pages' TLB misses cost (a VM's nested page walks are slow).
// --kv f16|bf16: K and V stored as float16 / bfloat16 (the same random values rounded once,
// attn::to_dtype), Q and out float32: the mixed rows of bench/shapes.md (issue 14).
// --qkv bf16: Q, K, V and out all bfloat16: the all-bf16 rows, which run bf16 compute
// (vdpbf16ps) on a CPU with AVX-512 BF16; the check then allows bf16 compute's error (2e-2).
// --ab N: after the timing, N pairs of calls A (flash_lab_variant = 0, the shipped code) and B
// (= 1, or --variant V: a change under study that reads it: flash.hpp), alternately, each timed by
// the process's CPU time; prints the median of the B/A speed ratios (A's CPU time / B's) with
// their min and max, and of the wall times A/B. On a machine shared with builds the pairs see the
// same load, where separate processes minutes apart do not. --ab-threads M: B is the shipped code
// on M threads instead (A on --threads): the CPU time per FLOP of 1 against 2 threads, paired —
// with OMP_WAIT_POLICY=passive, so a waiting thread burns none. --run-variant V: flash_lab_variant = V
// in every call but --ab's A calls (the timing, the check): to profile a variant with perf.
//
// Method: one warm-up run, then --reps runs; prints median and min time and GFLOP/s with
// FLOPs = 4·D per visible (query, key) pair (bench/visible_pairs.hpp; causal: ≈ half), and per
// CPU-second of the process (bench/machine.hpp: on a shared machine, wall time says what the run
// got, CPU time what the code does when it runs). --peak first measures the FMA peak of the chosen ISA's
// width (ymm for avx2/portable, zmm for avx512) on the same threads with `attn bench`'s own
// loop (bench/peaks.hpp measure_fma_peak).
//
// ── Changelog (2 threads, g++ 12 -O3, this machine; S2 = B1 H16 L4096 D64, S3 = L4096 D128 causal)
// The machine was shared and loaded (load average 5–16) throughout, so the comparable
// number is FLOP per CPU-second per thread ("per CPU-second x threads"), next to the FMA
// loop's figure from the same run (≈ 94 quiet, 73–80 under that load).
// v1  transposed 6×16 micro-kernels, Mb = Nb = 64, accumulators in arrays:
//     S2 36 GFLOP/s wall (2 threads, before the load). GCC kept the __m256 arrays on the
//     stack: one store per FMA pair.
// v2  named accumulators (macro-unrolled rows): 1 thread, B1 H4 L4096 D64: 63.9–66.5 per
//     CPU-second (FMA loop 80 in the same run).
// v3  softmax max with 4 independent chains, sum with 2 (the single max chain waited on
//     vmaxps latency: 6 % of the time in one instruction): 65.1–65.5 (FMA loop 73–75).
// Tiles (v3, 1 thread, B1 H2 L4096, per CPU-second; losing sizes kept, ± 5 noise):
//     D64   Mb\Nb   32    64    128   256        D128  Mb\Nb   32    64    128   256
//           32     44.0  64.4  64.3  62.6             32     69.9  68.0  63.9  61.0
//           64     60.6  67.2  61.2  63.2             64     58.5  68.7  69.0  66.4
//           128    61.9  60.2  66.3  65.9             128    63.3  67.3  67.1  68.7
//     → Mb = Nb = 64 for every head dim (flat within the noise elsewhere).
// 2026-12-05 --peak and --paired run `attn bench`'s FMA loop (bench/peaks.hpp) instead of the
//     lab's copy, whose ten accumulators g++ 12 stored to the stack every iteration (the asm
//     barriers on an array): on the Zen 5 VM it gave 150 GFLOP per CPU-second x threads on 2 zmm
//     threads against the bench loop's 430-456, 66 against 116 on 1 ymm thread.
#include <sys/mman.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "attn/sdpa.hpp"
#include "attn/tensor.hpp"
#include "kernels/flash/flash.hpp"
#include "kernels/isa.hpp"
#include "kernels/reference/reference.hpp"
#include "machine.hpp"
#include "peaks.hpp"
#include "sdpa/problem.hpp"
#include "visible_pairs.hpp"

using namespace attn;
using namespace attn::detail;

namespace {

// n floats, 2 MiB aligned and advised to use transparent huge pages; zeroed (first touch).
float* huge_floats(std::int64_t n) {
    constexpr std::size_t kHuge = std::size_t{2} << 20;
    const std::size_t bytes = (static_cast<std::size_t>(n) * sizeof(float) + kHuge - 1) / kHuge * kHuge;
    void* p = std::aligned_alloc(kHuge, bytes);
    if (p == nullptr) std::abort();
    madvise(p, bytes, MADV_HUGEPAGE);
    std::memset(p, 0, bytes);
    return static_cast<float*>(p);
}

void fill(float* p, std::int64_t n, unsigned seed) {
    std::mt19937 g(seed);
    std::normal_distribution<float> d(0.f, 1.f);
    for (std::int64_t i = 0; i < n; ++i) p[i] = d(g);
}

void fill(const Tensor& t, unsigned seed) { fill(t.data_as<float>(), t.numel(), seed); }

}  // namespace

constexpr const char* kUsage =
    "flash_lab [--shape S1..S5|S7|S8] [B H Lq Lk D causal] [--hkv N] [--mb N] [--nb N] [--splits N] [--group N] [--pass N]\n"
    "          [--isa portable|avx2|avx512] [--threads N] [--reps N] [--peak] [--no-check] [--no-warmup] [--paired N]\n"
    "          [--mha-layout] [--head-major] [--seq-first] [--seq-first-heads] [--huge] [--kv f16|bf16] [--qkv bf16] [--ab N]\n"
    "          [--variant V] [--ab-threads M] [--run-variant V]\n"
    "--isa: the kernel-table row (default: the one attn picks on this CPU, ATTN_ISA included).\n"
    "The comment at the top of dev/flash_lab.cpp says what each option does.\n";

int run(int argc, char** argv) {
    std::int64_t B = 1, H = 16, Lq = 4096, Lk = 4096, D = 64, Hkv = 0;
    bool causal = false, peak = false, check = true, warmup = true, mha_layout = false, head_major = false, huge = false;
    bool seq_first = false, seq_first_heads = false;
    int paired = 0;
    int ab = 0, variant = 1, ab_threads = 0;
    DType kv_dtype = DType::f32;
    bool all_bf16 = false;  // --qkv bf16
    FlashTiles tiles{};
    bool tiles_set_mb = false, tiles_set_nb = false;
    Isa isa = kernel_set().isa;
    int threads = 2, reps = 5;
    std::vector<std::string> pos;
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        auto next = [&] {
            if (i + 1 >= argc) throw std::invalid_argument(a + " needs a value");
            return std::string(argv[++i]);
        };
        if (a == "--help" || a == "-h") {
            std::fputs(kUsage, stdout);
            return 0;
        } else if (a == "--shape") {
            std::string s = next();
            if (s == "S1") { B = 1; H = 16; Lq = Lk = 1024; D = 64; causal = false; }
            else if (s == "S2") { B = 1; H = 16; Lq = Lk = 4096; D = 64; causal = false; }
            else if (s == "S3") { B = 1; H = 16; Lq = Lk = 4096; D = 128; causal = true; }
            else if (s == "S4") { B = 2; H = 8; Lq = 512; Lk = 4096; D = 64; causal = false; }
            else if (s == "S8") { B = 1; H = 8; Lq = Lk = 32768; D = 64; causal = true; }
            else if (s == "S5") { B = 1; H = 32; Lq = 1; Lk = 16384; D = 128; causal = false; }
            else if (s == "S7") { B = 1; H = 32; Hkv = 8; Lq = 1; Lk = 16384; D = 128; causal = false; }
            else { std::fprintf(stderr, "unknown shape %s\n", s.c_str()); return 2; }
        } else if (a == "--mb") { tiles.Mb = std::stoi(next()); tiles_set_mb = true; }
        else if (a == "--nb") { tiles.Nb = std::stoi(next()); tiles_set_nb = true; }
        else if (a == "--splits") tiles.key_splits = std::stoi(next());  // key chunks per task (1: no split)
        else if (a == "--group") tiles.query_group = std::stoi(next());  // query blocks per group (1: none)
        else if (a == "--pass") tiles.group_pass = std::stoi(next());    // keys per pass of a group
        else if (a == "--isa") {
            const std::string n = next();
            if (n != "portable" && n != "avx2" && n != "avx512") {
                std::fprintf(stderr, "--isa must be portable, avx2 or avx512 but got %s\n", n.c_str());
                return 2;
            }
            isa = n == "portable" ? Isa::portable : n == "avx512" ? Isa::avx512 : Isa::avx2;
        }
        else if (a == "--threads") threads = std::stoi(next());
        else if (a == "--reps") reps = std::stoi(next());
        else if (a == "--peak") peak = true;
        else if (a == "--hkv") Hkv = std::stoll(next());  // GQA: KV heads (default H)
        else if (a == "--no-check") check = false;  // e.g. for peak RSS: the check's reference stores Lq×Lk
        else if (a == "--no-warmup") warmup = false;
        else if (a == "--mha-layout") mha_layout = true;
        else if (a == "--head-major") mha_layout = head_major = true;
        else if (a == "--seq-first") seq_first = true;
        else if (a == "--seq-first-heads") mha_layout = head_major = seq_first = seq_first_heads = true;
        else if (a == "--huge") huge = true;
        else if (a == "--kv") {
            const std::string n = next();
            if (n != "f16" && n != "bf16") {
                std::fprintf(stderr, "--kv must be f16 or bf16 but got %s\n", n.c_str());
                return 2;
            }
            kv_dtype = n == "f16" ? DType::f16 : DType::bf16;
        } else if (a == "--qkv") {
            const std::string n = next();
            if (n != "bf16") {
                std::fprintf(stderr, "--qkv must be bf16 but got %s\n", n.c_str());
                return 2;
            }
            all_bf16 = true;
            kv_dtype = DType::bf16;
        }
        // N × (FMA loop, kernel) back to back: on a shared machine the ratio of two
        // neighbouring runs is steadier than either number.
        else if (a == "--paired") paired = std::stoi(next());
        else if (a == "--ab") ab = std::stoi(next());
        else if (a == "--variant") variant = std::stoi(next());      // B's flash_lab_variant (default 1)
        else if (a == "--ab-threads") ab_threads = std::stoi(next());  // B's threads (default --threads)
        else if (a == "--run-variant") flash_lab_variant = std::stoi(next());  // every call's (perf of a variant)
        else if (a.size() > 1 && a[0] == '-' && !std::isdigit(static_cast<unsigned char>(a[1]))) {
            std::fprintf(stderr, "unknown option %s\n%s", a.c_str(), kUsage);
            return 2;
        } else pos.push_back(a);
    }
    if (!cpu_supports(isa)) {
        std::fprintf(stderr, "--isa %s: this CPU cannot run it\n", isa_name(isa));
        return 2;
    }
    const KernelSet& kernels = *kernel_set_for(isa);
    if (pos.size() == 6) {
        B = std::stoll(pos[0]); H = std::stoll(pos[1]); Lq = std::stoll(pos[2]); Lk = std::stoll(pos[3]);
        D = std::stoll(pos[4]); causal = pos[5] == "1";
    }
    const FlashTiles def = flash_default_tiles(D, D);
    if (!tiles_set_mb) tiles.Mb = def.Mb;
    if (!tiles_set_nb) tiles.Nb = def.Nb;
    if (peak) {  // the benchmark's own ceiling (bench/peaks.hpp): 3 trials of 0.25 s, as `attn bench`
        const bench::Ceiling c =
            bench::measure_fma_peak(threads, 0.25, 3, isa == Isa::avx512 ? bench::FmaWidth::avx512 : bench::FmaWidth::avx2);
        if (!c.measured) std::printf("FMA peak: %s\n", c.note.c_str());
        else std::printf("FMA peak %s (%d threads): %.1f GFLOP/s wall, %.1f per CPU-second x threads\n", isa == Isa::avx512 ? "zmm" : "ymm", threads, c.value, c.per_cpu);
    }

    if (Hkv <= 0) Hkv = H;
    Tensor qt(DType::f32, Shape{B, H, Lq, D}), kt(DType::f32, Shape{B, Hkv, Lk, D}), vt(DType::f32, Shape{B, Hkv, Lk, D}),
        ot(DType::f32, Shape{B, H, Lq, D});
    TensorView q = qt.view(), k = kt.view(), v = vt.view(), o = ot.view();
    Tensor qkv, obuf;
    if (mha_layout) {
        if (Lq != Lk || Hkv != H) {
            std::fprintf(stderr, "--mha-layout needs Lq = Lk and Hkv = H\n");
            return 2;
        }
        const std::int64_t E = H * D, L = Lq;
        qt = Tensor();
        kt = Tensor();
        vt = Tensor();
        ot = Tensor();
        float *qkvp, *outp;
        if (huge) {
            qkvp = huge_floats(B * L * 3 * E);
            outp = huge_floats(B * L * E);
        } else {
            qkv = Tensor(DType::f32, Shape{B * L, 3 * E});
            obuf = Tensor(DType::f32, Shape{B * L, E});
            qkvp = qkv.data_as<float>();
            outp = obuf.data_as<float>();
            std::memset(outp, 0, obuf.nbytes());
        }
        fill(qkvp, B * L * 3 * E, 1);
        // Row of (b, l): b·rb + l·rl (batch-major, or seq-first with --seq-first).
        const std::int64_t rb = seq_first ? 1 : L, rl = seq_first ? B : 1;
        auto view = [&](float* base, std::int64_t ld) {
            return TensorView(base, DType::f32, Shape{B, H, L, D}, Strides{rb * ld, D, rl * ld, 1});
        };
        q = view(qkvp, 3 * E);
        k = view(qkvp + E, 3 * E);
        v = view(qkvp + 2 * E, 3 * E);
        if (head_major) {  // head k: a (B·L, D) matrix at k·B·L·D; row b·L + l (--seq-first-heads: l·B + b)
            const std::int64_t hb = seq_first_heads ? 1 : L, hl = seq_first_heads ? B : 1;
            auto head_view = [&](float* base) {
                return TensorView(base, DType::f32, Shape{B, H, L, D}, Strides{hb * D, B * L * D, hl * D, 1});
            };
            q = head_view(qkvp);
            k = head_view(qkvp + H * B * L * D);
            v = head_view(qkvp + 2 * H * B * L * D);
        }
        o = view(outp, E);
    } else if (huge) {
        const std::int64_t nq = B * H * Lq * D, nkv = B * Hkv * Lk * D;
        float* qp = huge_floats(nq);
        float* kp = huge_floats(nkv);
        float* vp = huge_floats(nkv);
        float* op = huge_floats(nq);  // never freed: the lab exits after timing
        fill(qp, nq, 1);
        fill(kp, nkv, 2);
        fill(vp, nkv, 3);
        q = TensorView(qp, DType::f32, Shape{B, H, Lq, D});
        k = TensorView(kp, DType::f32, Shape{B, Hkv, Lk, D});
        v = TensorView(vp, DType::f32, Shape{B, Hkv, Lk, D});
        o = TensorView(op, DType::f32, Shape{B, H, Lq, D});
    } else {
        fill(qt, 1);
        fill(kt, 2);
        fill(vt, 3);
        std::memset(ot.data(), 0, ot.nbytes());
    }
    if (kv_dtype != DType::f32 && (mha_layout || huge)) {
        std::fprintf(stderr, "--kv: not with --mha-layout or --huge\n");
        return 2;
    }
    Tensor q16, k16, v16, o16;
    if (all_bf16) {  // (asks_bf16_products: out bfloat16 too)
        q16 = to_dtype(q, DType::bf16);
        q = q16.view();
        o16 = Tensor(DType::bf16, Shape{B, H, Lq, D});
        o = o16.view();
    }
    if (kv_dtype != DType::f32) {
        k16 = to_dtype(k, kv_dtype);
        v16 = to_dtype(v, kv_dtype);
        k = k16.view();
        v = v16.view();
    }
    SdpaOptions opt;
    opt.causal = causal ? Causal::top_left : Causal::none;

    // Validate: head 0, the first min(Lq, 192) queries (a slice view), against the reference.
    if (check) {
        const std::int64_t n = std::min<std::int64_t>(Lq, 192);
        TensorView qs = q.slice(0, 0, 1).slice(1, 0, 1).slice(2, 0, n);
        TensorView ks = k.slice(0, 0, 1).slice(1, 0, 1), vs = v.slice(0, 0, 1).slice(1, 0, 1);
        Tensor of(all_bf16 ? DType::bf16 : DType::f32, Shape{1, 1, n, D}), orf(DType::f32, Shape{1, 1, n, D});
        SdpaProblem pf = make_problem(qs, ks, vs, opt, of, nullptr, nullptr);
        SdpaProblem pr = make_problem(qs, ks, vs, opt, orf, nullptr, nullptr);
        flash_forward(pf, kernels, threads, &tiles);
        reference_forward(pr);
        const Tensor of32 = to_dtype(of.view(), DType::f32);
        double worst = 0;
        for (std::int64_t i = 0; i < of.numel(); ++i)
            worst = std::max(worst, (double)std::fabs(of32.data_as<float>()[i] - orf.data_as<float>()[i]));
        const double tol = all_bf16 ? 2e-2 : 1e-4;  // bf16 compute rounds Pᵀ to bf16
        std::printf("check vs reference (head 0, %lld queries): max |diff| = %.3g%s\n", (long long)n, worst,
                    worst < tol ? "" : "  FAIL");
        if (!(worst < tol)) return 1;
    }

    SdpaProblem p = make_problem(q, k, v, opt, o, nullptr, nullptr);
    const double flops = 4.0 * bench::visible_pairs(p) * (double)D;
    std::vector<double> t, ct;
    for (int r = warmup ? 0 : 1; r <= reps; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        const double c0 = bench::process_cpu_seconds();
        flash_forward(p, kernels, threads, &tiles);
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (r > 0) t.push_back(s);  // the first run warms caches and pages
        if (r > 0) ct.push_back((bench::process_cpu_seconds() - c0) / threads);
    }
    std::sort(t.begin(), t.end());
    std::sort(ct.begin(), ct.end());
    if (paired > 0) {
        std::vector<double> ratio, pk, kr;
        for (int r = 0; r < paired; ++r) {
            const double pw = bench::measure_fma_peak(threads, 0.02, 1).value;  // one short ymm trial
            const auto t0 = std::chrono::steady_clock::now();
            flash_forward(p, kernels, threads, &tiles);
            const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            pk.push_back(pw);
            kr.push_back(flops / s / 1e9);
            ratio.push_back(flops / s / 1e9 / pw);
        }
        std::vector<double> rs = ratio;
        std::sort(rs.begin(), rs.end());
        std::printf("paired x%d: kernel/FMA-peak ratio median %.3f, max %.3f; best kernel %.1f GFLOP/s, best peak %.1f "
                    "GFLOP/s (best/best %.3f)\n",
                    paired, rs[rs.size() / 2], rs.back(), *std::max_element(kr.begin(), kr.end()),
                    *std::max_element(pk.begin(), pk.end()),
                    *std::max_element(kr.begin(), kr.end()) / *std::max_element(pk.begin(), pk.end()));
    }
    if (ab > 0) {  // B/A speed = A's CPU time / B's, pair by pair
        std::vector<double> ratio, wall_ratio;
        double wall = 0;  // the last call's wall time
        auto cpu_time = [&](int var, int n) {
            flash_lab_variant = var;
            const double c0 = bench::process_cpu_seconds();
            const auto t0 = std::chrono::steady_clock::now();
            flash_forward(p, kernels, n, &tiles);
            wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            return bench::process_cpu_seconds() - c0;
        };
        // The first pair's outputs, compared bit for bit (B's output where O is contiguous: not
        // with --mha-layout, whose out rows lie apart).
        std::vector<unsigned char> out_a;  // (bytes: out may be bfloat16)
        const std::size_t esize = dtype_size(o.dtype());
        const unsigned char* obytes = static_cast<const unsigned char*>(o.data());
        std::int64_t differ = -1;
        for (int r = 0; r < ab; ++r) {
            const double a = cpu_time(0, threads), wall_a = wall;
            if (r == 0 && !mha_layout) out_a.assign(obytes, obytes + o.numel() * static_cast<std::int64_t>(esize));
            const double b = cpu_time(ab_threads > 0 ? 0 : variant, ab_threads > 0 ? ab_threads : threads);
            if (r == 0 && !mha_layout) {
                differ = 0;
                for (std::int64_t i = 0; i < o.numel(); ++i) differ += std::memcmp(&out_a[i * esize], obytes + i * esize, esize) != 0;
            }
            ratio.push_back(a / b);
            wall_ratio.push_back(wall_a / wall);
        }
        flash_lab_variant = 0;
        std::sort(ratio.begin(), ratio.end());
        std::sort(wall_ratio.begin(), wall_ratio.end());
        std::printf("ab x%d: B/A speed median %.3f (min %.3f, max %.3f); wall time A/B median %.3f (min %.3f, max %.3f); "
                    "outputs that differ in a bit: %s of %lld\n", ab,
                    ratio[ratio.size() / 2], ratio.front(), ratio.back(), wall_ratio[wall_ratio.size() / 2],
                    wall_ratio.front(), wall_ratio.back(),
                    differ < 0 ? "(not compared)" : std::to_string(differ).c_str(), (long long)o.numel());
    }
    const double med = t[t.size() / 2];
    std::printf("B%lld H%lld Lq%lld Lk%lld D%lld %s isa=%s threads=%d Mb=%d Nb=%d: median %.4f s  min %.4f s  "
                "%.1f GFLOP/s (min-time %.1f; per CPU-second x threads %.1f)%s%s\n",
                (long long)B, (long long)H, (long long)Lq, (long long)Lk, (long long)D, causal ? "causal" : "full",
                isa_name(isa), threads, tiles.Mb, tiles.Nb, med, t.front(), flops / med / 1e9, flops / t.front() / 1e9,
                flops / ct[ct.size() / 2] / 1e9, (std::string(head_major ? " [mha layout, head-major]" : mha_layout ? " [mha layout]" : "") + (seq_first_heads ? " [seq-first heads]" : seq_first ? " [seq-first]" : "") + (huge ? " [huge pages]" : "")).c_str(),
                all_bf16 ? " [Q/K/V bfloat16]" : kv_dtype == DType::f32 ? "" : (" [K/V " + std::string(dtype_name(kv_dtype)) + "]").c_str());
    return 0;
}

// Bad arguments (tile sizes, shapes) come back as attn::Error or std::invalid_argument: say so
// and exit 2 instead of terminating.
int main(int argc, char** argv) {
    try {
        return run(argc, argv);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "flash_lab: %s\n", e.what());
        return 2;
    }
}
