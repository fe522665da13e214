// A serving engine pins its worker threads to cores. The kernels that split a few large work
// items (decode's key chunks, flash's key splits, the backward's chunks of key blocks) size the
// split by the process's CPU count, so a worker pinned to one core must get the same bits as an
// unpinned one for the same call and thread count. They read omp_get_num_procs(), which counts
// the calling thread's affinity, and differed in the last bits (an exploratory test found it).
#include <gtest/gtest.h>
#include <pthread.h>
#include <sched.h>

#include <cstdlib>
#include <functional>
#include <random>
#include <thread>
#include <vector>

#include "attn/decode.hpp"
#include "attn/kv_cache.hpp"
#include "attn/paged_kv_cache.hpp"
#include "attn/sdpa.hpp"
#include "attn/sdpa_backward.hpp"
#include "attn/threads.hpp"
#include "common/util.hpp"
#include "core/threads.hpp"

namespace attn::test {
namespace {

int cpus_of_this_thread() {
    cpu_set_t set;
    CPU_ZERO(&set);
    return sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
}

// Runs fn on a new thread whose affinity is the first CPU this thread may run on.
void on_a_pinned_thread(const std::function<void()>& fn) {
    cpu_set_t mine, one;
    CPU_ZERO(&mine);
    CPU_ZERO(&one);
    ASSERT_EQ(sched_getaffinity(0, sizeof mine, &mine), 0);
    for (int c = 0; c < CPU_SETSIZE; ++c) {
        if (CPU_ISSET(c, &mine)) {
            CPU_SET(c, &one);
            break;
        }
    }
    bool pinned = false;
    std::thread worker([&] {
        pinned = pthread_setaffinity_np(pthread_self(), sizeof one, &one) == 0 && cpus_of_this_thread() == 1;
        if (pinned) fn();
    });
    worker.join();
    ASSERT_TRUE(pinned) << "could not pin a thread to one CPU";
}

// One call of each kernel whose split counts CPUs, on one thread: decode (one query per head)
// against a contiguous and a paged cache of one long sequence, and flash forward and backward
// with few query blocks (key splits / chunks of key blocks).
struct SplitCalls {
    static constexpr std::int64_t Hq = 4, Hkv = 1, D = 64, L = 4096, Lq = 32;
    std::mt19937_64 rng{17};
    KVCache cache{KVCacheConfig{1, Hkv, D, D, L, DType::f32}};
    PagedKVCache pages{PagedKVCacheConfig{Hkv, D, D, 16, L / 16, DType::f32}};
    PagedKVCache::SeqId seq = pages.add_sequence();
    Tensor k = randn(DType::f32, Shape{1, Hkv, L, D}, rng), v = randn(DType::f32, Shape{1, Hkv, L, D}, rng);
    Tensor q1 = randn(DType::f32, Shape{1, Hq, 1, D}, rng);
    Tensor q = randn(DType::f32, Shape{1, 1, Lq, D}, rng), dO = randn(DType::f32, Shape{1, 1, Lq, D}, rng);

    SplitCalls() {
        cache.append(k, v);
        pages.append(seq, TensorView(k.data(), DType::f32, Shape{Hkv, L, D}), TensorView(v.data(), DType::f32, Shape{Hkv, L, D}));
    }

    std::vector<Tensor> run() const {
        const ScopedNumThreads one_thread(1);  // the same thread count for every caller
        std::vector<Tensor> r;
        r.emplace_back(DType::f32, Shape{1, Hq, 1, D});
        decode_attention(q1, cache, SdpaOptions{}, r.back());
        r.emplace_back(DType::f32, Shape{1, Hq, 1, D});
        paged_attention(q1, pages, {seq}, SdpaOptions{}, r.back());
        SdpaOptions flash;
        flash.impl = Impl::flash;
        const TensorView k1 = k.view().slice(1, 0, 1), v1 = v.view().slice(1, 0, 1);
        Tensor out(DType::f32, Shape{1, 1, Lq, D}), lse(DType::f32, Shape{1, 1, Lq});
        const TensorView lse_view = lse.view();
        sdpa(q, k1, v1, flash, out, &lse_view);
        Tensor dq(DType::f32, q.shape()), dk(DType::f32, Shape{1, 1, L, D}), dv(DType::f32, Shape{1, 1, L, D});
        sdpa_backward(q, k1, v1, out, lse, dO, flash, dq, dk, dv);
        for (Tensor* t : {&out, &lse, &dq, &dk, &dv}) r.push_back(std::move(*t));
        return r;
    }
};

TEST(WorkerAffinity, PinnedAndUnpinnedWorkersGetTheSameBits) {
    if (cpus_of_this_thread() < 2) GTEST_SKIP() << "skipped: this process may run on one CPU only";
    const SplitCalls calls;
    const std::vector<Tensor> unpinned = calls.run();
    std::vector<Tensor> pinned;
    on_a_pinned_thread([&] { pinned = calls.run(); });
    ASSERT_EQ(pinned.size(), unpinned.size());
    const char* names[] = {"decode_attention", "paged_attention", "flash out", "flash lse", "dq", "dk", "dv"};
    for (std::size_t i = 0; i < unpinned.size(); ++i) EXPECT_TRUE(bit_equal(pinned[i], unpinned[i])) << names[i];
}

// The count is read once: a process whose first attn call comes from a pinned worker must not
// keep that worker's one CPU, or every later call of the process would split for one CPU (a
// fresh process: the death test re-runs this test alone; checked to fail when the count is
// read from the calling thread).
TEST(WorkerAffinityDeathTest, AFirstCallFromAPinnedWorkerSetsNothing) {
    if (cpus_of_this_thread() < 2) GTEST_SKIP() << "skipped: this process may run on one CPU only";
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    EXPECT_EXIT(
        {
            const SplitCalls calls;
            std::vector<Tensor> pinned;
            on_a_pinned_thread([&] { pinned = calls.run(); });  // the process's first split
            const bool process_count = detail::split_cpu_count() == cpus_of_this_thread();
            std::exit(process_count && all_bit_equal(pinned, calls.run()) ? 0 : 1);
        },
        ::testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace attn::test
