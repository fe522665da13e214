#include "report.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace attn::bench {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;

std::string mib(std::int64_t bytes) { return bytes < 0 ? "?" : format_double("%.0f MiB", static_cast<double>(bytes) / kMiB); }

std::string ceiling_line(const Ceiling& c, const char* unit) {
    if (!c.measured) return c.note;
    double share = 0.0;
    for (double x : c.cpu_shares) share = std::max(share, x);
    return format_double("%.1f ", c.value) + unit + " (median " + format_double("%.1f", c.median) + ") on " + std::to_string(c.threads) +
           (c.threads == 1 ? " thread" : " threads") + format_double(" [got up to %.0f%% of the CPUs", 100 * share) +
           format_double("; est. %.1f with the CPUs alone]", c.per_cpu);
}

nlohmann::json ceiling_json(const Ceiling& c) {
    nlohmann::json j = {{"threads", c.threads}, {"measured", c.measured}, {"repeats", c.repeats},
                        {"method", c.method},   {"note", c.note},         {"trials", c.trials}};
    j["cpu_shares"] = c.cpu_shares;
    j["per_cpu_best"] = c.measured ? nlohmann::json(c.per_cpu) : nlohmann::json(nullptr);
    j["best"] = c.measured ? nlohmann::json(c.value) : nlohmann::json(nullptr);
    j["median"] = c.measured ? nlohmann::json(c.median) : nlohmann::json(nullptr);
    return j;
}

template <class T>
nlohmann::json opt(const std::optional<T>& x) {
    return x ? nlohmann::json(*x) : nlohmann::json(nullptr);
}

}  // namespace

void print_header(const Report& r) {
    const MachineInfo& m = r.machine;
    std::printf("attn bench — %s\n", m.date_utc.c_str());
    std::printf("command   : %s\n", r.command.c_str());
    std::printf("commit    : %s (attn %s)\n", m.commit.c_str(), m.attn_version.c_str());
    std::printf("machine   : %s; %d logical CPUs, %d cores; features: %s; %.1f GiB RAM\n", m.cpu_model.c_str(),
                m.logical_cpus, m.physical_cores, m.isa.c_str(), static_cast<double>(m.mem_total) / (kMiB * 1024));
    std::printf("build     : %s, %s, flags \"%s\"; ISA files \"%s\" (chosen at run time)\n", m.compiler.c_str(),
                m.build_type.c_str(), m.cxx_flags.c_str(), m.isa_flags.c_str());
    if (m.build_type != "Release" || m.sanitized)
        std::printf("WARNING   : not a plain Release build (%s%s): the timings below do not describe attn's speed\n",
                    m.build_type.c_str(), m.sanitized ? ", sanitizers on" : "");
    std::printf("threads   : %d (OpenMP; torch.set_num_threads(%d) for torch); load average %s at the start, %s at the end\n",
                r.cfg.threads, r.cfg.threads, m.loadavg_start.c_str(), r.loadavg_end.c_str());
    std::printf("runs      : 1 warm-up + up to %d timed calls per (shape, impl), stopping after %.0f s of timed calls; "
                "median and min\n",
                r.cfg.runs, r.cfg.max_seconds);
    std::printf("torch     : %s\n",
                r.torch_version.empty() ? (r.cfg.torch ? r.torch_note.c_str() : "off (--no-torch)")
                                        : ("torch " + r.torch_version + " via " + r.cfg.python +
                                           ": hand-written softmax(q@k^T*scale + mask)@v")
                                              .c_str());
    std::printf("columns   : GFLOP/s from the median time and the FLOP formula; %%peak of the widest FMA peak on %d thread(s) "
                "measured below\n            (AVX-512 where the CPU has it; %%avx2 = of the AVX2 peak, shown then too; a kernel *_bf16\n"
                "            that computed in bf16: of the bf16 dot peak, *_amx_bf16: of the AMX bf16 peak);\n            vs torch = torch median / this median (> 1: attn is faster; torch runs in float32 for every row,\n            16-bit ones too); cpu%% = CPU time of the timed calls /\n"
                "            (wall time x threads): well below 100%% means other processes took the CPUs (or threads idled);\n"
                "            adj%%pk = estimate of %%peak had the CPUs been free: (GFLOP/s / cpu share) / (peak / its cpu share)\n",
                r.cfg.threads);
    std::fflush(stdout);
}

void print_ceilings(const Report& r) {
    const Ceilings& c = r.ceilings;
    std::printf("FMA peak  : %s; %s\n", ceiling_line(c.fma_1t, "GFLOP/s").c_str(),
                ceiling_line(c.fma_nt, "GFLOP/s").c_str());
    if (c.fma_nt.measured)
        std::printf("            best of %d trials per thread count; %s\n", c.fma_nt.repeats, c.fma_nt.method.c_str());
    std::printf("AVX-512   : %s; %s\n", ceiling_line(c.fma512_1t, "GFLOP/s").c_str(),
                ceiling_line(c.fma512_nt, "GFLOP/s").c_str());
    if (c.fma512_nt.measured)
        std::printf("            best of %d trials per thread count; %s; %%peak uses this one\n", c.fma512_nt.repeats,
                    c.fma512_nt.method.c_str());
    std::printf("bf16 dot  : %s; %s\n", ceiling_line(c.bf16_1t, "GFLOP/s").c_str(),
                ceiling_line(c.bf16_nt, "GFLOP/s").c_str());
    if (c.bf16_nt.measured)
        std::printf("            best of %d trials per thread count; %s; the ceiling of bf16 compute\n",
                    c.bf16_nt.repeats, c.bf16_nt.method.c_str());
    std::printf("AMX bf16  : %s; %s\n", ceiling_line(c.amx_1t, "GFLOP/s").c_str(), ceiling_line(c.amx_nt, "GFLOP/s").c_str());
    if (c.amx_nt.measured)
        std::printf("            best of %d trials per thread count; %s; the ceiling of bf16 compute on AMX tiles\n",
                    c.amx_nt.repeats, c.amx_nt.method.c_str());
    std::printf("read BW   : %s; %s\n", ceiling_line(c.bw_1t, "GB/s").c_str(), ceiling_line(c.bw_nt, "GB/s").c_str());
    if (c.bw_nt.measured)
        std::printf("            best of %d trials per thread count; %s\n", c.bw_nt.repeats, c.bw_nt.method.c_str());
    std::printf("\n");
    std::fflush(stdout);
}

void print_case(const Context& ctx, const CaseResult& c) {
    std::string title = c.id + (c.variant.empty() ? "" : " (" + c.variant + ")") + "  " + c.what + " — " + c.shape;
    if (c.status == "unavailable" || c.status == "skipped") {
        std::printf("%s\n  %s\n\n", title.c_str(), c.note.c_str());
        std::fflush(stdout);
        return;
    }
    if (c.flop > 0) title += format_double(" — %.2f GFLOP per call", c.flop / 1e9) + " [" + c.flop_formula + "]";
    if (c.bytes > 0) title += format_double(" — %.0f MiB read per call", c.bytes / kMiB);
    std::printf("%s\n", title.c_str());
    bool any_bytes = false, any_diff = false;
    for (const Row& r : c.rows) {
        any_bytes |= r.bytes > 0;
        any_diff |= r.max_abs_diff.has_value();
    }
    const bool wide = (ctx.cfg.threads == 1 ? ctx.ceilings.fma512_1t : ctx.ceilings.fma512_nt).measured;
    std::printf("  %-10s %-21s %4s %11s %11s %9s %6s", "impl", "kernel", "runs", "median ms", "min ms", "GFLOP/s", "%peak");
    if (wide) std::printf(" %6s", "%avx2");
    if (any_bytes) std::printf(" %7s %5s", "GB/s", "%bw");
    std::printf(" %10s %9s %5s %6s", "peak RSS", "vs torch", "cpu%", "adj%pk");
    if (any_diff) std::printf(" %12s", "max|d| ref");
    std::printf("\n");
    for (const Row& r : c.rows) {
        if (r.status != "ok") {
            std::printf("  %-10s %s: %s\n", r.impl.c_str(), r.status.c_str(), r.note.c_str());
            continue;
        }
        // torch rows describe their expression in the header and the JSON, not in this column.
        // 21 characters: "flash/avx512_amx_bf16" whole.
        std::string kernel = r.impl.rfind("torch", 0) == 0 ? "-" : r.kernel.substr(0, 21);
        std::printf("  %-10s %-21s %4d %11.2f %11.2f", r.impl.c_str(), kernel.c_str(), r.timing.runs, r.timing.median_s * 1e3,
                    r.timing.min_s * 1e3);
        std::printf(" %9s %6s", r.flop > 0 ? format_double("%.1f", r.gflops).c_str() : "-",
                    r.pct_peak > 0 ? format_double("%.1f%%", r.pct_peak).c_str() : "-");
        if (wide) std::printf(" %6s", r.pct_peak_avx2 > 0 ? format_double("%.1f%%", r.pct_peak_avx2).c_str() : "-");
        if (any_bytes)
            std::printf(" %7s %5s", r.bytes > 0 ? format_double("%.1f", r.gbs).c_str() : "-",
                        r.pct_bw > 0 ? format_double("%.0f%%", r.pct_bw).c_str() : "-");
        std::printf(" %10s %9s %5s", mib(r.peak_rss).c_str(), r.speedup_vs_torch ? format_double("%.2fx", *r.speedup_vs_torch).c_str() : "-",
                    r.timing.cpu_share > 0 ? format_double("%.0f%%", 100 * r.timing.cpu_share).c_str() : "-");
        std::printf(" %6s", r.pct_peak_cpu_adjusted > 0 ? format_double("%.1f%%", r.pct_peak_cpu_adjusted).c_str() : "-");
        if (any_diff) std::printf(" %12s", r.max_abs_diff ? format_double("%.2e", *r.max_abs_diff).c_str() : "-");
        if (!r.note.empty()) std::printf("  (%s)", r.note.c_str());
        std::printf("\n");
    }
    if (c.rss_limit) {
        for (const Row& r : c.rows) {
            if (r.status != "ok" || r.impl.rfind("torch", 0) == 0) continue;
            std::printf("  peak RSS of %s: %s vs target %s = %s: %s\n", r.impl.c_str(), mib(r.peak_rss).c_str(),
                        c.rss_limit_formula.c_str(), mib(*c.rss_limit).c_str(),
                        r.peak_rss <= *c.rss_limit ? "met" : "MISSED");
        }
    }
    (void)ctx;
    std::printf("\n");
    std::fflush(stdout);
}

nlohmann::json to_json(const Report& r) {
    const MachineInfo& m = r.machine;
    nlohmann::json j;
    j["schema"] = "attn-bench/1";
    j["date"] = m.date_utc;
    j["command"] = r.command;
    j["machine"] = {{"cpu_model", m.cpu_model}, {"logical_cpus", m.logical_cpus}, {"physical_cores", m.physical_cores},
                    {"isa", m.isa},             {"mem_total_bytes", m.mem_total}, {"hostname", m.hostname},
                    {"loadavg_start", m.loadavg_start}, {"loadavg_end", r.loadavg_end}};
    j["build"] = {{"compiler", m.compiler},   {"build_type", m.build_type}, {"cxx_flags", m.cxx_flags},
                  {"isa_flags", m.isa_flags}, {"sanitized", m.sanitized},   {"commit", m.commit},
                  {"attn_version", m.attn_version}};
    nlohmann::json impls = nlohmann::json::array();
    for (Impl i : r.cfg.impls) impls.push_back(std::string(impl_name(i)));
    j["config"] = {{"threads", r.cfg.threads},
                   {"runs", r.cfg.runs},
                   {"max_seconds", r.cfg.max_seconds},
                   {"quick", r.cfg.quick},
                   {"impls", impls},
                   {"torch", r.cfg.torch},
                   {"python", r.cfg.python},
                   {"reference_max_gflop", r.cfg.reference_max_gflop}};
    j["torch"] = {{"version", r.torch_version.empty() ? nlohmann::json(nullptr) : nlohmann::json(r.torch_version)},
                  {"note", r.torch_note}};
    j["ceilings"] = {{"fma_peak_gflops", {ceiling_json(r.ceilings.fma_1t), ceiling_json(r.ceilings.fma_nt)}},
                     {"fma512_peak_gflops", {ceiling_json(r.ceilings.fma512_1t), ceiling_json(r.ceilings.fma512_nt)}},
                     {"bf16_dot_peak_gflops", {ceiling_json(r.ceilings.bf16_1t), ceiling_json(r.ceilings.bf16_nt)}},
                     {"amx_bf16_peak_gflops", {ceiling_json(r.ceilings.amx_1t), ceiling_json(r.ceilings.amx_nt)}},
                     {"read_bandwidth_gbs", {ceiling_json(r.ceilings.bw_1t), ceiling_json(r.ceilings.bw_nt)}},
                     {"threads_for_percentages", r.cfg.threads}};
    nlohmann::json cases = nlohmann::json::array();
    for (const CaseResult& c : r.cases) {
        nlohmann::json cj = {{"id", c.id},         {"variant", c.variant},   {"what", c.what},
                             {"shape", c.shape},   {"params", c.params},     {"status", c.status},
                             {"note", c.note},     {"flop", c.flop},         {"flop_formula", c.flop_formula},
                             {"bytes", c.bytes},   {"io_bytes", c.io_bytes}, {"rss_limit_bytes", opt(c.rss_limit)},
                             {"rss_limit_formula", c.rss_limit_formula}};
        nlohmann::json rows = nlohmann::json::array();
        for (const Row& w : c.rows) {
            nlohmann::json rj = {{"impl", w.impl},
                                 {"kernel", w.kernel},
                                 {"status", w.status},
                                 {"note", w.note},
                                 {"runs", w.timing.runs},
                                 {"median_s", w.timing.median_s},
                                 {"min_s", w.timing.min_s},
                                 {"warmup_s", w.timing.warmup_s},
                                 {"warmup_counted", w.timing.warmup_counted},
                                 {"cpu_share", w.timing.cpu_share},
                                 {"steal_share", w.timing.steal_share},
                                 {"samples_s", w.timing.samples},
                                 {"flop", w.flop},
                                 {"bytes", w.bytes},
                                 {"gflops", w.gflops},
                                 {"gflops_best", w.gflops_best},
                                 {"pct_peak", w.pct_peak},
                                 {"pct_peak_avx2", w.pct_peak_avx2},
                                 {"pct_peak_cpu_adjusted", w.pct_peak_cpu_adjusted},
                                 {"gbs", w.gbs},
                                 {"pct_bw", w.pct_bw},
                                 {"peak_rss_bytes", w.peak_rss},
                                 {"baseline_rss_bytes", w.baseline_rss},
                                 {"peak_rss_reset", w.peak_rss_reset},
                                 {"speedup_vs_torch", opt(w.speedup_vs_torch)},
                                 {"max_abs_diff_vs_reference", opt(w.max_abs_diff)}};
            if (w.scaling_efficiency) {
                rj["one_thread_median_ms"] = 1e3 * *w.one_thread_median_s;
                rj["scaling_efficiency"] = *w.scaling_efficiency;
                rj["one_thread_paired"] = w.one_thread_paired;
            }
            if (!w.ratio_to.empty()) {
                rj["ratio_to"] = w.ratio_to;
                rj["ratio_target"] = w.ratio_target;
                rj["ratio_median"] = opt(w.ratio);
                rj["ratio_min"] = opt(w.ratio_min);
            }
            if (c.rss_limit && w.status == "ok" && w.impl.rfind("torch", 0) != 0)
                rj["rss_target_met"] = w.peak_rss >= 0 && w.peak_rss <= *c.rss_limit;
            rows.push_back(std::move(rj));
        }
        cj["rows"] = std::move(rows);
        cases.push_back(std::move(cj));
    }
    j["cases"] = std::move(cases);
    return j;
}

}  // namespace attn::bench
