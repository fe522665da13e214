// S5 and S7 of bench/shapes.md in `attn bench`: one decode step (Lq = 1) against a KV cache
// of Lk = 16384 positions, float32, float16 and bfloat16 storage, timed cold by bench/decode/
// (time_decode_shape: caches evicted before each step) and in the steady state (steps back
// to back: the "decode steady" rows). Rows report the K/V bytes a step
// reads as GB/s and % of the read bandwidth the bench measured in this run (finish_case);
// the notes add each variant's % of the bandwidth sampled right before its steps, the f16
// speed-up over f32, and for S7 its time over a quarter of S5's (S7 reads a quarter of
// S5's bytes: with the same bandwidth the ratio is 1). torch runs the step as sdpa with
// Lq = 1, bottom-right (its hand-written attention over float32 K/V).
#include <cstdio>
#include <map>
#include <memory>
#include <string>

#include "decode_bench.hpp"
#include "harness.hpp"
#include "machine.hpp"

namespace attn::bench {
namespace {

// Medians of the S5 steps of this process, kept for S7's ratio (the registry runs S5 first).
std::map<DType, double>& s5_medians() {
    static std::map<DType, double> m;
    return m;
}

void run_decode_shape(const Context& ctx, const std::string& id, std::int64_t Hkv, std::vector<CaseResult>& out) {
    constexpr std::int64_t B = 1, Hq = 32, Lk = 16384, D = 128;
    const Config& cfg = ctx.cfg;
    // The eviction buffer: 1 GiB (4x this CPU's caches and then some); a quick run uses
    // 64 MiB — a smoke test, not an eviction.
    const std::size_t flush_bytes = cfg.quick ? (std::size_t{64} << 20) : (std::size_t{1} << 30);
    std::map<DType, double> medians;
    for (DType st : {DType::f32, DType::f16, DType::bf16}) {
        CaseResult c;
        c.id = id;
        c.variant = std::string(dtype_name(st)) + " cache";
        c.what = Hkv == Hq ? "decode step (KV cache)" : "GQA decode";
        c.shape = "B=1 Hq=32 Hkv=" + std::to_string(Hkv) + " Lq=1 Lk=16384 D=128";
        c.params = {{"B", B}, {"Hq", Hq}, {"Hkv", Hkv}, {"Lq", 1}, {"Lk", Lk}, {"D", D}, {"storage", dtype_name(st)}};
        c.flop = 4.0 * B * Hq * Lk * D;
        c.flop_formula = "4·B·Hq·Lk·D (Lq = 1)";
        c.bytes = 2.0 * B * Hkv * Lk * D * static_cast<double>(dtype_size(st));
        c.io_bytes = static_cast<std::int64_t>(c.bytes);
        const double avail = static_cast<double>(mem_available());
        if (avail > 0 && c.bytes + static_cast<double>(flush_bytes) > cfg.memory_fraction * avail) {
            c.status = "skipped";
            c.note = "the cache and the eviction buffer need more than " + format_double("%.0f%%", 100 * cfg.memory_fraction) +
                     " of MemAvailable";
            out.push_back(std::move(c));
            continue;
        }
        // The plain step, then (S5) the step with sinks and ALiBi as a ratio to it (issue 13).
        // cold: caches evicted before each step (a model's other layers ran in between);
        // steady: back-to-back steps with nothing in between (TLB and prefetchers warm, the
        // cache itself still 4–16x the last-level cache, so it streams from memory either way).
        auto time_row = [&](const std::string& modifiers, double target, bool cold = true) {
            Row r;
            r.impl = modifiers.empty() ? "decode" : "decode+" + modifiers;
            if (!cold) r.impl += " steady";
            r.flop = 0.0;  // bandwidth-bound: GB/s, not GFLOP/s, is the measure
            r.bytes = c.bytes;
            RssProbe probe;
            r.baseline_rss = probe.baseline();
            r.peak_rss_reset = probe.was_reset();
            try {
                SdpaOptions mods;
                ModifierTensors keep;
                if (!modifiers.empty()) {
                    set_modifiers(modifiers, Hq, mods, keep);
                    r.ratio_to = "decode";
                    r.ratio_target = target;
                }
                const std::unique_ptr<FlushBuffer> flush = cold ? std::make_unique<FlushBuffer>(flush_bytes) : nullptr;
                const double steal0 = machine_steal_seconds(), start = now_seconds();
                const DecodeTiming t = time_decode_shape(id, Hq, Hkv, st, cfg.runs, flush.get(), mods);
                std::vector<double> seconds;
                for (double ms : t.samples_ms) seconds.push_back(ms * 1e-3);
                r.timing = timing_from_samples(std::move(seconds), 0.0);
                r.timing.steal_share = steal_share_since(steal0, now_seconds() - start);  // cache fill and evictions included
                r.kernel = "decode";
                r.note = cold ? format_double("cold; %.0f%% of the bandwidth sampled just before each step (median)",
                                     100 * t.median_bw_fraction) +
                                    (cfg.quick ? "; quick: 64 MiB eviction buffer, caches not really cold" : "")
                              : "steady state: steps back to back, no eviction";
                if (modifiers.empty() && cold) medians[st] = r.timing.median_s;
            } catch (const std::exception& e) {
                r.status = "error";
                r.note = error_note(e);
            }
            r.peak_rss = probe.peak();
            c.rows.push_back(std::move(r));
        };
        time_row("", 0.0);
        time_row("", 0.0, false);
        if (id == "S5") time_row("sinks+alibi", 1.05);
        Row torch = run_torch(ctx, {{"mode", "sdpa"}, {"B", "1"}, {"Hq", "32"}, {"Hkv", std::to_string(Hkv)}, {"Lq", "1"},
                                    {"Lk", "16384"}, {"Dk", "128"}, {"Dv", "128"}, {"causal", "bottom-right"}});
        torch.bytes = 2.0 * B * Hkv * Lk * D * 4.0;  // torch reads float32 K/V
        c.rows.push_back(std::move(torch));
        out.push_back(std::move(c));
    }
    // Targets of bench/shapes.md: f16 >= 1.7x over f32; S7 / (S5 / 4) <= 1.3.
    std::string note;
    if (medians.count(DType::f32) && medians.count(DType::f16)) {
        note = "f16 speed-up over f32: " + format_double("%.2fx", medians[DType::f32] / medians[DType::f16]) + " (target >= 1.7x)";
    }
    if (medians.count(DType::f32) && medians.count(DType::bf16)) {
        note += std::string(note.empty() ? "" : "; ") + "bf16 speed-up over f32: " +
                format_double("%.2fx", medians[DType::f32] / medians[DType::bf16]);
    }
    if (id == "S5") {
        s5_medians() = medians;
    } else {
        const auto& s5 = s5_medians();
        for (DType st : {DType::f32, DType::f16, DType::bf16}) {
            if (!medians.count(st)) continue;
            const std::string name(dtype_name(st));
            note += "; S7 time / (S5 time / 4), " + name + ": " +
                    (s5.count(st) ? format_double("%.2f", medians[st] / (s5.at(st) / 4)) + " (target <= 1.3)"
                                  : std::string("run S5 in the same bench for it"));
        }
    }
    for (auto& c : out)
        if (c.id == id && c.status == "ok") c.note = note;
}

}  // namespace

BenchCase decode_case(const std::string& id) {
    BenchCase bc;
    bc.id = id;
    const std::int64_t Hkv = id == "S5" ? 32 : 8;
    bc.what = id == "S5" ? "decode step (KV cache)" : "GQA decode";
    bc.shape = "B=1 Hq=32 Hkv=" + std::to_string(Hkv) + " Lq=1 Lk=16384 D=128, f32, f16 and bf16 cache";
    bc.run = [id, Hkv](const Context& ctx, std::vector<CaseResult>& out) { run_decode_shape(ctx, id, Hkv, out); };
    return bc;
}

}  // namespace attn::bench
