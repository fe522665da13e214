// attn bench [--shapes S1,S2,...|all] [--impl flash,reference] [--runs N] [--threads N]
//            [--json FILE] [--torch|--no-torch] [--quick]
// Measures the machine's FMA peak and read bandwidth, then every selected shape id of
// bench/shapes.md on attn's kernels and on PyTorch's hand-written attention, in
// the same run; prints a table and, with --json, writes the same data for tools.
#include <omp.h>
#include <sched.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <memory>
#include <set>
#include <string>
#include <system_error>

#include "attn/error.hpp"
#include "attn/threads.hpp"
#include "command_path.hpp"
#include "commands.hpp"
#include "core/check.hpp"
#include "core/cpu_features.hpp"
#include "harness.hpp"
#include "number_text.hpp"
#include "output_files.hpp"
#include "report.hpp"
#include "strict_options.hpp"
#include "threads_option.hpp"

namespace attn::cli {
namespace {

// The PyTorch baseline's default: an installed attn's own copy (`cmake --install` puts it at
// ATTN_BENCH_TORCH_SCRIPT_FROM_BIN from the attn binary's directory), else — attn run from its
// build tree — the source tree's. With the source path alone, an installed attn lost its
// baseline with the source tree ("torch baseline script not found").
std::string default_torch_script() {
    std::error_code ec;
    const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
    if (!ec) {
        const std::filesystem::path installed = (exe.parent_path() / ATTN_BENCH_TORCH_SCRIPT_FROM_BIN).lexically_normal();
        if (std::filesystem::is_regular_file(installed, ec)) return installed.string();
    }
    return ATTN_BENCH_TORCH_SCRIPT;
}

struct BenchArgs {
    std::string shapes = "all";
    std::string impls = "flash,reference";
    std::int64_t runs = 5;  // int64: the CLI's strict integer rule (strict_options.hpp)
    std::int64_t threads = 0;
    std::string json;
    bool torch = true, quick = false, list = false, scaling = false;
    double max_seconds = 15.0;
    double reference_max_gflop = 10.0;
    std::string torch_script = default_torch_script(), python = ATTN_BENCH_PYTHON;
    std::string custom;
};

// --scaling: the case again on 1 thread (attn's kernels only: no torch, no reference), for the
// rows whose calls did not already alternate with 1-thread ones (time_calls_into: the decode
// steps, timed by their own loop); each such row's 1-thread median kept on the matching row of
// the n-thread run (same case id, variant and impl); finish_case turns it into the efficiency.
// The thread setting is restored after.
void time_on_one_thread(const bench::Context& ctx, const bench::BenchCase& bc, std::vector<bench::CaseResult>& results) {
    bool any_unpaired = false;
    for (const bench::CaseResult& c : results)
        for (const bench::Row& r : c.rows)
            any_unpaired = any_unpaired || (r.status == "ok" && r.impl != "torch" && r.impl != "reference" && !r.one_thread_median_s);
    if (!any_unpaired) return;
    bench::Config one = ctx.cfg;
    one.threads = 1;
    one.torch = false;
    one.impls.erase(std::remove(one.impls.begin(), one.impls.end(), Impl::reference), one.impls.end());
    if (one.impls.empty()) return;
    std::fprintf(stderr, "attn bench: %s again on 1 thread (--scaling)\n", bc.id.c_str());
    const bench::Context ctx1{one, ctx.machine, ctx.ceilings, ctx.torch_version, ctx.torch_note};
    std::vector<bench::CaseResult> single;
    omp_set_num_threads(1);
    attn::set_num_threads(1);
    try {
        bc.run(ctx1, single);
    } catch (...) {
        omp_set_num_threads(ctx.cfg.threads);
        attn::set_num_threads(ctx.cfg.threads);
        throw;
    }
    omp_set_num_threads(ctx.cfg.threads);
    attn::set_num_threads(ctx.cfg.threads);
    for (bench::CaseResult& c : results)
        for (const bench::CaseResult& c1 : single) {
            if (c1.id != c.id || c1.variant != c.variant) continue;
            for (bench::Row& r : c.rows)
                for (const bench::Row& r1 : c1.rows)
                    if (r1.impl == r.impl && r1.status == "ok" && r.status == "ok" && r1.timing.median_s > 0.0 && !r.one_thread_paired)
                        r.one_thread_median_s = r1.timing.median_s;
        }
}

// --json: written as every output is (staged, renamed into place), and a failure names the option
// (the path was checked before measuring, but a full disk shows only when the file is written).
void write_json(const OutputFiles& outputs, const std::string& path, const nlohmann::json& j) {
    outputs.write_bytes("--json", path, j.dump(2) + "\n");
}

// "S1, S2" → {"S1", "S2"} (spaces dropped); an empty item ("S1,", ",S1", "S1,,S2") is an error
// naming the option, as an empty value is for every option.
std::vector<std::string> split(const std::string& flag, const std::string& s) {
    std::vector<std::string> out;
    std::string cur;
    for (char c : s + ",") {
        if (c == ',') {
            if (cur.empty()) throw Error(flag + ": item " + std::to_string(out.size() + 1) + " of " + detail::quoted(s) + " is empty");
            out.push_back(cur);
            cur.clear();
        } else if (c != ' ') {
            cur += c;
        }
    }
    return out;
}

void run(const BenchArgs& a, bool shapes_given, bool runs_given, bool max_seconds_given) {
    OutputFiles outputs;  // --json: checked now, not after minutes of measuring
    if (a.json.size()) {
        outputs.add("--json", a.json);
        // The torch rows read these two: --json naming either replaced it (the script, or the
        // interpreter when run as root) with the results. A bare --python name is the file PATH
        // gives the shell, not one of that name in the current directory.
        if (a.torch) {
            outputs.add_input("--torch-script", a.torch_script);
            outputs.add_input("--python", command_path(a.python));
        }
        outputs.check();
    }
    bench::Report rep;
    bench::Config& cfg = rep.cfg;
    // 0: the library's own count (ATTN_NUM_THREADS when it is 1..4096, else OMP_NUM_THREADS, else
    // every CPU; attn/threads.hpp), so the bench runs what a call would.
    const int threads = thread_count(a.threads);
    cfg.threads = threads > 0 ? threads : attn::num_threads();
    if (a.runs < 1 || a.runs > std::numeric_limits<int>::max()) {
        throw Error("--runs: expected 1 to " + std::to_string(std::numeric_limits<int>::max()) + " but got " + given_number("--runs", a.runs));
    }
    if (!(a.max_seconds > 0))
        throw Error("--max-seconds: expected a positive number of seconds but got " + given_number("--max-seconds", a.max_seconds));
    cfg.quick = a.quick;
    cfg.runs = a.quick && !runs_given ? 2 : static_cast<int>(a.runs);
    cfg.max_seconds = a.quick && !max_seconds_given ? 2.0 : a.max_seconds;
    cfg.torch = a.torch;
    cfg.python = a.python;
    cfg.torch_script = a.torch_script;
    cfg.reference_max_gflop = a.reference_max_gflop;
    cfg.scaling = a.scaling;
    for (const std::string& name : split("--impl", a.impls)) {
        const Impl i = with_flag("--impl", [&] { return parse_impl(name); });
        if (std::find(cfg.impls.begin(), cfg.impls.end(), i) == cfg.impls.end()) cfg.impls.push_back(i);
    }
    if (cfg.impls.empty()) throw Error("--impl: expected a list such as flash,reference but got " + detail::quoted(a.impls));

    // Which registry entries run: --shapes (ids, or all), and the custom shape when given.
    const std::vector<bench::BenchCase> registry = bench::all_cases();
    std::vector<bench::BenchCase> selected;
    const bool only_custom = !a.custom.empty() && !shapes_given;
    if (!only_custom) {
        const std::vector<std::string> ids = split("--shapes", a.shapes);
        const bool all = ids.size() == 1 && ids[0] == "all";
        if (!all && std::find(ids.begin(), ids.end(), "all") != ids.end())
            throw Error("--shapes: 'all' stands alone (it names every shape) but got " + detail::quoted(a.shapes));
        std::set<std::string> known;
        for (const auto& c : registry) known.insert(c.id);
        for (const std::string& id : ids) {
            if (!all && !known.count(id)) {
                std::string list;
                for (const auto& k : known) list += (list.empty() ? "" : ", ") + k;
                throw Error("--shapes: unknown shape id " + detail::quoted(id) + "; known: " + list + " (or all)");
            }
        }
        for (const auto& c : registry) {
            const bool named = std::find(ids.begin(), ids.end(), c.id) != ids.end();
            if (named || (all && !(a.quick && c.slow))) selected.push_back(c);
            else if (all) std::fprintf(stderr, "bench: --quick leaves out %s (%s: minutes per call; --shapes %s runs it)\n",
                                       c.id.c_str(), c.what.c_str(), c.id.c_str());
        }
    }
    if (!a.custom.empty()) selected.push_back(bench::sdpa_forward_case(bench::parse_custom_shape(a.custom)));
    if (a.list) {
        nlohmann::json list = nlohmann::json::array();
        int variant_width = 0;  // the widest variant ("Q/out bfloat16, K/V bfloat16"), for the columns
        for (const auto& c : registry) variant_width = std::max(variant_width, static_cast<int>(c.variant.size()));
        for (const auto& c : registry) {
            std::printf("%-4s %-*s %-32s %s\n", c.id.c_str(), variant_width, c.variant.c_str(), c.what.c_str(),
                        c.run ? c.shape.c_str() : c.unavailable.c_str());
            // "selected": whether this command line (--shapes, --quick) would run it.
            const bool chosen = std::any_of(selected.begin(), selected.end(), [&](const bench::BenchCase& x) {
                return x.id == c.id && x.variant == c.variant;
            });
            list.push_back({{"id", c.id}, {"variant", c.variant}, {"what", c.what}, {"shape", c.shape},
                            {"available", static_cast<bool>(c.run)}, {"selected", chosen}, {"note", c.unavailable}});
        }
        if (!a.json.empty()) write_json(outputs, a.json, {{"schema", "attn-bench-list/1"}, {"cases", list}});
        return;
    }

    omp_set_num_threads(cfg.threads);
    attn::set_num_threads(cfg.threads);  // the library's own setting (it would otherwise follow ATTN_NUM_THREADS)
    rep.machine = bench::describe_machine();
    // Said before the minutes of a run, not found in its numbers afterwards.
    if (cfg.scaling && cfg.threads == 1)
        std::fprintf(stderr, "bench: --scaling compares the run's threads with 1 thread; on 1 thread there is nothing to "
                             "compare (no efficiency column; give --threads 2 or more)\n");
    if (cpu_set_t set; sched_getaffinity(0, sizeof set, &set) == 0 && cfg.threads > CPU_COUNT(&set))
        std::fprintf(stderr, "bench: %d threads on the %d CPUs this process may use: threads take turns, so cpu%% reads "
                             "below 100%% and the peaks' \"est. with the CPUs alone\" is no machine's peak\n",
                     cfg.threads, CPU_COUNT(&set));
    rep.command = bench::command_line();
    if (cfg.torch) rep.torch_version = bench::probe_torch(cfg, rep.torch_note);
    else rep.torch_note = "off (--no-torch)";

    // The ceilings, measured in this run: before the shapes and again after them, each the
    // best of its trials (a shared machine may be busy during one of the two). A quick run
    // only checks the machinery: its buffer fits in the caches, so its "bandwidth" is not a
    // memory number. Progress goes to stderr; the report to stdout at the end, when every
    // percentage can use the final ceilings.
    const double peak_s = a.quick ? 0.02 : 0.25;
    const int repeats = a.quick ? 2 : 5;
    std::size_t bw_bytes = a.quick ? (64u << 20) : (1u << 30);
    const std::int64_t avail = bench::mem_available();
    while (avail > 0 && static_cast<std::int64_t>(bw_bytes) > avail / 4 && bw_bytes > (64u << 20)) bw_bytes /= 2;
    auto measure = [&](bench::Ceilings& ce) {
        ce.fma_1t = bench::measure_fma_peak(1, peak_s, repeats);
        ce.fma_nt = cfg.threads == 1 ? ce.fma_1t : bench::measure_fma_peak(cfg.threads, peak_s, repeats);
        const auto w512 = bench::FmaWidth::avx512;
        ce.fma512_1t = bench::measure_fma_peak(1, peak_s, repeats, w512);
        ce.fma512_nt = cfg.threads == 1 ? ce.fma512_1t : bench::measure_fma_peak(cfg.threads, peak_s, repeats, w512);
        const auto wbf16 = bench::FmaWidth::avx512_bf16;
        ce.bf16_1t = bench::measure_fma_peak(1, peak_s, repeats, wbf16);
        ce.bf16_nt = cfg.threads == 1 ? ce.bf16_1t : bench::measure_fma_peak(cfg.threads, peak_s, repeats, wbf16);
        const auto wamx = bench::FmaWidth::amx_bf16;
        ce.amx_1t = bench::measure_fma_peak(1, peak_s, repeats, wamx);
        ce.amx_nt = cfg.threads == 1 ? ce.amx_1t : bench::measure_fma_peak(cfg.threads, peak_s, repeats, wamx);
        ce.bw_1t = bench::measure_read_bandwidth(1, bw_bytes, repeats);
        ce.bw_nt = cfg.threads == 1 ? ce.bw_1t : bench::measure_read_bandwidth(cfg.threads, bw_bytes, repeats);
    };
    // A misspelt ATTN_ISA / ATTN_CPU_HIDE is refused now, not after a minute of peaks at the first shape.
    (void)attn::detail::select_isa();
    std::fprintf(stderr, "attn bench: measuring the FMA peak and the read bandwidth\n");
    bench::Ceilings& ce = rep.ceilings;
    measure(ce);
    const bench::Context ctx{cfg, rep.machine, rep.ceilings, rep.torch_version, rep.torch_note};
    for (const bench::BenchCase& bc : selected) {
        std::fprintf(stderr, "attn bench: %s%s %s\n", bc.id.c_str(), bc.variant.empty() ? "" : (" (" + bc.variant + ")").c_str(),
                     bc.run ? bc.shape.c_str() : "(not built)");
        std::vector<bench::CaseResult> results;
        if (!bc.run) {
            bench::CaseResult c;
            c.id = bc.id;
            c.variant = bc.variant;
            c.what = bc.what;
            c.shape = bc.shape;
            c.status = "unavailable";
            c.note = bc.unavailable;
            results.push_back(std::move(c));
        } else {
            bc.run(ctx, results);
            if (cfg.scaling && cfg.threads > 1) time_on_one_thread(ctx, bc, results);
        }
        for (bench::CaseResult& c : results) {
            if (c.variant.empty()) c.variant = bc.variant;
            rep.cases.push_back(std::move(c));
        }
    }
    std::fprintf(stderr, "attn bench: measuring the FMA peak and the read bandwidth again\n");
    bench::Ceilings after;
    measure(after);
    // Each pair as measure() fills it: on 1 thread the run's ceiling is the 1-thread one. (A
    // ceiling not measured, AVX-512 on an AVX2 CPU, stays as it was: merge keeps it.)
    const auto merge_pair = [&](bench::Ceiling& one, bench::Ceiling& run, const bench::Ceiling& one_after,
                                const bench::Ceiling& run_after) {
        one = bench::merge(one, one_after, "measured before and after the shapes");
        run = cfg.threads == 1 ? one : bench::merge(run, run_after, "measured before and after the shapes");
    };
    merge_pair(ce.fma_1t, ce.fma_nt, after.fma_1t, after.fma_nt);
    merge_pair(ce.fma512_1t, ce.fma512_nt, after.fma512_1t, after.fma512_nt);
    merge_pair(ce.bf16_1t, ce.bf16_nt, after.bf16_1t, after.bf16_nt);
    merge_pair(ce.amx_1t, ce.amx_nt, after.amx_1t, after.amx_nt);
    merge_pair(ce.bw_1t, ce.bw_nt, after.bw_1t, after.bw_nt);
    if (a.quick) ce.bw_1t.note = ce.bw_nt.note = "quick: a cache-sized buffer, not a memory bandwidth";
    rep.loadavg_end = bench::load_average();

    bench::print_header(rep);
    bench::print_ceilings(rep);
    for (bench::CaseResult& c : rep.cases) {
        bench::finish_case(ctx, c);
        bench::print_case(ctx, c);
    }
    if (!a.json.empty()) {
        write_json(outputs, a.json, bench::to_json(rep));
        std::printf("wrote %s\n", a.json.c_str());
    }
}

}  // namespace

void add_bench_command(CLI::App& app) {
    auto args = std::make_shared<BenchArgs>();
    CLI::App* cmd = app.add_subcommand(
        "bench", "Benchmark attn on the shapes of bench/shapes.md beside the reference and PyTorch, in the same run");
    auto* shapes = cmd->add_option("--shapes", args->shapes, "shape ids, comma-separated (S1,S2,...) or all")
                       ->capture_default_str();
    cmd->add_option("--impl", args->impls, "attn kernels to time, comma-separated: auto, reference, flash, decode (decode takes Lq <= 16 only; "
                   "a row it declines says why)")->capture_default_str();
    auto* runs = cmd->add_option("--runs", args->runs, "timed calls per (shape, impl) after one warm-up")->capture_default_str();
    cmd->add_option("--threads", args->threads, "threads (0 or not given: ATTN_NUM_THREADS, else OMP_NUM_THREADS, else all CPUs)");
    cmd->add_option("--json", args->json, "also write the results as JSON to this file");
    // Two flags rather than CLI11's "--torch,!--no-torch", whose help reads "--no-torch{false}" as
    // if torch were off by default.
    auto* torch_on = cmd->add_flag("--torch", args->torch, "run PyTorch's hand-written attention beside attn (the default)");
    cmd->add_flag_callback("--no-torch", [args] { args->torch = false; }, "do not run PyTorch beside attn")
        ->excludes(torch_on);
    cmd->add_flag("--scaling", args->scaling,
                  "time every attn row on 1 thread too and report the parallel efficiency T1 / (threads x T) beside it: "
                  "1-thread calls alternate with the row's own (the decode steps: a 1-thread pass after the case) "
                  "(about doubles the run time; torch and the reference are not repeated)");
    cmd->add_flag("--quick", args->quick,
                  "smoke test: 2 runs, short peak loops, a small bandwidth buffer, and without the slow shapes (S8) "
                  "unless --shapes names them");
    auto* maxs = cmd->add_option("--max-seconds", args->max_seconds, "stop timing a (shape, impl) after this many seconds of timed calls")
                     ->capture_default_str();
    cmd->add_option("--reference-max-gflop", args->reference_max_gflop,
                    "run the reference only where it computes at most this many GFLOP (>= 0; 0: never)")
        ->capture_default_str()
        ->check(CLI::Validator(
            [](std::string& text) {
                const double gflop = std::strtod(text.c_str(), nullptr);  // the canonical text: strict_options.hpp
                return gflop >= 0.0 ? std::string()
                                    : "must be >= 0 (0: never) but got " + given_number("--reference-max-gflop", gflop);
            },
            ""));  // described in the help text (a name here printed as "FLOAT:GFLOP >= 0=10")
    cmd->add_option("--torch-script", args->torch_script, "the PyTorch baseline script")->capture_default_str();
    cmd->add_option("--python", args->python, "Python with torch for the baseline")->capture_default_str();
    cmd->add_flag("--list", args->list, "list the shape ids this build knows (and which are not built) and exit; with --json, also as JSON");
    // One custom sdpa-forward shape (the tests' small one; runs alone unless --shapes is given too).
    // Listed in --help: hidden, its errors named no option ("attn: error: : an empty value").
    cmd->add_option("--shape-custom", args->custom,
                    "one more shape, B,Hq,Hkv,Lq,Lk,D,causal (D may be Dk:Dv; causal 0/1/none/top-left/bottom-right), "
                    "e.g. 1,16,16,2048,2048,64,1; alone unless --shapes is given too");
    cmd->callback([args, shapes, runs, maxs] { run(*args, shapes->count() > 0, runs->count() > 0, maxs->count() > 0); });
}

}  // namespace attn::cli
