#include "machine.hpp"

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <set>
#include <sstream>
#include <utility>

#include "attn/version.hpp"
#include "build_config.hpp"
#include "git_describe.hpp"

namespace attn::bench {
namespace {

// Value of "key<sep>value" lines (e.g. "VmHWM:   1234 kB"), first match, trimmed.
std::string field(const std::string& path, const std::string& key, char sep) {
    std::ifstream in(path);
    std::string line;
    while (std::getline(in, line)) {
        const auto colon = line.find(sep);
        if (colon == std::string::npos) continue;
        std::string k = line.substr(0, colon);
        while (!k.empty() && (k.back() == ' ' || k.back() == '\t')) k.pop_back();
        if (k != key) continue;
        std::string v = line.substr(colon + 1);
        const auto b = v.find_first_not_of(" \t");
        return b == std::string::npos ? std::string() : v.substr(b);
    }
    return {};
}

std::int64_t kib_field(const std::string& path, const std::string& key) {
    const std::string v = field(path, key, ':');
    if (v.empty()) return -1;
    try {
        return std::stoll(v) * 1024;
    } catch (...) {
        return -1;
    }
}

}  // namespace

MachineInfo describe_machine() {
    MachineInfo m;
    m.cpu_model = field("/proc/cpuinfo", "model name", ':');
    if (m.cpu_model.empty()) m.cpu_model = "unknown CPU";
    {
        std::ifstream in("/proc/cpuinfo");
        std::string line, phys = "0";
        std::set<std::pair<std::string, std::string>> cores;
        std::string flags;
        while (std::getline(in, line)) {
            const auto colon = line.find(':');
            if (colon == std::string::npos) continue;
            std::string k = line.substr(0, colon);
            while (!k.empty() && (k.back() == ' ' || k.back() == '\t')) k.pop_back();
            const std::string v = colon + 2 <= line.size() ? line.substr(colon + 2) : std::string();
            if (k == "processor") ++m.logical_cpus;
            else if (k == "physical id") phys = v;
            else if (k == "core id") cores.emplace(phys, v);
            else if (k == "flags" && flags.empty()) flags = " " + v + " ";
        }
        m.physical_cores = static_cast<int>(cores.size());
        for (const char* f : {"sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512_bf16", "amx_bf16"})
            if (flags.find(std::string(" ") + f + " ") != std::string::npos) {
                if (!m.isa.empty()) m.isa += ' ';
                m.isa += f;
            }
    }
    if (m.logical_cpus == 0) m.logical_cpus = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
    m.mem_total = kib_field("/proc/meminfo", "MemTotal");
    m.compiler = ATTN_BENCH_COMPILER;
    m.build_type = ATTN_BENCH_BUILD_TYPE;
    m.cxx_flags = ATTN_BENCH_CXX_FLAGS;
    m.isa_flags = ATTN_BENCH_ISA_FLAGS;
    const std::string san = ATTN_BENCH_SANITIZE_STR;
    m.sanitized = san == "ON" || san == "1" || san == "TRUE" || san == "YES" || san == "on";
    m.commit = ATTN_BENCH_GIT_DESCRIBE;
    m.attn_version = kVersion;
    char buf[64];
    const std::time_t now = std::time(nullptr);
    std::tm tm{};
    gmtime_r(&now, &tm);
    std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
    m.date_utc = buf;
    char host[256] = {};
    if (gethostname(host, sizeof host - 1) == 0) m.hostname = host;
    m.loadavg_start = load_average();
    return m;
}

std::string load_average() {
    std::ifstream in("/proc/loadavg");
    std::string a, b, c;
    if (!(in >> a >> b >> c)) return "?";
    return a + " " + b + " " + c;
}

std::string shell_quote(const std::string& word) {
    if (!word.empty() && word.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./=,:+@%") ==
                             std::string::npos)
        return word;
    std::string q = "'";
    for (char c : word) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return q + "'";
}

std::string command_line() {
    std::ifstream in("/proc/self/cmdline", std::ios::binary);
    std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::string out, word;
    std::size_t i = 0;
    for (char c : all) {
        if (c != '\0') {
            word += c;
            continue;
        }
        // argv[0] as its last path component: the report should not depend on the build dir.
        if (i++ == 0) {
            const auto slash = word.rfind('/');
            if (slash != std::string::npos) word = word.substr(slash + 1);
        }
        if (!out.empty()) out += ' ';
        out += shell_quote(word);
        word.clear();
    }
    return out.empty() ? std::string("attn bench") : out;
}

std::int64_t current_rss() { return kib_field("/proc/self/status", "VmRSS"); }
std::int64_t peak_rss() { return kib_field("/proc/self/status", "VmHWM"); }

bool reset_peak_rss() {
    std::ofstream f("/proc/self/clear_refs");
    if (!f) return false;
    f << "5";
    f.flush();
    return static_cast<bool>(f);
}

double process_cpu_seconds() {
    rusage u{};
    getrusage(RUSAGE_SELF, &u);
    return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
           1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

double cpu_share(double cpu_seconds, double wall_seconds, int threads) {
    if (!(wall_seconds > 0.0) || threads < 1) return 0.0;
    return std::clamp(cpu_seconds / (wall_seconds * threads), 0.0, 1.0);
}

std::int64_t steal_ticks_of(const std::string& line) {
    std::istringstream in(line);
    std::string label;
    if (!(in >> label) || label != "cpu") return -1;
    std::int64_t v = -1;
    for (int field = 1; field <= 8; ++field)  // user nice system idle iowait irq softirq steal
        if (!(in >> v)) return -1;
    return v;
}

double machine_steal_seconds() {
    std::ifstream in("/proc/stat");
    std::string line;
    if (!std::getline(in, line)) return -1.0;
    const std::int64_t ticks = steal_ticks_of(line);
    const long hz = sysconf(_SC_CLK_TCK);
    return ticks < 0 || hz <= 0 ? -1.0 : static_cast<double>(ticks) / static_cast<double>(hz);
}

std::int64_t mem_available() { return kib_field("/proc/meminfo", "MemAvailable"); }

int run_command(const std::string& command, std::string& out) {
    out.clear();
    FILE* pipe = popen(command.c_str(), "r");
    if (pipe == nullptr) return -1;
    char buf[4096];
    std::size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, pipe)) > 0) out.append(buf, n);
    const int status = pclose(pipe);
    if (status == -1) return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

}  // namespace attn::bench
