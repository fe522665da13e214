// flash_forward_batch (flash.hpp): problems of different sizes in one task list give each
// problem the bits flash_forward gives it alone — on every kernel row, with 1 and 2 threads,
// with GQA, both causal alignments and dropout (a seed per problem), beside problems whose
// groups convert their K/V tiles — and a batch whose problems differ in head dims is refused
// before anything is written.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "attn/error.hpp"
#include "attn/sdpa.hpp"
#include "common/util.hpp"
#include "kernels/flash/flash.hpp"
#include "kernels/isa.hpp"
#include "sdpa/problem.hpp"

namespace attn {
namespace {

using test::bit_equal;
using test::poisoned;
using test::randn;
using test::still_poisoned;

struct One {
    Tensor q, k, v, out, lse;
    SdpaOptions opt;
};

// (Lq, Lk) pairs: long and short, Lq < Mb (heads grouped per block) and Lq > Lk.
std::vector<One> make_batch(std::uint64_t seed, std::int64_t Dk, std::int64_t Dv) {
    std::mt19937_64 rng(seed);
    const std::int64_t sizes[][2] = {{7, 30}, {200, 200}, {65, 130}, {1, 9}, {130, 64}, {96, 300}};
    std::vector<One> batch;
    int i = 0;
    for (const auto& s : sizes) {
        One o;
        o.q = randn(DType::f32, Shape{1, 4, s[0], Dk}, rng);
        o.k = randn(DType::f32, Shape{1, 2, s[1], Dk}, rng);
        o.v = randn(DType::f32, Shape{1, 2, s[1], Dv}, rng);
        o.opt.causal = i % 3 == 0 ? Causal::none : i % 3 == 1 ? Causal::top_left : Causal::bottom_right;
        if (i % 2 == 1) {
            o.opt.dropout_p = 0.25;
            o.opt.dropout_seed = 100 + static_cast<std::uint64_t>(i);
        }
        batch.push_back(std::move(o));
        ++i;
    }
    return batch;
}

std::vector<detail::SdpaProblem> problems(std::vector<One>& batch) {
    std::vector<detail::SdpaProblem> ps;
    for (One& o : batch) {
        o.out = poisoned(DType::f32, Shape{1, o.q.view().dim(1), o.q.view().dim(2), o.v.view().dim(3)});
        o.lse = poisoned(DType::f32, Shape{1, o.q.view().dim(1), o.q.view().dim(2)});
        const TensorView lse = o.lse.view();
        ps.push_back(detail::make_problem(o.q, o.k, o.v, o.opt, o.out, &lse, nullptr));
    }
    return ps;
}

TEST(FlashBatch, EachProblemAsAlone) {
    std::uint64_t seed = 1;
    for (const detail::KernelSet* row : detail::runnable_kernel_sets()) {
        for (int threads : {1, 2}) {
            SCOPED_TRACE(std::string(detail::isa_name(row->isa)) + ", " + std::to_string(threads) + " threads");
            std::vector<One> batch = make_batch(seed++, 32, 16);
            std::vector<detail::SdpaProblem> ps = problems(batch);
            detail::flash_forward_batch(ps.data(), ps.size(), *row, threads);
            for (std::size_t i = 0; i < batch.size(); ++i) {
                SCOPED_TRACE("problem " + std::to_string(i));
                One& o = batch[i];
                const Tensor out = poisoned(DType::f32, o.out.shape()), lse = poisoned(DType::f32, o.lse.shape());
                const TensorView lv = lse.view();
                detail::flash_forward(detail::make_problem(o.q, o.k, o.v, o.opt, out, &lv, nullptr), *row, threads);
                EXPECT_FALSE(still_poisoned(out));
                EXPECT_TRUE(bit_equal(o.out, out));
                EXPECT_TRUE(bit_equal(o.lse, lse));
            }
        }
    }
}

// With forced key splits (each task's keys in 3 chunks, merged after all items): a batch still
// gives each problem its own result, split problems beside one-block ones (Lk = 9, 30: no split).
TEST(FlashBatch, EachProblemAsAloneWithKeySplits) {
    const detail::FlashTiles tiles{64, 16, 3};
    std::uint64_t seed = 50;
    for (const detail::KernelSet* row : detail::runnable_kernel_sets()) {
        SCOPED_TRACE(detail::isa_name(row->isa));
        std::vector<One> batch = make_batch(seed++, 32, 16);
        std::vector<detail::SdpaProblem> ps = problems(batch);
        detail::flash_forward_batch(ps.data(), ps.size(), *row, 2, &tiles);
        for (std::size_t i = 0; i < batch.size(); ++i) {
            One& o = batch[i];
            const Tensor out = poisoned(DType::f32, o.out.shape()), lse = poisoned(DType::f32, o.lse.shape());
            const TensorView lv = lse.view();
            detail::flash_forward(detail::make_problem(o.q, o.k, o.v, o.opt, out, &lv, nullptr), *row, 1, &tiles);
            EXPECT_FALSE(still_poisoned(out)) << "problem " << i;
            EXPECT_TRUE(bit_equal(o.out, out) && bit_equal(o.lse, lse)) << "problem " << i;
        }
    }
}

// Partials past 256 MiB in one batch run in waves (flash_schedule.hpp run_flash): 17 one-task
// problems split into 8 chunks with Mb = 4096 take 2.1 MB per chunk, 136 chunks in all, so
// the batch runs as 15 problems then 2. Each must still get its result alone.
TEST(FlashBatch, PartialsPastTheCapRunInWaves) {
    const detail::FlashTiles tiles{4096, 64, 8};
    std::mt19937_64 rng(60);
    std::vector<One> batch(17);
    for (One& o : batch) {
        o.q = randn(DType::f32, Shape{1, 1, 20, 64}, rng);
        o.k = randn(DType::f32, Shape{1, 1, 512, 64}, rng);
        o.v = randn(DType::f32, Shape{1, 1, 512, 64}, rng);
    }
    std::vector<detail::SdpaProblem> ps = problems(batch);
    const detail::KernelSet& row = detail::kernel_set();
    detail::flash_forward_batch(ps.data(), ps.size(), row, 2, &tiles);
    for (std::size_t i = 0; i < batch.size(); ++i) {
        One& o = batch[i];
        const Tensor out = poisoned(DType::f32, o.out.shape()), lse = poisoned(DType::f32, o.lse.shape());
        const TensorView lv = lse.view();
        detail::flash_forward(detail::make_problem(o.q, o.k, o.v, o.opt, out, &lv, nullptr), row, 2, &tiles);
        EXPECT_FALSE(still_poisoned(out)) << "problem " << i;
        EXPECT_TRUE(bit_equal(o.out, out) && bit_equal(o.lse, lse)) << "problem " << i;
    }
}

// Groups of query blocks in a batch whose problems read their K/V rows differently: float32 in
// place (the longest, so problem 0 of the task list), float16 and bfloat16 (converted) and
// float32 with a strided head dim (copied). Each problem's groups make shared tiles only if it
// converts its own (JobPlan::group_tiles); every thread still has them for the converting ones.
// Each problem: the bits of its tasks run alone, on every row, with 1 and 2 threads.
TEST(FlashBatch, GroupsConvertingBesideInPlaceEachAsAlone) {
    const detail::FlashTiles grouped{16, 7, 0, 4}, alone{16, 7, 0, 1};
    const std::int64_t Dk = 13, Dv = 11;
    std::mt19937_64 rng(70);
    std::vector<One> batch;
    const std::int64_t sizes[][2] = {{70, 90}, {45, 61}, {33, 52}, {50, 75}, {64, 40}};
    for (int i = 0; i < 5; ++i) {
        One o;
        const std::int64_t Lq = sizes[i][0], Lk = sizes[i][1];
        o.q = randn(DType::f32, Shape{1, 4, Lq, Dk}, rng);
        if (i == 3) {  // head dim strided: rows of (1, 2, D, Lk) transposed
            o.k = randn(DType::f32, Shape{1, 2, Dk, Lk}, rng);
            o.v = randn(DType::f32, Shape{1, 2, Dv, Lk}, rng);
        } else {
            const DType kv = i == 1 ? DType::f16 : i == 2 ? DType::bf16 : DType::f32;
            o.k = test::to_storage(randn(DType::f32, Shape{1, 2, Lk, Dk}, rng).view(), kv);
            o.v = test::to_storage(randn(DType::f32, Shape{1, 2, Lk, Dv}, rng).view(), kv);
        }
        o.opt.causal = i % 2 == 0 ? Causal::none : Causal::bottom_right;
        batch.push_back(std::move(o));
    }
    std::vector<TensorView> ks, vs;  // K and V as the kernel reads them
    for (std::size_t i = 0; i < batch.size(); ++i) {
        const bool strided = i == 3;
        ks.push_back(strided ? batch[i].k.view().transpose(2, 3) : batch[i].k.view());
        vs.push_back(strided ? batch[i].v.view().transpose(2, 3) : batch[i].v.view());
    }
    for (const detail::KernelSet* row : detail::runnable_kernel_sets())
        for (int threads : {1, 2}) {
            SCOPED_TRACE(std::string(detail::isa_name(row->isa)) + ", " + std::to_string(threads) + " threads");
            std::vector<detail::SdpaProblem> ps;
            for (std::size_t i = 0; i < batch.size(); ++i) {
                One& o = batch[i];
                o.out = poisoned(DType::f32, Shape{1, 4, o.q.view().dim(2), Dv});
                o.lse = poisoned(DType::f32, Shape{1, 4, o.q.view().dim(2)});
                const TensorView lse = o.lse.view();
                ps.push_back(detail::make_problem(o.q, ks[i], vs[i], o.opt, o.out, &lse, nullptr));
            }
            detail::flash_forward_batch(ps.data(), ps.size(), *row, threads, &grouped);
            for (std::size_t i = 0; i < batch.size(); ++i) {
                SCOPED_TRACE("problem " + std::to_string(i));
                const One& o = batch[i];
                const Tensor out = poisoned(DType::f32, o.out.shape()), lse = poisoned(DType::f32, o.lse.shape());
                const TensorView lv = lse.view();
                detail::flash_forward(detail::make_problem(o.q, ks[i], vs[i], o.opt, out, &lv, nullptr), *row, threads, &alone);
                EXPECT_FALSE(still_poisoned(out));
                EXPECT_TRUE(bit_equal(o.out, out) && bit_equal(o.lse, lse));
            }
        }
}

TEST(FlashBatch, DifferentHeadDimsRefused) {
    std::vector<One> batch = make_batch(7, 32, 16);
    std::mt19937_64 rng(8);
    batch[3].v = randn(DType::f32, Shape{1, 2, batch[3].k.view().dim(2), 32}, rng);  // Dv 32, not 16
    std::vector<detail::SdpaProblem> ps = problems(batch);
    try {
        detail::flash_forward_batch(ps.data(), ps.size(), detail::kernel_set(), 2);
        FAIL() << "expected attn::Error";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("problem 3"), std::string::npos) << e.what();
    }
    for (const One& o : batch) EXPECT_TRUE(still_poisoned(o.out));
}

}  // namespace
}  // namespace attn
