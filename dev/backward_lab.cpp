// Kernel lab for the flash backward (docs/design.md, "The kernel lab"): the backward alone,
// validated against the reference, then timed. Not a benchmark (that is `attn bench`, whose
// S1/S3 rows time forward + backward together); a tool to see what a change to the backward
// tile does, and a loop to run under `perf record`.
//
//   backward_lab [--shape S1|S3] [B H Lq Lk D causal] [--threads N] [--reps N] [--peak] [--no-check] [--bf16]
//                [--alibi] [--softcap C] [--dropout P] [--with-forward]
//
// The row is the process's (ATTN_ISA picks another; ATTN_CPU_HIDE hides a feature). Inputs are
// uniform in [-1, 1); out and lse come from one flash forward, then --reps backward calls are
// timed after one warm-up. Prints the FLOPs of a call, 2.5 × the forward's 4·D per visible
// (query, key) pair (bench/shapes.md; causal is top-left, its pairs counted exactly by
// bench/visible_pairs.hpp: with Lq < Lk not the bottom-right count), median and min wall time, GFLOP/s
// and per CPU-second of the process (bench/machine.hpp), and with --peak the avx512 FMA peak on
// the same threads (bench/peaks.hpp, as `attn bench`). The check compares dQ, dK, dV with the reference's (in
// double) by max |Δ| / max |ref| per gradient; it runs where the reference costs at most
// 20 GFLOP (S1: yes, S3: no) unless --no-check. A hash of the gradients' bits tells whether
// two builds computed the same bits. --bf16: every tensor but lse bfloat16 (the float32 values
// rounded once), the all-bf16 call that runs bf16 compute (AMX, or vdpbf16ps under
// ATTN_CPU_HIDE=amx_bf16); the check is then against the reference on those bf16 inputs.
// --alibi (attn::alibi_slopes(H)), --softcap C, --dropout P (seed 1): the variants whose tiles
// run S or dP unfused (a score rule, the softcap, dropout: tile_body.inl); the FLOPs are counted
// as without them. --with-forward: each timed call is the forward (keeping lse) then the
// backward, as `attn bench`'s forward+backward rows time them (FLOPs 3.5 × the forward's), and
// the two parts' median wall times are printed too: what the backward costs after a forward
// rather than after another backward.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "attn/sdpa.hpp"
#include "attn/sdpa_backward.hpp"
#include "attn/tensor.hpp"
#include "attn/threads.hpp"
#include "lab_util.hpp"
#include "machine.hpp"
#include "peaks.hpp"
#include "sdpa/problem.hpp"
#include "visible_pairs.hpp"

namespace {

// max |a − b| / max |b| over every element (NaN anywhere: NaN).
double relative_error(const attn::Tensor& a, const attn::Tensor& b) {
    const float* x = a.data_as<const float>();
    const float* y = b.data_as<const float>();
    double d = 0.0, m = 0.0;
    for (std::int64_t e = 0; e < a.numel(); ++e) {
        if (std::isnan(x[e]) != std::isnan(y[e])) return NAN;
        d = std::max(d, std::fabs(static_cast<double>(x[e]) - static_cast<double>(y[e])));
        m = std::max(m, std::fabs(static_cast<double>(y[e])));
    }
    return m > 0.0 ? d / m : d;
}

// FNV-1a over the bytes of the three gradients: two builds that print the same hash computed
// the same bits.
std::uint64_t bits_hash(const attn::Tensor* g, int n) {
    std::uint64_t h = 1469598103934665603ull;
    for (int t = 0; t < n; ++t) {
        const unsigned char* p = g[t].data_as<const unsigned char>();
        // the byte count once: numel() per byte was 5 % of a profile's samples
        const std::int64_t bytes = g[t].numel() * static_cast<std::int64_t>(dtype_size(g[t].dtype()));
        for (std::int64_t e = 0; e < bytes; ++e) h = (h ^ p[e]) * 1099511628211ull;
    }
    return h;
}

}  // namespace

int main(int argc, char** argv) {
    using namespace attn;
    std::int64_t B = 1, H = 16, Lq = 1024, Lk = 1024, D = 64;
    bool causal = false, peak = false, check = true, bf16 = false, alibi = false, with_forward = false;
    double softcap = 0.0, dropout = 0.0;
    int threads = 2, reps = 5;
    std::vector<std::string> pos;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        auto next = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string("0"); };
        if (a == "--shape") {
            const std::string s = next();
            if (s == "S3") Lq = Lk = 4096, D = 128, causal = true;
            else if (s != "S1") return std::fprintf(stderr, "--shape: S1 or S3\n"), 2;
        } else if (a == "--threads") threads = std::stoi(next());
        else if (a == "--reps") reps = std::max(1, std::stoi(next()));
        else if (a == "--peak") peak = true;
        else if (a == "--no-check") check = false;
        else if (a == "--bf16") bf16 = true;
        else if (a == "--alibi") alibi = true;
        else if (a == "--with-forward") with_forward = true;
        else if (a == "--softcap") softcap = std::stod(next());
        else if (a == "--dropout") dropout = std::stod(next());
        else pos.push_back(a);
    }
    if (pos.size() == 6) {
        B = std::stoll(pos[0]), H = std::stoll(pos[1]), Lq = std::stoll(pos[2]), Lk = std::stoll(pos[3]);
        D = std::stoll(pos[4]), causal = pos[5] == "1";
    } else if (!pos.empty()) {
        return std::fprintf(stderr, "usage: backward_lab [--shape S1|S3] [B H Lq Lk D causal] [--threads N] "
                                    "[--reps N] [--peak] [--no-check] [--bf16] [--alibi] [--softcap C] [--dropout P] "
                                    "[--with-forward]\n"), 2;
    }
    set_num_threads(threads);

    const DType dt = bf16 ? DType::bf16 : DType::f32;
    // uniform in [-1, 1) from fixed seeds, rounded to bf16 with --bf16
    auto input = [&](Shape shape, std::uint64_t seed) {
        Tensor t(DType::f32, shape);
        lab::fill(t, seed);
        if (!bf16) return t;
        return to_dtype(t.view(), DType::bf16);
    };
    const Tensor q = input(Shape{B, H, Lq, D}, 1), k = input(Shape{B, H, Lk, D}, 2), v = input(Shape{B, H, Lk, D}, 3);
    const Tensor dO = input(Shape{B, H, Lq, D}, 4);
    const Tensor o(dt, Shape{B, H, Lq, D}), lse(DType::f32, Shape{B, H, Lq});
    SdpaOptions opt;
    opt.impl = Impl::flash;
    opt.causal = causal ? Causal::top_left : Causal::none;
    const Tensor slopes = alibi_slopes(H);
    if (alibi) opt.alibi_slopes = slopes.view();
    opt.softcap = softcap;
    if (dropout > 0.0) opt.dropout_p = dropout, opt.dropout_seed = 1;
    const TensorView lse_view = lse.view();
    sdpa(q, k, v, opt, o, &lse_view);
    const Tensor grads[3] = {Tensor(dt, q.shape()), Tensor(dt, k.shape()), Tensor(dt, v.shape())};
    const Tensor &dq = grads[0], &dk = grads[1], &dv = grads[2];
    SdpaReport rep;
    sdpa_backward(q, k, v, o, lse, dO, opt, dq, dk, dv, &rep);  // the warm-up
    std::printf("gradient bits hash %016llx\n", static_cast<unsigned long long>(bits_hash(grads, 3)));
    const double pairs = bench::visible_pairs(detail::make_problem(q, k, v, opt, o, nullptr, nullptr));
    const double backward_flop = 2.5 * 4.0 * pairs * static_cast<double>(D);
    const double flop = with_forward ? 3.5 / 2.5 * backward_flop : backward_flop;
    std::printf("FLOP per call %.6g (%s x 4·D x %.0f visible (query, key) pairs)\n", flop, with_forward ? "3.5" : "2.5", pairs);
    if (check && backward_flop <= 20e9) {
        SdpaOptions ref = opt;
        ref.impl = Impl::reference;
        const Tensor rq(DType::f32, q.shape()), rk(DType::f32, k.shape()), rv(DType::f32, v.shape());
        sdpa_backward(q, k, v, o, lse, dO, ref, rq, rk, rv);
        auto err = [&](const Tensor& g, const Tensor& r) {
            return bf16 ? relative_error(to_dtype(g.view(), DType::f32), r) : relative_error(g, r);
        };
        std::printf("check against the reference, max|Δ|/max|ref|: dQ %.2e  dK %.2e  dV %.2e\n", err(dq, rq), err(dk, rk),
                    err(dv, rv));
    }
    if (peak) {
        const bench::Ceiling c = bench::measure_fma_peak(threads, 0.25, 3, bench::FmaWidth::avx512);
        if (!c.measured) std::printf("FMA peak: %s\n", c.note.c_str());
        else std::printf("FMA peak zmm (%d threads): %.1f GFLOP/s wall, %.1f per CPU-second x threads\n", threads, c.value, c.per_cpu);
    }
    std::vector<double> wall, cpu, forward_wall, backward_wall;
    for (int r = 0; r < reps; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        const double c0 = bench::process_cpu_seconds();
        if (with_forward) sdpa(q, k, v, opt, o, &lse_view);
        const auto t1 = std::chrono::steady_clock::now();
        sdpa_backward(q, k, v, o, lse, dO, opt, dq, dk, dv);
        const auto t2 = std::chrono::steady_clock::now();
        wall.push_back(std::chrono::duration<double>(t2 - t0).count());
        forward_wall.push_back(std::chrono::duration<double>(t1 - t0).count());
        backward_wall.push_back(std::chrono::duration<double>(t2 - t1).count());
        cpu.push_back((bench::process_cpu_seconds() - c0) / threads);
    }
    for (auto* x : {&wall, &cpu, &forward_wall, &backward_wall}) std::sort(x->begin(), x->end());
    if (with_forward)
        std::printf("forward median %.2f ms, backward median %.2f ms (wall, each part's own median)\n",
                    1e3 * forward_wall[forward_wall.size() / 2], 1e3 * backward_wall[backward_wall.size() / 2]);
    const double med = wall[wall.size() / 2], cmed = cpu[cpu.size() / 2];
    std::string mods;
    if (alibi) mods += " alibi";
    char buf[64];
    if (softcap > 0.0) mods += (std::snprintf(buf, sizeof buf, " softcap=%g", softcap), buf);
    if (dropout > 0.0) mods += (std::snprintf(buf, sizeof buf, " dropout=%g", dropout), buf);
    std::printf("%s B%lld H%lld Lq%lld Lk%lld D%lld %s%s %s threads=%d: median %.2f ms  min %.2f ms  %.1f GFLOP/s "
                "(min-time %.1f; per CPU-second x threads %.1f)\n",
                with_forward ? "forward+backward" : "backward", static_cast<long long>(B), static_cast<long long>(H),
                static_cast<long long>(Lq), static_cast<long long>(Lk),
                static_cast<long long>(D), causal ? "causal" : "full", mods.c_str(), rep.kernel.c_str(), threads, 1e3 * med,
                1e3 * wall.front(), flop / med / 1e9, flop / wall.front() / 1e9, flop / cmed / 1e9);
    return 0;
}
