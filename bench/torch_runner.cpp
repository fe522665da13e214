// The PyTorch baseline: bench/torch_attention.py in a subprocess (its own memory, its own
// threads), one JSON object on its last line of stdout.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "harness.hpp"

namespace attn::bench {
namespace {

std::string last_line(const std::string& text) {
    std::size_t end = text.find_last_not_of("\r\n");
    if (end == std::string::npos) return {};
    const std::size_t begin = text.rfind('\n', end);
    return text.substr(begin == std::string::npos ? 0 : begin + 1, end + 1 - (begin == std::string::npos ? 0 : begin + 1));
}

std::string first_lines(const std::string& path, std::size_t max_chars) {
    FILE* f = std::fopen(path.c_str(), "r");
    if (f == nullptr) return {};
    std::string s(max_chars, '\0');
    s.resize(std::fread(s.data(), 1, max_chars, f));
    std::fclose(f);
    while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
    for (char& ch : s)
        if (ch == '\n') ch = ' ';
    return s;
}

}  // namespace

std::string probe_torch(const Config& cfg, std::string& note) {
    std::string out;
    const int rc = run_command(shell_quote(cfg.python) + " -c 'import torch; print(torch.__version__)' 2>/dev/null", out);
    if (rc != 0) {
        if (run_command("command -v " + shell_quote(cfg.python) + " >/dev/null 2>&1", out) != 0) {
            note = cfg.python + " is not a Python interpreter this machine can run (--python)";
            return {};
        }
        note = "torch is not installed for " + cfg.python + " (Debian: python3-torch)";
        return {};
    }
    return last_line(out);
}

Row run_torch(const Context& ctx, const std::map<std::string, std::string>& args, const std::string& label) {
    Row row;
    row.impl = label;
    if (!ctx.cfg.torch) {
        row.status = "skipped";
        row.note = "--no-torch";
        return row;
    }
    if (ctx.torch_version.empty()) {
        row.status = "unavailable";
        row.note = ctx.torch_note;
        return row;
    }
    struct stat st{};
    if (stat(ctx.cfg.torch_script.c_str(), &st) != 0) {
        row.status = "error";
        row.note = "torch baseline script not found: " + ctx.cfg.torch_script + " (set --torch-script)";
        return row;
    }
    char err_path[] = "/tmp/attn-bench-torch-XXXXXX";
    const int fd = mkstemp(err_path);
    if (fd >= 0) close(fd);
    std::string cmd = "OMP_NUM_THREADS=" + std::to_string(ctx.cfg.threads) + " " + shell_quote(ctx.cfg.python) + " " +
                      shell_quote(ctx.cfg.torch_script);
    for (const auto& [k, v] : args) cmd += " --" + k + " " + shell_quote(v);
    cmd += " --threads " + std::to_string(ctx.cfg.threads) + " --runs " + std::to_string(ctx.cfg.runs) +
           " --max-seconds " + std::to_string(ctx.cfg.max_seconds);
    cmd += fd >= 0 ? std::string(" 2>") + err_path : std::string(" 2>/dev/null");
    std::string out;
    const int rc = run_command(cmd, out);
    const std::string err = fd >= 0 ? first_lines(err_path, 600) : std::string();
    if (fd >= 0) std::remove(err_path);
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(last_line(out));
    } catch (const std::exception&) {
        row.status = "error";
        row.note = "torch baseline failed (exit " + std::to_string(rc) + ")" + (err.empty() ? "" : ": " + err);
        return row;
    }
    row.status = j.value("status", "error");
    row.note = j.value("note", "");
    row.kernel = j.value("what", "");
    if (row.status != "ok") return row;
    row.timing = timing_from_samples(j.at("samples").get<std::vector<double>>(), j.value("warmup_s", 0.0));
    row.timing.warmup_counted = j.value("warmup_counted", false);
    row.timing.cpu_share = j.value("cpu_share", 0.0);
    if (row.timing.warmup_counted) row.note = "one call: the warm-up alone exceeded --max-seconds";
    row.peak_rss = j.value("peak_rss", std::int64_t{-1});
    row.baseline_rss = j.value("baseline_rss", std::int64_t{-1});
    row.peak_rss_reset = j.value("peak_rss_reset", false);
    return row;
}

}  // namespace attn::bench
