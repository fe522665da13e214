#include "harness.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <chrono>
#include <new>

#include <omp.h>

#include "attn/error.hpp"
#include "attn/sdpa_varlen.hpp"
#include "attn/threads.hpp"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace attn::bench {

double now_seconds() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string format_double(const char* format, double x) {
    const int n = std::snprintf(nullptr, 0, format, x);
    if (n <= 0) return {};
    std::string out(static_cast<std::size_t>(n) + 1, '\0');
    std::snprintf(out.data(), out.size(), format, x);
    out.resize(static_cast<std::size_t>(n));
    return out;
}

double steal_share_since(double steal0, double wall_s) {
    const double steal1 = machine_steal_seconds();
    const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    if (steal0 < 0 || steal1 < 0 || cpus <= 0 || wall_s < 0.1) return -1.0;
    return (steal1 - steal0) / (wall_s * static_cast<double>(cpus));
}

Timing timing_from_samples(std::vector<double> samples, double warmup_s) {
    Timing t;
    t.warmup_s = warmup_s;
    t.samples = samples;
    t.runs = static_cast<int>(samples.size());
    if (samples.empty()) return t;
    std::sort(samples.begin(), samples.end());
    const std::size_t n = samples.size();
    t.median_s = n % 2 == 1 ? samples[n / 2] : 0.5 * (samples[n / 2 - 1] + samples[n / 2]);
    t.min_s = samples.front();
    return t;
}

Timing time_calls(const Config& cfg, const std::function<void()>& fn) {
    double cpu0 = process_cpu_seconds(), steal0 = machine_steal_seconds();
    double t0 = now_seconds();
    fn();  // warm-up: first touch of outputs and workspaces, caches, thread pool start
    const double warmup = now_seconds() - t0;
    if (warmup >= cfg.max_seconds) {
        Timing t = timing_from_samples({warmup}, warmup);
        t.warmup_counted = true;
        t.cpu_share = cpu_share(process_cpu_seconds() - cpu0, warmup, cfg.threads);  // warm-up ≥ max_seconds
        t.steal_share = steal_share_since(steal0, warmup);
        return t;
    }
    cpu0 = process_cpu_seconds();
    steal0 = machine_steal_seconds();
    std::vector<double> samples;
    double spent = 0.0;
    for (int r = 0; r < std::max(1, cfg.runs); ++r) {
        if (r > 0 && spent >= cfg.max_seconds) break;
        t0 = now_seconds();
        fn();
        const double dt = now_seconds() - t0;
        samples.push_back(dt);
        spent += dt;
    }
    const double cpu = process_cpu_seconds() - cpu0;
    Timing t = timing_from_samples(std::move(samples), warmup);
    // Below ~0.1 s the process CPU time is too coarse (the kernel splits it by tick samples)
    // for a share: left unknown (0).
    t.cpu_share = spent >= 0.1 ? cpu_share(cpu, spent, cfg.threads) : 0.0;
    t.steal_share = steal_share_since(steal0, spent);
    return t;
}

std::vector<Timing> time_interleaved(const Config& cfg, const std::vector<std::function<void()>>& fns) {
    const std::size_t n = fns.size();
    std::vector<double> warmup(n), spent(n, 0.0), cpu(n, 0.0);
    for (std::size_t i = 0; i < n; ++i) {
        const double t0 = now_seconds();
        fns[i]();
        warmup[i] = now_seconds() - t0;
    }
    std::vector<std::vector<double>> samples(n);
    double total = 0.0;
    const double steal0 = machine_steal_seconds(), start = now_seconds();
    for (int r = 0; r < std::max(1, cfg.runs); ++r) {
        if (r > 0 && total >= cfg.max_seconds * static_cast<double>(n)) break;
        for (std::size_t i = 0; i < n; ++i) {
            const double c0 = process_cpu_seconds(), t0 = now_seconds();
            fns[i]();
            const double dt = now_seconds() - t0;
            cpu[i] += process_cpu_seconds() - c0;
            samples[i].push_back(dt);
            spent[i] += dt;
            total += dt;
        }
    }
    // Steal over the rounds as a whole: the variants ran in turn through the same minutes.
    const double steal = steal_share_since(steal0, now_seconds() - start);
    std::vector<Timing> out;
    for (std::size_t i = 0; i < n; ++i) {
        Timing t = timing_from_samples(std::move(samples[i]), warmup[i]);
        t.steal_share = steal;
        // As time_calls: below ~0.1 s of calls the process CPU time is too coarse for a share.
        t.cpu_share = spent[i] >= 0.1 ? cpu_share(cpu[i], spent[i], cfg.threads) : 0.0;
        out.push_back(std::move(t));
    }
    return out;
}

RssProbe::RssProbe() {
    // The buffer sdpa_varlen keeps between calls (up to 256 MiB) belongs to the row that ran
    // it: left in place, a full run's S8 rows started 250 MiB above their own footprint. A
    // varlen row allocates it again in its warm-up, inside its own peak.
    release_varlen_scratch();
#if defined(__GLIBC__)
    // Return memory freed by earlier rows (kept by malloc's arenas) to the OS, so this row's
    // resident set starts from what is live now.
    malloc_trim(0);
#endif
    reset_ = reset_peak_rss();
    baseline_ = current_rss();
}

std::int64_t RssProbe::peak() const { return bench::peak_rss(); }

std::string error_note(const std::exception& e) {
    const bool bare_bad_alloc = dynamic_cast<const std::bad_alloc*>(&e) != nullptr &&
                                dynamic_cast<const attn::OutOfMemory*>(&e) == nullptr;
    return bare_bad_alloc ? "out of memory" : e.what();
}

bool time_calls_into(const Config& cfg, Row& r, const std::function<void()>& fn) {
    RssProbe probe;
    r.baseline_rss = probe.baseline();
    r.peak_rss_reset = probe.was_reset();
    bool ran = false;
    try {
        if (cfg.scaling && cfg.threads > 1 && r.impl != "reference") {
            const auto on_one_thread = [&] {
                const ScopedNumThreads one(1);
                omp_set_num_threads(1);  // (as the 1-thread pass: any OpenMP region outside attn's setting too)
                struct Restore {
                    int n;
                    ~Restore() { omp_set_num_threads(n); }
                } restore{cfg.threads};
                fn();
            };
            std::vector<Timing> both = time_interleaved(cfg, {fn, on_one_thread});
            r.timing = std::move(both[0]);
            if (both[1].runs > 0 && both[1].median_s > 0.0) {
                r.one_thread_median_s = both[1].median_s;
                r.one_thread_paired = true;
            }
        } else {
            r.timing = time_calls(cfg, fn);
        }
        ran = true;
    } catch (const std::exception& e) {
        r.status = "error";
        r.note = error_note(e);
    }
    r.peak_rss = probe.peak();
    return ran;
}

void finish_case(const Context& ctx, CaseResult& c) {
    const Row* torch = nullptr;
    for (const Row& r : c.rows)
        if (r.impl == "torch" && r.status == "ok" && r.timing.runs > 0) torch = &r;
    const Ceiling& widest = ctx.ceilings.widest_fma(ctx.cfg.threads);
    const Ceiling& bf16 = ctx.cfg.threads == 1 ? ctx.ceilings.bf16_1t : ctx.ceilings.bf16_nt;
    const Ceiling& amx = ctx.cfg.threads == 1 ? ctx.ceilings.amx_1t : ctx.ceilings.amx_nt;
    const Ceiling& fma2 = ctx.cfg.threads == 1 ? ctx.ceilings.fma_1t : ctx.ceilings.fma_nt;
    const Ceiling& bw = ctx.cfg.threads == 1 ? ctx.ceilings.bw_1t : ctx.ceilings.bw_nt;
    const auto add_note = [](Row& r, const std::string& note) { r.note = r.note.empty() ? note : r.note + "; " + note; };
    for (Row& r : c.rows) {
        if (r.status != "ok" || r.timing.runs == 0 || r.timing.median_s <= 0.0) continue;
        if (r.flop > 0.0) {
            r.gflops = r.flop / r.timing.median_s / 1e9;
            r.gflops_best = r.flop / r.timing.min_s / 1e9;
            const bool bf16_compute = r.kernel.ends_with("_bf16");
            // (a forward+backward row names both kernels: its last, the backward's, decides)
            const bool on_amx = r.kernel.ends_with("_amx_bf16");
            const Ceiling& fma = on_amx ? amx : bf16_compute ? bf16 : widest;
            if (fma.measured && fma.value > 0.0) r.pct_peak = 100.0 * r.gflops / fma.value;
            if (!bf16_compute && fma2.measured && fma2.value > 0.0) r.pct_peak_avx2 = 100.0 * r.gflops / fma2.value;
            if (fma.measured && fma.per_cpu > 0.0 && r.timing.cpu_share > 0.0)
                r.pct_peak_cpu_adjusted = 100.0 * r.gflops / r.timing.cpu_share / fma.per_cpu;
            if (bf16_compute) add_note(r, on_amx ? "bf16 compute: %peak of the AMX bf16 peak" : "bf16 compute: %peak of the bf16 dot peak");
        }
        if (r.bytes > 0.0) {
            r.gbs = r.bytes / r.timing.median_s / 1e9;
            if (bw.measured && bw.value > 0.0) r.pct_bw = 100.0 * r.gbs / bw.value;
        }
        if (torch != nullptr && &r != torch) r.speedup_vs_torch = torch->timing.median_s / r.timing.median_s;
        if (r.timing.steal_share >= kStealNote) {  // the host took vCPU time: the row's times are suspect
            char buf[120];
            std::snprintf(buf, sizeof buf, "host steal %.0f%% of the vCPUs during the timed calls", 100 * r.timing.steal_share);
            add_note(r, buf);
        }
        if (r.one_thread_median_s && ctx.cfg.threads > 1) {
            r.scaling_efficiency = *r.one_thread_median_s / (ctx.cfg.threads * r.timing.median_s);
            char buf[120];
            std::snprintf(buf, sizeof buf, "%d-thread efficiency %.2f (1 thread %.2f ms%s)", ctx.cfg.threads,
                          *r.scaling_efficiency, 1e3 * *r.one_thread_median_s,
                          r.one_thread_paired ? ", calls alternated" : ", a later pass");
            add_note(r, buf);
        }
    }
    for (Row& r : c.rows) {
        if (r.ratio_to.empty() || r.status != "ok" || r.timing.runs == 0) continue;
        for (const Row& p : c.rows) {
            if (&p == &r || p.impl != r.ratio_to || p.status != "ok" || p.timing.median_s <= 0.0) continue;
            r.ratio = r.timing.median_s / p.timing.median_s;
            r.ratio_min = r.timing.min_s / p.timing.min_s;
            char buf[160];
            std::snprintf(buf, sizeof buf, "%.3fx the %s row (min/min %.3fx; target <= %.2fx)", *r.ratio, p.impl.c_str(),
                          *r.ratio_min, r.ratio_target);
            r.note = r.note.empty() ? buf : std::string(buf) + "; " + r.note;
        }
    }
}

}  // namespace attn::bench
