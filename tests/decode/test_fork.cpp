// A process forked after attn ran a call on two threads: libgomp's thread pool does not survive
// fork(), and the child's next parallel region waited for ever (an embedding test found the
// hang, Python multiprocessing's default start method among others). attn runs every call of
// such a child on one thread (src/core/threads.cpp): the child finishes, with the same bits.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstring>
#include <random>

#include "attn/sdpa.hpp"
#include "attn/threads.hpp"
#include "common/util.hpp"

namespace attn::test {
namespace {

TEST(Fork, ChildOfAMultiThreadedProcessRunsOnOneThread) {
    std::mt19937 rng(43);
    const Tensor q = randn(DType::f32, Shape{1, 4, 300, 32}, rng), k = randn(DType::f32, Shape{1, 4, 300, 32}, rng);
    SdpaOptions o;
    o.impl = Impl::flash;
    Tensor out(DType::f32, Shape{1, 4, 300, 32});
    {
        const ScopedNumThreads two(2);  // starts OpenMP's team in this process
        attn::sdpa(q, k, k, o, out);
    }
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
        alarm(60);  // a hang ends as SIGALRM
        const ScopedNumThreads two(2);  // asked for, and still one: more would hang
        Tensor child_out(DType::f32, Shape{1, 4, 300, 32});
        attn::sdpa(q, k, k, o, child_out);
        const bool same = std::memcmp(child_out.data(), out.data(), out.nbytes()) == 0;
        _exit(!same ? 3 : attn::num_threads() != 1 ? 4 : 0);
    }
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_FALSE(WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM) << "the child hung in its first call";
    ASSERT_TRUE(WIFEXITED(status)) << "the child died of signal " << WTERMSIG(status);
    EXPECT_EQ(WEXITSTATUS(status), 0) << "3: other bits than the parent's; 4: more than one thread";
    const ScopedNumThreads two(2);
    EXPECT_EQ(attn::num_threads(), 2);  // the parent is not a forked child: its setting holds
}

}  // namespace
}  // namespace attn::test
