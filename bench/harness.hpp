// The benchmark's harness: configuration, timing, one result row per (shape, impl), and the
// registry entry type through which every feature plugs its shapes into `attn bench`.
//
// To add a shape id (e.g. S5 once the decode kernel exists): write a runner
//   void run_decode(const Context& ctx, std::vector<CaseResult>& out)
// that fills one CaseResult per variant (f32 cache, f16 cache, ...) with its rows — use
// time_calls_into() for a row's timing and peak memory, run_torch() for the PyTorch
// baseline — and point its entry in registry.cpp at it (run_sdpa_forward in sdpa_cases.cpp
// is a complete example). Set Row::flop for compute-bound work (GFLOP/s, % of the FMA peak)
// and/or Row::bytes for bandwidth-bound work (GB/s, % of the read bandwidth). The driver
// calls finish_case() for the derived numbers (and the speed-up vs the row named "torch").
// bench/torch_attention.py already has the baselines the planned entries need:
//   --mode sdpa           hand-written attention (S1–S4, S8; decode S5/S7 as Lq = 1, bottom-right)
//   --mode sdpa-backward  its forward + backward through autograd (S1/S3 forward+backward)
//   --mode mha            nn.MultiheadAttention, eval + inference_mode (S6: --B --L --E --heads)
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "attn/sdpa.hpp"
#include "machine.hpp"
#include "modifiers.hpp"
#include "peaks.hpp"

namespace attn::bench {

struct Config {
    int threads = 1;
    int runs = 5;                      // timed calls after one warm-up
    double max_seconds = 15.0;         // per (shape, impl): stop timing after this (≥ 1 timed call)
    bool quick = false;                // smoke-test mode: short peaks, small buffer, 2 runs
    std::vector<Impl> impls;           // attn kernels to run, in order
    bool torch = true;                 // the PyTorch baseline
    std::string python = "/usr/bin/python3";
    std::string torch_script;          // bench/torch_attention.py
    double reference_max_gflop = 10.0; // the reference runs only where its full FLOPs are below this
    double memory_fraction = 0.6;      // skip a run whose estimated memory exceeds this share of MemAvailable
    bool scaling = false;              // --scaling: time every attn row on 1 thread too (target 6 of issue 16);
                                       // time_calls_into alternates the two, other rows get a 1-thread pass
};

// What the driver measured before the shapes: the ceilings every row is compared with.
struct Ceilings {
    Ceiling fma_1t, fma_nt;   // GFLOP/s on 1 and on Config::threads threads: AVX2 (256-bit) FMA
    Ceiling fma512_1t, fma512_nt;  // the same with 512-bit FMA (not measured without AVX-512)
    Ceiling bf16_1t, bf16_nt;      // vdpbf16ps, GFLOP/s (bf16 compute's ceiling; AVX-512 BF16 only)
    Ceiling amx_1t, amx_nt;        // tdpbf16ps on AMX tiles, GFLOP/s (bf16 compute's ceiling on AMX-BF16 CPUs)
    // The widest FMA ceiling the CPU has on `threads` threads (AVX-512 when measured): the
    // %peak of every row. The AVX2 one stays in the report beside it (%avx2).
    const Ceiling& widest_fma(int threads) const {
        const Ceiling& w = threads == 1 ? fma512_1t : fma512_nt;
        return w.measured ? w : (threads == 1 ? fma_1t : fma_nt);
    }
    Ceiling bw_1t, bw_nt;     // GB/s
};

struct Context {
    const Config& cfg;
    const MachineInfo& machine;
    const Ceilings& ceilings;
    std::string torch_version;  // empty when torch is not available
    std::string torch_note;     // why not, if so
};

struct Timing {  // of one (shape, impl)
    int runs = 0;
    double median_s = 0.0, min_s = 0.0;
    double warmup_s = 0.0;
    bool warmup_counted = false;  // the warm-up alone exceeded the budget: it is the one sample
    // CPU time of the timed calls / (their wall time x threads); < 1 when other processes took
    // CPU time (or the kernel left threads idle); 0 when not measured.
    double cpu_share = 0.0;
    // Steal time of the machine during the timed calls / (their wall time x the machine's
    // CPUs): the share of the vCPUs the VM's host gave to something else, which cpu_share
    // cannot show (machine.hpp); -1 when the kernel does not report steal time.
    double steal_share = -1.0;
    std::vector<double> samples;  // seconds, in run order
};

// One warm-up call, then up to cfg.runs timed calls, stopping early (after at least one)
// when cfg.max_seconds of timed calls are spent. A warm-up longer than cfg.max_seconds is
// itself the one sample (what it warms — first touch of the output, caches — is then a
// negligible share of the call), so a call of a minute is not run twice.
Timing time_calls(const Config& cfg, const std::function<void()>& fn);
Timing timing_from_samples(std::vector<double> samples, double warmup_s);

// Several variants of one call timed in turn, one call of each per round (A B C, A B C, …),
// after one warm-up call each, for rows whose ratio is the point (paged vs contiguous
// decode). On a shared VM a slow phase then lands on every variant alike: back to back (all
// of A, then all of B) the same decode step moved by ±25 % between rows a minute apart.
// Rounds stop at cfg.runs, or (after the first) once cfg.max_seconds per variant is spent.
std::vector<Timing> time_interleaved(const Config& cfg, const std::vector<std::function<void()>>& fns);

// A steady clock, in seconds.
double now_seconds();

// printf's `format` with one double, e.g. format_double("%.2fx", r) — any length (the bench's
// notes are sentences).
std::string format_double(const char* format, double x);

// Steal seconds since `steal0` (machine_steal_seconds()) as a share of `wall_s` seconds of all
// the machine's CPUs; -1 when either reading is unavailable or the span is under 0.1 s (the
// kernel counts steal in ticks of 10 ms).
double steal_share_since(double steal0, double wall_s);

// finish_case notes a row whose steal share (Timing::steal_share) is at least this.
inline constexpr double kStealNote = 0.02;

// Peak resident memory of what runs between construction and peak(): resets the kernel's
// high-water mark when it may (see reset_peak_rss), else reports the process's.
class RssProbe {
public:
    RssProbe();
    std::int64_t baseline() const { return baseline_; }
    std::int64_t peak() const;
    bool was_reset() const { return reset_; }

private:
    std::int64_t baseline_ = -1;
    bool reset_ = false;
};

struct Row {
    std::string impl;            // "flash", "reference", "torch", ...
    std::string kernel;          // what ran, when the library says (SdpaReport::kernel)
    std::string status = "ok";   // ok | skipped | error | unavailable
    std::string note;
    Timing timing;
    double flop = 0.0;           // counted FLOP per call (0: not compute-bound, e.g. decode)
    double bytes = 0.0;          // bytes a call must read (0: not bandwidth-bound)
    std::int64_t peak_rss = -1;  // bytes; high-water mark during the row (inputs included)
    std::int64_t baseline_rss = -1;
    bool peak_rss_reset = false; // false: the process-wide high-water mark
    std::optional<double> max_abs_diff;  // vs the reference output of the same inputs
    // Filled by finish_case():
    // pct_peak: of the widest FMA peak (Ceilings::widest_fma), or of the bf16 dot peak for a row
    // whose kernel computed in bf16 (its name ends in "_bf16": a float32 peak would read 128 %),
    // of the AMX peak for one that computed on AMX tiles (its name ends in "_amx_bf16");
    // pct_peak_avx2: of the AVX2 one (equal on a CPU without AVX-512; 0 for bf16 compute).
    double gflops = 0.0, gflops_best = 0.0, pct_peak = 0.0, pct_peak_avx2 = 0.0, gbs = 0.0, pct_bw = 0.0;
    // An estimate for a shared machine: this row's rate per unit of CPU share against the
    // FMA ceiling's (Ceiling::per_cpu) — what % peak would be with the CPUs alone. 0 if unknown.
    double pct_peak_cpu_adjusted = 0.0;
    std::optional<double> speedup_vs_torch;  // torch median / this median
    // A score-modifier row (modifiers.hpp): the impl of its plain row in the same case, the
    // target on the ratio; finish_case fills median/median and min/min.
    std::string ratio_to;
    double ratio_target = 0.0;
    std::optional<double> ratio, ratio_min;
    // --scaling: the same row timed again on 1 thread (median, seconds), and the parallel
    // efficiency T1 / (threads · Tthreads) that finish_case derives from it (1 = perfect).
    // one_thread_paired: its 1-thread calls alternated with the row's own (time_calls_into);
    // else they ran in a pass of their own after the case.
    std::optional<double> one_thread_median_s, scaling_efficiency;
    bool one_thread_paired = false;
};

// The note of a row whose calls threw: the exception's message — "out of memory" for a bare
// std::bad_alloc, whose what() says only "std::bad_alloc" (attn::OutOfMemory's names the buffer).
std::string error_note(const std::exception& e);

// One row's timed calls: time_calls(cfg, fn) into r.timing, with the peak RSS of the calls
// (RssProbe). An exception becomes the row's error: status "error", error_note as the note.
// Returns whether the calls ran. With --scaling on more than 1 thread (and r.impl other than
// "reference", which the scaling check skips), the calls alternate with the same call on 1
// thread (time_interleaved): r.one_thread_median_s then comes from the same minutes as the
// row's own median — a 1-thread pass tens of seconds later read the host's drift as the
// kernel's efficiency (0.63–0.93 where paired calls gave ≈ 1: kernels-lab dec-16, fwd-41).
bool time_calls_into(const Config& cfg, Row& r, const std::function<void()>& fn);

struct CaseResult {
    std::string id;       // "S1", "custom"
    std::string variant;  // "" or e.g. "f16 cache", "forward+backward"
    std::string what;     // "prefill"
    std::string shape;    // human-readable sizes
    nlohmann::json params = nlohmann::json::object();  // the sizes as numbers
    std::string status = "ok";  // ok | unavailable
    std::string note;
    std::string flop_formula;
    double flop = 0.0, bytes = 0.0;
    std::int64_t io_bytes = 0;                // bytes of the inputs and outputs (Q, K, V, O)
    std::optional<std::int64_t> rss_limit;    // a target on peak RSS (S8)
    std::string rss_limit_formula;
    std::vector<Row> rows;
};

// One entry of the registry: a shape id and a variant of it (the same id may have several
// entries, e.g. S1 forward and S1 forward+backward; --shapes S1 selects all of them).
// `run` is empty when its feature is not in this build; `unavailable` then says which
// feature, and the report prints that instead of numbers.
struct BenchCase {
    std::string id;
    std::string variant;  // "" for the plain forward
    std::string what;
    std::string shape;
    std::function<void(const Context&, std::vector<CaseResult>&)> run;
    std::string unavailable;
    bool slow = false;  // minutes per call: `--quick` leaves it out unless --shapes names it
};

// Every shape id known to this build, in report order (registry.cpp).
std::vector<BenchCase> all_cases();

// The sdpa-forward runner for any shape (sdpa_cases.cpp); `custom` ids use it too.
struct SdpaShape {
    std::string id, what;
    std::int64_t B = 1, Hq = 1, Hkv = 1, Lq = 1, Lk = 1, Dk = 1, Dv = 1;
    Causal causal = Causal::none;
    bool report_rss_target = false;  // compare peak RSS with 1.25 x bytes(Q,K,V,O) + 100 MiB
    // Storage of Q (and out) and of K/V: float32, float16 or bfloat16 (the 16-bit rows of
    // docs/BENCHMARKS: the kernels convert per tile). Not f32: no torch row (see the f32 one).
    DType q_dtype = DType::f32, kv_dtype = DType::f32;
    std::vector<ModifierRow> modifier_rows = {};  // timed again with these modifiers (fast kernel only)
};
void run_sdpa_forward(const Context& ctx, const SdpaShape& s, std::vector<CaseResult>& out);
BenchCase sdpa_forward_case(const SdpaShape& s);
// The training step of the same shape (backward_cases.cpp): forward with lse + sdpa_backward
// per timed call, vs torch autograd (--mode sdpa-backward); FLOPs (1 + 2.5) x forward.
void run_sdpa_forward_backward(const Context& ctx, const SdpaShape& s, std::vector<CaseResult>& out);
BenchCase sdpa_forward_backward_case(const SdpaShape& s);
// Shared by the sdpa runners (sdpa_cases.cpp): "none"/"top-left"/"bottom-right"; inputs
// uniform in [-1, 1) as a pure function of (seed, index); NaN poison; max |a − b| (NaN when
// either holds NaN); "12.3 GiB"; the shape as the report prints it.
std::string causal_word(Causal c);
void fill_uniform(const Tensor& t, std::uint64_t seed);
void poison(const Tensor& t);
double max_abs_diff(const Tensor& a, const Tensor& b);
std::string gib(double bytes);
std::string sdpa_shape_text(const SdpaShape& s);
// torch's row for an sdpa shape (torch_attention.py --mode `mode`), or a skipped row when its
// estimated memory `torch_bytes` exceeds --memory-fraction of MemAvailable; the note then
// reads "<who> needs ~X GiB<for_what>; MemAvailable is Y GiB".
Row torch_sdpa_row(const Context& ctx, const SdpaShape& s, const std::string& mode, double torch_bytes,
                   const std::string& who, const std::string& for_what);
// What the reference's row of a case would cost: its FLOPs (every score, in double) and the
// bytes it holds beside the case's io_bytes; avail is MemAvailable (0 when unknown).
struct ReferenceCost {
    double flop = 0.0, bytes = 0.0;
    std::int64_t io_bytes = 0;
    double avail = 0.0;
};
// The rows of a case's attn impls, rows[i] for cfg.impls[i], each named and counting `flop`.
// The reference runs first, so that the others can be compared with it; its row is skipped
// when its FLOPs exceed --reference-max-gflop or its bytes --memory-fraction of avail.
// time(impl, r) runs and times one impl into r; once the reference ran, compare(r) gives each
// other row that ran its max_abs_diff. *reference_ran (when given): whether it did.
std::vector<Row> impl_rows(const Config& cfg, double flop, const ReferenceCost& reference,
                           const std::function<void(Impl, Row&)>& time, const std::function<void(Row&)>& compare,
                           bool* reference_ran = nullptr);
// The score-modifier rows of s, appended to rows: after the first fast impl that ran (rows[i]
// is cfg.impls[i]'s), one row "<impl>+<modifier>" per s.modifier_rows with its ratio target;
// time(opt, r) times it with that impl's options, s.causal and the modifier set.
void add_modifier_rows(const Config& cfg, const SdpaShape& s, double flop, std::vector<Row>& rows,
                       const std::function<void(const SdpaOptions&, Row&)>& time);
// Parses "B,Hq,Hkv,Lq,Lk,D,causal" (D may be Dk:Dv; causal 0/1/none/top-left/bottom-right).
SdpaShape parse_custom_shape(const std::string& text);

// Decode steps S5 / S7 (decode_cases.cpp) and the MHA layer S6 (mha_cases.cpp).
BenchCase decode_case(const std::string& id);
BenchCase mha_s6_case();
// Serving (issue 18, serving_cases.cpp): V1 varlen vs padded prefill; P5/P7 paged vs contiguous decode.
std::vector<BenchCase> serving_cases();

// FLOP of an attention forward by the written formula: 2·B·Hq·Lq·Lk·(Dk + Dv)
// (= 4·B·H·Lq·Lk·D when Dk = Dv), halved when causal.
double sdpa_forward_flop(const SdpaShape& s);

// Runs bench/torch_attention.py with `args` (--mode and the sizes) plus the thread count,
// runs and time budget of the config; returns its row ("torch" unless `label` says).
Row run_torch(const Context& ctx, const std::map<std::string, std::string>& args, const std::string& label = "torch");
// Asks the configured Python for torch's version; empty and a reason when it has none.
std::string probe_torch(const Config& cfg, std::string& note);

// Derived numbers of every row: GFLOP/s from the median and min, % of the measured FMA peak
// on cfg.threads, GB/s and % of the measured read bandwidth, speed-up vs the torch row.
void finish_case(const Context& ctx, CaseResult& c);

}  // namespace attn::bench
