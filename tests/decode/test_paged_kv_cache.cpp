// PagedKVCache and paged_attention:
//   * bit-identical to decode_attention on a contiguous KVCache holding the same tokens, for
//     random page sizes, storages, GQA, lengths, forks and truncations, on every kernel row;
//   * fork is copy-on-write: neither side ever sees the other's later tokens, pages are
//     shared until written;
//   * chunked prefill (Lq > 16, or group·Lq filling one flash panel, two with float32 K/V):
//     through flash on the pages of any pool, bit-identical to flash on the contiguous cache;
//     both paths (flash, decode blocks) against the double reference, the decode blocks for
//     every mask kind, alignment and modifier;
//   * pool exhaustion and every bad argument: a clear attn::Error, nothing changed/written.
// The oracle side keeps each sequence's tokens in a plain "shadow" tensor list written by the
// test, independent of the page bookkeeping under test.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "attn/decode.hpp"
#include "attn/error.hpp"
#include "attn/kv_cache.hpp"
#include "attn/paged_kv_cache.hpp"
#include "decode/decode_util.hpp"
#include "kernels/decode/decode.hpp"
#include "kernels/flash/flash.hpp"
#include "kernels/isa.hpp"
#include "kv_cache/paged_layout.hpp"
#include "sdpa/problem.hpp"

namespace attn::test {
namespace {

using SeqId = PagedKVCache::SeqId;

// The tokens of one sequence, as the test wrote them: rows of (Hkv, ·, D) float32.
struct Shadow {
    std::vector<std::vector<float>> k, v;  // per token: Hkv·Dk / Hkv·Dv values
};

struct World {
    PagedKVCacheConfig cfg;
    PagedKVCache cache;
    std::map<SeqId, Shadow> shadow;
    explicit World(const PagedKVCacheConfig& c) : cfg(c), cache(c) { cfg.value_dim = cache.value_dim(); }
};

void append_random(World& w, SeqId s, std::int64_t T, std::mt19937& rng) {
    const Tensor k = random_f32(Shape{w.cfg.kv_heads, T, w.cfg.head_dim}, rng);
    const Tensor v = random_f32(Shape{w.cfg.kv_heads, T, w.cfg.value_dim}, rng);
    w.cache.append(s, k, v);
    Shadow& sh = w.shadow[s];
    for (std::int64_t t = 0; t < T; ++t) {
        std::vector<float> kr, vr;
        for (std::int64_t h = 0; h < w.cfg.kv_heads; ++h) {
            for (std::int64_t d = 0; d < w.cfg.head_dim; ++d) kr.push_back(static_cast<float>(at(k, h, t, d)));
            for (std::int64_t d = 0; d < w.cfg.value_dim; ++d) vr.push_back(static_cast<float>(at(v, h, t, d)));
        }
        sh.k.push_back(kr);
        sh.v.push_back(vr);
    }
}

// A contiguous KVCache with batch row b = sequence ids[b]'s shadow tokens.
KVCache contiguous(const World& w, const std::vector<SeqId>& ids) {
    std::int64_t cap = 1;
    for (SeqId s : ids) cap = std::max<std::int64_t>(cap, static_cast<std::int64_t>(w.shadow.at(s).k.size()));
    KVCacheConfig c;
    c.batch = static_cast<std::int64_t>(ids.size());
    c.kv_heads = w.cfg.kv_heads;
    c.head_dim = w.cfg.head_dim;
    c.value_dim = w.cfg.value_dim;
    c.capacity = cap;
    c.storage = w.cfg.storage;
    KVCache kv(c);
    for (std::size_t b = 0; b < ids.size(); ++b) {
        const Shadow& sh = w.shadow.at(ids[b]);
        const auto T = static_cast<std::int64_t>(sh.k.size());
        if (T == 0) continue;
        Tensor k(DType::f32, Shape{c.kv_heads, T, c.head_dim}), v(DType::f32, Shape{c.kv_heads, T, c.value_dim});
        for (std::int64_t t = 0; t < T; ++t)
            for (std::int64_t h = 0; h < c.kv_heads; ++h) {
                for (std::int64_t d = 0; d < c.head_dim; ++d)
                    store(k, offset_of(k, Index{h, t, d, 0}), sh.k[static_cast<std::size_t>(t)][static_cast<std::size_t>(h * c.head_dim + d)]);
                for (std::int64_t d = 0; d < c.value_dim; ++d)
                    store(v, offset_of(v, Index{h, t, d, 0}), sh.v[static_cast<std::size_t>(t)][static_cast<std::size_t>(h * c.value_dim + d)]);
            }
        kv.append(static_cast<std::int64_t>(b), k, v);
    }
    return kv;
}

// Random life of a cache: adds, appends of 1..40 tokens, forks, truncations, frees.
void random_history(World& w, std::mt19937& rng, int steps) {
    std::vector<SeqId> live;
    for (int i = 0; i < steps; ++i) {
        const unsigned r = rng() % 10;
        if (live.empty() || r < 2) {
            live.push_back(w.cache.add_sequence());
            w.shadow[live.back()] = {};
            append_random(w, live.back(), 1 + static_cast<std::int64_t>(rng() % 40), rng);
        } else if (r < 6) {
            append_random(w, live[rng() % live.size()], 1 + static_cast<std::int64_t>(rng() % (rng() % 2 ? 3 : 40)), rng);
        } else if (r < 8) {
            const SeqId parent = live[rng() % live.size()];
            const SeqId child = w.cache.fork(parent);
            w.shadow[child] = w.shadow[parent];
            live.push_back(child);
        } else if (r < 9) {
            const SeqId s = live[rng() % live.size()];
            const auto n = static_cast<std::int64_t>(rng() % (w.shadow[s].k.size() + 1));
            w.cache.truncate(s, n);
            w.shadow[s].k.resize(static_cast<std::size_t>(n));
            w.shadow[s].v.resize(static_cast<std::size_t>(n));
        } else if (live.size() > 2) {
            const std::size_t i2 = rng() % live.size();
            w.cache.free(live[i2]);
            w.shadow.erase(live[i2]);
            live.erase(live.begin() + static_cast<std::ptrdiff_t>(i2));
        }
    }
}

// A random pool for the bit-identity tests: a page size of `page_sizes`, 1 or 2 KV heads, a head
// dim of 8, 16, 64 or 13, a value dim of 24 one time in three, a float32, float16 or bfloat16 pool.
PagedKVCacheConfig random_config(std::mt19937& rng, const std::vector<std::int64_t>& page_sizes, std::int64_t num_pages) {
    PagedKVCacheConfig cfg;
    cfg.page_size = page_sizes[rng() % page_sizes.size()];
    cfg.kv_heads = 1 + static_cast<std::int64_t>(rng() % 2);
    cfg.head_dim = std::vector<std::int64_t>{8, 16, 64, 13}[rng() % 4];
    cfg.value_dim = rng() % 3 ? cfg.head_dim : 24;
    cfg.num_pages = num_pages;
    cfg.storage = std::vector<DType>{DType::f32, DType::f16, DType::bf16}[rng() % 3];
    return cfg;
}

// paged_attention of q on the sequences `ids` with `opt` gives the bits, out (of dtype out_dtype)
// and lse, of decode_attention with `contiguous_opt` on a contiguous cache of the same tokens.
::testing::AssertionResult paged_matches_contiguous(World& w, const Tensor& q, const std::vector<SeqId>& ids,
                                                    const SdpaOptions& opt, const SdpaOptions& contiguous_opt,
                                                    DType out_dtype) {
    const Shape lse_shape{q.shape()[0], q.shape()[1], q.shape()[2]};
    const Shape out_shape{lse_shape[0], lse_shape[1], lse_shape[2], w.cfg.value_dim};
    const Tensor out_p = poisoned(out_dtype, out_shape), out_c = poisoned(out_dtype, out_shape);
    const Tensor lse_p = poisoned(DType::f32, lse_shape), lse_c = poisoned(DType::f32, lse_shape);
    const TensorView lpv = lse_p.view(), lcv = lse_c.view();
    paged_attention(q, w.cache, ids, opt, out_p, &lpv);
    decode_attention(q, contiguous(w, ids), contiguous_opt, out_c, &lcv);
    if (!bit_equal(out_p, out_c)) return ::testing::AssertionFailure() << "out: " << compare(out_p, out_c, 0, 0).message();
    if (!bit_equal(lse_p, lse_c)) return ::testing::AssertionFailure() << "lse: " << compare(lse_p, lse_c, 0, 0).message();
    return ::testing::AssertionSuccess();
}

void paged_vs_contiguous(const detail::KernelSet& row, std::uint32_t seed, int worlds) {
    const detail::ScopedKernelSet use(row);
    std::mt19937 rng(seed);
    for (int wi = 0; wi < worlds; ++wi) {
        const PagedKVCacheConfig cfg = random_config(rng, {1, 2, 4, 16, 32, 64}, 4096);
        World w(cfg);
        random_history(w, rng, 30);
        // Attention for a random subset of the live sequences (in random order).
        std::vector<SeqId> ids;
        for (const auto& [s, sh] : w.shadow)
            if (!sh.k.empty() && rng() % 3) ids.push_back(s);
        if (ids.empty()) ids.push_back(w.shadow.begin()->first);
        std::shuffle(ids.begin(), ids.end(), rng);
        std::int64_t shortest = 1 << 30;
        for (SeqId s : ids) shortest = std::min<std::int64_t>(shortest, static_cast<std::int64_t>(w.shadow[s].k.size()));
        SdpaOptions opt;
        if (shortest > 0 && rng() % 3) opt.causal = Causal::bottom_right;
        if (rng() % 4 == 0) opt.window = Window{static_cast<std::int64_t>(rng() % 50), -1, Align::bottom_right};
        const std::int64_t Lq = std::max<std::int64_t>(1, std::min<std::int64_t>(
                                                              opt.causal == Causal::none ? 16 : shortest,
                                                              std::vector<std::int64_t>{1, 1, 3, 16}[rng() % 4]));
        const std::int64_t Hq = cfg.kv_heads * (1 + static_cast<std::int64_t>(rng() % 4));
        const auto B = static_cast<std::int64_t>(ids.size());
        SCOPED_TRACE("world " + std::to_string(wi) + ": page " + std::to_string(cfg.page_size) + " " +
                     std::string(dtype_name(cfg.storage)) + " B=" + std::to_string(B) + " Hq=" + std::to_string(Hq) +
                     " Lq=" + std::to_string(Lq) + " causal=" + std::to_string(static_cast<int>(opt.causal)));
        const Tensor q = random_f32(Shape{B, Hq, Lq, cfg.head_dim}, rng);
        ASSERT_TRUE(paged_matches_contiguous(w, q, ids, opt, opt, DType::f32));
    }
}

// `worlds` random worlds of `vs_contiguous` on every kernel-table row this CPU has (portable, AVX2,
// and any row added later), a seed each from `seed` on; stops at the first fatal failure.
void on_every_kernel_row(void (*vs_contiguous)(const detail::KernelSet&, std::uint32_t, int), std::uint32_t seed,
                         int worlds) {
    for (const detail::KernelSet* row : detail::runnable_kernel_sets()) {
        SCOPED_TRACE(std::string("kernel row ") + detail::isa_name(row->isa));
        vs_contiguous(*row, seed++, worlds);
        if (::testing::Test::HasFatalFailure()) return;
    }
}

TEST(PagedKVCache, BitIdenticalToContiguousEveryKernelRow) { on_every_kernel_row(paged_vs_contiguous, 1, 40); }

// Long sequences: the decode kernel splits the keys over the cores (flash-decoding), chunks
// crossing pages.
TEST(PagedKVCache, SplitKVLongSequenceBitIdentical) {
    std::mt19937 rng(3);
    for (const detail::KernelSet* row : detail::runnable_kernel_sets())
    for (std::int64_t ps : {16, 32}) {
        const detail::ScopedKernelSet use(*row);
        PagedKVCacheConfig cfg;
        cfg.page_size = ps;
        cfg.kv_heads = 2;
        cfg.head_dim = 64;
        cfg.num_pages = 4096 / ps * 2 + 8;
        World w(cfg);
        const SeqId a = w.cache.add_sequence(), b = w.cache.add_sequence();
        append_random(w, a, 3000, rng);
        append_random(w, b, 1234, rng);
        const std::vector<SeqId> ids = {b, a};
        const Tensor q = random_f32(Shape{2, 8, 1, 64}, rng);
        const Tensor out_p = poisoned(DType::f32, Shape{2, 8, 1, 64}), out_c = poisoned(DType::f32, Shape{2, 8, 1, 64});
        paged_attention(q, w.cache, ids, causal_bottom_right(), out_p);
        decode_attention(q, contiguous(w, ids), causal_bottom_right(), out_c);
        EXPECT_TRUE(bit_equal(out_p, out_c)) << "page size " << ps << ", kernel row " << detail::isa_name(row->isa);
    }
}

// The decode kernel reads a stretch of pages that follow each other in the pool as one run
// (decode_core.hpp for_key_runs): pools where each sequence holds stretches of 1..6 adjacent
// pages, pages in descending order (reused after frees: never joined), and page sizes
// below, at and above the decode kernel's key block (kDecodeBlock), against the contiguous cache, with the keys split
// over chunks (long sequences) or not, GQA rows 1..4 per KV head, and float32 and 16-bit pools.
TEST(PagedKVCache, PagesInStretchesBitIdentical) {
    std::mt19937 rng(18);
    for (const detail::KernelSet* row : detail::runnable_kernel_sets())
        for (std::int64_t ps : {std::int64_t{1}, std::int64_t{16}, std::int64_t{32}, detail::kDecodeBlock / 2,
                                detail::kDecodeBlock, 2 * detail::kDecodeBlock})
            for (DType storage : {DType::f32, DType::f16}) {
                const detail::ScopedKernelSet use(*row);
                PagedKVCacheConfig cfg;
                cfg.page_size = ps;
                cfg.kv_heads = 2;
                cfg.head_dim = 32;
                cfg.storage = storage;
                const std::int64_t per_seq = std::max<std::int64_t>(1600, 12 * ps);  // stretches of several pages
                cfg.num_pages = 3 * ((per_seq + ps - 1) / ps + 8);
                World w(cfg);
                // A third sequence takes a few pages and is freed, so that later pages come
                // back from the free list in its (descending, or shuffled) order.
                const SeqId a = w.cache.add_sequence(), b = w.cache.add_sequence(), c = w.cache.add_sequence();
                append_random(w, c, 7 * ps, rng);
                w.cache.free(c);
                w.shadow.erase(c);
                while (static_cast<std::int64_t>(w.shadow[a].k.size()) < per_seq) {
                    for (SeqId s : {a, b}) {
                        const std::int64_t pages = 1 + static_cast<std::int64_t>(rng() % 6);
                        const std::int64_t have = static_cast<std::int64_t>(w.shadow[s].k.size());
                        append_random(w, s, std::min(per_seq - have, pages * ps - have % ps), rng);
                    }
                }
                // The pool order this test is about: some pages join their successor, some do not.
                int joined = 0, apart = 0;
                for (SeqId s : {a, b}) {
                    const std::vector<std::int32_t>& t = w.cache.page_table(s);
                    for (std::size_t i = 0; i + 1 < t.size(); ++i) (t[i + 1] == t[i] + 1 ? joined : apart) += 1;
                }
                ASSERT_GT(joined, 0);
                ASSERT_GT(apart, 0);
                const std::vector<SeqId> ids = {a, b};
                for (std::int64_t Hq : {2, 8}) {
                    const Tensor q = random_f32(Shape{2, Hq, 1, cfg.head_dim}, rng);
                    const Tensor out_p = poisoned(DType::f32, Shape{2, Hq, 1, cfg.head_dim});
                    const Tensor out_c = poisoned(DType::f32, out_p.shape());
                    paged_attention(q, w.cache, ids, causal_bottom_right(), out_p);
                    decode_attention(q, contiguous(w, ids), causal_bottom_right(), out_c);
                    ASSERT_TRUE(bit_equal(out_p, out_c))
                        << "page size " << ps << ", " << dtype_name(storage) << ", Hq " << Hq << ", kernel row "
                        << detail::isa_name(row->isa) << ": " << compare(out_p, out_c, 0, 0).message();
                }
            }
}

// Chunked prefill through the flash kernel reading pages (auto: Lq > 16 or group·Lq filling a
// flash panel, two with float32 K/V; or impl = flash):
// bit-identical to flash on the contiguous cache (same tiles, same values) for random page
// sizes (smaller, equal and larger than the 64-key tile), float32/float16/bfloat16 pools with
// float32 or 16-bit Q and out (all-bfloat16: the bf16-compute operands on AVX-512 BF16),
// histories with forks and truncations, GQA, masks, modifiers, and V holding NaN/inf/huge
// values (finite.hpp paths).
void chunked_prefill_vs_contiguous(const detail::KernelSet& row, std::uint32_t seed, int worlds) {
    const detail::ScopedKernelSet use(row);
    std::mt19937 rng(seed);
    for (int wi = 0; wi < worlds; ++wi) {
        const PagedKVCacheConfig cfg = random_config(rng, {1, 4, 16, 32, 64, 128, 256}, 8192);
        World w(cfg);
        random_history(w, rng, 20);
        std::vector<SeqId> ids;
        for (const auto& [s, sh] : w.shadow)
            if (rng() % 3) ids.push_back(s);
        if (ids.empty()) ids.push_back(w.shadow.begin()->first);
        std::shuffle(ids.begin(), ids.end(), rng);
        // The chunk: Lq new tokens appended to every sequence of the call (a fork may appear
        // twice in ids only through distinct ids, so each sequence gets its chunk once).
        const std::int64_t Lq = std::vector<std::int64_t>{5, 17, 40, 64, 100, 150}[rng() % 6];
        for (SeqId s : ids) append_random(w, s, Lq, rng);
        const bool nonfinite = rng() % 4 == 0;
        if (nonfinite) {  // through the pages' bits and the shadow alike
            const SeqId s = ids[rng() % ids.size()];
            const auto n = static_cast<std::int64_t>(w.shadow[s].v.size());
            const float bad[] = {NAN, INFINITY, -INFINITY, 3e38f};
            for (int e = 0; e < 3; ++e) {
                const std::int64_t j = static_cast<std::int64_t>(rng()) % n, h = static_cast<std::int64_t>(rng() % cfg.kv_heads);
                const std::int64_t d = static_cast<std::int64_t>(rng() % cfg.value_dim);
                float x = bad[rng() % 4];
                const std::int32_t page = w.cache.page_table(s)[static_cast<std::size_t>(j / cfg.page_size)];
                const TensorView vp = w.cache.value_pages();
                const std::int64_t at = vp.offset(h, page, j % cfg.page_size, d);  // pages (Hkv, P, page, Dv)
                store(vp, at, x);
                x = static_cast<float>(load(vp, at));  // as stored (3e38 is inf in float16)
                // Forks share pages: every sequence holding this page sees the new value.
                for (auto& [o, sh] : w.shadow) {
                    const std::vector<std::int32_t>& t = w.cache.page_table(o);
                    for (std::size_t i = 0; i < t.size(); ++i) {
                        const auto tok = static_cast<std::size_t>(static_cast<std::int64_t>(i) * cfg.page_size + j % cfg.page_size);
                        if (t[i] == page && tok < sh.v.size()) sh.v[tok][static_cast<std::size_t>(h * cfg.value_dim + d)] = x;
                    }
                }
            }
        }
        SdpaOptions opt;
        const unsigned mode = rng() % 4;
        if (mode < 2) opt.causal = Causal::bottom_right;
        if (mode == 2) opt.causal = Causal::top_left;
        if (rng() % 4 == 0) opt.window = Window{static_cast<std::int64_t>(rng() % 70), -1, Align::bottom_right};
        if (opt.causal == Causal::top_left && opt.window.active()) opt.window.align = Align::top_left;
        if (rng() % 5 == 0) opt.softcap = 5.0f;
        const std::int64_t Hq = cfg.kv_heads * (1 + static_cast<std::int64_t>(rng() % 4));
        Tensor sinks(DType::f32, Shape{Hq});
        for (std::int64_t h = 0; h < Hq; ++h) sinks.data_as<float>()[h] = 0.5f * static_cast<float>(h) - 1.0f;
        if (rng() % 5 == 0) opt.sinks = sinks.view();
        if (Lq <= 16) opt.impl = Impl::flash;  // the automatic choice there may be decode
        const auto B = static_cast<std::int64_t>(ids.size());
        SCOPED_TRACE("world " + std::to_string(wi) + ": page " + std::to_string(cfg.page_size) + " B=" +
                     std::to_string(B) + " Hq=" + std::to_string(Hq) + " Lq=" + std::to_string(Lq) + " Dk=" +
                     std::to_string(cfg.head_dim) + " causal=" + std::to_string(static_cast<int>(opt.causal)) +
                     " nonfinite=" + std::to_string(nonfinite));
        // Q and out float32 or the pool's 16-bit dtype (both 16-bit bfloat16: bf16 compute).
        const DType qt = rng() % 2 ? cfg.storage : DType::f32, ot = rng() % 2 ? qt : DType::f32;
        const Tensor q = to_storage(random_f32(Shape{B, Hq, Lq, cfg.head_dim}, rng).view(), qt);
        SCOPED_TRACE(std::string("pool ") + std::string(dtype_name(cfg.storage)) + " q " + std::string(dtype_name(qt)) +
                     " out " + std::string(dtype_name(ot)));
        SdpaOptions co = opt;
        co.impl = Impl::flash;
        ASSERT_TRUE(paged_matches_contiguous(w, q, ids, opt, co, ot));
    }
}

TEST(PagedKVCache, ChunkedPrefillThroughFlashBitIdentical) { on_every_kernel_row(chunked_prefill_vs_contiguous, 100, 40); }

// All-bfloat16 Q, pool and out (bf16 compute on AVX-512 BF16: the operands find K and V rows
// through the page table themselves): without a mask whole tiles take the V-pair path straight
// from the pages, causal tiles on the diagonal the checked float32 rows; each with finite V,
// then with a NaN and an inf in V. The bits of the contiguous cache on every kernel row, for
// pages of 16 (every tile spans four pages of an interleaved pool) and 128 (tiles in place).
// On a CPU without AVX-512 BF16 (or on the other rows) the same calls run the float32 operands.
TEST(PagedKVCache, AllBfloat16ChunkOnPagesBitIdentical) {
    for (const detail::KernelSet* row : detail::runnable_kernel_sets()) {
        const detail::ScopedKernelSet use(*row);
        for (std::int64_t ps : {16, 128}) {
            SCOPED_TRACE(std::string(detail::isa_name(row->isa)) + ", page " + std::to_string(ps));
            std::mt19937 rng(21);
            PagedKVCacheConfig cfg;
            cfg.page_size = ps;
            cfg.kv_heads = 2;
            cfg.head_dim = 64;
            cfg.num_pages = 2 * (600 / ps + 2);
            cfg.storage = DType::bf16;
            World w(cfg);
            const SeqId a = w.cache.add_sequence(), other = w.cache.add_sequence();
            for (int part = 0; part < 4; ++part) {  // interleaved: a's pages are not consecutive
                append_random(w, a, 130, rng);
                append_random(w, other, 70, rng);
            }
            const Tensor q = to_storage(random_f32(Shape{1, 4, 40, 64}, rng).view(), DType::bf16);
            for (int run = 0; run < 4; ++run) {
                const bool nonfinite = run >= 2;
                SdpaOptions o;
                o.causal = run % 2 ? Causal::bottom_right : Causal::none;
                SCOPED_TRACE(std::string(nonfinite ? "NaN and inf in V" : "finite V") + (run % 2 ? ", causal" : ""));
                if (run == 2) {
                    const TensorView vp = w.cache.value_pages();
                    const std::vector<std::int32_t>& t = w.cache.page_table(a);
                    const float bad[] = {NAN, INFINITY};
                    for (int e = 0; e < 2; ++e) {
                        const std::int64_t j = 77 + 300 * e, h = e, d = 5 + e;
                        const std::int64_t at = vp.offset(h, t[static_cast<std::size_t>(j / ps)], j % ps, d);
                        store(vp, at, bad[e]);
                        w.shadow[a].v[static_cast<std::size_t>(j)][static_cast<std::size_t>(h * 64 + d)] = bad[e];
                    }
                }
                const Tensor out_p = poisoned(DType::bf16, Shape{1, 4, 40, 64}), out_c = poisoned(DType::bf16, out_p.shape());
                const Tensor lse_p = poisoned(DType::f32, Shape{1, 4, 40}), lse_c = poisoned(DType::f32, lse_p.shape());
                const TensorView lpv = lse_p.view(), lcv = lse_c.view();
                paged_attention(q, w.cache, {a}, o, out_p, &lpv);
                decode_attention(q, contiguous(w, {a}), o, out_c, &lcv);
                EXPECT_TRUE(bit_equal(out_p, out_c)) << compare(out_p, out_c, 0, 0).message();
                EXPECT_TRUE(bit_equal(lse_p, lse_c)) << compare(lse_p, lse_c, 0, 0).message();
            }
        }
    }
}

// Groups of query blocks on pages (run_group makes each key block's rows once in the group
// tiles, gathered from the pages): forced groups (FlashTiles::query_group) against tasks alone,
// and both against the same tiles on the contiguous cache, bit for bit. K/V and key lengths are
// paged_attention's (its PagedLayout: the pools with a page's strides, rows found through the
// tables), since paged_attention takes no tiles. Pages of 2 and 4 keys under key blocks of 7
// (every tile crosses pages, at varying offsets), pages interleaved with another sequence's,
// GQA, odd head dims, two sequences of different lengths, a float16 and a float32 pool.
TEST(PagedKVCache, FlashGroupsOnPagesBitIdentical) {
    const detail::FlashTiles grouped{16, 7, 0, 4}, alone{16, 7, 0, 1};
    for (DType pool : {DType::f16, DType::f32})
        for (std::int64_t ps : {2, 4}) {
            std::mt19937 rng(31);
            PagedKVCacheConfig cfg;
            cfg.page_size = ps;
            cfg.kv_heads = 2;
            cfg.head_dim = 13;
            cfg.value_dim = 11;
            cfg.num_pages = 200 / ps + 8;
            cfg.storage = pool;
            World w(cfg);
            const SeqId a = w.cache.add_sequence(), other = w.cache.add_sequence();
            for (int part = 0; part < 3; ++part) {  // interleaved: a's pages are not consecutive
                append_random(w, a, 25, rng);
                append_random(w, other, 17, rng);
            }
            const std::vector<SeqId> ids{a, other};
            const std::int64_t B = 2, Hq = 4, Lq = 45;  // lengths 75 and 51
            const detail::PagedLayout pages(w.cache, ids);
            const KVCache kv = contiguous(w, ids);
            const Tensor q = random_f32(Shape{B, Hq, Lq, 13}, rng);
            for (int mask = 0; mask < 3; ++mask) {
                SdpaOptions o;
                o.causal = mask < 2 ? Causal::bottom_right : Causal::none;
                if (mask == 1) o.dropout_p = 0.25, o.dropout_seed = 5;
                if (mask == 2) o.window = Window{-1, 6, Align::bottom_right};
                o.key_lengths = pages.key_lengths;
                for (const detail::KernelSet* ks : detail::runnable_kernel_sets()) {
                    SCOPED_TRACE(std::string(dtype_name(pool)) + " pool, page " + std::to_string(ps) + ", mask " +
                                 std::to_string(mask) + ", isa " + detail::isa_name(ks->isa));
                    Tensor out[3], lse[3];
                    for (int r = 0; r < 3; ++r) {  // pages grouped, pages alone, contiguous alone
                        out[r] = poisoned(DType::f32, Shape{B, Hq, Lq, 11});
                        lse[r] = poisoned(DType::f32, Shape{B, Hq, Lq});
                        const TensorView lv = lse[r].view();
                        detail::SdpaProblem p = detail::make_problem(q, r < 2 ? pages.k : kv.keys(), r < 2 ? pages.v : kv.values(),
                                                                     o, out[r].view(), &lv, nullptr);
                        if (r < 2) p.paged = &pages.rows;
                        detail::flash_forward(p, *ks, 2, r == 0 ? &grouped : &alone);
                    }
                    EXPECT_FALSE(any_poisoned(out[0]) || any_poisoned(lse[0]));
                    EXPECT_TRUE(bit_equal(out[0], out[1]) && bit_equal(lse[0], lse[1])) << "grouped vs alone";
                    EXPECT_TRUE(bit_equal(out[1], out[2]) && bit_equal(lse[1], lse[2])) << "pages vs contiguous";
                }
            }
        }
}

// A chunk of 512 new queries on a long sequence, pages of 16 and 32 (every key tile packed
// from 4 or 2 pages) and 128 (tiles in place): the flash path against the decode path on the
// same pages (impl = decode: blocks of 16 queries), which are different float32 sums, and both
// against the double reference.
TEST(PagedKVCache, LongChunkFlashAgreesWithDecodeBlocksAndReference) {
    std::mt19937 rng(9);
    for (std::int64_t ps : {16, 32, 128}) {
        PagedKVCacheConfig cfg;
        cfg.page_size = ps;
        cfg.kv_heads = 2;
        cfg.head_dim = 32;
        cfg.num_pages = 3000 / ps + 800 / ps + 16;
        World w(cfg);
        const SeqId a = w.cache.add_sequence(), other = w.cache.add_sequence();
        for (int part = 0; part < 20; ++part) {  // interleaved: a's pages are not consecutive
            append_random(w, a, 100, rng);
            append_random(w, other, 37, rng);
        }
        const Tensor q = random_f32(Shape{1, 4, 512, 32}, rng);
        const Tensor out_f = poisoned(DType::f32, Shape{1, 4, 512, 32}), out_d = poisoned(DType::f32, out_f.shape());
        paged_attention(q, w.cache, {a}, causal_bottom_right(), out_f);
        SdpaOptions dec = causal_bottom_right();
        dec.impl = Impl::decode;
        paged_attention(q, w.cache, {a}, dec, out_d);
        const KVCache kv = contiguous(w, {a});
        SdpaOptions ro = causal_bottom_right();
        ro.impl = Impl::reference;
        const Tensor want = poisoned(DType::f64, out_f.shape());
        sdpa(to_dtype(q, DType::f64), to_dtype(kv.keys(), DType::f64), to_dtype(kv.values(), DType::f64), ro, want);
        EXPECT_LE(max_abs_diff(out_f, want) / max_abs(want), 2e-5) << "page " << ps;
        EXPECT_LE(max_abs_diff(out_d, want) / max_abs(want), 2e-5) << "page " << ps;
    }
}

// Non-finite values in V: the kernel's selecting path (kernels/finite.hpp) reads the block's
// rows page by page too. An inf/NaN at a key the window hides contributes nothing; one a row
// sees propagates — the same bits as the contiguous cache either way.
TEST(PagedKVCache, NonFiniteValuesSameAsContiguous) {
    for (const detail::KernelSet* row : detail::runnable_kernel_sets()) {
        const detail::ScopedKernelSet use(*row);
        std::mt19937 rng(8);
        PagedKVCacheConfig cfg;
        cfg.page_size = 4;
        cfg.head_dim = 8;
        cfg.num_pages = 64;
        World w(cfg);
        const SeqId a = w.cache.add_sequence();
        Tensor k = random_f32(Shape{1, 100, 8}, rng), v = random_f32(Shape{1, 100, 8}, rng);
        v.data_as<float>()[10 * 8 + 3] = INFINITY;   // key 10: hidden by the window below
        v.data_as<float>()[97 * 8 + 5] = NAN;        // key 97: visible
        w.cache.append(a, k, v);
        Shadow& sh = w.shadow[a];
        for (std::int64_t t = 0; t < 100; ++t) {
            sh.k.emplace_back(k.data_as<float>() + t * 8, k.data_as<float>() + t * 8 + 8);
            sh.v.emplace_back(v.data_as<float>() + t * 8, v.data_as<float>() + t * 8 + 8);
        }
        SdpaOptions opt = causal_bottom_right();
        opt.window = Window{40, -1, Align::bottom_right};
        const Tensor q = random_f32(Shape{1, 2, 3, 8}, rng);
        const Tensor out_p = poisoned(DType::f32, Shape{1, 2, 3, 8}), out_c = poisoned(DType::f32, Shape{1, 2, 3, 8});
        paged_attention(q, w.cache, {a}, opt, out_p);
        decode_attention(q, contiguous(w, {a}), opt, out_c);
        EXPECT_TRUE(bit_equal(out_p, out_c)) << detail::isa_name(row->isa);
        EXPECT_TRUE(written_nan(at(out_p, 0, 0, 0, 5)));   // the visible NaN reaches its column
        EXPECT_TRUE(std::isfinite(at(out_p, 0, 0, 0, 3)));  // the hidden inf does not
    }
}

// Key rows of sequence s as the pages hold them (float32 storage).
std::vector<float> key_row(const PagedKVCache& c, SeqId s, std::int64_t j) {
    const std::int32_t page = c.page_table(s)[static_cast<std::size_t>(j / c.page_size())];
    const TensorView kp = c.key_pages();
    std::vector<float> r;
    for (std::int64_t h = 0; h < c.kv_heads(); ++h)
        for (std::int64_t d = 0; d < c.head_dim(); ++d) r.push_back(static_cast<float>(at(kp, h, page, j % c.page_size(), d)));
    return r;
}

TEST(PagedKVCache, ForkIsCopyOnWriteAndIsolated) {
    std::mt19937 rng(4);
    PagedKVCacheConfig cfg;
    cfg.page_size = 16;
    cfg.kv_heads = 2;
    cfg.head_dim = 8;
    cfg.num_pages = 16;
    World w(cfg);
    const SeqId parent = w.cache.add_sequence();
    append_random(w, parent, 40, rng);  // pages: 16 + 16 + 8 (last page partly filled)
    EXPECT_EQ(w.cache.free_pages(), 13);
    const SeqId child = w.cache.fork(parent);
    w.shadow[child] = w.shadow[parent];
    EXPECT_EQ(w.cache.free_pages(), 13) << "fork copies nothing";
    EXPECT_EQ(w.cache.shared_pages(), 3);
    EXPECT_EQ(w.cache.pages_needed(child, 1), 1) << "the shared, partly filled last page is copied first";
    append_random(w, child, 5, rng);
    EXPECT_EQ(w.cache.free_pages(), 12);
    EXPECT_EQ(w.cache.shared_pages(), 2);
    EXPECT_NE(w.cache.page_table(child)[2], w.cache.page_table(parent)[2]);
    append_random(w, parent, 30, rng);  // its own last page now: no copy, then new pages
    // Every position of each sequence holds exactly what that sequence appended.
    for (SeqId s : {parent, child})
        for (std::int64_t j = 0; j < w.cache.length(s); ++j)
            ASSERT_EQ(key_row(w.cache, s, j), w.shadow[s].k[static_cast<std::size_t>(j)]) << "sequence " << s << " position " << j;
    EXPECT_EQ(w.cache.length(child), 45);
    EXPECT_EQ(w.cache.length(parent), 70);
    // Truncating into a shared page, then appending: copy-on-write again.
    const SeqId c2 = w.cache.fork(child);
    w.shadow[c2] = w.shadow[child];
    w.cache.truncate(c2, 20);
    w.shadow[c2].k.resize(20), w.shadow[c2].v.resize(20);
    append_random(w, c2, 3, rng);
    for (SeqId s : {parent, child, c2})
        for (std::int64_t j = 0; j < w.cache.length(s); ++j)
            ASSERT_EQ(key_row(w.cache, s, j), w.shadow[s].k[static_cast<std::size_t>(j)]) << "sequence " << s << " position " << j;
    // Freeing returns exactly the pages no one else holds.
    const std::int64_t before = w.cache.free_pages();
    w.cache.free(c2);
    EXPECT_EQ(w.cache.free_pages(), before + 1);  // its own copy of page 1; page 0 is shared
    w.cache.free(parent);
    w.cache.free(child);
    EXPECT_EQ(w.cache.free_pages(), 16);
    EXPECT_EQ(w.cache.shared_pages(), 0);
}

// Pages are handed out lowest-numbered first, also after frees and truncates: decode joins
// consecutive page numbers into one stream, and a stack of freed pages gave a new sequence
// its pages in descending order (bit-identical results, ~25 % slower steps).
// A pool of `pages` pages of 4 tokens, head dim 4: page numbers are easy to follow.
PagedKVCacheConfig small_pool(std::int64_t pages) {
    PagedKVCacheConfig cfg;
    cfg.page_size = 4;
    cfg.head_dim = 4;
    cfg.num_pages = pages;
    return cfg;
}

TEST(PagedKVCache, FreedPagesComeBackInOrder) {
    std::mt19937 rng(12);
    World w(small_pool(12));
    const SeqId a = w.cache.add_sequence();
    append_random(w, a, 8, rng);  // pages 0, 1
    const SeqId tmp = w.cache.add_sequence();
    append_random(w, tmp, 20, rng);  // pages 2 .. 6
    const SeqId c = w.cache.add_sequence();
    append_random(w, c, 4, rng);  // page 7
    w.cache.free(tmp);
    const SeqId b = w.cache.add_sequence();
    append_random(w, b, 20, rng);
    EXPECT_EQ(w.cache.page_table(b), (std::vector<std::int32_t>{2, 3, 4, 5, 6})) << "after a free";
    w.cache.truncate(b, 4);  // frees 3 .. 6
    append_random(w, a, 12, rng);
    EXPECT_EQ(w.cache.page_table(a), (std::vector<std::int32_t>{0, 1, 3, 4, 5})) << "after a truncate";
    w.cache.free(a);
    w.cache.free(c);
    const SeqId d = w.cache.add_sequence();
    append_random(w, d, 40, rng);  // b still holds page 2
    EXPECT_EQ(w.cache.page_table(d), (std::vector<std::int32_t>{0, 1, 3, 4, 5, 6, 7, 8, 9, 10}));
}

TEST(PagedKVCache, PoolExhaustedChangesNothing) {
    std::mt19937 rng(5);
    World w(small_pool(3));
    const SeqId a = w.cache.add_sequence();
    append_random(w, a, 10, rng);  // 3 pages, last one half full
    const SeqId b = w.cache.fork(a);
    const std::vector<unsigned char> before(static_cast<const unsigned char*>(w.cache.key_pages().data()),
                                            static_cast<const unsigned char*>(w.cache.key_pages().data()) + 3 * 4 * 4 * 4);
    const auto table = w.cache.page_table(a);
    const Tensor k = random_f32(Shape{1, 1, 4}, rng), v = random_f32(Shape{1, 1, 4}, rng);
    for (SeqId s : {a, b}) {
        try {
            w.cache.append(s, k, v);  // needs a copy of the shared last page: none free
            ADD_FAILURE() << "no error";
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find("PagedKVCache: append: the page pool is exhausted: sequence " +
                                                 std::to_string(s) + " needs 1 more page for 1 token but 0 of 3 are free"),
                      std::string::npos)
                << e.what();
        }
        EXPECT_EQ(w.cache.length(s), 10);
        EXPECT_EQ(w.cache.page_table(s), table);
    }
    EXPECT_EQ(0, std::memcmp(before.data(), w.cache.key_pages().data(), before.size()));
    w.cache.truncate(b, 8);  // b now ends on a page boundary, but a new page is still needed
    EXPECT_THROW(w.cache.append(b, k, v), Error);
    w.cache.free(b);
    EXPECT_THROW(w.cache.append(a, random_f32(Shape{1, 3, 4}, rng), random_f32(Shape{1, 3, 4}, rng)), Error);
    EXPECT_EQ(w.cache.length(a), 10);
    w.cache.append(a, random_f32(Shape{1, 2, 4}, rng), random_f32(Shape{1, 2, 4}, rng));  // fits the last page
    EXPECT_EQ(w.cache.length(a), 12);
}

// Chunked prefill through decode blocks of 16 queries (impl = decode, on any pool) for
// every mask kind and modifier, against the double reference on the same (rounded) tokens:
// each block must keep the caller's diagonals (causal and window of either alignment,
// query_offset), ALiBi distances and mask rows. Bound: docs/conventions.md's 1e-5·(1 + |ref|).
TEST(PagedKVCache, DecodeBlocksEveryMaskAndModifierMatchReference) {
    std::mt19937 rng(21);
    for (const detail::KernelSet* row : detail::runnable_kernel_sets()) {
        const detail::ScopedKernelSet use(*row);
        for (int wi = 0; wi < 30; ++wi) {
            PagedKVCacheConfig cfg;
            cfg.page_size = std::vector<std::int64_t>{1, 4, 16, 64}[rng() % 4];
            cfg.kv_heads = 1 + static_cast<std::int64_t>(rng() % 2);
            cfg.head_dim = std::vector<std::int64_t>{8, 13, 32}[rng() % 3];
            cfg.value_dim = rng() % 3 ? cfg.head_dim : 24;
            cfg.num_pages = 4096;
            cfg.storage = std::vector<DType>{DType::f32, DType::f16, DType::bf16}[wi % 3];
            World w(cfg);
            random_history(w, rng, 12);
            std::vector<SeqId> ids;
            for (const auto& [id, sh] : w.shadow)
                if (rng() % 3) ids.push_back(id);
            if (ids.empty()) ids.push_back(w.shadow.begin()->first);
            std::shuffle(ids.begin(), ids.end(), rng);
            const std::int64_t Lq = std::vector<std::int64_t>{17, 20, 37, 50}[rng() % 4];
            for (SeqId id : ids) append_random(w, id, Lq, rng);
            const auto B = static_cast<std::int64_t>(ids.size());
            const std::int64_t Hq = cfg.kv_heads * (1 + static_cast<std::int64_t>(rng() % 3));
            Tensor lengths(DType::i64, Shape{B});
            std::int64_t n = 0;
            for (std::int64_t b = 0; b < B; ++b) {
                lengths.data_as<std::int64_t>()[b] = static_cast<std::int64_t>(w.shadow[ids[static_cast<std::size_t>(b)]].k.size());
                n = std::max(n, lengths.data_as<std::int64_t>()[b]);
            }

            SdpaOptions opt;
            opt.impl = Impl::decode;  // blocks of 16 queries on any pool
            opt.causal = std::vector<Causal>{Causal::none, Causal::top_left, Causal::bottom_right}[rng() % 3];
            if (rng() % 3 == 0) {
                opt.window.left = rng() % 3 ? static_cast<std::int64_t>(rng() % 30) : -1;
                opt.window.right = opt.window.left < 0 || rng() % 2 ? static_cast<std::int64_t>(rng() % 8) : -1;
                opt.window.align = rng() % 2 ? Align::top_left : Align::bottom_right;
            }
            if (rng() % 5 == 0) opt.query_offset = QueryOffset(static_cast<std::int64_t>(rng() % 40) - 5);
            Tensor slopes(DType::f32, Shape{Hq}), sinks(DType::f32, Shape{Hq});
            for (std::int64_t h = 0; h < Hq; ++h) {
                slopes.data_as<float>()[h] = 0.1f * static_cast<float>(h + 1) / static_cast<float>(Hq);
                sinks.data_as<float>()[h] = 0.5f * static_cast<float>(h) - 1.0f;
            }
            if (rng() % 2) opt.alibi_slopes = slopes.view();
            if (rng() % 4 == 0) opt.softcap = 5.0;
            if (rng() % 4 == 0) opt.sinks = sinks.view();
            const unsigned mask_kind = rng() % 4;
            Tensor mask;
            if (mask_kind == 1) mask = random_bool(Shape{B, 1, Lq, n}, rng, 0.8);
            if (mask_kind == 2) mask = random_bool(Shape{B, 1, 1, n}, rng, 0.8);
            if (mask_kind == 3) {
                mask = randn<float>(DType::f32, Shape{1, Hq, Lq, n}, rng);
                for (std::int64_t e = 0; e < mask.numel(); ++e)
                    if (rng() % 10 == 0) mask.data_as<float>()[e] = -INFINITY;
            }
            if (mask_kind == 1 || mask_kind == 2) opt.bool_mask = mask.view();
            if (mask_kind == 3) opt.additive_mask = mask.view();
            SCOPED_TRACE(std::string(detail::isa_name(row->isa)) + " world " + std::to_string(wi) + ": " +
                         std::string(dtype_name(cfg.storage)) + " page " + std::to_string(cfg.page_size) + " B=" +
                         std::to_string(B) + " Hq=" + std::to_string(Hq) + " Lq=" + std::to_string(Lq) + " causal=" +
                         std::to_string(static_cast<int>(opt.causal)) + " window=" + std::to_string(opt.window.left) +
                         "," + std::to_string(opt.window.right) + " offset=" + std::to_string(opt.query_offset.has_value()) +
                         " alibi=" + std::to_string(opt.alibi_slopes.has_value()) + " mask=" + std::to_string(mask_kind));

            const Tensor q = random_f32(Shape{B, Hq, Lq, cfg.head_dim}, rng);
            const Tensor out = poisoned(DType::f32, Shape{B, Hq, Lq, cfg.value_dim}), lse = poisoned(DType::f32, Shape{B, Hq, Lq});
            const TensorView lv = lse.view();
            paged_attention(q, w.cache, ids, opt, out, &lv);

            const KVCache kv = contiguous(w, ids);
            SdpaOptions ro = opt;
            ro.impl = Impl::reference;
            ro.key_lengths = lengths.view();
            const Tensor want = poisoned(DType::f64, out.shape()), want_lse = poisoned(DType::f64, lse.shape());
            const TensorView wl = want_lse.view();
            sdpa(to_dtype(q, DType::f64), to_dtype(kv.keys(), DType::f64), to_dtype(kv.values(), DType::f64), ro, want, &wl);
            ASSERT_TRUE(all_close(out, want, 1e-5, 1e-5)) << "out";
            ASSERT_TRUE(all_close(lse, want_lse, 1e-5, 1e-5)) << "lse";
        }
    }
}

TEST(PagedKVCache, ChunkedPrefillMatchesReference) {
    std::mt19937 rng(6);
    PagedKVCacheConfig cfg;
    cfg.page_size = 16;
    cfg.kv_heads = 2;
    cfg.head_dim = 32;
    cfg.num_pages = 64;
    World w(cfg);
    const SeqId a = w.cache.add_sequence(), b = w.cache.add_sequence();
    append_random(w, a, 100, rng);  // a prompt already in the cache, then a 45-token chunk
    append_random(w, a, 45, rng);
    append_random(w, b, 60, rng);
    const std::vector<SeqId> ids = {a, b};
    for (int variant = 0; variant < 2; ++variant) {
        SdpaOptions opt = causal_bottom_right();
        if (variant == 1) opt.window = Window{20, -1, Align::bottom_right};
        const Tensor q = random_f32(Shape{2, 4, 45, 32}, rng);
        const Tensor out = poisoned(DType::f32, Shape{2, 4, 45, 32}), lse = poisoned(DType::f32, Shape{2, 4, 45});
        const TensorView lv = lse.view();
        paged_attention(q, w.cache, ids, opt, out, &lv);
        // The reference on the contiguous copy, in double.
        const KVCache kv = contiguous(w, ids);
        const Tensor kd = to_dtype(kv.keys(), DType::f64), vd = to_dtype(kv.values(), DType::f64);
        const Tensor kl(DType::i64, Shape{2});
        kl.data_as<std::int64_t>()[0] = 145, kl.data_as<std::int64_t>()[1] = 60;
        SdpaOptions ro = opt;
        ro.key_lengths = kl.view();
        ro.impl = Impl::reference;
        const Tensor want = poisoned(DType::f64, out.shape()), want_lse = poisoned(DType::f64, lse.shape());
        const TensorView wl = want_lse.view();
        sdpa(to_dtype(q, DType::f64), kd, vd, ro, want, &wl);
        // fp32 kernel vs double: the error budget of tests/grad/test_backward.cpp (2e-5 of the
        // largest value; these sums are shorter).
        EXPECT_LE(max_abs_diff(out, want) / max_abs(want), 2e-5) << "variant " << variant;
        EXPECT_LE(max_abs_diff(lse, want_lse), 2e-5 * max_abs(want_lse)) << "variant " << variant;
    }
}

TEST(PagedKVCache, BadArgumentsAreClearErrors) {
    PagedKVCacheConfig bad;
    bad.page_size = 24;
    bad.num_pages = 4;
    EXPECT_NE(error_of([&] { PagedKVCache c(bad); }).find("PagedKVCache: page_size must be a power of two"), std::string::npos);
    bad.page_size = 16;
    bad.num_pages = 0;
    EXPECT_NE(error_of([&] { PagedKVCache c(bad); }).find("num_pages must be in [1, 2^31 - 1] but got 0"), std::string::npos);

    std::mt19937 rng(7);
    PagedKVCacheConfig cfg;
    cfg.page_size = 8;
    cfg.head_dim = 4;
    cfg.num_pages = 8;
    World w(cfg);
    const SeqId a = w.cache.add_sequence();
    append_random(w, a, 5, rng);
    EXPECT_NE(error_of([&] { w.cache.length(7); }).find("PagedKVCache: length: sequence 7 does not exist"), std::string::npos);
    EXPECT_NE(error_of([&] { w.cache.truncate(a, 6); }).find("truncate: new_length must be in [0, 5]"), std::string::npos);
    EXPECT_NE(error_of([&] { w.cache.append(a, random_f32(Shape{1, 2, 5}, rng), random_f32(Shape{1, 2, 4}, rng)); })
                  .find("append: k_new must have shape (Hkv, T, Dk) = (1, T, 4) but got (1, 2, 5)"),
              std::string::npos);
    EXPECT_NE(error_of([&] { w.cache.append(a, random_f32(Shape{1, 2, 4}, rng), random_f32(Shape{1, 3, 4}, rng)); })
                  .find("append: v_new has 3 tokens but k_new has 2"),
              std::string::npos);
    EXPECT_EQ(w.cache.length(a), 5);
    // q.length + tokens overflowed: pages_needed(a, 2^63 − 1) returned a negative count.
    EXPECT_NE(error_of([&] { w.cache.pages_needed(a, std::numeric_limits<std::int64_t>::max()); })
                  .find("pages_needed: 9223372036854775807 tokens do not fit a length counter"),
              std::string::npos);
    EXPECT_EQ(w.cache.pages_needed(a, 3), 0);  // 5 + 3 = 8: the first page holds them
    EXPECT_EQ(w.cache.pages_needed(a, 4), 1);

    const Tensor q = random_f32(Shape{1, 1, 1, 4}, rng);
    const Tensor out = poisoned(DType::f32, Shape{1, 1, 1, 4});
    const SeqId freed = w.cache.add_sequence();
    w.cache.free(freed);
    EXPECT_NE(error_of([&] { paged_attention(q, w.cache, {a, a}, {}, out); }).find("paged_attention: seqs: has 2 sequence ids but Q's batch is 1"),
              std::string::npos);
    EXPECT_NE(error_of([&] { paged_attention(q, w.cache, {freed}, {}, out); }).find("seqs: entry 0 = 1 is not a sequence of the cache"),
              std::string::npos);
    SdpaOptions o;
    o.impl = Impl::reference;
    EXPECT_NE(error_of([&] { paged_attention(q, w.cache, {a}, o, out); })
                  .find("impl: only the decode and flash kernels read pages; use auto, decode or flash but got reference"),
              std::string::npos);
    const Tensor kl(DType::i64, Shape{1});
    o = {};
    o.key_lengths = kl.view();
    EXPECT_NE(error_of([&] { paged_attention(q, w.cache, {a}, o, out); }).find("options.key_lengths: must be unset"), std::string::npos);
    const Tensor q6 = random_f32(Shape{1, 1, 6, 4}, rng), out6 = poisoned(DType::f32, Shape{1, 1, 6, 4});
    EXPECT_NE(error_of([&] { paged_attention(q6, w.cache, {a}, causal_bottom_right(), out6); })
                  .find("holds 5 positions but there are 6 new queries"),
              std::string::npos);
    // An empty sequence beside it (an idle slot) takes the rule: out 0, lse −inf — as
    // decode_attention does (it was "holds 0 positions … append the new tokens").
    {
        const SeqId idle = w.cache.add_sequence();
        const Tensor q2 = random_f32(Shape{2, 1, 1, 4}, rng), out2 = poisoned(DType::f32, Shape{2, 1, 1, 4});
        Tensor lse2 = poisoned(DType::f32, Shape{2, 1, 1});
        const TensorView lse2v = lse2;
        EXPECT_EQ(error_of([&] { paged_attention(q2, w.cache, {a, idle}, causal_bottom_right(), out2, &lse2v); }), "(no error)");
        for (int d = 0; d < 4; ++d) EXPECT_EQ(out2.data_as<float>()[4 + d], 0.0f);
        EXPECT_EQ(lse2.data_as<float>()[1], -std::numeric_limits<float>::infinity());
        EXPECT_TRUE(std::isfinite(lse2.data_as<float>()[0]));
        w.cache.free(idle);
    }
    o = {};
    o.dropout_p = 0.5;
    o.dropout_seed = 3;
    o.impl = Impl::decode;
    EXPECT_NE(error_of([&] { paged_attention(q, w.cache, {a}, o, out); }).find("declines this call: dropout"), std::string::npos);
    // auto: decode declines dropout, so flash runs it on the pages (as sdpa would).
    o.impl = Impl::automatic;
    const Tensor dropped = poisoned(DType::f32, out.shape());
    EXPECT_EQ(error_of([&] { paged_attention(q, w.cache, {a}, o, dropped); }), "(no error)");
    EXPECT_FALSE(still_poisoned(dropped));
    // float64 Q: only the reference reads it, and it reads no pages. The message said "the
    // decode kernel, which reads the pages, declines", as if flash did not read them.
    Tensor q64(DType::f64, q.shape());
    for (std::int64_t i = 0; i < q64.numel(); ++i) q64.data_as<double>()[i] = q.data_as<float>()[i];
    const std::string f64_error = error_of([&] { paged_attention(q64, w.cache, {a}, {}, dropped); });
    EXPECT_EQ(f64_error.rfind("paged_attention: no kernel that reads pages takes this call: decode: Q is float64", 0), 0u)
        << f64_error;
    EXPECT_NE(f64_error.find("; flash: Q is float64"), std::string::npos) << f64_error;
    const TensorView into_pages(w.cache.value_pages().data(), DType::f32, Shape{1, 1, 1, 4});
    EXPECT_EQ(error_of([&] { paged_attention(q, w.cache, {a}, {}, into_pages); }),
              "paged_attention: out: must not share memory with the value pages (the kernel writes out while it still "
              "reads the value pages)");
    // In the last page of the pool, beyond the rows the kernel's K/V views span, but a page the
    // call may read: refused all the same.
    const TensorView vp = w.cache.value_pages();
    const TensorView into_last_page(static_cast<float*>(vp.data()) + vp.numel() - 4, DType::f32, Shape{1, 1, 1, 4});
    EXPECT_NE(error_of([&] { paged_attention(q, w.cache, {a}, {}, into_last_page); }).find("out: must not share memory with the value pages"),
              std::string::npos);
    const Tensor q3 = random_f32(Shape{1, 1, 1, 3}, rng);
    EXPECT_EQ(error_of([&] { paged_attention(q3, w.cache, {a}, {}, out); }),
              "paged_attention: Q: head dim 3 does not match the cache's head_dim 4");
    EXPECT_TRUE(still_poisoned(out));
    EXPECT_TRUE(still_poisoned(out6));
}

// append(s, T = 0 tokens) appends nothing, so an empty k_new/v_new is accepted whatever its data
// pointer (an empty tensor's may be null; it said "k_new data pointer is null"): no page is taken.
TEST(PagedKVCache, EmptyAppendWithNullDataChangesNothing) {
    std::mt19937 rng(5);
    PagedKVCacheConfig cfg;
    cfg.page_size = 4;
    cfg.head_dim = 3;
    cfg.num_pages = 4;
    World w(cfg);
    const SeqId a = w.cache.add_sequence();
    append_random(w, a, 3, rng);
    const std::vector<std::int32_t> pages = w.cache.page_table(a);
    const std::int64_t free_before = w.cache.free_pages();
    const Tensor keys_before = to_dtype(w.cache.key_pages(), DType::f32), values_before = to_dtype(w.cache.value_pages(), DType::f32);
    w.cache.append(a, TensorView(nullptr, DType::f32, Shape{1, 0, 3}), TensorView(nullptr, DType::f32, Shape{1, 0, 3}));
    EXPECT_EQ(w.cache.length(a), 3);
    EXPECT_EQ(w.cache.page_table(a), pages);
    EXPECT_EQ(w.cache.free_pages(), free_before);
    EXPECT_EQ(std::memcmp(to_dtype(w.cache.key_pages(), DType::f32).data(), keys_before.data(), keys_before.nbytes()), 0);
    EXPECT_EQ(std::memcmp(to_dtype(w.cache.value_pages(), DType::f32).data(), values_before.data(), values_before.nbytes()), 0);
    EXPECT_EQ(error_of([&] { w.cache.append(a, TensorView(nullptr, DType::f32, Shape{1, 1, 3}), random_f32(Shape{1, 1, 3}, rng)); }),
              "PagedKVCache: append: k_new: data pointer is null but its shape (1, 1, 3) has elements");
    EXPECT_EQ(w.cache.length(a), 3);
    // The dtype rule is require_floating's, as for every other input (one wording).
    std::vector<std::int32_t> ints(3, 1);
    EXPECT_EQ(error_of([&] { w.cache.append(a, random_f32(Shape{1, 1, 3}, rng), TensorView(ints.data(), DType::i32, Shape{1, 1, 3})); }),
              "PagedKVCache: append: v_new: dtype must be float32, float64, float16 or bfloat16 but got int32");
    EXPECT_EQ(w.cache.length(a), 3);
}

// A moved-from cache has no pages and no sequences: its views and new sequences are errors
// (key_pages() dereferenced a null pool), and so is every call naming an old sequence.
TEST(PagedKVCache, MovedFromIsEmptyAndRefusesCalls) {
    PagedKVCacheConfig cfg;
    cfg.page_size = 8;
    cfg.head_dim = 4;
    cfg.num_pages = 4;
    std::mt19937 rng(9);
    PagedKVCache a(cfg);
    const SeqId s = a.add_sequence();
    a.append(s, random_f32(Shape{cfg.kv_heads, 3, 4}, rng), random_f32(Shape{cfg.kv_heads, 3, 4}, rng));
    PagedKVCache b(std::move(a));
    EXPECT_EQ(b.length(s), 3);
    EXPECT_EQ(a.free_pages(), 0);
    EXPECT_EQ(a.pool_bytes(), 0);
    EXPECT_FALSE(a.contains(s));
    const std::string moved = "this cache was moved from (it holds no pages)";
    EXPECT_NE(error_of([&] { (void)a.key_pages(); }).find(moved), std::string::npos);
    EXPECT_NE(error_of([&] { (void)a.value_pages(); }).find(moved), std::string::npos);
    EXPECT_NE(error_of([&] { (void)a.add_sequence(); }).find(moved), std::string::npos);
    // Calls naming a sequence say the cache was moved from (they said "sequence 0 does not exist").
    EXPECT_EQ(error_of([&] { (void)a.length(s); }), "PagedKVCache: length: " + moved);
    EXPECT_EQ(error_of([&] { a.free(s); }).find("does not exist"), std::string::npos);
    const Tensor q = random_f32(Shape{1, cfg.kv_heads, 1, 4}, rng), o(DType::f32, Shape{1, cfg.kv_heads, 1, 4});
    EXPECT_EQ(error_of([&] { paged_attention(q, a, {s}, {}, o); }), "paged_attention: cache: holds no pages (it was moved from)");
    PagedKVCache c(cfg);
    c = std::move(b);
    EXPECT_EQ(c.length(s), 3);
    EXPECT_NE(error_of([&] { (void)b.key_pages(); }).find(moved), std::string::npos);
}

// A pool whose bytes cannot be counted is an attn::Error naming the pool, its shape and the
// factors (as KVCache's buffers: test_kv_cache.cpp, KVCacheSizes) — it said "pool size: 2251799812636672
// × 1048576 exceeds …", running products of the config. Both pools are counted before either is
// allocated: a countable key pool no system gives (4 PiB here) and a value pool past 64 bits was
// the key pool's attn::OutOfMemory, not the error about the value pool.
TEST(PagedKVCacheSizes, UncountablePoolIsAnErrorNamingItsShape) {
    const auto message = [](const PagedKVCacheConfig& cfg) -> std::string {
        try {
            PagedKVCache c(cfg);
        } catch (const Error& e) {
            return e.what();
        } catch (const std::exception& e) {
            return std::string("not an attn::Error: ") + e.what();
        }
        return "(no error)";
    };
    PagedKVCacheConfig keys;
    keys.kv_heads = std::int64_t{1} << 20;
    keys.head_dim = 8;
    keys.page_size = std::int64_t{1} << 20;
    keys.num_pages = std::numeric_limits<std::int32_t>::max();
    EXPECT_EQ(message(keys),
              "PagedKVCache: key pages (Hkv, num_pages, page_size, Dk) of shape (1048576, 2147483647, 1048576, 8) with "
              "4-byte elements needs more bytes than a 64-bit size can count (1048576 × 2147483647 × 1048576 × 8 × 4 > "
              "9223372036854775807)");
    PagedKVCacheConfig values = keys;
    values.kv_heads = 1;
    values.head_dim = 1;
    values.value_dim = std::int64_t{1} << 40;
    values.storage = DType::bf16;
    EXPECT_EQ(message(values),
              "PagedKVCache: value pages (Hkv, num_pages, page_size, Dv) of shape (1, 2147483647, 1048576, "
              "1099511627776) with 2-byte elements needs more bytes than a 64-bit size can count (1 × 2147483647 × "
              "1048576 × 1099511627776 × 2 > 9223372036854775807)");
}

}  // namespace
}  // namespace attn::test
