#include "attn/threads.hpp"

#include <omp.h>
#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "attn/error.hpp"
#include "check.hpp"
#include "startable_threads.hpp"
#include "threads.hpp"

namespace attn {
namespace {

constexpr int kMaxThreads = 4096;

std::atomic<int> g_threads{0};      // set_num_threads; 0 = default
thread_local int t_override = 0;    // ScopedNumThreads on this thread; 0 = none

// fork(): libgomp's thread pool does not survive it, and a parallel region in the child of a
// process that had started one waits for ever (the child of a 2-thread call hung: an
// embedding test found it, Python multiprocessing's default start method included). A child
// forked after attn ran a call on more than one thread therefore runs every call on one.
std::atomic<bool> g_team_started{false};  // this process ran a call on more than one thread
std::atomic<bool> g_forked_child{false};  // and was forked after that: one thread from now on

void one_thread_in_the_child() {
    if (g_team_started.load(std::memory_order_relaxed)) g_forked_child.store(true, std::memory_order_relaxed);
    detail::forget_startable_threads();  // the parent's check and pool do not hold here
}

// Registered when the library is loaded, before any fork can matter (a lazy registration behind a
// function-local static's guard could leave a child forked mid-registration waiting on the guard).
// The handler reads and writes two lock-free atomics and the forking thread's own thread-local
// ints: safe in the child of a threaded process (a first touch of the thread-local block may
// allocate, and glibc's malloc works in a forked child).
[[maybe_unused]] const int g_atfork_registered = pthread_atfork(nullptr, nullptr, one_thread_in_the_child);

// ATTN_NUM_THREADS when it is an integer in 1..4096, else 0: the variable is ignored, as
// libgomp ignores a malformed OMP_NUM_THREADS, and said so once on stderr, as libgomp does
// ("ATTN_NUM_THREADS=two" silently ran on every CPU); the value quoted, control bytes escaped.
int env_threads() {
    static const int value = [] {
        const char* env = std::getenv("ATTN_NUM_THREADS");
        if (env == nullptr || *env == '\0') return 0;  // set empty: as if unset
        int n = 0;
        const char* end = env + std::strlen(env);
        const auto [p, ec] = std::from_chars(env, end, n);
        if (ec == std::errc() && p == end && n >= 1 && n <= kMaxThreads) return n;
        std::fprintf(stderr, "attn: warning: ignoring ATTN_NUM_THREADS=%s: expected an integer from 1 to %d\n",
                     detail::quoted(env).c_str(), kMaxThreads);
        return 0;
    }();
    return value;
}

void check_count(int n, const char* what) {
    if (n < 0 || n > kMaxThreads) {
        throw Error(std::string(what) + ": expected a thread count from 1 to " + std::to_string(kMaxThreads) +
                    " (0 = the default) but got " + std::to_string(n));
    }
}

}  // namespace

void set_num_threads(int n) {
    check_count(n, "set_num_threads");
    g_threads.store(n, std::memory_order_relaxed);
}

namespace {

int asked_threads() {
    if (t_override > 0) return t_override;
    if (const int g = g_threads.load(std::memory_order_relaxed); g > 0) return g;
    if (const int e = env_threads(); e > 0) return e;
    return omp_get_max_threads();
}

}  // namespace

// Every kernel's count comes from here or from ComputeThreads (which starts libgomp's pool on
// it): the one place that keeps a call from asking libgomp for threads the system will not
// create (startable_threads.hpp: libgomp would exit).
int num_threads() {
    if (g_forked_child.load(std::memory_order_relaxed)) return 1;
    return detail::startable_threads(asked_threads());
}

ScopedNumThreads::ScopedNumThreads(int n) : previous_(t_override) {
    check_count(n, "threads");
    if (n > 0) t_override = n;
}

ScopedNumThreads::~ScopedNumThreads() { t_override = previous_; }

namespace detail {

// omp_get_max_threads() is read before the count is changed, so num_threads()'s OpenMP
// default is the caller's own setting, and a nested scope (sdpa inside an MHA call) keeps it.
ComputeThreads::ComputeThreads() : previous_(omp_get_max_threads()) {
    int n = 1;
    if (!g_forked_child.load(std::memory_order_relaxed)) {
        const int asked = asked_threads();
        if (asked > 1) g_team_started.store(true, std::memory_order_relaxed);  // libgomp's pool may start now
        n = detail::start_team(asked);  // num_threads(), with libgomp's pool started on them
    }
    omp_set_num_threads(n);
}

ComputeThreads::~ComputeThreads() { omp_set_num_threads(previous_); }

namespace {

// The CPUs the process's main thread may run on, read once. omp_get_num_procs() counts the
// *calling* thread's affinity: a serving worker pinned to one core got another split, and other
// float32 sums, than an unpinned worker of the same process (an exploratory test found it). On
// Linux sched_getaffinity(getpid()) reads the thread whose id is the process id, the main
// thread, whichever thread asks.
int process_cpu_count() {
    for (int cpus = 1024; cpus <= (1 << 20); cpus *= 8) {
        cpu_set_t* set = CPU_ALLOC(cpus);
        if (set == nullptr) break;
        const std::size_t bytes = CPU_ALLOC_SIZE(cpus);
        const int rc = sched_getaffinity(getpid(), bytes, set);
        const int count = rc == 0 ? CPU_COUNT_S(bytes, set) : 0;
        CPU_FREE(set);
        if (rc == 0) return count > 0 ? count : 1;
        if (errno != EINVAL) break;  // EINVAL: the kernel's mask is larger than ours
    }
    return omp_get_num_procs();
}

}  // namespace

int split_cpu_count() {
    static const int count = process_cpu_count();
    return count;
}

std::int64_t split_target(std::int64_t floor) {
    const std::int64_t per_cpu = 4 * static_cast<std::int64_t>(split_cpu_count());
    return per_cpu > floor ? per_cpu : floor;
}

}  // namespace detail
}  // namespace attn
