#include "startable_threads.hpp"

#include <omp.h>
#include <pthread.h>
#include <sched.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

namespace attn::detail {
namespace {

// libgomp's thread pool belongs to the thread that starts a region (each calling thread has its
// own), so the check is per calling thread too.
// t_cap > 0: the largest team a check found this thread's calls able to start, from then on; 0: no
// check has found fewer than it asked for.
thread_local int t_cap = 0;
// The team attn's calls left this thread's libgomp pool at (1: no pool), or fewer: a call on
// fewer threads shrinks the pool to its team (start_team), and the pool only grows by start_team.
thread_local int t_pool = 1;
// The largest team a check passed for on this thread (the queries' answer; a call re-checks
// whatever it needs beyond t_pool, right before libgomp creates it).
thread_local int t_checked = 1;
std::atomic<bool> g_warned{false};

// The stack libgomp gives its threads: OMP_STACKSIZE, else GOMP_STACKSIZE, in the OpenMP
// specification's form — a positive integer, then optionally B, K, M or G (K when none), blanks
// around — so a size the system will not map fails the check as it would fail libgomp. 0: not
// set or not of that form (libgomp ignores it then), the system's default stack.
std::size_t stack_size_of(const char* text) {
    if (text == nullptr) return 0;
    while (std::isspace(static_cast<unsigned char>(*text))) ++text;
    if (!std::isdigit(static_cast<unsigned char>(*text))) return 0;
    errno = 0;
    char* end = nullptr;
    const unsigned long long value = std::strtoull(text, &end, 10);
    if (errno != 0 || value == 0) return 0;
    while (std::isspace(static_cast<unsigned char>(*end))) ++end;
    int shift = 10;
    switch (std::toupper(static_cast<unsigned char>(*end))) {
        case 'B': shift = 0, ++end; break;
        case 'K': shift = 10, ++end; break;
        case 'M': shift = 20, ++end; break;
        case 'G': shift = 30, ++end; break;
        default: break;
    }
    while (std::isspace(static_cast<unsigned char>(*end))) ++end;
    if (*end != '\0' || value > (~0ULL >> shift)) return 0;
    return static_cast<std::size_t>(value << shift);
}

std::size_t openmp_stack_size() {
    const std::size_t omp = stack_size_of(std::getenv("OMP_STACKSIZE"));
    return omp != 0 ? omp : stack_size_of(std::getenv("GOMP_STACKSIZE"));
}

// Probe threads wait here until every one the check could create exists: the team's threads
// live at the same time, so the check must hold as many at once.
struct Gate {
    std::mutex mutex;
    std::condition_variable opened;
    bool open = false;
};

struct Probe {
    Gate* gate;
    pid_t tid;  // the kernel's id of the probe thread (wait_released)
};

void* wait_at(void* probe_ptr) {
    Probe& probe = *static_cast<Probe*>(probe_ptr);
    probe.tid = gettid();
    std::unique_lock<std::mutex> lock(probe.gate->mutex);
    probe.gate->opened.wait(lock, [&] { return probe.gate->open; });
    return nullptr;
}

// pthread_join returns when the kernel has woken the joiner, on the thread's way out, and the
// thread still counts against RLIMIT_NPROC (and a cgroup's pids.max) for a moment after that: at
// a limit that left room for exactly three threads, three made again right after three were made
// and joined were refused 10 times in 20000 (a C program, Linux 6.18) — libgomp, making them
// then, would have ended the process. The kernel's id of a thread disappears from /proc once the
// kernel has let it go: waiting for that, none of 20000 was refused. Bounded (100 ms), in case
// /proc is another process's or a thread takes that long to go.
void wait_released(const std::vector<Probe>& probes) {
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::milliseconds(100);
    char path[64];
    for (const Probe& p : probes) {
        std::snprintf(path, sizeof path, "/proc/self/task/%d", static_cast<int>(p.tid));
        struct stat st;
        while (stat(path, &st) == 0 && std::chrono::steady_clock::now() < give_up) sched_yield();
    }
}

// How many of `extra` threads (libgomp's stack size) can exist at once beside the process's
// current ones; each created is joined, and released by the kernel, before this returns.
// *error: the first refusal's errno.
int creatable(int extra, int* error) {
    pthread_attr_t attr;
    if (pthread_attr_init(&attr) != 0) return extra;  // cannot check: leave it to libgomp, as before
    // A size pthreads refuses outright (below PTHREAD_STACK_MIN) keeps the default: what libgomp
    // makes of it is libgomp's to say.
    if (const std::size_t stack = openmp_stack_size(); stack != 0) (void)pthread_attr_setstacksize(&attr, stack);
    Gate gate;
    std::vector<Probe> probes(static_cast<std::size_t>(extra), Probe{&gate, 0});
    std::vector<pthread_t> made;
    made.reserve(static_cast<std::size_t>(extra));
    for (int i = 0; i < extra; ++i) {
        pthread_t t;
        if (const int rc = pthread_create(&t, &attr, wait_at, &probes[static_cast<std::size_t>(i)]); rc != 0) {
            *error = rc;
            break;
        }
        made.push_back(t);
    }
    pthread_attr_destroy(&attr);
    {
        const std::lock_guard<std::mutex> lock(gate.mutex);
        gate.open = true;
    }
    gate.opened.notify_all();
    for (pthread_t t : made) pthread_join(t, nullptr);
    probes.resize(made.size());
    wait_released(probes);
    return static_cast<int>(made.size());
}

// Creates (and joins) the threads a team of n needs beside this thread's pool; a team the
// system refuses becomes this thread's cap, said once per process.
[[gnu::noinline]] int check(int n) {
    int error = 0;
    const int team = t_pool + creatable(n - t_pool, &error);  // the pool's threads exist already
    if (team > t_checked) t_checked = team;
    if (team < n) {
        t_cap = team;
        if (!g_warned.exchange(true, std::memory_order_relaxed)) {
            std::fprintf(stderr,
                         "attn: warning: a call asked for %d threads but the system let it start only %d (creating a "
                         "thread: %s; a limit such as RLIMIT_NPROC or a cgroup's pids.max, or OMP_STACKSIZE): the "
                         "calling thread's calls compute on %d from now on (attn::num_threads() says so)\n",
                         n, team, std::strerror(error), team);
        }
    }
    return team;
}

// Where a region cannot be active (a kernel nested in another's task, as varlen's short
// sequences are), libgomp creates no thread: nothing to check, and a check there would count the
// enclosing team's threads against this one.
bool regions_nest() { return omp_get_active_level() >= omp_get_max_active_levels(); }

}  // namespace

void forget_startable_threads() noexcept {
    t_cap = 0;
    t_pool = 1;
    t_checked = 1;
}

int startable_threads(int n) {
    if (t_cap > 0 && n > t_cap) n = t_cap;
    if (n <= t_pool || n <= t_checked || regions_nest()) return n;  // the steady path
    return check(n);
}

int start_team(int n) {
    if (t_cap > 0 && n > t_cap) n = t_cap;
    if (n <= t_pool) {  // the steady path: the pool has the threads
        if (n > 1) t_pool = n;  // this call's regions of n end the pool's other threads
        return n;
    }
    if (regions_nest()) return n;
    const int team = check(n);
    // libgomp creates the pool's threads now, as soon after the check as it can (an empty region
    // would be compiled away: each thread counts itself).
    std::atomic<int> started{0};
#pragma omp parallel num_threads(team)
    started.fetch_add(1, std::memory_order_relaxed);
    t_pool = started.load(std::memory_order_relaxed);
    return team;
}

}  // namespace attn::detail
