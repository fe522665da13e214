// A call whose threads the system will not create (src/core/startable_threads.hpp): libgomp
// printed "libgomp: Thread creation failed: …" and called exit(1), ending the caller's process.
// attn checks ahead and computes on the threads it could create, with the right result.
//
//   thread_limit_check nproc   runs itself as `child` under RLIMIT_NPROC = 1 (as user nobody when
//                              run as root, whom the limit does not bind): no thread can be created
//   thread_limit_check stack   runs itself as `child` with OMP_STACKSIZE=4G and an address space
//                              limit (RLIMIT_AS) that leaves 1 GiB: no thread's stack can be mapped
//   thread_limit_check fork    runs itself as `forked` (as user nobody when run as root), which
//                              has attn check 4 threads with no limit (attn::num_threads()), then
//                              forks a process that lowers RLIMIT_NPROC to 1 and does what `child`
//                              does: the parent's check must not stand for the forked child's
//   thread_limit_check child   asks for 4 threads: the sdpa forward and backward complete on 1,
//                              forward equal to an independent naive attention, and
//                              attn::num_threads() says 1
//   thread_limit_check regrow_count   runs itself as `shrunk_by_count` (as user nobody when run as
//                              root): a call on 4 threads, one on 2 (libgomp ends two of its
//                              pool's threads), RLIMIT_NPROC = 1, then `child`'s calls on 4: attn
//                              checks the two again, the system refuses them, they run on 2
//   thread_limit_check regrow_kernel  runs itself as `shrunk_by_kernel` (the same): a call on 4
//                              threads, a call on 4 whose loop has 2 items (the reference kernel
//                              over 2 heads: its loop asked libgomp for a team of 2, which ended
//                              two of the pool's threads), RLIMIT_NPROC = 1, then `child`'s calls
//                              on 4: the pool kept its threads, they run on 4, with no warning
// Each parent reads its child's stderr: the attn warning expected (one, or none), and libgomp's
// message nowhere (when attn checked only a thread's first team, libgomp ended both regrow
// children's process).
#include <fcntl.h>
#include <grp.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>

#include "attn/attn.hpp"
#include "common/address_space.hpp"
#include "common/util.hpp"
#include "unit/naive_attention.hpp"

namespace {

constexpr int kSkip = 77;  // ctest's SKIP_RETURN_CODE
constexpr uid_t kNobody = 65534;

// The sdpa forward and backward on 4 threads asked for, which must run on `expected` (what
// attn::num_threads() says after them), the forward equal to an independent naive attention.
int sdpa_against_naive(int expected) {
    using namespace attn;
    attn::set_num_threads(4);
    std::mt19937 rng(11);
    const Shape s{1, 4, 96, 32};
    const Tensor q = test::randn(DType::f32, s, rng), k = test::randn(DType::f32, s, rng),
                 v = test::randn(DType::f32, s, rng), dO = test::randn(DType::f32, s, rng);
    Tensor out(DType::f32, s), lse(DType::f32, {1, 4, 96});
    const TensorView lv = lse;
    SdpaOptions o;
    o.impl = Impl::flash;
    sdpa(q, k, v, o, out, &lv);
    Tensor dq(DType::f32, s), dk(DType::f32, s), dv(DType::f32, s);
    sdpa_backward(q, k, v, out, lse, dO, o, dq, dk, dv);
    if (attn::num_threads() != expected) {
        std::printf("FAIL num_threads() = %d, expected the %d thread(s) the system allows\n", attn::num_threads(),
                    expected);
        return 3;
    }
    // float32 sums of 96 keys against double: |error| <= 1e-5·(1 + |want|) holds with a wide
    // margin (float32's unit roundoff is 6e-8), and a wrong or unwritten row misses it by far.
    const attn_test::NaiveResult want = attn_test::naive_attention(q, k, v, 1.0 / std::sqrt(32.0));
    for (std::int64_t h = 0; h < s[1]; ++h)
        for (std::int64_t i = 0; i < s[2]; ++i)
            for (std::int64_t d = 0; d < s[3]; ++d)
                if (const double w = want.o(0, h, i, d); !(std::fabs(test::at(out, 0, h, i, d) - w) <= 1e-5 * (1 + std::fabs(w)))) {
                    std::printf("FAIL out[0][%lld][%lld][%lld] = %g, the naive attention gives %g\n",
                                static_cast<long long>(h), static_cast<long long>(i), static_cast<long long>(d),
                                test::at(out, 0, h, i, d), w);
                    return 4;
                }
    std::printf("ok   child: forward and backward on %d thread(s), forward as the naive attention\n",
                attn::num_threads());
    return 0;
}

int child() { return sdpa_against_naive(1); }

// RLIMIT_NPROC = 1 for this process and those it creates: no thread can be created.
void no_more_threads() {
    const rlimit one{1, 1};
    if (setrlimit(RLIMIT_NPROC, &one) != 0) _exit(5);
}

// An sdpa forward (`impl`) of `heads` heads of 96 queries on the calling thread's count (4 unless
// a scope says otherwise): with more than one item, its loop's region starts that many threads.
void sdpa_call(attn::Impl impl, std::int64_t heads) {
    using namespace attn;
    std::mt19937 rng(5);
    const Shape s{1, heads, 96, 32};
    const Tensor q = test::randn(DType::f32, s, rng), k = test::randn(DType::f32, s, rng),
                 v = test::randn(DType::f32, s, rng);
    Tensor out(DType::f32, s);
    SdpaOptions o;
    o.impl = impl;
    sdpa(q, k, v, o, out);
}

// libgomp shrinks a thread's pool to each smaller team it starts, and creates the threads again
// when a later region asks for more: that growth is checked too (startable_threads.hpp). The
// calls before the limit have none.
int shrunk(bool by_count) {
    attn::set_num_threads(4);
    sdpa_call(attn::Impl::flash, 4);  // the pool: 4 threads
    if (by_count) {
        const attn::ScopedNumThreads two(2);
        sdpa_call(attn::Impl::flash, 4);  // a team of 2: libgomp ends two threads
    } else {
        sdpa_call(attn::Impl::reference, 2);  // one item per head: 2
    }
    no_more_threads();
    return sdpa_against_naive(by_count ? 2 : 4);
}

// `child` in a process forked after this one's check of 4 threads, under no limit, passed; the
// forked process lowers RLIMIT_NPROC to 1 first, as a worker may. libgomp's pool is not
// inherited: the forked process creates its threads anew, and the parent's check said nothing
// about them (libgomp ended the forked process).
int forked() {
    attn::set_num_threads(4);
    if (attn::num_threads() != 4) {
        std::printf("FAIL num_threads() = %d before the fork, with no limit\n", attn::num_threads());
        return 3;
    }
    std::fflush(stdout);
    const pid_t pid = fork();
    if (pid < 0) return 5;
    if (pid == 0) {
        no_more_threads();
        _exit(child());
    }
    int status = 0;
    if (waitpid(pid, &status, 0) != pid) return 5;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// The child's limit, set after fork() and before exec(): the new process starts under it, as
// `ulimit -u 1; exec …` would; the OpenMP pool of this process plays no part.
[[noreturn]] void exec_child(const char* self, const std::string& mode, int err_fd) {
    dup2(err_fd, STDERR_FILENO);
    const bool regrow = mode == "regrow_count" || mode == "regrow_kernel";
    if (mode == "nproc" || mode == "fork" || regrow) {
        if (geteuid() == 0 && (setgroups(0, nullptr) != 0 || setgid(kNobody) != 0 || setuid(kNobody) != 0)) {
            std::printf("skipped: running as root, and cannot become user %u (%s): root ignores RLIMIT_NPROC\n",
                        kNobody, std::strerror(errno));
            std::fflush(stdout);
            _exit(kSkip);
        }
        if (mode == "nproc") no_more_threads();
    } else {
        setenv("OMP_STACKSIZE", "4G", 1);
        attn::test::limit_address_space(1ul << 30);
    }
    const char* as = mode == "fork"           ? "forked"
                     : mode == "regrow_count"  ? "shrunk_by_count"
                     : mode == "regrow_kernel" ? "shrunk_by_kernel"
                                               : "child";
    execl(self, self, as, static_cast<char*>(nullptr));
    std::printf("skipped: cannot run %s as user %u (%s)\n", self, kNobody, std::strerror(errno));
    std::fflush(stdout);
    _exit(kSkip);
}

int count(const std::string& text, const char* what) {
    int n = 0;
    for (std::size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
    return n;
}

int parent(const char* self, const std::string& mode) {
    int fds[2];
    if (pipe(fds) != 0) return 5;
    std::fflush(stdout);
    const pid_t pid = fork();
    if (pid < 0) return 5;
    if (pid == 0) {
        close(fds[0]);
        exec_child(self, mode, fds[1]);
    }
    close(fds[1]);
    std::string err;
    char buf[4096];
    for (ssize_t got; (got = read(fds[0], buf, sizeof buf)) != 0;)
        if (got > 0) err.append(buf, static_cast<std::size_t>(got));
        else if (errno != EINTR) break;
    close(fds[0]);
    int status = 0;
    if (waitpid(pid, &status, 0) != pid) return 5;
    std::printf("child's stderr:\n%s", err.c_str());
    if (WIFEXITED(status) && WEXITSTATUS(status) == kSkip) return kSkip;
    int failures = 0;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        std::printf("FAIL the child %s %d\n", WIFEXITED(status) ? "exited with" : "died of signal",
                    WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
        ++failures;
    }
    if (count(err, "libgomp") != 0) {
        std::printf("FAIL libgomp failed to create a thread\n");
        ++failures;
    }
    if (mode == "regrow_kernel") {
        if (count(err, "attn: warning") != 0) {
            std::printf("FAIL expected no attn warning: the pool kept its 4 threads\n");
            ++failures;
        }
    } else {
        const int started = mode == "regrow_count" ? 2 : 1;
        const std::string warning = "attn: warning: a call asked for 4 threads but the system let it start only " +
                                    std::to_string(started) + " ";
        if (count(err, "attn: warning") != 1 || count(err, warning.c_str()) != 1) {
            std::printf("FAIL expected one attn warning naming 4 threads asked for and %d started\n", started);
            ++failures;
        }
    }
    std::printf("%s\n", failures == 0 ? "ok" : "FAILED");
    return failures == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
    const std::string mode = argc > 1 ? argv[1] : "";
    if (mode == "child") return child();
    if (mode == "forked") return forked();
    if (mode == "shrunk_by_count" || mode == "shrunk_by_kernel") return shrunk(mode == "shrunk_by_count");
#if defined(__SANITIZE_ADDRESS__)
    // The stack mode's address space limit leaves no room for ASan's shadow memory, and under the
    // thread limit LeakSanitizer's exit check (which runs on a thread of its own) could not run.
    std::printf("skipped: ASan cannot run under these limits\n");
    return kSkip;
#endif
#if defined(ATTN_TEST_SANITIZED_MEMORY)
    // The stack mode's address space limit (TSan re-executes the child without it).
    if (mode == "stack") {
        std::printf("skipped: a sanitizer's shadow memory cannot live under an address space limit\n");
        return kSkip;
    }
#endif
    if (mode == "nproc" || mode == "stack" || mode == "fork" || mode == "regrow_count" || mode == "regrow_kernel")
        return parent("/proc/self/exe", mode);
    std::printf("usage: thread_limit_check nproc|stack|fork|regrow_count|regrow_kernel|child|forked|shrunk_by_count|"
                "shrunk_by_kernel\n");
    return 2;
}
