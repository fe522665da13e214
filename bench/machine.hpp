// What the benchmark states about where and how it ran (machine, build, commit, date,
// command), and the process-memory probes it reports peak memory with.
#pragma once

#include <cstdint>
#include <string>

namespace attn::bench {

struct MachineInfo {
    std::string cpu_model;        // /proc/cpuinfo "model name"
    int logical_cpus = 0;         // processors the OS shows
    int physical_cores = 0;       // distinct (physical id, core id) pairs; 0 if unknown
    std::string isa;              // the relevant CPU features present, e.g. "avx2 fma f16c avx512f"
    std::int64_t mem_total = 0;   // bytes (/proc/meminfo)
    std::string compiler;         // e.g. "GNU 12.2.0"
    std::string build_type;       // CMAKE_BUILD_TYPE
    std::string cxx_flags;        // the flags of the build type (library and CLI)
    std::string isa_flags;        // flags of the ISA-specific files only
    bool sanitized = false;       // an ASan/UBSan build: timings mean nothing
    std::string commit;           // git describe at build time, or "unknown"
    std::string attn_version;
    std::string date_utc;         // ISO 8601, when the run started
    std::string hostname;
    std::string loadavg_start;    // /proc/loadavg (1, 5, 15 min): other work on the machine
};

// The 1, 5 and 15 minute load averages, e.g. "0.12 0.30 0.25".
std::string load_average();

MachineInfo describe_machine();

// The command line of this process, shell-quoted (from /proc/self/cmdline).
std::string command_line();

// Memory of this process, in bytes, from /proc/self/status (-1 when unreadable).
std::int64_t current_rss();
std::int64_t peak_rss();  // VmHWM: high-water mark of the resident set
// Resets VmHWM to the current RSS (Linux ≥ 4.0: "5" to /proc/self/clear_refs), so the next
// peak_rss() is the high-water mark of what runs in between. False when not permitted.
bool reset_peak_rss();
// CPU time (user + system, all threads) this process has used so far, in seconds. Compared
// with wall time x threads it says what share of its CPUs the run got on a shared machine.
double process_cpu_seconds();
// cpu_seconds / (wall_seconds x threads): the share of its CPUs a timed stretch got, 0 to 1 (0
// also when wall_seconds <= 0). A busy stretch measures a little above 1 (1.01-1.03 in quick
// runs): getrusage counts another running thread's time up to its last scheduler tick (1-4 ms),
// and the CPU readings bracket the wall clock's with the call and thread wake-ups around it.
// More than every CPU cannot be had, so that is 1 — clamped here, where every share (the rows'
// and the peaks' trials) is made, rather than by each reader.
double cpu_share(double cpu_seconds, double wall_seconds, int threads);
// Steal time of the whole machine so far, in CPU-seconds summed over its CPUs: the time a VM's
// host ran something else while a vCPU wanted to run (/proc/stat's "cpu" line, 8th value).
// A process cannot see it in its own CPU time — a stolen vCPU still counts as running — so a
// row can show 100 % CPU share and twice its time. -1 when the kernel does not report it.
double machine_steal_seconds();
// The steal field (CPU ticks) of /proc/stat's first line, e.g. "cpu  4535265 3111 567868
// 3796491 37310 0 1681 23325 0 0" → 23325; -1 when the line has fewer than 8 values.
std::int64_t steal_ticks_of(const std::string& proc_stat_cpu_line);

// MemAvailable from /proc/meminfo, in bytes (-1 when unreadable).
std::int64_t mem_available();

// Runs a shell command (/bin/sh); returns its exit status and stdout. stderr is not
// captured: redirect it in the command.
int run_command(const std::string& command, std::string& out);

// Quotes a word for /bin/sh.
std::string shell_quote(const std::string& word);

}  // namespace attn::bench
