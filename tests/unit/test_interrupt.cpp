// attn::ScopedInterruptFlag (attn/interrupt.hpp): a call made inside the scope stops once the flag
// is set and throws attn::Interrupted — from every kernel family's parallel loops (flash,
// reference, decode, the backward, varlen, the projection GEMM) —, while calls outside the scope,
// on other threads, or under an inner scope whose flag is clear do not read it.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <ctime>
#include <functional>
#include <random>
#include <thread>

#include "attn/attn.hpp"
#include "common/util.hpp"
#include "core/interrupt.hpp"

namespace attn {
namespace {

using test::poisoned;
using test::randn;
using test::still_poisoned;

double seconds_of(const std::function<void()>& f) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

struct Qkv {
    Tensor q, k, v;
};

Qkv random_qkv(std::int64_t B, std::int64_t H, std::int64_t Lq, std::int64_t Lk, std::int64_t D, unsigned seed) {
    std::mt19937 rng(seed);
    Qkv t{randn(DType::f32, {B, H, Lq, D}, rng), randn(DType::f32, {B, H, Lk, D}, rng), randn(DType::f32, {B, H, Lk, D}, rng)};
    return t;
}

SdpaOptions with_impl(Impl impl) {
    SdpaOptions o;
    o.impl = impl;
    return o;
}

// Each call with the flag set before it starts: attn::Interrupted, and (the arguments checked,
// no task run) nothing written.
TEST(Interrupt, FlagSetBeforeTheCallStopsEveryKernel) {
    const Qkv t = random_qkv(2, 3, 70, 90, 16, 1);
    const Qkv one = random_qkv(2, 3, 1, 90, 16, 2);
    std::atomic<bool> stop{true};
    const ScopedInterruptFlag watch(stop);

    for (Impl impl : {Impl::flash, Impl::reference}) {
        Tensor out = poisoned(DType::f32, {2, 3, 70, 16});
        EXPECT_THROW(sdpa(t.q, t.k, t.v, with_impl(impl), out), Interrupted) << static_cast<int>(impl);
        EXPECT_TRUE(still_poisoned(out));
    }
    {
        Tensor out = poisoned(DType::f32, {2, 3, 1, 16});
        EXPECT_THROW(sdpa(one.q, one.k, one.v, with_impl(Impl::decode), out), Interrupted);
        EXPECT_TRUE(still_poisoned(out));
    }
    {
        KVCache cache(KVCacheConfig{.batch = 2, .kv_heads = 3, .head_dim = 16, .capacity = 90});
        {
            std::atomic<bool> clear{false};
            const ScopedInterruptFlag inner(clear);  // the innermost scope's flag counts
            cache.append(one.k, one.v);
        }
        Tensor out = poisoned(DType::f32, {2, 3, 1, 16});
        EXPECT_THROW(decode_attention(one.q, cache, SdpaOptions{}, out), Interrupted);
        EXPECT_TRUE(still_poisoned(out));
    }
    EXPECT_THROW((void)reference_steps(t.q, t.k, t.v, SdpaOptions{}), Interrupted);  // attn demo's steps
    for (Impl impl : {Impl::flash, Impl::reference}) {
        Tensor out(DType::f32, {2, 3, 70, 16}), lse(DType::f32, {2, 3, 70});
        Tensor dq = poisoned(DType::f32, {2, 3, 70, 16}), dk = poisoned(DType::f32, {2, 3, 90, 16}),
               dv = poisoned(DType::f32, {2, 3, 90, 16});
        EXPECT_THROW(sdpa_backward(t.q, t.k, t.v, out, lse, out, with_impl(impl), dq, dk, dv), Interrupted)
            << static_cast<int>(impl);
    }
    {
        // Three packed sequences (70 queries, 90 keys in all), 3 heads.
        std::mt19937 rng(3);
        const Tensor q = randn(DType::f32, {70, 3, 16}, rng), k = randn(DType::f32, {90, 3, 16}, rng),
                     v = randn(DType::f32, {90, 3, 16}, rng);
        Tensor cq(DType::i32, {4}), ck(DType::i32, {4});
        const std::int32_t qs[] = {0, 10, 40, 70}, ks[] = {0, 20, 50, 90};
        for (int i = 0; i < 4; ++i) {
            cq.data_as<std::int32_t>()[i] = qs[i];
            ck.data_as<std::int32_t>()[i] = ks[i];
        }
        Tensor out = poisoned(DType::f32, {70, 3, 16});
        EXPECT_THROW(sdpa_varlen(q, k, v, cq, ck, SdpaOptions{}, out), Interrupted);
        EXPECT_TRUE(still_poisoned(out));
    }
    {
        // The layer's first projection GEMM stops it.
        const MultiHeadAttention layer(MhaConfig{.embed_dim = 64, .num_heads = 4, .batch_first = true});
        std::mt19937 rng(4);
        const Tensor x = randn(DType::f32, {2, 33, 64}, rng);
        Tensor out = poisoned(DType::f32, {2, 33, 64});
        MhaForwardOptions o;
        o.need_weights = false;
        EXPECT_THROW(layer.forward_into(x, x, x, o, out, nullptr), Interrupted);
        EXPECT_TRUE(still_poisoned(out));
    }
}

// The reference kernel reads the flag once per query row, not only between its (batch, head)
// tasks: one large head runs for minutes (16384 queries and keys), and a Ctrl-C waited for all of
// it. One head of 1536 queries and keys in double (a task of a few tenths of a second of CPU time
// here): the flag is set once the calling thread has computed for 20 ms (its CPU clock, whatever
// the machine's load), inside the head's first steps. The call must then end in attn::Interrupted
// with its outputs unwritten — the kernel writes a head's rows when the head is done, so a head
// that ran to its end would have written them (and a single task seen no flag: no exception).
void stop_inside_one_head(const std::function<void()>& call) {
    std::atomic<bool> stop{false}, done{false};
    bool interrupted = false;
    std::thread caller([&] {
        const ScopedInterruptFlag watch(stop);
        try {
            call();
        } catch (const Interrupted&) {
            interrupted = true;
        }
        done = true;
    });
    clockid_t clock{};
    ASSERT_EQ(pthread_getcpuclockid(caller.native_handle(), &clock), 0);
    for (timespec t{}; !done && clock_gettime(clock, &t) == 0 && t.tv_sec == 0 && t.tv_nsec < 20'000'000;)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    stop = true;
    caller.join();
    EXPECT_TRUE(interrupted) << "the head ran to its end";
}

TEST(Interrupt, TheReferenceKernelStopsInsideAHead) {
    std::mt19937 rng(12);
    const Shape s{1, 1, 1536, 64};
    const Tensor q = randn(DType::f64, s, rng), k = randn(DType::f64, s, rng), v = randn(DType::f64, s, rng);
    const SdpaOptions o = with_impl(Impl::reference);
    Tensor out = poisoned(DType::f64, s);
    stop_inside_one_head([&] { sdpa(q, k, v, o, out); });
    EXPECT_TRUE(still_poisoned(out));

    Tensor lse(DType::f64, {1, 1, 1536});
    Tensor dq = poisoned(DType::f64, s), dk = poisoned(DType::f64, s), dv = poisoned(DType::f64, s);
    stop_inside_one_head([&] { sdpa_backward(q, k, v, v, lse, v, o, dq, dk, dv); });  // out, dO: any values
    EXPECT_TRUE(still_poisoned(dq));
    EXPECT_TRUE(still_poisoned(dk));
    EXPECT_TRUE(still_poisoned(dv));
}

// The kernel's last pass, which writes a head's rows of out and lse and, when asked, its
// Lq x Lk weights and scores, reads the flag once per row too (writing the weights of 8192 queries
// and keys in double took 0.6 s and more). Here 3072 queries and keys in double, 2 x 72 MiB to
// write (0.12-0.17 s measured on a loaded machine: the margin for this thread to see the pass
// begin). The flag is set as soon as out's first row holds a value (no step before the last pass
// writes there, so the pass has begun); the call must end in attn::Interrupted with the weights'
// and scores' last rows unwritten — without a read in the pass, it ran to its end and returned.
TEST(Interrupt, TheReferenceKernelStopsWhileWritingTheWeights) {
    constexpr std::int64_t L = 3072;
    std::mt19937 rng(13);
    const Shape s{1, 1, L, 1};
    const Tensor q = randn(DType::f64, s, rng), k = randn(DType::f64, s, rng), v = randn(DType::f64, s, rng);
    const SdpaOptions o = with_impl(Impl::reference);
    const Tensor out = poisoned(DType::f64, s), weights = poisoned(DType::f64, {1, 1, L, L}),
                 scores = poisoned(DType::f64, {1, 1, L, L});
    const ScoresOutput scores_out{scores, ScoreStage::scaled};
    const int mem = open("/proc/self/mem", O_RDONLY | O_CLOEXEC);  // (below: how out is watched)
    ASSERT_GE(mem, 0) << "cannot open /proc/self/mem to watch the kernel's progress";
    std::atomic<bool> stop{false}, done{false};
    bool interrupted = false;
    std::thread caller([&] {
        const ScopedInterruptFlag watch(stop);
        try {
            const TensorView w = weights;
            sdpa(q, k, v, o, out, nullptr, &w, nullptr, &scores_out);
        } catch (const Interrupted&) {
            interrupted = true;
        }
        done = true;
    });
    // The kernel writes out's first row with plain stores while this thread polls it, so the poll
    // reads through /proc/self/mem — a copy the system makes, as a debugger's — never with a load
    // of its own: a load here, even an atomic one (std::atomic_ref), races with the kernel's store
    // (ThreadSanitizer reported it).
    bool unreadable = false;
    const auto first = [&] {
        double x = 0;
        const auto at = static_cast<off_t>(reinterpret_cast<std::uintptr_t>(out.data_as<double>()));
        unreadable = pread(mem, &x, sizeof x, at) != static_cast<ssize_t>(sizeof x);
        return x;
    };
    while (!done && !unreadable && test::is_poison(first())) std::this_thread::yield();
    close(mem);
    stop = true;
    caller.join();
    EXPECT_FALSE(unreadable) << "reading out through /proc/self/mem failed";
    EXPECT_TRUE(interrupted) << "the last pass ran to its end";
    EXPECT_TRUE(still_poisoned(weights.view().slice(2, L - 1, 1)));
    EXPECT_TRUE(still_poisoned(scores.view().slice(2, L - 1, 1)));
}

// attn::reference_steps copies each head's four Lq x Lk steps into its own tensors once the head's
// steps are done, and reads the flag once per row there too: the copies are the first touch of
// fresh tensors (2 GiB at 8192 queries and keys). Here 2560 queries and keys in double, 50 MiB per
// buffer (above glibc's largest mmap threshold, so each call maps and faults them afresh). The
// copies are seen by the page faults: the steps fill four such buffers, the copies four more, so
// the second half of the call's faults is the copies'. The flag is set once the process has
// faulted three quarters of what one uninterrupted call faults: the call must end in
// attn::Interrupted — without a read in the copies, it ran to its end and returned.
long minor_faults() {
    rusage u{};
    getrusage(RUSAGE_SELF, &u);
    return u.ru_minflt;
}

TEST(Interrupt, ReferenceStepsStopWhileCopyingTheSteps) {
    constexpr std::int64_t L = 2560;
    std::mt19937 rng(14);
    const Shape s{1, 1, L, 1};
    const Tensor q = randn(DType::f64, s, rng), k = randn(DType::f64, s, rng), v = randn(DType::f64, s, rng);
    const long before = minor_faults();
    (void)reference_steps(q, k, v, SdpaOptions{});
    const long call_faults = minor_faults() - before;
    if (call_faults < 1024)  // 8 x 50 MiB are 102400 pages of 4 KiB
        GTEST_SKIP() << "skipped: the call faulted " << call_faults << " pages (an allocator that keeps freed memory?)";

    std::atomic<bool> stop{false}, done{false};
    bool interrupted = false;
    const long target = minor_faults() + call_faults * 3 / 4;
    std::thread caller([&] {
        const ScopedInterruptFlag watch(stop);
        try {
            (void)reference_steps(q, k, v, SdpaOptions{});
        } catch (const Interrupted&) {
            interrupted = true;
        }
        done = true;
    });
    while (!done && minor_faults() < target) std::this_thread::yield();
    const bool set_while_running = !done;
    stop = true;
    caller.join();
    ASSERT_TRUE(set_while_running) << "the call ended before faulting " << call_faults * 3 / 4 << " pages";
    EXPECT_TRUE(interrupted) << "the copies ran to their end";
}

// A long flash call stopped from another thread soon after it started: attn::Interrupted, long
// before the call would have ended (its uninterrupted time measured here). Then, the flag
// cleared, the same call inside the same scope gives the uninterrupted call's bits.
TEST(Interrupt, FlagSetDuringTheCallStopsItSoon) {
    const Qkv t = random_qkv(1, 8, 1024, 1024, 64, 5);
    Tensor want(DType::f32, {1, 8, 1024, 64});
    const SdpaOptions o = with_impl(Impl::flash);
    sdpa(t.q, t.k, t.v, o, want);  // warm-up
    double full = seconds_of([&] { sdpa(t.q, t.k, t.v, o, want); });
    int repeat = 1;  // heads of the long call: the call made to take about half a second here
    while (full * repeat < 0.5 && repeat < 256) repeat *= 2;
    const Qkv big = random_qkv(1, 8 * repeat, 1024, 1024, 64, 6);
    Tensor out(DType::f32, {1, 8 * repeat, 1024, 64});
    full = seconds_of([&] { sdpa(big.q, big.k, big.v, o, out); });
    const Tensor uninterrupted = to_dtype(out, DType::f32);  // a copy

    std::atomic<bool> stop{false};
    const ScopedInterruptFlag watch(stop);
    constexpr double kAfter = 0.05;
    std::thread setter([&] {
        std::this_thread::sleep_for(std::chrono::duration<double>(kAfter));
        stop.store(true);
    });
    bool interrupted = false;
    const double stopped = seconds_of([&] {
        try {
            sdpa(big.q, big.k, big.v, o, out);
        } catch (const Interrupted&) {
            interrupted = true;
        }
    });
    setter.join();
    EXPECT_TRUE(interrupted);
    EXPECT_LT(stopped, kAfter + 0.25 * full) << "the whole call takes " << full << " s";

    stop.store(false);
    sdpa(big.q, big.k, big.v, o, out);
    EXPECT_TRUE(test::bit_equal(out, uninterrupted));
}

// Set, but outside any scope, on another thread than the scope's, or under an inner scope with a
// clear flag: not read, and the call gives its result.
TEST(Interrupt, OnlyTheScopesThreadReadsTheFlag) {
    const Qkv t = random_qkv(1, 2, 40, 50, 8, 7);
    Tensor want(DType::f32, {1, 2, 40, 8}), out(DType::f32, {1, 2, 40, 8});
    sdpa(t.q, t.k, t.v, SdpaOptions{}, want);
    std::atomic<bool> stop{true};
    {
        const ScopedInterruptFlag watch(stop);
        std::thread other([&] { sdpa(t.q, t.k, t.v, SdpaOptions{}, out); });
        other.join();
        EXPECT_TRUE(test::bit_equal(out, want));
        std::atomic<bool> clear{false};
        {
            const ScopedInterruptFlag inner(clear);
            test::poison(out);
            sdpa(t.q, t.k, t.v, SdpaOptions{}, out);
            EXPECT_TRUE(test::bit_equal(out, want));
        }
        EXPECT_THROW(sdpa(t.q, t.k, t.v, SdpaOptions{}, out), Interrupted);  // the outer scope's again
    }
    test::poison(out);
    sdpa(t.q, t.k, t.v, SdpaOptions{}, out);  // the scope has ended; the flag is still set
    EXPECT_TRUE(test::bit_equal(out, want));
}

// A flag set, then cleared before the call's loops end (another thread sharing it clears it for
// its own next call): the tasks skipped while it was set stay skipped, so the call must still end
// in Interrupted, not return a partly written output. The rule, on the loops' reader itself:
TEST(Interrupt, ASeenFlagStaysSeenAfterItIsCleared) {
    std::atomic<bool> stop{false};
    const ScopedInterruptFlag watch(stop);
    {
        const detail::Interrupt never_seen;
        stop = true;
        stop = false;  // set and cleared before any reader looked: nothing was skipped
        EXPECT_FALSE(never_seen.requested());
        EXPECT_NO_THROW(never_seen.throw_if_requested());
    }
    const detail::Interrupt seen;
    EXPECT_FALSE(seen.requested());
    stop = true;
    EXPECT_TRUE(seen.requested());
    stop = false;
    EXPECT_TRUE(seen.requested());
    EXPECT_THROW(seen.throw_if_requested(), Interrupted);
}

// The same through a whole flash call (512 tasks on 2 threads): the flag set at a third of the
// call and cleared 1/2000 of the call later — the tasks that start meanwhile are skipped at once,
// and the region ends only when the tasks running then are done, after the flag is clear again.
// Timing-dependent only in that a run where no task saw the flag returns the full result, which
// passes too.
TEST(Interrupt, AFlagClearedDuringTheCallNeverReturnsAPartialResult) {
    const Qkv t = random_qkv(1, 16, 2048, 2048, 64, 11);
    Tensor want(DType::f32, {1, 16, 2048, 64}), out(DType::f32, {1, 16, 2048, 64});
    const double full = seconds_of([&] { sdpa(t.q, t.k, t.v, SdpaOptions{}, want); });
    for (int round = 0; round < 3; ++round) {
        test::poison(out);
        std::atomic<bool> stop{false};
        std::thread toggler([&] {
            std::this_thread::sleep_for(std::chrono::duration<double>(full * 0.3));
            stop = true;
            std::this_thread::sleep_for(std::chrono::duration<double>(full / 2000));
            stop = false;
        });
        bool interrupted = false;
        {
            const ScopedInterruptFlag watch(stop);
            try {
                sdpa(t.q, t.k, t.v, SdpaOptions{}, out);
            } catch (const Interrupted&) {
                interrupted = true;
            }
        }
        toggler.join();
        if (!interrupted) {  // braces: EXPECT_TRUE is an if-else inside (-Wdangling-else)
            EXPECT_TRUE(test::bit_equal(out, want)) << "round " << round << ": returned a partial result";
        }
    }
}

}  // namespace
}  // namespace attn
