// Out of memory in the middle of a call that changes state: the state stays exactly as it was
// (the headers' "nothing is written / the cache is unchanged" promises). This binary replaces
// the global operator new so that the n-th allocation of a call can be made to fail, and every
// n is tried in turn until the call allocates no more (the way a fault-injection review found a
// half-made sequence after a failed PagedKVCache::fork, a page lost to the pool after a failed
// append, new weights left in a layer whose load_state_dict had failed, and std::terminate from
// a safetensors header's JSON document, whose destructor allocates). It replaces aligned_alloc
// too, the library's one allocation of large buffers (core/allocate.cpp), so that a test can
// refuse what OpenMP worker threads allocate inside a parallel region.
#include <gtest/gtest.h>
#include <omp.h>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <map>
#include <new>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "attn/decode.hpp"
#include "attn/error.hpp"
#include "attn/kv_cache.hpp"
#include "attn/mha.hpp"
#include "attn/paged_kv_cache.hpp"
#include "attn/reference.hpp"
#include "attn/safetensors.hpp"
#include "attn/sdpa.hpp"
#include "attn/sdpa_backward.hpp"
#include "attn/sdpa_varlen.hpp"
#include "attn/threads.hpp"
#include "common/util.hpp"
#include "core/threads.hpp"
#include "gemm/gemm.hpp"
#include "kernels/backward/backward.hpp"
#include "kernels/isa.hpp"

namespace {

// 0: never fail; n > 0: the n-th allocation from now throws std::bad_alloc (once). Counted on
// the calling thread outside parallel regions only: an exception may not leave an OpenMP
// region (it would terminate), and what worker threads allocate is not covered here.
thread_local long g_fail_at = 0;

// Which aligned_alloc calls return null: none; from a worker thread of a parallel region (thread
// number >= 1, while the calling thread, number 0, allocates and computes its share); or from a
// thread outside any parallel region (the caller). Each such thread's first g_let_through calls
// are let through (the GEMM's threads take their op(A) buffer before their op(B) one), and
// g_refused_bytes is the size of the first refused call (0: none yet).
enum class Refuse { none, workers, caller };
std::atomic<Refuse> g_refuse_aligned{Refuse::none};
std::atomic<int> g_let_through{0};
std::atomic<std::size_t> g_refused_bytes{0};
thread_local int t_aligned_calls = 0;  // the calls of this thread that the refusal was aimed at

bool refuse_aligned(std::size_t n) {
    const Refuse r = g_refuse_aligned.load();
    const bool aimed = (r == Refuse::workers && omp_get_level() > 0 && omp_get_thread_num() > 0) ||
                       (r == Refuse::caller && omp_get_level() == 0);
    if (!aimed || t_aligned_calls++ < g_let_through.load()) return false;
    std::size_t none = 0;
    g_refused_bytes.compare_exchange_strong(none, n);
    return true;
}

void* allocate(std::size_t n, std::size_t align) {
    if (g_fail_at > 0 && omp_in_parallel() == 0 && --g_fail_at == 0) throw std::bad_alloc();
    void* p = align > alignof(std::max_align_t) ? std::aligned_alloc(align, (n + align - 1) / align * align)
                                                : std::malloc(n == 0 ? 1 : n);
    if (p == nullptr) throw std::bad_alloc();
    return p;
}

}  // namespace

extern "C" void* aligned_alloc(std::size_t align, std::size_t n) noexcept {
    if (refuse_aligned(n)) return nullptr;
    void* p = nullptr;
    return posix_memalign(&p, std::max(align, sizeof(void*)), n) == 0 ? p : nullptr;
}

void* operator new(std::size_t n) { return allocate(n, 0); }
void* operator new[](std::size_t n) { return allocate(n, 0); }
void* operator new(std::size_t n, std::align_val_t a) { return allocate(n, static_cast<std::size_t>(a)); }
void* operator new[](std::size_t n, std::align_val_t a) { return allocate(n, static_cast<std::size_t>(a)); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
// The no-throw forms (std::stable_sort's temporary buffer is one) through the same allocate():
// libstdc++'s own no-throw new calls the replaced plain one, but under ASan the runtime's took
// them, and its block then met the free() above — an alloc-dealloc mismatch that aborted the test.
namespace {
void* allocate_or_null(std::size_t n, std::size_t align) noexcept {
    try {
        return allocate(n, align);
    } catch (const std::bad_alloc&) {
        return nullptr;
    }
}
}  // namespace
void* operator new(std::size_t n, const std::nothrow_t&) noexcept { return allocate_or_null(n, 0); }
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept { return allocate_or_null(n, 0); }
void* operator new(std::size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
    return allocate_or_null(n, static_cast<std::size_t>(a));
}
void* operator new[](std::size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
    return allocate_or_null(n, static_cast<std::size_t>(a));
}
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }

namespace {

using attn::DType;
using attn::PagedKVCache;
using attn::PagedKVCacheConfig;
using attn::Shape;
using attn::Tensor;
using attn::TensorView;

Tensor random_f32(const Shape& shape, std::uint64_t seed) {
    std::mt19937_64 rng(seed);
    return attn::test::randn(DType::f32, shape, rng);
}

// Runs `call` with its n-th allocation failing, for n = 1, 2, ... until a run completes;
// after each failed run `unchanged()` must hold (and `said` gets what the call threw). Returns
// how many runs failed (> 0: the call allocates, so the sweep tested something).
int sweep(const std::function<void()>& call, const std::function<void(long)>& unchanged,
          const std::function<void(const std::bad_alloc&)>& said = {}) {
    for (long n = 1; n < 100000; ++n) {
        g_fail_at = n;
        bool failed = false;
        try {
            call();
        } catch (const std::bad_alloc& e) {
            failed = true;
            if (said) said(e);
        }
        g_fail_at = 0;
        if (!failed) return static_cast<int>(n - 1);
        unchanged(n);
    }
    ADD_FAILURE() << "the call never completed";
    return 0;
}

struct CacheState {
    std::vector<std::int64_t> lengths;
    std::vector<std::vector<std::int32_t>> tables;
    std::int64_t free_pages = 0;
    std::vector<unsigned char> keys;
    bool operator==(const CacheState&) const = default;
};

CacheState state_of(const PagedKVCache& c, const std::vector<PagedKVCache::SeqId>& seqs) {
    CacheState s;
    for (PagedKVCache::SeqId id : seqs) {
        s.lengths.push_back(c.length(id));
        s.tables.push_back(c.page_table(id));
    }
    s.free_pages = c.free_pages();
    const TensorView kp = c.key_pages();
    const auto* k = static_cast<const unsigned char*>(kp.data());
    s.keys.assign(k, k + kp.numel() * static_cast<std::int64_t>(attn::dtype_size(kp.dtype())));
    return s;
}

PagedKVCacheConfig small_pool() {
    PagedKVCacheConfig cfg;
    cfg.kv_heads = 2;
    cfg.head_dim = 4;
    cfg.page_size = 4;
    cfg.num_pages = 16;
    return cfg;
}

// attn::reference_steps allocates one head's Lq x Lk buffers per call, not per head: a call over 6
// heads (2 sequences of 3) makes as many allocations as one over 1. A HeadSteps per head took
// (and faulted in) its four Lq x Lk doubles again for each head: 2 GiB per head at 8192.
TEST(AllocFailures, ReferenceStepsAllocatesPerCallNotPerHead) {
    auto allocations = [](std::int64_t B, std::int64_t H) {
        const Tensor q = random_f32(Shape{B, H, 5, 4}, 1), k = random_f32(Shape{B, H, 6, 4}, 2),
                     v = random_f32(Shape{B, H, 6, 3}, 3);
        return sweep([&] { (void)attn::reference_steps(q.view(), k.view(), v.view(), attn::SdpaOptions{}); },
                     [](long) {});  // a new result each call: no state to compare
    };
    const int one = allocations(1, 1);
    EXPECT_GT(one, 0);
    EXPECT_EQ(allocations(2, 3), one);
}

TEST(AllocFailures, PagedForkLeavesNoHalfMadeSequence) {
    PagedKVCache c(small_pool());
    const PagedKVCache::SeqId a = c.add_sequence();
    const Tensor k = random_f32(Shape{2, 10, 4}, 1);
    c.append(a, k, k);
    const CacheState before = state_of(c, {a});
    int failures = sweep([&] { (void)c.fork(a); }, [&](long n) {
        EXPECT_EQ(state_of(c, {a}), before) << "allocation " << n;
        // No sequence was made: the next id is still the one a fork would have taken.
        EXPECT_FALSE(c.contains(a + 1)) << "allocation " << n;
    });
    EXPECT_GT(failures, 0);
    EXPECT_EQ(c.page_table(a + 1), c.page_table(a));  // the completed fork
}

TEST(AllocFailures, PagedAppendLosesNoPage) {
    PagedKVCache c(small_pool());
    const PagedKVCache::SeqId a = c.add_sequence();
    const Tensor k = random_f32(Shape{2, 10, 4}, 2);
    c.append(a, k, k);
    const PagedKVCache::SeqId b = c.fork(a);  // shares a's half-full last page: append copies it
    const Tensor more = random_f32(Shape{2, 9, 4}, 3);
    const CacheState before = state_of(c, {a, b});
    const int failures = sweep([&] { c.append(b, more, more); },
                               [&](long n) { EXPECT_EQ(state_of(c, {a, b}), before) << "allocation " << n; });
    EXPECT_GT(failures, 0);
    EXPECT_EQ(c.length(b), 19);
    c.free(a);
    c.free(b);
    EXPECT_EQ(c.free_pages(), 16);  // every page back
}

TEST(AllocFailures, PagedFreeIsAllOrNothing) {
    PagedKVCache c(small_pool());
    std::vector<PagedKVCache::SeqId> ids;
    const Tensor k = random_f32(Shape{2, 5, 4}, 4);
    for (int i = 0; i < 3; ++i) {
        ids.push_back(c.add_sequence());
        c.append(ids.back(), k, k);
    }
    const CacheState before = state_of(c, ids);
    sweep([&] { c.free(ids[1]); }, [&](long n) {
        EXPECT_EQ(state_of(c, ids), before) << "allocation " << n;
        EXPECT_TRUE(c.contains(ids[1]));
    });
    EXPECT_FALSE(c.contains(ids[1]));
    EXPECT_EQ(c.free_pages(), 16 - 4);
}

std::vector<std::pair<std::string, Tensor>> random_state(const attn::MultiHeadAttention& m, std::uint64_t seed) {
    std::vector<std::pair<std::string, Tensor>> sd;
    for (const auto& [name, shape] : m.parameter_shapes()) sd.emplace_back(name, random_f32(shape, seed++));
    return sd;
}

std::vector<unsigned char> bytes_of(const attn::MultiHeadAttention& m) {
    std::vector<unsigned char> all;
    for (const auto& [name, shape] : m.parameter_shapes()) {
        const TensorView p = m.parameter(name);
        const auto* b = static_cast<const unsigned char*>(p.data());
        all.insert(all.end(), b, b + p.numel() * static_cast<std::int64_t>(attn::dtype_size(p.dtype())));
    }
    return all;
}

TEST(AllocFailures, MhaLoadAndParamDtypeChangeNothingOnFailure) {
    attn::MultiHeadAttention m(attn::MhaConfig{.embed_dim = 8, .num_heads = 2});
    const auto first = random_state(m, 10);
    std::vector<std::pair<std::string, TensorView>> views;
    for (const auto& [n, t] : first) views.emplace_back(n, t.view());
    m.load_state_dict(views);
    m.pack_weights();
    const Tensor x = random_f32(Shape{3, 1, 8}, 20);
    attn::MhaForwardOptions o;
    o.need_weights = false;
    const Tensor out_before = m.forward(x, x, x, o).output;
    const std::vector<unsigned char> params_before = bytes_of(m);
    const auto unchanged = [&](long n) {
        EXPECT_EQ(bytes_of(m), params_before) << "allocation " << n;
        EXPECT_EQ(m.config().param_dtype, DType::f32) << "allocation " << n;
        const Tensor out = m.forward(x, x, x, o).output;  // the packed weights agree with the parameters
        EXPECT_EQ(std::memcmp(out.data(), out_before.data(), out.nbytes()), 0) << "allocation " << n;
    };
    const auto second = random_state(m, 30);
    std::vector<std::pair<std::string, TensorView>> next;
    for (const auto& [n, t] : second) next.emplace_back(n, t.view());
    EXPECT_GT(sweep([&] { m.load_state_dict(next); }, unchanged), 0);
    m.load_state_dict(views);  // back to the first weights
    EXPECT_GT(sweep([&] { m.set_param_dtype(DType::bf16); }, unchanged), 0);
    EXPECT_EQ(m.config().param_dtype, DType::bf16);
}

// A flash backward of (1, 2, 40, 16) float32 tensors on one thread (Q and dO read in place: the
// rows need no copy), whose out and lse come from the flash forward. On one thread the region is
// inactive (omp_in_parallel() is 0), so the injection reaches the allocations inside it too.
struct FlashBackwardCase {
    Shape s{1, 2, 40, 16};
    Tensor q, k, v, dout;
    attn::SdpaOptions opt;
    Tensor o{DType::f32, s}, lse{DType::f32, Shape{1, 2, 40}};
    Tensor dq{DType::f32, s}, dk{DType::f32, s}, dv{DType::f32, s};
    explicit FlashBackwardCase(std::uint64_t seed, float q5 = 0.0f, float dout7 = 0.0f)
        : q(random_f32(s, seed)), k(random_f32(s, seed + 1)), v(random_f32(s, seed + 2)), dout(random_f32(s, seed + 3)) {
        if (q5 != 0.0f) q.data_as<float>()[5] = q5;
        if (dout7 != 0.0f) dout.data_as<float>()[7] = dout7;
        opt.impl = attn::Impl::flash;
        const TensorView lv = lse.view();
        attn::sdpa(q, k, v, opt, o, &lv);
    }
    void backward() { attn::sdpa_backward(q, k, v, o, lse, dout, opt, dq, dk, dv); }
    // The messages of the refusals that contain `marker`, over a sweep of the backward on a new
    // thread: the buffers the backward keeps per thread from call to call (thread_local) are not
    // sized yet, whichever test ran before. `sized_first`: a backward of this shape without
    // NaN/±inf sizes them before the sweep. (Sized inside a sweep, what one run keeps is not
    // allocated by the next, whose n-th allocation is then further on, past what a test wants
    // refused: run alone, as ctest runs it, grad_out's zeroed copy was never refused.)
    std::vector<std::string> refusals(const char* marker, bool sized_first) {
        std::vector<std::string> said;
        std::thread([&] {
            const attn::ScopedNumThreads one(1);
            if (sized_first) FlashBackwardCase(1).backward();
            const int failures = sweep([&] { backward(); }, [](long) {}, [&](const std::bad_alloc& e) {
                const std::string m = e.what();
                if (m.find(marker) == std::string::npos) return;
                said.push_back(m);
                EXPECT_NE(dynamic_cast<const attn::OutOfMemory*>(&e), nullptr) << m;
            });
            EXPECT_GT(failures, 0);
        }).join();
        return said;
    }
};

// A refusal is attn::OutOfMemory saying what it could not allocate and its bytes ("out of memory:
// cannot allocate N bytes (…) for <what>", the reference's "… N bytes (…) per thread …"), never a
// bare std::bad_alloc, which names nothing.
void expect_out_of_memory(const std::bad_alloc& e) {
    const std::string m = e.what();
    EXPECT_NE(dynamic_cast<const attn::OutOfMemory*>(&e), nullptr) << "a bare std::bad_alloc: " << m;
    EXPECT_EQ(m.rfind("out of memory: ", 0), 0u) << m;
    EXPECT_NE(m.find(" bytes"), std::string::npos) << m;
}

// A sweep's check of each refusal: attn::OutOfMemory (expect_out_of_memory) naming exactly one of
// `names`, counted in `named`; `said` keeps the message for the next check's text.
std::function<void(const std::bad_alloc&)> naming_one_of(const std::vector<std::string>& names, std::vector<int>& named,
                                                         std::string& said) {
    return [&names, &named, &said](const std::bad_alloc& e) {
        said = e.what();
        expect_out_of_memory(e);
        int which = 0;
        for (std::size_t x = 0; x < names.size(); ++x)
            if (said.find(names[x]) != std::string::npos) ++named[x], ++which;
        EXPECT_EQ(which, 1) << "names none (or more than one) of the buffers: " << said;
    };
}

// A forward call's refusals, each allocation refused in turn (sweep): every one is attn::OutOfMemory
// (expect_out_of_memory) naming exactly one of `names`, each name is refused at least once, and
// `out` and `lse` stay as they were (poisoned). One call first, never refused: what the process
// sets up once (the kernel table's row and its reason, on the first call) would otherwise be done
// inside the sweep, and every allocation after it counted two places earlier from then on — run
// alone, a sweep never refused the kernel's buffers. The completed call writes `out`.
void sweep_forward_refusals(const std::function<void()>& call, Tensor& out, Tensor& lse,
                            const std::vector<std::string>& names) {
    call();
    attn::test::poison(out);
    attn::test::poison(lse);
    std::vector<int> named(names.size(), 0);
    std::string said;
    const int failures = sweep(call,
                               [&](long n) {
                                   EXPECT_TRUE(attn::test::still_poisoned(out)) << "allocation " << n << ": " << said;
                                   EXPECT_TRUE(attn::test::still_poisoned(lse)) << "allocation " << n << ": " << said;
                                   attn::test::poison(out);
                                   attn::test::poison(lse);
                               },
                               naming_one_of(names, named, said));
    EXPECT_GT(failures, 0) << "the call allocated nothing: the sweep tested nothing";
    for (std::size_t x = 0; x < names.size(); ++x) EXPECT_GT(named[x], 0) << "never refused: " << names[x];
    EXPECT_FALSE(attn::test::still_poisoned(out));
}

// attn::sdpa with a report: each allocation of the call refused in turn, on one thread (its
// region inactive, so the injection reaches what the kernels size inside it) — a refusal is
// attn::OutOfMemory naming what it was for and leaves `out` and `lse` as they were. The report's
// text was built after the kernel had written them (so a refusal of its few bytes threw from a
// call whose output was complete); it is made before the kernel now, for decode, flash and the
// reference alike. 28 refusals over the three kernels were a bare std::bad_alloc, which names
// nothing: the checks' and the choice's strings, decode's scratch, flash's list of problems, the
// reference's list of per-thread buffers. `names`: what the refusals of the kernel may name.
TEST(AllocFailures, SdpaWithAReportWritesNothingWhenAnAllocationFails) {
    const attn::ScopedNumThreads one(1);
    struct Case {
        const char* name;
        attn::Impl impl;
        std::int64_t hq, hkv, lq, lk;
        std::vector<std::string> names;
    };
    const std::string checks = "the few hundred bytes for sdpa's argument checks and report text; nothing was written";
    for (const Case& c :
         {Case{"decode", attn::Impl::decode, 4, 2, 1, 100,
               {checks, " for the decode kernel's key interval of every query row",
                " for the decode kernel's scratch (one per thread) and split partials"}},
          Case{"flash", attn::Impl::flash, 2, 1, 33, 70, {checks, " for the flash kernel's list of problems"}},
          Case{"reference", attn::Impl::reference, 2, 1, 33, 70,
               {checks, " for the reference kernel's list of per-thread buffers",
                "the reference kernel keeps one head's Lq x Lk = 33 x 70 scores four times in double"}}}) {
        SCOPED_TRACE(c.name);
        const std::int64_t d = 16;
        const Tensor q = random_f32({1, c.hq, c.lq, d}, 1), k = random_f32({1, c.hkv, c.lk, d}, 2),
                     v = random_f32({1, c.hkv, c.lk, d}, 3);
        attn::SdpaOptions opt;
        opt.impl = c.impl;
        opt.causal = attn::Causal::bottom_right;
        Tensor out = attn::test::poisoned(DType::f32, {1, c.hq, c.lq, d});
        Tensor lse = attn::test::poisoned(DType::f32, {1, c.hq, c.lq});
        const TensorView lse_view = lse;
        attn::SdpaReport report;
        sweep_forward_refusals([&] { attn::sdpa(q, k, v, opt, out, &lse_view, nullptr, &report); }, out, lse, c.names);
        EXPECT_NE(report.kernel.find(c.name), std::string::npos) << report.kernel;  // the kernel asked for ran
    }
}

// attn::decode_attention, the same sweep: its checks, the cache's lengths and the choice of a
// kernel are bookkeeping (they were a bare std::bad_alloc), the decode kernel names its buffers,
// and `out` and `lse` are not written.
TEST(AllocFailures, DecodeAttentionWritesNothingWhenAnAllocationFails) {
    const attn::ScopedNumThreads one(1);
    attn::KVCache cache(attn::KVCacheConfig{.batch = 2, .kv_heads = 2, .head_dim = 16, .capacity = 64});
    const Tensor k = random_f32({2, 2, 50, 16}, 4), v = random_f32({2, 2, 50, 16}, 5);
    cache.append(k, v);
    const Tensor q = random_f32({2, 4, 1, 16}, 6);
    Tensor out = attn::test::poisoned(DType::f32, {2, 4, 1, 16});
    Tensor lse = attn::test::poisoned(DType::f32, {2, 4, 1});
    const TensorView lse_view = lse;
    attn::SdpaOptions step;
    step.causal = attn::Causal::bottom_right;
    const std::vector<std::string> names = {
        "the few hundred bytes for decode_attention's argument checks and the cache's lengths; nothing was written",
        " for the decode kernel's key interval of every query row",
        " for the decode kernel's scratch (one per thread) and split partials"};
    sweep_forward_refusals([&] { attn::decode_attention(q, cache, step, out, &lse_view); }, out, lse, names);
}

// The four packed sequences of the varlen sweeps: 5, 7, 9 and 3 queries on 9, 11, 13 and no keys,
// Hq = 4 on Hkv = 2, head dims 16.
struct FourSequences {
    static constexpr std::int64_t hq = 4, hkv = 2, d = 16;
    Tensor q, k, v, cu_q{DType::i32, Shape{5}}, cu_k{DType::i32, Shape{5}};
    explicit FourSequences(std::uint64_t seed)
        : q(random_f32({24, hq, d}, seed)), k(random_f32({33, hkv, d}, seed + 1)), v(random_f32({33, hkv, d}, seed + 2)) {
        const std::int32_t starts_q[] = {0, 5, 12, 21, 24}, starts_k[] = {0, 9, 20, 33, 33};
        std::copy(std::begin(starts_q), std::end(starts_q), cu_q.data_as<std::int32_t>());
        std::copy(std::begin(starts_k), std::end(starts_k), cu_k.data_as<std::int32_t>());
    }
};

// attn::sdpa_varlen on the four sequences (causal), one kernel per case, with and without lse, each
// allocation refused in turn as in sweep_forward_refusals: every refusal is attn::OutOfMemory
// naming exactly one of `names`, each refused at least once, and `out` and `lse` stay poisoned.
// Its checks (and cu_seqlens' copies), the split of its sequences among the kernels and the
// report's text are one bookkeeping step before anything is written — their lists and strings
// were a bare std::bad_alloc (27 in a sweep of forward_packed), and so was the slice the sequence
// without keys is filled through, now last. Flash runs every sequence in one call; decode and the
// reference run the sequences in turn, each kernel call taking its own buffers, so a refusal in a
// later sequence's kernel left the earlier sequences' rows written: they write staged rows now,
// copied into `out` and `lse` once every sequence has run (src/varlen/staging.hpp).
TEST(AllocFailures, SdpaVarlenRefusalsAreNamedAndWriteNothing) {
    const attn::ScopedNumThreads one(1);
    const std::string checks =
        "the few hundred bytes for sdpa_varlen's argument checks and report text; nothing was written";
    const std::vector<std::string> tables = {" for cu_seqlens_q", " for cu_seqlens_k", " for the sequences' table"};
    struct Case {
        const char* name;
        attn::Impl impl;
        std::vector<std::string> kernel;  // what a refusal of the kernel may name
    };
    const FourSequences s(7);
    for (const Case& c :
         {Case{"decode", attn::Impl::decode,
               {" for the decode kernel's key interval of every query row",
                " for the decode kernel's scratch (one per thread) and split partials"}},
          Case{"flash", attn::Impl::flash, {" for the flash kernel's list of problems"}},
          Case{"reference", attn::Impl::reference,
               {" for the reference kernel's list of per-thread buffers", "the reference kernel keeps one head's"}}})
        for (const bool with_lse : {true, false}) {
            SCOPED_TRACE(std::string(c.name) + (with_lse ? ", with lse" : ", without lse"));
            std::vector<std::string> names = {checks};
            names.insert(names.end(), tables.begin(), tables.end());
            names.insert(names.end(), c.kernel.begin(), c.kernel.end());
            attn::SdpaOptions opt;
            opt.impl = c.impl;
            opt.causal = attn::Causal::bottom_right;
            Tensor out = attn::test::poisoned(DType::f32, {24, s.hq, s.d});
            Tensor lse = attn::test::poisoned(DType::f32, {24, s.hq});  // poisoned throughout when not given
            const TensorView lse_view = lse;
            attn::SdpaReport report;
            const auto call = [&] {
                attn::sdpa_varlen(s.q, s.k, s.v, s.cu_q, s.cu_k, opt, out, with_lse ? &lse_view : nullptr, &report);
            };
            sweep_forward_refusals(call, out, lse, names);
            EXPECT_NE(report.kernel.find(c.name), std::string::npos) << report.kernel;  // the kernel asked for ran
        }
}

// attn::sdpa_varlen_backward on the four sequences, with and without sinks (and dsinks), each
// allocation refused in turn: every refusal is attn::OutOfMemory naming exactly one of `names`,
// each refused at least once, and dq, dk, dv (and dsinks) stay poisoned. Its checks, the sequences'
// table, the head-major plan and the report's text are one bookkeeping step before any gradient is
// written (they were a bare std::bad_alloc). Each sequence runs its own sdpa_backward, which takes
// its own buffers: a later sequence's refusal left the earlier ones' gradients written, and the
// report's text, the last sequence's joined to the first line, was made after the gradients were
// written. The sequences write staged gradients now, copied into dq, dk and dv once every sequence
// has run and the report's text is made (src/varlen/staging.hpp).
TEST(AllocFailures, SdpaVarlenBackwardRefusalsAreNamedAndWriteNothing) {
    const attn::ScopedNumThreads one(1);
    const std::string checks =
        "the few hundred bytes for sdpa_varlen_backward's argument checks and report text; nothing was written";
    const FourSequences s(17);
    const Tensor grad_out = random_f32({24, s.hq, s.d}, 20), sinks = random_f32({s.hq}, 21);
    struct Case {
        const char* name;
        attn::Impl impl;
        std::vector<std::string> kernel;  // what a refusal of sdpa_backward's kernel may name
        std::vector<std::string> sinks;   // and with sinks
    };
    for (const Case& c :
         {Case{"flash", attn::Impl::flash,
               {" for the flash backward's first visible key of every query row",
                " for the flash backward's end of the visible keys of every query row"},
               {" for the flash backward's D = rowsum(dO ∘ O) of every row (for the sinks)"}},
          Case{"reference", attn::Impl::reference,
               {" for the reference backward's list of per-thread buffers",
                " for the reference backward's sink gradients of every (batch, head)", "the reference kernel keeps one head's"},
               {}}})
        for (const bool with_sinks : {false, true}) {
            SCOPED_TRACE(std::string(c.name) + (with_sinks ? ", with sinks and dsinks" : ", without sinks"));
            attn::SdpaOptions opt;
            opt.impl = c.impl;
            opt.causal = attn::Causal::bottom_right;
            if (with_sinks) opt.sinks = sinks.view();
            Tensor out(DType::f32, Shape{24, s.hq, s.d}), lse(DType::f32, Shape{24, s.hq});
            const TensorView lse_view = lse;
            attn::sdpa_varlen(s.q, s.k, s.v, s.cu_q, s.cu_k, opt, out, &lse_view);
            Tensor dq = attn::test::poisoned(DType::f32, {24, s.hq, s.d});
            Tensor dk = attn::test::poisoned(DType::f32, {33, s.hkv, s.d}), dv = attn::test::poisoned(DType::f32, {33, s.hkv, s.d});
            Tensor dsinks = attn::test::poisoned(DType::f32, {s.hq});
            const TensorView dsinks_view = dsinks;
            attn::SdpaReport report;
            const auto call = [&] {
                attn::sdpa_varlen_backward(s.q, s.k, s.v, s.cu_q, s.cu_k, out, lse, grad_out, opt, dq, dk, dv, &report,
                                           with_sinks ? &dsinks_view : nullptr);
            };
            call();  // once unrefused: what the process sets up once (sweep_forward_refusals says why)
            std::vector<std::string> names = {checks, " for cu_seqlens_q", " for cu_seqlens_k", " for the sequences' table",
                                              "sdpa_backward's argument checks and report text"};
            names.insert(names.end(), c.kernel.begin(), c.kernel.end());
            if (with_sinks) names.insert(names.end(), c.sinks.begin(), c.sinks.end());
            std::vector<int> named(names.size(), 0);
            std::string said;
            const std::vector<Tensor*> gradients = {&dq, &dk, &dv, &dsinks};
            for (Tensor* t : gradients) attn::test::poison(*t);
            const int failures = sweep(
                call,
                [&](long n) {
                    for (Tensor* t : gradients) {
                        EXPECT_TRUE(attn::test::still_poisoned(*t)) << "allocation " << n << ": " << said;
                        attn::test::poison(*t);
                    }
                },
                naming_one_of(names, named, said));
            EXPECT_GT(failures, 0) << "the call allocated nothing: the sweep tested nothing";
            for (std::size_t x = 0; x < names.size(); ++x) EXPECT_GT(named[x], 0) << "never refused: " << names[x];
            for (Tensor* t : {&dq, &dk, &dv}) EXPECT_FALSE(attn::test::still_poisoned(*t));
            EXPECT_EQ(attn::test::still_poisoned(dsinks), !with_sinks);
            EXPECT_NE(report.kernel.find(c.name), std::string::npos) << report.kernel;  // the kernel asked for ran
        }
}

// The flash backward sizes each thread's buffers inside its parallel region, where no exception
// may leave, and says a refusal after it. With Q and dO read in place (contiguous float32) it
// said "cannot allocate 0 bytes": it counted only the rows it copies.
TEST(AllocFailures, FlashBackwardSaysTheBytesOfAThreadsBuffers) {
    FlashBackwardCase c(50);
    const std::vector<std::string> per_thread = c.refusals("buffers of one thread", false);
    ASSERT_FALSE(per_thread.empty()) << "no refusal of the per-thread buffers was seen";
    for (const std::string& m : per_thread) {
        EXPECT_EQ(m.find("cannot allocate 0 bytes"), std::string::npos) << m;
        // At least the tiles: S, dP and P·drop (64 × 64 floats each) and the dK/dV rows.
        const long long bytes = std::stoll(m.substr(m.find("allocate ") + 9));
        EXPECT_GE(bytes, 3 * 64 * 64 * 4 + 2 * 64 * 16 * 4) << m;
    }
}

// A head of Q (or grad_out) read in place that holds a NaN or ±inf gets a zeroed copy, allocated
// by the task that meets it, inside the region: its refusal left the region and terminated the
// program ("terminate called after throwing an instance of 'std::bad_alloc'"). It is now an
// attn::OutOfMemory after the region, naming the copy and its bytes.
TEST(AllocFailures, FlashBackwardRefusedZeroedCopyIsOutOfMemoryNotTerminate) {
    FlashBackwardCase c(60, std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity());
    const std::vector<std::string> copies = c.refusals("NaN", true);
    ASSERT_EQ(copies.size(), 2u) << "a zeroed copy of Q's rows and one of grad_out's";
    EXPECT_NE(copies[0].find("Q rows"), std::string::npos) << copies[0];
    EXPECT_NE(copies[1].find("grad_out rows"), std::string::npos) << copies[1];
    for (const std::string& m : copies)  // one head (a group of 1) of 40 rows of 16 floats
        EXPECT_NE(m.find("cannot allocate 2560 bytes"), std::string::npos) << m;
}

// What a call said with aligned_alloc refused as `who` and `let_through` say, on a fresh
// std::thread of 2 OpenMP threads (a fresh team: the GEMM's per-thread buffers, kept from call
// to call, are not sized yet), and the bytes refused.
struct Said {
    std::string what = "no error";
    std::size_t refused = 0;
};

// `then`, if given, runs on the same thread after the refusals have stopped: the next call there.
Said refused_on_fresh_thread(Refuse who, int let_through, const std::function<void()>& call,
                             const std::function<void()>& then = {}) {
    Said s;
    std::thread([&] {
        omp_set_num_threads(2);
        g_refused_bytes = 0;
        g_let_through = let_through;
        g_refuse_aligned = who;
        try {
            call();
        } catch (const attn::OutOfMemory& e) {
            s.what = e.what();
        } catch (const std::exception& e) {
            s.what = std::string("not attn::OutOfMemory: ") + e.what();
        }
        g_refuse_aligned = Refuse::none;
        s.refused = g_refused_bytes;
        if (then) then();
    }).join();
    return s;
}

// `s` is an attn::OutOfMemory for `buffer` whose byte count is the first refused call's (which
// allocate_aligned_or_null rounded up to a multiple of its 64-byte alignment): the buffer that
// was refused is the one named, with its own size.
void expect_named(const Said& s, const std::string& buffer) {
    const std::string lead = "out of memory: cannot allocate ";
    ASSERT_EQ(s.what.rfind(lead, 0), 0u) << s.what;
    EXPECT_NE(s.what.find(" for " + buffer), std::string::npos) << s.what;
    const long long bytes = std::stoll(s.what.substr(lead.size()));
    EXPECT_GT(bytes, 0) << s.what;
    EXPECT_LE(static_cast<std::size_t>(bytes), s.refused) << s.what;
    EXPECT_LT(s.refused, static_cast<std::size_t>(bytes) + 64) << s.what;
}

// The staged outputs' buffers are aligned allocations of the calling thread, which the operator
// new sweeps above never refuse: each aligned allocation of a varlen call refused in turn (the
// reference kernel: every sequence staged) is attn::OutOfMemory, the staged buffer's refusal names
// it, and no refusal writes an output. The backward's staging lives in the buffer the process keeps
// between calls (head_major.hpp): released first, so that the call allocates it.
TEST(AllocFailures, SdpaVarlenStagingBuffersAreNamedAndWriteNothing) {
    const FourSequences s(27);
    const Tensor grad_out = random_f32({24, s.hq, s.d}, 30);
    attn::SdpaOptions opt;
    opt.impl = attn::Impl::reference;
    opt.causal = attn::Causal::bottom_right;
    Tensor out = attn::test::poisoned(DType::f32, {24, s.hq, s.d}), lse = attn::test::poisoned(DType::f32, {24, s.hq});
    Tensor dq = attn::test::poisoned(DType::f32, {24, s.hq, s.d});
    Tensor dk = attn::test::poisoned(DType::f32, {33, s.hkv, s.d}), dv = attn::test::poisoned(DType::f32, {33, s.hkv, s.d});
    const TensorView lse_view = lse;
    struct Call {
        const char* staging;  // the name of its staged outputs' buffer
        std::vector<Tensor*> outputs;
        std::function<void()> run;
    };
    const Call calls[] = {
        {"sdpa_varlen's staged out and lse of its decode and reference sequences", {&out, &lse},
         [&] { attn::sdpa_varlen(s.q, s.k, s.v, s.cu_q, s.cu_k, opt, out, &lse_view); }},
        {"sdpa_varlen_backward's staged dQ, dK, dV and head-major copies", {&dq, &dk, &dv}, [&] {
             attn::sdpa_varlen_backward(s.q, s.k, s.v, s.cu_q, s.cu_k, out, lse, grad_out, opt, dq, dk, dv);
         }}};
    for (const Call& c : calls) {
        SCOPED_TRACE(c.staging);
        int refusals = 0, named = 0;
        for (int let_through = 0; let_through < 1000; ++let_through) {
            for (Tensor* t : c.outputs) attn::test::poison(*t);
            attn::release_varlen_scratch();
            const Said said = refused_on_fresh_thread(Refuse::caller, let_through, c.run);
            if (said.what == "no error") break;
            ++refusals;
            EXPECT_EQ(said.what.rfind("out of memory: cannot allocate ", 0), 0u) << said.what;
            for (Tensor* t : c.outputs) EXPECT_TRUE(attn::test::still_poisoned(*t)) << said.what;
            if (said.what.find(c.staging) == std::string::npos) continue;
            ++named;
            expect_named(said, c.staging);
        }
        EXPECT_GT(refusals, 0);
        EXPECT_EQ(named, 1) << "the staged outputs are one allocation, refused once";
        for (Tensor* t : c.outputs) EXPECT_FALSE(attn::test::still_poisoned(*t));  // the call never refused
    }
}

// The MHA layer (E = 16, 2 heads, seq-first (L, B, E) = (5, 2, 16) queries, average weights):
// self-attention; cross-attention on a memory of 7 rows with a bool key_padding_mask and a bool
// attn_mask (combined into one keep mask); self-attention with bfloat16 intermediates; and
// self-attention with per-head weights (written by sdpa into the caller's tensor).
struct MhaCase {
    const char* name;
    bool cross;
    std::optional<DType> intermediate;
    std::vector<std::string> buffers;  // the layer's own buffers the call takes (each refused in turn)
    bool average = true;               // average_attn_weights
};

struct MhaCall {
    attn::MultiHeadAttention m{attn::MhaConfig{.embed_dim = 16, .num_heads = 2}};
    Tensor x = random_f32(Shape{5, 2, 16}, 110), mem = random_f32(Shape{7, 2, 16}, 111);
    Tensor kpm{DType::boolean, Shape{2, 7}}, mask{DType::boolean, Shape{5, 7}};
    attn::MhaForwardOptions opt;
    bool cross;
    Tensor out, weights;
    explicit MhaCall(const MhaCase& c) : cross(c.cross) {
        const auto state = random_state(m, 120);
        std::vector<std::pair<std::string, TensorView>> views;
        for (const auto& [n, t] : state) views.emplace_back(n, t.view());
        m.load_state_dict(views);
        for (std::int64_t j = 0; j < 14; ++j) kpm.data_as<bool>()[j] = j % 7 == 6;  // the last key of each item
        for (std::int64_t j = 0; j < 35; ++j) mask.data_as<bool>()[j] = j % 7 == 0 && j > 0;  // key 0, but for row 0
        if (cross) {
            opt.key_padding_mask = kpm.view();
            opt.attn_mask = mask.view();
        }
        opt.intermediate_dtype = c.intermediate;
        opt.average_attn_weights = c.average;
        out = attn::test::poisoned(DType::f32, Shape{5, 2, 16});
        weights = c.average ? attn::test::poisoned(DType::f32, Shape{2, 5, cross ? 7 : 5})
                            : attn::test::poisoned(DType::f32, Shape{2, 2, 5, cross ? 7 : 5});
    }
    const Tensor& kv() const { return cross ? mem : x; }
    void forward_into() {
        const TensorView wv = weights.view();
        m.forward_into(x, kv(), kv(), opt, out, &wv);
    }
};

// MultiHeadAttention::forward_into: each operator new of the call refused in turn, on one thread,
// is attn::OutOfMemory naming what it was for — the layer's checks and masks as one step before
// anything is written (25 of a sweep of the self-attention case were a bare std::bad_alloc: the
// checks' lists and strings, each workspace Tensor's description), and sdpa's own — and then
// each aligned allocation of the calling thread (the layer's buffers, the GEMM's), each an
// attn::OutOfMemory naming its buffer; the output and the weights stay poisoned on every refusal.
TEST(AllocFailures, MhaForwardIntoRefusalsAreOutOfMemoryAndWriteNothing) {
    const std::string bookkeeping = "the few hundred bytes for the MHA layer's argument checks and masks; nothing was written";
    const std::string o = "the MHA layer's attention output O", per_head = "the MHA layer's per-head attention weights";
    for (const MhaCase& c :
         {MhaCase{"self-attention", false, std::nullopt, {o, per_head, "the MHA layer's projected Q, K and V"}},
          MhaCase{"cross-attention with both masks", true, std::nullopt,
                  {o, per_head, "the MHA layer's keep mask", "the MHA layer's projected Q", "the MHA layer's projected K and V"}},
          MhaCase{"bfloat16 intermediates", false, DType::bf16,
                  {o, per_head, "the MHA layer's projected Q, K and V", "the MHA layer's 16-bit projections"}},
          MhaCase{"per-head weights", false, std::nullopt, {o, "the MHA layer's projected Q, K and V"}, false}}) {
        SCOPED_TRACE(c.name);
        MhaCall call(c);
        {
            const attn::ScopedNumThreads one(1);
            sweep_forward_refusals([&] { call.forward_into(); }, call.out, call.weights,
                                   {bookkeeping, "sdpa's argument checks and report text",
                                    " for the flash kernel's list of problems"});
        }
        const std::vector<unsigned char> want(static_cast<const unsigned char*>(call.out.data()),
                                              static_cast<const unsigned char*>(call.out.data()) + call.out.nbytes());
        std::vector<int> named(c.buffers.size(), 0);
        int refusals = 0;
        for (int let_through = 0; let_through < 1000; ++let_through) {
            SCOPED_TRACE("refused after " + std::to_string(let_through) + " aligned allocations");
            attn::test::poison(call.out);
            attn::test::poison(call.weights);
            const Said s = refused_on_fresh_thread(Refuse::caller, let_through, [&] { call.forward_into(); });
            if (s.what == "no error") {
                EXPECT_EQ(std::memcmp(call.out.data(), want.data(), want.size()), 0);
                break;
            }
            ++refusals;
            EXPECT_EQ(s.what.rfind("out of memory: cannot allocate ", 0), 0u) << s.what;
            EXPECT_TRUE(attn::test::still_poisoned(call.out)) << s.what;
            EXPECT_TRUE(attn::test::still_poisoned(call.weights)) << s.what;
            for (std::size_t x = 0; x < c.buffers.size(); ++x) {
                if (s.what.find(" for " + c.buffers[x]) == std::string::npos) continue;
                ++named[x];
                expect_named(s, c.buffers[x]);
            }
        }
        EXPECT_GT(refusals, 0);
        for (std::size_t x = 0; x < c.buffers.size(); ++x) EXPECT_GT(named[x], 0) << "never refused: " << c.buffers[x];
    }
}

// MultiHeadAttention::forward, which allocates the tensors it returns: each operator new refused
// in turn is attn::OutOfMemory (the sweep above, inside), and the returned tensors' own refusals
// name them — the output first, then the weights.
TEST(AllocFailures, MhaForwardRefusalsAreOutOfMemoryNamingTheReturnedTensors) {
    MhaCall call(MhaCase{"self-attention", false, std::nullopt, {}});
    {
        const attn::ScopedNumThreads one(1);
        (void)call.m.forward(call.x, call.x, call.x, call.opt);
        int failures = sweep([&] { (void)call.m.forward(call.x, call.x, call.x, call.opt); }, [](long) {},
                             [&](const std::bad_alloc& e) { expect_out_of_memory(e); });
        EXPECT_GT(failures, 0);
    }
    const char* const returned[] = {"the MHA layer's output (float32) of shape (5, 2, 16)",
                                    "the MHA layer's attention weights (float32) of shape (2, 5, 5)"};
    for (int let_through = 0; let_through < 2; ++let_through) {
        const Said s = refused_on_fresh_thread(Refuse::caller, let_through,
                                               [&] { (void)call.m.forward(call.x, call.x, call.x, call.opt); });
        expect_named(s, returned[let_through]);
    }
}

// The MHA layer copies an input the projection GEMM cannot read in place (strided, or float64)
// into contiguous rows (projection.hpp, as_rows): a refusal of that copy names it — which
// argument, and why it is copied — where it said "a tensor". Self-attention on a strided view:
// query is copied, and key and value are that copy.
TEST(AllocFailures, MhaInputCopyRefusalNamesTheArgument) {
    MhaCall call(MhaCase{"self-attention", false, std::nullopt, {}});
    const Tensor batch_first = random_f32(Shape{2, 5, 16}, 160);
    const TensorView x = batch_first.view().transpose(0, 1);  // (5, 2, 16) seq-first, not contiguous
    const std::string copy = "the MHA layer's copy of query, strided or float64, as the contiguous rows its projection GEMM reads";
    int named = 0;
    for (int let_through = 0; let_through < 1000; ++let_through) {
        attn::test::poison(call.out);
        const Said s = refused_on_fresh_thread(Refuse::caller, let_through, [&] {
            const TensorView wv = call.weights.view();
            call.m.forward_into(x, x, x, call.opt, call.out, &wv);
        });
        if (s.what == "no error") break;
        EXPECT_TRUE(attn::test::still_poisoned(call.out)) << s.what;
        EXPECT_EQ(s.what.find("a tensor"), std::string::npos) << s.what;
        if (s.what.find(copy) == std::string::npos) continue;
        ++named;
        expect_named(s, copy + " (float32) of shape (5, 2, 16)");
    }
    EXPECT_EQ(named, 1) << "the copy of query is one allocation, refused once";
}

// MultiHeadAttention::forward_incremental_into, one new token of 2 sequences after 5 in the
// cache: each operator new refused in turn, on one thread, is attn::OutOfMemory naming what it
// was for (its checks as one step, the lengths it restores, decode_attention's own), the output
// stays poisoned and the cache keeps its 5 tokens (a refusal after the append takes it back).
TEST(AllocFailures, MhaForwardIncrementalRefusalsAreOutOfMemoryAndChangeNothing) {
    const attn::ScopedNumThreads one(1);
    MhaCall layer(MhaCase{"incremental", false, std::nullopt, {}});
    attn::KVCache cache(attn::KVCacheConfig{.batch = 2, .kv_heads = 2, .head_dim = 8, .capacity = 64});
    (void)layer.m.forward_incremental(layer.x, cache);  // 5 tokens; the process's one-time set-up
    const Tensor step = random_f32(Shape{1, 2, 16}, 140);
    Tensor out = attn::test::poisoned(DType::f32, Shape{1, 2, 16});
    const auto call = [&] { layer.m.forward_incremental_into(step, cache, out); };
    call();  // this shape's set-up outside the sweep, then back to 5 tokens
    for (std::int64_t b = 0; b < 2; ++b) cache.truncate(b, 5);
    attn::test::poison(out);
    const std::vector<std::string> names = {
        "the few hundred bytes for the MHA layer's forward_incremental argument checks; nothing was written",
        " for the cache's lengths before the step",
        "the few hundred bytes for decode_attention's argument checks and the cache's lengths; nothing was written",
        " for the decode kernel's key interval of every query row",
        " for the decode kernel's scratch (one per thread) and split partials"};
    std::vector<int> named(names.size(), 0);
    std::string said;
    const int failures = sweep(
        call,
        [&](long n) {
            EXPECT_TRUE(attn::test::still_poisoned(out)) << "allocation " << n << ": " << said;
            EXPECT_EQ(cache.length(0), 5) << "allocation " << n << ": " << said;
            EXPECT_EQ(cache.length(1), 5) << "allocation " << n << ": " << said;
        },
        naming_one_of(names, named, said));
    EXPECT_GT(failures, 0);
    for (std::size_t x = 0; x < names.size(); ++x) EXPECT_GT(named[x], 0) << "never refused: " << names[x];
    EXPECT_EQ(cache.length(0), 6);
    EXPECT_FALSE(attn::test::still_poisoned(out));
}

// MultiHeadAttention::forward_packed, two sequences of 3 and 4 tokens: each operator new of the
// call refused in turn, on one thread, is attn::OutOfMemory naming what it was for — the layer's
// checks, sdpa_varlen's (its lists and report text: 27 were a bare std::bad_alloc), cu_seqlens'
// copies, the decode kernel's buffers — and then each aligned allocation of the calling thread is
// attn::OutOfMemory naming its buffer (the layer's O, Q, K, V and output, the GEMM's).
TEST(AllocFailures, MhaForwardPackedRefusedBuffersAreNamed) {
    MhaCall layer(MhaCase{"packed", false, std::nullopt, {}});
    const Tensor x = random_f32(Shape{7, 16}, 150);
    Tensor cu(DType::i32, Shape{3});
    cu.data_as<std::int32_t>()[0] = 0, cu.data_as<std::int32_t>()[1] = 3, cu.data_as<std::int32_t>()[2] = 7;
    const attn::MhaPackedOptions opt;
    const auto call = [&] { (void)layer.m.forward_packed(x, x, x, cu, cu, opt); };
    call();
    {
        const attn::ScopedNumThreads one(1);
        const std::vector<std::string> names = {
            "the few hundred bytes for MultiHeadAttention.forward_packed's argument checks; nothing was written",
            "the few hundred bytes for sdpa_varlen's argument checks and report text; nothing was written",
            " for cu_seqlens_q", " for cu_seqlens_k", " for the sequences' table",
            " for the decode kernel's key interval of every query row",  // 3 and 4 queries: auto runs decode
            " for the decode kernel's scratch (one per thread) and split partials"};
        std::vector<int> named(names.size(), 0);
        std::string said;
        EXPECT_GT(sweep(call, [](long) {}, naming_one_of(names, named, said)), 0);
        for (std::size_t i = 0; i < names.size(); ++i) EXPECT_GT(named[i], 0) << "never refused: " << names[i];
    }
    const std::vector<std::string> buffers = {"the MHA layer's attention output O", "the MHA layer's projected Q",
                                              "the MHA layer's projected K", "the MHA layer's projected V",
                                              "the MHA layer's output"};
    std::vector<int> named(buffers.size(), 0);
    int refusals = 0;
    for (int let_through = 0; let_through < 1000; ++let_through) {
        const Said s = refused_on_fresh_thread(Refuse::caller, let_through, call);
        if (s.what == "no error") break;
        ++refusals;
        EXPECT_EQ(s.what.rfind("out of memory: cannot allocate ", 0), 0u) << s.what;
        for (std::size_t i = 0; i < buffers.size(); ++i) {
            if (s.what.find(" for " + buffers[i]) == std::string::npos) continue;
            ++named[i];
            expect_named(s, buffers[i]);
        }
    }
    EXPECT_GT(refusals, 0);
    for (std::size_t i = 0; i < buffers.size(); ++i) EXPECT_GT(named[i], 0) << "never refused: " << buffers[i];
}

// attn::paged_attention, the same sweep on two sequences of a paged cache (10 and 7 positions,
// group 2), through the decode kernel (1 query) and the flash kernel (impl = flash, 6 queries):
// its checks, the choice of a kernel and the list of decode blocks are bookkeeping (they were a
// bare std::bad_alloc), the sequences' lengths and page tables and the kernels' buffers are named,
// and `out` and `lse` are not written.
TEST(AllocFailures, PagedAttentionWritesNothingWhenAnAllocationFails) {
    const attn::ScopedNumThreads one(1);
    PagedKVCache cache(small_pool());
    const PagedKVCache::SeqId a = cache.add_sequence(), b = cache.add_sequence();
    const Tensor ka = random_f32(Shape{2, 10, 4}, 130), kb = random_f32(Shape{2, 7, 4}, 131);
    cache.append(a, ka, ka);
    cache.append(b, kb, kb);
    const std::vector<PagedKVCache::SeqId> seqs{a, b};  // made here: the sweep refuses the call's allocations only
    const std::string checks =
        "the few hundred bytes for paged_attention's argument checks and the sequences' page tables; nothing was written";
    struct Case {
        const char* name;
        attn::Impl impl;
        std::int64_t lq;
        std::vector<std::string> kernel;
    };
    for (const Case& c : {Case{"decode", attn::Impl::automatic, 1,
                               {" for the decode kernel's key interval of every query row",
                                " for the decode kernel's scratch (one per thread) and split partials"}},
                          Case{"flash", attn::Impl::flash, 6, {" for the flash kernel's list of problems"}}}) {
        SCOPED_TRACE(c.name);
        const Tensor q = random_f32(Shape{2, 4, c.lq, 4}, 132);
        Tensor out = attn::test::poisoned(DType::f32, Shape{2, 4, c.lq, 4});
        Tensor lse = attn::test::poisoned(DType::f32, Shape{2, 4, c.lq});
        const TensorView lse_view = lse;
        attn::SdpaOptions step;
        step.causal = attn::Causal::bottom_right;
        step.impl = c.impl;
        std::vector<std::string> names = {checks, " for the lengths of seqs", " for the page tables of seqs"};
        names.insert(names.end(), c.kernel.begin(), c.kernel.end());
        sweep_forward_refusals([&] { attn::paged_attention(q, cache, seqs, step, out, &lse_view); }, out, lse, names);
    }
}

// The GEMM's operands, float32 or bfloat16 (with bfloat16 A and B the pair kernel runs where the
// row and the CPU have it: another instance of the driver).
struct GemmOperands {
    static constexpr std::int64_t N = 256, K = 300, kMaxM = 64;
    Tensor a = random_f32(Shape{kMaxM, K}, 70), b = random_f32(Shape{K, N}, 71);
    Tensor a16 = attn::to_dtype(a.view(), DType::bf16), b16 = attn::to_dtype(b.view(), DType::bf16);
    attn::detail::GemmArgs args(std::int64_t M, bool bf16, std::vector<float>& c) const {
        attn::detail::GemmArgs g;
        g.M = M, g.N = N, g.K = K;
        g.A = a.data_as<const float>(), g.lda = K, g.B = b.data_as<const float>(), g.ldb = N, g.C = c.data(), g.ldc = N;
        if (bf16) {
            g.a16 = g.b16 = attn::detail::GemmHalf::bf16;
            g.A16 = a16.data_as<const std::uint16_t>(), g.B16 = b16.data_as<const std::uint16_t>();
        }
        return g;
    }
};

// Every buffer the GEMM takes for a call, refused in turn: the packing buffer of op(A) (each
// thread's, inside the parallel region) and of op(B) — the block its threads share, taken by the
// calling thread before the region, or with M <= 4 each thread's own sliver, taken inside it. A
// refusal inside the region left it as attn::OutOfMemory and ended the program (std::terminate):
// the thread refused computes nothing, the calling thread computes its share and meets the
// barriers, and the refusal is an attn::OutOfMemory after the region naming the buffer refused
// and its bytes. The next call on that thread allocates again and gets the bits of a call that
// was never refused. (Only op(A)'s buffer was tested: one slot's message for the other's would
// have passed.)
TEST(AllocFailures, GemmRefusedPackingBufferIsOutOfMemoryNotTerminate) {
    const GemmOperands ops;
    struct Case {
        std::int64_t M;
        Refuse who;
        int let_through;
        const char* buffer;
    };
    const std::string a_buf = "the GEMM's packing buffer of op(A)'s panels (one per thread)";
    const std::string b_buf = "the GEMM's packing buffer of op(B)'s panels";
    const Case cases[] = {
        {1, Refuse::workers, 0, a_buf.c_str()},    // few rows: the worker's op(A) rows
        {1, Refuse::workers, 1, b_buf.c_str()},    // few rows: the worker's B sliver, after its op(A) buffer
        {64, Refuse::workers, 0, a_buf.c_str()},   // blocked: the worker's op(A) panels
        {64, Refuse::caller, 0, b_buf.c_str()},    // blocked: the shared op(B) block, before the region
    };
    for (const attn::detail::KernelSet* row : attn::detail::runnable_kernel_sets()) {
        for (const bool bf16 : {false, true}) {
            for (const Case& c : cases) {
                SCOPED_TRACE(std::string(attn::detail::isa_name(row->isa)) + (bf16 ? " bf16" : " f32") +
                             " M = " + std::to_string(c.M) + ", refused: " + c.buffer);
                std::vector<float> want(static_cast<std::size_t>(c.M * GemmOperands::N)), refused(want.size()),
                    after(want.size());
                attn::detail::sgemm(*row, ops.args(c.M, bf16, want));
                const Said s = refused_on_fresh_thread(
                    c.who, c.let_through, [&] { attn::detail::sgemm(*row, ops.args(c.M, bf16, refused)); },
                    [&] { attn::detail::sgemm(*row, ops.args(c.M, bf16, after)); });  // the same threads, again
                expect_named(s, c.buffer);
                EXPECT_EQ(std::memcmp(after.data(), want.data(), want.size() * sizeof(float)), 0);
            }
        }
    }
}

// A weight packed once (PackedB: its float32 panels, and for a bfloat16 B on a row and CPU with
// the pair kernel its pair panels too), refused: attn::OutOfMemory naming it and the bytes of
// the panels refused.
TEST(AllocFailures, GemmRefusedPackedWeightIsOutOfMemory) {
    const GemmOperands ops;
    std::vector<float> c(static_cast<std::size_t>(GemmOperands::N));
    for (const attn::detail::KernelSet* row : attn::detail::runnable_kernel_sets()) {
        for (const bool bf16 : {false, true}) {
            const attn::detail::GemmArgs g = ops.args(1, bf16, c);
            const bool pairs = bf16 && attn::detail::pack_b(*row, g).pair_panels() != nullptr;
            for (int let_through = 0; let_through < (pairs ? 2 : 1); ++let_through) {
                SCOPED_TRACE(std::string(attn::detail::isa_name(row->isa)) + (bf16 ? " bf16" : " f32") +
                             (let_through == 1 ? ": the pair panels" : ": the panels"));
                expect_named(refused_on_fresh_thread(Refuse::caller, let_through, [&] { attn::detail::pack_b(*row, g); }),
                             "a packed GEMM weight");
            }
        }
    }
}

// A flash backward whose keys are split into chunks: B·Hkv = 1 (two query heads sharing one KV
// head) and 197 keys, 4 key blocks of 64. backward_chunks asks for split_target(8) / (B·Hkv) >= 8
// chunks on any machine and at most one per key block: 4 chunks whatever the CPU count (this
// VM's 2 CPUs, a 2-core Zen 3, 64 cores), and each chunk sums its dQ in its own partials
// (DqPartials: allocated by the calling thread before the region, kept for its next call). A
// bottom-right causal mask (Lq < Lk: the tasks skip different tiles), odd head dims (Dk 20, padded
// to 24) and sinks (their gradient reads every row's D, kept by the first chunk's tasks).
struct ChunkedBackwardCase {
    static constexpr std::int64_t kHq = 2, kLq = 37, kLk = 197, kDk = 20, kDkp = 24, kDv = 12;
    static constexpr std::int64_t kChunks = 4;                        // 197 keys: 4 blocks of 64
    static constexpr std::int64_t kPartialFloats = kHq * kLq * kDkp;  // one chunk's: B·Hq·Lq·Dkp
    Tensor q, k, v, dout, sinks;
    attn::SdpaOptions opt;
    attn::SdpaReport report;  // the call makes its text too: a refusal there must come before the kernel writes
    Tensor o{DType::f32, Shape{1, kHq, kLq, kDv}}, lse{DType::f32, Shape{1, kHq, kLq}};
    Tensor dq{DType::f32, Shape{1, kHq, kLq, kDk}}, dk{DType::f32, Shape{1, 1, kLk, kDk}}, dv{DType::f32, Shape{1, 1, kLk, kDv}},
        dsinks{DType::f32, Shape{kHq}};
    explicit ChunkedBackwardCase(std::uint64_t seed)
        : q(random_f32(Shape{1, kHq, kLq, kDk}, seed)), k(random_f32(Shape{1, 1, kLk, kDk}, seed + 1)),
          v(random_f32(Shape{1, 1, kLk, kDv}, seed + 2)), dout(random_f32(Shape{1, kHq, kLq, kDv}, seed + 3)),
          sinks(random_f32(Shape{kHq}, seed + 4)) {
        opt.impl = attn::Impl::flash;
        opt.causal = attn::Causal::bottom_right;
        opt.sinks = sinks.view();
        const TensorView lv = lse.view();
        attn::sdpa(q, k, v, opt, o, &lv);
    }
    void backward() {
        const TensorView ds = dsinks.view();
        attn::sdpa_backward(q, k, v, o, lse, dout, opt, dq, dk, dv, &report, &ds);
    }
    void poison_gradients() {
        for (const Tensor* g : {&dq, &dk, &dv, &dsinks}) attn::test::poison(g->view());
    }
    bool gradients_poisoned() const {
        return attn::test::still_poisoned(dq) && attn::test::still_poisoned(dk) && attn::test::still_poisoned(dv) &&
               attn::test::still_poisoned(dsinks);
    }
    std::vector<unsigned char> gradient_bits() const {
        std::vector<unsigned char> all;
        for (const Tensor* g : {&dq, &dk, &dv, &dsinks}) {
            const auto* b = static_cast<const unsigned char*>(g->data());
            all.insert(all.end(), b, b + g->nbytes());
        }
        return all;
    }
    // The gradients of a call on a fresh thread of `threads` OpenMP threads (nothing kept from an
    // earlier call there), never refused.
    std::vector<unsigned char> fresh_bits(int threads) {
        std::thread([&] {
            const attn::ScopedNumThreads n(threads);
            poison_gradients();
            backward();
        }).join();
        return gradient_bits();
    }
};

// Each allocation of c.backward() refused in turn (sweep): every refusal is attn::OutOfMemory
// (expect_out_of_memory) and leaves the poisoned gradients unwritten; `inspect` reads each message.
void sweep_backward_refusals(ChunkedBackwardCase& c, const std::function<void(const std::string&)>& inspect = {}) {
    int out_of_memory = 0;
    std::string said;
    c.poison_gradients();
    const int failures = sweep(
        [&] { c.backward(); },
        [&](long n) {
            EXPECT_TRUE(c.gradients_poisoned()) << "allocation " << n << ": " << said;
            c.poison_gradients();
        },
        [&](const std::bad_alloc& e) {
            said = e.what();
            out_of_memory += dynamic_cast<const attn::OutOfMemory*>(&e) != nullptr;
            expect_out_of_memory(e);
            if (inspect) inspect(said);
        });
    EXPECT_GT(failures, 0);
    EXPECT_EQ(out_of_memory, failures) << "a refusal was a bare std::bad_alloc";
}

// Every allocation of a several-chunk backward refused in turn — the calling thread's (the dQ
// partials among them), then a worker thread's inside the region — is an attn::OutOfMemory naming
// the buffer (and its bytes: all but the checks' and the report's few hundred bytes, which were a
// bare std::bad_alloc), never std::terminate;
// dq, dk, dv and dsinks are not written (the call sizes every buffer before it writes; no NaN or
// ±inf here, so no task sizes a copy); and the next call on that thread, which reuses whatever the
// refused call kept (its partials, its threads' buffers), gives the bits of a call never refused.
TEST(AllocFailures, FlashBackwardSeveralChunksRefusalsWriteNothingAndLeaveNothingStale) {
    ChunkedBackwardCase c(80);
    using Case = ChunkedBackwardCase;
    ASSERT_EQ(attn::detail::backward_chunks(1, Case::kChunks, Case::kPartialFloats, attn::detail::split_target(8)),
              Case::kChunks)
        << "the shape no longer makes several chunks: this test would not reach the dQ partials";
    const std::vector<unsigned char> want = c.fresh_bits(1);
    ASSERT_EQ(c.report.kernel.rfind("flash-backward", 0), 0u) << c.report.kernel;
    EXPECT_EQ(c.fresh_bits(2), want);  // the same bits on 2 threads (the chunks do not follow the threads)

    // Each aligned_alloc of the calling thread outside the region (the dQ partials) in turn, then
    // each of the worker's inside it (its CacheLineVector buffers), on a fresh thread each time;
    // `then` checks the refused call wrote nothing and reruns it on the same thread.
    int partials_refused = 0;
    for (const Refuse who : {Refuse::caller, Refuse::workers}) {
        int refusals = 0;
        for (int let_through = 0; let_through < 1000; ++let_through) {
            SCOPED_TRACE(std::string(who == Refuse::caller ? "caller" : "worker") + ", refused after " +
                         std::to_string(let_through) + " aligned allocations");
            bool poisoned = false;
            std::vector<unsigned char> after;
            c.poison_gradients();
            const Said s = refused_on_fresh_thread(
                who, let_through,
                [&] {
                    const attn::ScopedNumThreads two(2);
                    c.backward();
                },
                [&] {
                    poisoned = c.gradients_poisoned();
                    const attn::ScopedNumThreads two(2);
                    c.poison_gradients();
                    c.backward();
                    after = c.gradient_bits();
                });
            if (s.what == "no error") break;
            ++refusals;
            EXPECT_TRUE(poisoned) << s.what;
            EXPECT_EQ(after, want) << s.what;
            if (s.what.find("dQ partials") != std::string::npos) {
                ++partials_refused;
                EXPECT_EQ(s.refused, sizeof(float) * Case::kChunks * Case::kPartialFloats) << s.what;
                expect_named(s, "the flash backward's dQ partials (one per chunk of key blocks)");
            } else {  // a worker's buffer: the message says the bytes of all of a thread's buffers
                const std::string lead = "out of memory: cannot allocate ";
                ASSERT_EQ(s.what.rfind(lead, 0), 0u) << s.what;
                EXPECT_NE(s.what.find("the flash backward's buffers of one thread"), std::string::npos) << s.what;
                EXPECT_GE(std::stoull(s.what.substr(lead.size())), s.refused) << s.what;
            }
        }
        EXPECT_GT(refusals, 0) << (who == Refuse::caller ? "caller" : "worker") << ": nothing was refused";
    }
    EXPECT_EQ(partials_refused, 1) << "the dQ partials are one allocation, refused once";

    // Each operator new of the call in turn, on one thread (its region inactive, so the injection
    // reaches the buffers sized inside it), after a call on other inputs has left its values in
    // the partials and buffers this thread keeps.
    std::thread([&] {
        const attn::ScopedNumThreads one(1);
        ChunkedBackwardCase other(90);
        other.backward();
        sweep_backward_refusals(c);
        EXPECT_EQ(c.gradient_bits(), want);
    }).join();
}

// The reference backward (impl = reference, or float64 inputs) on the same chunked case: each
// allocation refused in turn — the checks' and the report's, the reference's per-thread buffers,
// its sink gradients — is attn::OutOfMemory naming what it could not allocate (the checks and the
// report text, the sink gradients and the list of per-thread buffers were bare std::bad_alloc), and
// no gradient is written; a call never refused then gives the gradients of a call on a fresh thread.
TEST(AllocFailures, ReferenceBackwardRefusalsAreOutOfMemoryAndWriteNothing) {
    ChunkedBackwardCase c(100);
    c.opt.impl = attn::Impl::reference;
    const std::vector<unsigned char> want = c.fresh_bits(1);
    ASSERT_EQ(c.report.kernel, "reference-backward");
    std::thread([&] {
        const attn::ScopedNumThreads one(1);
        int bookkeeping = 0, named_buffers = 0;
        sweep_backward_refusals(c, [&](const std::string& said) {
            bookkeeping += said.find("sdpa_backward's argument checks and report text; nothing was written") != std::string::npos;
            named_buffers += said.find("the reference backward's") != std::string::npos;
        });
        EXPECT_GT(bookkeeping, 0) << "no refusal of the checks' or the report's allocations was seen";
        EXPECT_EQ(named_buffers, 2) << "the sink gradients and the list of per-thread buffers, one refusal each";
        EXPECT_EQ(c.gradient_bits(), want);
    }).join();
}

// safetensors: reading and writing a header allocate all along (names, the JSON text, messages).
// Out of memory anywhere is std::bad_alloc — never std::terminate, which a header parsed into
// (or written through) a nlohmann::json document gave when the document's destructor, which
// allocates, failed — and a failed write leaves the target as it was, with no staging file.
std::string file_bytes(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::vector<std::string> listing(const std::filesystem::path& dir) {
    std::vector<std::string> names;
    for (const auto& e : std::filesystem::directory_iterator(dir)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
}

struct SafetensorsDir {
    std::filesystem::path dir = std::filesystem::temp_directory_path() / ("attn_alloc_st_" + std::to_string(::getpid()));
    SafetensorsDir() { std::filesystem::create_directories(dir); }
    ~SafetensorsDir() { std::filesystem::remove_all(dir); }
    std::string path(const char* name) const { return (dir / name).string(); }
};

// Tensors whose header has what a writer escapes and a reader unescapes: quotes, a newline,
// non-ASCII; a strided view, a kept float16, integers, metadata.
struct SafetensorsCase {
    Tensor a = random_f32(Shape{3, 4}, 40);
    Tensor h = attn::to_dtype(random_f32(Shape{2, 2}, 41), DType::f16);
    Tensor i = Tensor(DType::i64, Shape{5});
    std::vector<std::pair<std::string, TensorView>> views() const {
        return {{"a_t", a.view().transpose(0, 1)}, {"h \"half\"\n", h.view()}, {"\xc3\xa9", i.view()}};
    }
    std::map<std::string, std::string> metadata{{"format", "pt"}, {"note", "line\none"}};
};

TEST(AllocFailures, SafetensorsReadGivesBadAllocNeverTerminate) {
    const SafetensorsDir d;
    const SafetensorsCase c;
    const std::string path = d.path("w.safetensors");
    attn::write_safetensors(path, c.views(), c.metadata, true);
    const std::string image = file_bytes(path);
    const auto same_file = [&](long n) { EXPECT_EQ(file_bytes(path), image) << "allocation " << n; };
    EXPECT_GT(sweep([&] { (void)attn::read_safetensors(path); }, same_file), 0);
    EXPECT_GT(sweep([&] { (void)attn::read_safetensors_tensor(path, "\xc3\xa9"); }, same_file), 0);
    EXPECT_GT(sweep([&] { (void)attn::parse_safetensors(image.data(), image.size(), "image"); }, [](long) {}), 0);
    const attn::SafetensorsFile f = attn::read_safetensors(path);
    ASSERT_EQ(f.tensors.size(), 3u);
    EXPECT_EQ(f.metadata, c.metadata);
    EXPECT_EQ(f.find("h \"half\"\n")->dtype(), DType::f16);

    // Malformed headers: out of memory while the error is made is std::bad_alloc too.
    for (const std::string header : {R"({"a": {"dtype": {"x": [1, "y"]}, "shape": [1], "data_offsets": [0, 4]}})",
                                     R"({"a": {"dtype": "F32", "shape": [[1]], "data_offsets": [0, 4]}})",
                                     R"({"__metadata__": {"k": "v", "k": "w"}})", R"({"a": [1, {"b": 2}], "c": 3)"}) {
        std::string bad(8, '\0');
        bad[0] = static_cast<char>(header.size());
        bad += header + std::string(4, '\0');
        std::string error;
        const auto refuse = [&] {
            try {
                (void)attn::parse_safetensors(bad.data(), bad.size(), "bad");
            } catch (const attn::Error& e) {
                error = e.what();
            }
        };
        EXPECT_GT(sweep(refuse, [](long) {}), 0) << header;
        EXPECT_EQ(error.rfind("bad: ", 0), 0u) << header << ": " << error;
    }
}

TEST(AllocFailures, SafetensorsWriteLeavesNothingHalfWritten) {
    const SafetensorsDir d;
    const SafetensorsCase c;
    const std::string ref = d.path("ref.safetensors"), out = d.path("out.safetensors");
    attn::write_safetensors(ref, c.views(), c.metadata, true);
    const auto write = [&] { attn::write_safetensors(out, c.views(), c.metadata, true); };

    const std::vector<std::string> before = listing(d.dir);  // ref.safetensors alone
    EXPECT_GT(sweep(write, [&](long n) { EXPECT_EQ(listing(d.dir), before) << "allocation " << n; }), 0);
    EXPECT_EQ(file_bytes(out), file_bytes(ref));

    // Over an existing file: it stays the old file, whole, until the new one is complete.
    attn::write_safetensors(out, {{"old", c.a.view()}});
    const std::string old = file_bytes(out);
    const std::vector<std::string> with_old = listing(d.dir);
    EXPECT_GT(sweep(write, [&](long n) {
                  EXPECT_EQ(listing(d.dir), with_old) << "allocation " << n;
                  EXPECT_EQ(file_bytes(out), old) << "allocation " << n;
              }),
              0);
    EXPECT_EQ(file_bytes(out), file_bytes(ref));
}

}  // namespace
