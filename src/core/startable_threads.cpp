#include "startable_threads.hpp"

#include <omp.h>
#include <pthread.h>

#include <atomic>
#include <cctype>
#include <cerrno>
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
// > 0: the largest team this thread's calls were found able to start; < 0: a check found fewer,
// and -t_team is this thread's largest team from now on. One variable: the steady path reads one.
thread_local int t_team = 1;
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

void* wait_at(void* gate_ptr) {
    Gate& gate = *static_cast<Gate*>(gate_ptr);
    std::unique_lock<std::mutex> lock(gate.mutex);
    gate.opened.wait(lock, [&] { return gate.open; });
    return nullptr;
}

// How many of `extra` threads (libgomp's stack size) can exist at once beside the process's
// current ones; each created is joined before this returns. *error: the first refusal's errno.
int creatable(int extra, int* error) {
    pthread_attr_t attr;
    if (pthread_attr_init(&attr) != 0) return extra;  // cannot check: leave it to libgomp, as before
    // A size pthreads refuses outright (below PTHREAD_STACK_MIN) keeps the default: what libgomp
    // makes of it is libgomp's to say.
    if (const std::size_t stack = openmp_stack_size(); stack != 0) (void)pthread_attr_setstacksize(&attr, stack);
    Gate gate;
    std::vector<pthread_t> made;
    made.reserve(static_cast<std::size_t>(extra));
    for (int i = 0; i < extra; ++i) {
        pthread_t t;
        if (const int rc = pthread_create(&t, &attr, wait_at, &gate); rc != 0) {
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
    return static_cast<int>(made.size());
}

[[gnu::noinline]] int check(int n) {
    int error = 0;
    const int team = 1 + creatable(n - 1, &error);  // the calling thread is one of the team
    t_team = team;
    if (team < n) {
        t_team = -team;
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

}  // namespace

void forget_startable_threads() noexcept { t_team = 1; }

int startable_threads(int n) {
    const int team = t_team;
    if (n <= team) return n;  // the steady path
    if (team < 0) return n < -team ? n : -team;
    // Where a region cannot be active (a kernel nested in another's task, as varlen's short
    // sequences are), libgomp creates no thread: nothing to check, and a check there would
    // count the enclosing team's threads against this one.
    if (omp_get_active_level() >= omp_get_max_active_levels()) return n;
    return check(n);
}

}  // namespace attn::detail
