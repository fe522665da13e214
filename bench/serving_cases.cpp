// Serving shapes of issue 18 in `attn bench`:
//   V1  a mixed prefill batch: 16 causal sequences with lengths uniform in 64..4096 (fixed
//       seed), H = 16, D = 64 — sdpa_varlen on the packed tokens against sdpa on the batch
//       padded to the longest with key_lengths. Both rows count the same useful FLOPs (the
//       varlen work), so their GFLOP/s compare useful throughput. The note gives the memory
//       a PagedKVCache (page 16) needs for these sequences against a contiguous cache at the
//       longest length.
//   P5 / P7  one decode step at the S5 / S7 sizes (B = 1, Hq = 32, Hkv = 32 / 8, Lk = 16384,
//       D = 128, float32) from a contiguous KVCache and from a PagedKVCache with pages of 16
//       and 32 tokens (pages in order), and of 16 with the sequence on every other page
//       (fragmented); rows report GB/s of the K/V bytes read. Timed warm, all rows the same
//       way (the cache is 16–64x the last-level cache, so a step streams it from memory).
//   P2  chunked prefill: 512 new causal queries on a sequence of 4096 cached tokens (the chunk
//       included), Hq = 16, Hkv = 4, D = 128, float32 — the flash kernel on a contiguous
//       KVCache against flash reading a PagedKVCache (pages of 16, 32, 128, and 16 with the
//       sequence on every other page), and the paged decode kernel in blocks of 16 queries
//       (impl = decode); then a float16 pool of pages of 16, flash against decode blocks. The
//       float32 paged flash rows must give the contiguous row's bits (max_abs_diff 0); the
//       float16 rows differ from it by K and V's rounding to float16 (and read half the bytes;
//       the case's io_bytes count float32).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "attn/decode.hpp"
#include "attn/kv_cache.hpp"
#include "attn/paged_kv_cache.hpp"
#include "attn/sdpa_varlen.hpp"
#include "harness.hpp"
#include "visible_pairs.hpp"

namespace attn::bench {
namespace {

Row timed(const Config& cfg, const std::string& impl, const std::function<void()>& fn) {
    Row r;
    r.impl = impl;
    time_calls_into(cfg, r, fn);
    return r;
}

// A contiguous cache of one sequence, and a page pool of `sequences` × `tokens` tokens.
KVCacheConfig contiguous_config(std::int64_t kv_heads, std::int64_t head_dim, std::int64_t capacity) {
    KVCacheConfig cc;
    cc.kv_heads = kv_heads;
    cc.head_dim = head_dim;
    cc.capacity = capacity;
    return cc;
}

PagedKVCacheConfig paged_config(std::int64_t kv_heads, std::int64_t head_dim, std::int64_t page_size,
                                std::int64_t sequences, std::int64_t tokens) {
    PagedKVCacheConfig pc;
    pc.kv_heads = kv_heads;
    pc.head_dim = head_dim;
    pc.page_size = page_size;
    pc.num_pages = sequences * tokens / page_size;
    return pc;
}

void run_varlen(const Context& ctx, std::vector<CaseResult>& out) {
    constexpr std::int64_t N = 16, H = 16, D = 64;
    std::mt19937_64 rng(18);
    std::vector<std::int64_t> len(N);
    for (auto& l : len) l = 64 + static_cast<std::int64_t>(rng() % (4096 - 64 + 1));
    const std::int64_t T = [&] { std::int64_t s = 0; for (auto l : len) s += l; return s; }();
    const std::int64_t Lmax = *std::max_element(len.begin(), len.end());
    CaseResult c;
    c.id = "V1";
    c.what = "varlen prefill (mixed batch)";
    std::string lens;
    for (auto l : len) {
        if (!lens.empty()) lens += ',';
        lens += std::to_string(l);
    }
    c.shape = "16 seqs, lengths " + lens + " (total " + std::to_string(T) + "), H=16 D=64 causal fp32";
    c.params = {{"N", N}, {"H", H}, {"D", D}, {"lengths", len}, {"total_tokens", T}, {"max_length", Lmax}};
    double useful = 0.0;
    for (auto l : len) useful += 2.0 * (D + D) * visible_pairs(1, H, l, l, Causal::top_left);
    c.flop = useful;
    c.flop_formula = "sum_b 2*(Dk+Dv)*H*L_b(L_b+1)/2, the causal pairs (the varlen work; the padded row is charged the same)";
    c.io_bytes = 4 * 4 * T * H * D;

    const Tensor q(DType::f32, Shape{T, H, D}), k(DType::f32, Shape{T, H, D}), v(DType::f32, Shape{T, H, D});
    fill_uniform(q, 1);
    fill_uniform(k, 2);
    fill_uniform(v, 3);
    Tensor o(DType::f32, Shape{T, H, D}), cq(DType::i64, Shape{N + 1}), ck(DType::i64, Shape{N + 1});
    cq.data_as<std::int64_t>()[0] = 0;
    for (std::int64_t b = 0; b < N; ++b) cq.data_as<std::int64_t>()[b + 1] = cq.data_as<std::int64_t>()[b] + len[static_cast<std::size_t>(b)];
    std::copy_n(cq.data_as<std::int64_t>(), N + 1, ck.data_as<std::int64_t>());
    SdpaOptions opt;
    opt.causal = Causal::top_left;
    SdpaReport rep;
    Row rv = timed(ctx.cfg, "varlen", [&] { sdpa_varlen(q, k, v, cq, ck, opt, o, nullptr, &rep); });
    rv.kernel = rep.kernel;
    rv.flop = useful;
    c.rows.push_back(std::move(rv));
    {
        // The padded batch: (N, H, Lmax, D) with the same tokens, key_lengths = L_b.
        const Tensor pq(DType::f32, Shape{N, H, Lmax, D}, true), pk(DType::f32, Shape{N, H, Lmax, D}, true),
            pv(DType::f32, Shape{N, H, Lmax, D}, true), po(DType::f32, Shape{N, H, Lmax, D});
        Tensor kl(DType::i64, Shape{N});
        for (std::int64_t b = 0; b < N; ++b) {
            const std::int64_t t0 = cq.data_as<std::int64_t>()[b], L = len[static_cast<std::size_t>(b)];
            kl.data_as<std::int64_t>()[b] = L;
            for (const auto& [src, dst] : {std::pair{&q, &pq}, std::pair{&k, &pk}, std::pair{&v, &pv}})
                for (std::int64_t t = 0; t < L; ++t)
                    for (std::int64_t h = 0; h < H; ++h)
                        std::copy_n(src->data_as<float>() + ((t0 + t) * H + h) * D, D,
                                    dst->data_as<float>() + ((b * H + h) * Lmax + t) * D);
        }
        SdpaOptions po_opt = opt;
        po_opt.key_lengths = kl.view();
        Row rp = timed(ctx.cfg, "padded", [&] { sdpa(pq, pk, pv, po_opt, po, nullptr, nullptr, &rep); });
        rp.kernel = rep.kernel;
        rp.flop = useful;
        rp.note = "padded to L=" + std::to_string(Lmax) + " with key_lengths";
        // The varlen output against the padded one on the real rows.
        double m = 0.0;
        for (std::int64_t b = 0; b < N; ++b)
            for (std::int64_t t = 0; t < len[static_cast<std::size_t>(b)]; ++t)
                for (std::int64_t h = 0; h < H; ++h)
                    for (std::int64_t d = 0; d < D; ++d) {
                        const float x = o.data_as<float>()[((cq.data_as<std::int64_t>()[b] + t) * H + h) * D + d];
                        const float y = po.data_as<float>()[((b * H + h) * Lmax + t) * D + d];
                        m = std::max(m, static_cast<double>(std::fabs(x - y)));
                    }
        rp.max_abs_diff = m;
        c.rows.push_back(std::move(rp));
    }
    const double tv = c.rows[0].timing.median_s, tp = c.rows[1].timing.median_s;
    // KV memory of these sequences: pages of 16 tokens against B x the longest length.
    std::int64_t pages = 0;
    for (auto l : len) pages += (l + 15) / 16;
    const double per_token = 2.0 * H * D * 4.0;
    c.note = "varlen speed-up over padded: " + format_double("%.2fx", tp / tv) + " (target >= 1.8x); KV memory for these sequences: " +
             format_double("%.0f MiB", static_cast<double>(pages * 16) * per_token / (1 << 20)) + " paged (page 16) vs " +
             format_double("%.0f MiB", static_cast<double>(N * Lmax) * per_token / (1 << 20)) + " contiguous at L=" +
             std::to_string(Lmax) + " (" + format_double("%.2fx", static_cast<double>(N * Lmax) / static_cast<double>(pages * 16)) +
             ")";
    out.push_back(std::move(c));
}

void run_paged_decode(const Context& ctx, const std::string& id, std::int64_t Hkv, std::vector<CaseResult>& out) {
    constexpr std::int64_t Hq = 32, Lk = 16384, D = 128, chunk = 1024;
    CaseResult c;
    c.id = id;
    c.what = "paged decode step";
    c.shape = "B=1 Hq=32 Hkv=" + std::to_string(Hkv) + " Lq=1 Lk=16384 D=128 f32, contiguous vs pages of 16 / 32";
    c.params = {{"B", 1}, {"Hq", Hq}, {"Hkv", Hkv}, {"Lq", 1}, {"Lk", Lk}, {"D", D}, {"storage", "float32"}};
    c.bytes = 2.0 * Hkv * Lk * D * 4.0;
    c.io_bytes = static_cast<std::int64_t>(c.bytes);
    const Tensor q(DType::f32, Shape{1, Hq, 1, D}), o(DType::f32, Shape{1, Hq, 1, D});
    fill_uniform(q, 7);
    const SdpaOptions opt = [] { SdpaOptions s; s.causal = Causal::bottom_right; return s; }();
    // The same tokens for every cache, appended in chunks (a prefill's K/V).
    const Tensor kc(DType::f32, Shape{Hkv, chunk, D}), vc(DType::f32, Shape{Hkv, chunk, D});
    fill_uniform(kc, 8);
    fill_uniform(vc, 9);
    // All four caches are filled first and their steps timed in turn (time_interleaved), so
    // a slow phase of the machine cannot fall on one of them only: the ratios are the target.
    // Each step reads its own cache (512 / 128 MiB, far beyond the caches), so every step
    // starts cold whatever ran before it.
    RssProbe probe;
    KVCache contiguous(contiguous_config(Hkv, D, Lk));
    for (std::int64_t t = 0; t < Lk; t += chunk) contiguous.append(0, kc, vc);
    PagedKVCache paged16(paged_config(Hkv, D, 16, 1, Lk)), paged32(paged_config(Hkv, D, 32, 1, Lk));
    const PagedKVCache::SeqId s16 = paged16.add_sequence(), s32 = paged32.add_sequence();
    for (std::int64_t t = 0; t < Lk; t += chunk) {
        paged16.append(s16, kc, vc);
        paged32.append(s32, kc, vc);
    }
    // Fragmented: two sequences appended a page at a time in turn, so the measured one holds
    // every other page (its runs of 16 rows are not adjacent in memory).
    PagedKVCache frag(paged_config(Hkv, D, 16, 2, Lk));
    const PagedKVCache::SeqId sf = frag.add_sequence(), other = frag.add_sequence();
    for (std::int64_t t = 0; t < Lk; t += 16)
        for (PagedKVCache::SeqId x : {sf, other}) frag.append(x, kc.view().slice(1, t % chunk, 16), vc.view().slice(1, t % chunk, 16));

    const char* names[] = {"contiguous", "paged16", "paged32", "paged16-frag"};
    std::vector<Timing> timings;
    std::string error;
    try {
        timings = time_interleaved(ctx.cfg, {[&] { decode_attention(q, contiguous, opt, o); },
                                             [&] { paged_attention(q, paged16, {s16}, opt, o); },
                                             [&] { paged_attention(q, paged32, {s32}, opt, o); },
                                             [&] { paged_attention(q, frag, {sf}, opt, o); }});
    } catch (const std::exception& e) {
        error = error_note(e);
    }
    const std::int64_t peak = probe.peak();
    std::vector<double> medians;
    for (int i = 0; i < 4; ++i) {
        Row r;
        r.impl = names[i];
        r.kernel = i == 0 ? "decode" : "decode (pages)";
        r.bytes = c.bytes;
        r.baseline_rss = probe.baseline();
        r.peak_rss_reset = probe.was_reset();
        r.peak_rss = peak;  // the four caches live at once
        if (i == 3) r.note = "every other page";
        if (!error.empty()) {
            r.status = "error";
            r.note = error;
            medians.push_back(0.0);
        } else {
            r.timing = timings[static_cast<std::size_t>(i)];
            medians.push_back(r.timing.median_s);
        }
        c.rows.push_back(std::move(r));
    }
    if (!error.empty()) {
        out.push_back(std::move(c));
        return;
    }
    c.note = "paged / contiguous time: page 16 " + format_double("%.3f", medians[1] / medians[0]) + ", page 32 " +
             format_double("%.3f", medians[2] / medians[0]) + ", page 16 fragmented " + format_double("%.3f", medians[3] / medians[0]) +
             " (target <= 1.10; the steps timed in turn, one of each per round; peak RSS: all four caches)";
    out.push_back(std::move(c));
}

void run_chunked_prefill(const Context& ctx, std::vector<CaseResult>& out) {
    constexpr std::int64_t Hq = 16, Hkv = 4, n = 4096, Lq = 512, D = 128, chunk = 256;
    CaseResult c;
    c.id = "P2";
    c.what = "chunked prefill on a paged cache";
    c.shape = "B=1 Hq=16 Hkv=4 Lq=512 new of n=4096 cached, D=128 f32 causal: contiguous vs pages (flash) vs decode blocks; "
              "and a float16 pool";
    c.params = {{"B", 1}, {"Hq", Hq}, {"Hkv", Hkv}, {"Lq", Lq}, {"n", n}, {"D", D}, {"storage", "float32 (the -f16 rows: float16)"}};
    // Visible pairs: query i (of the chunk) sees n − Lq + i + 1 keys (bottom-right causal).
    c.flop = 4.0 * D * visible_pairs(1, Hq, Lq, n, Causal::bottom_right);
    c.flop_formula = "4*D*Hq*sum_i (n - Lq + i + 1)";
    c.io_bytes = 4 * (2 * Hq * Lq * D + 2 * Hkv * n * D);
    const Tensor q(DType::f32, Shape{1, Hq, Lq, D});
    fill_uniform(q, 11);
    SdpaOptions opt;
    opt.causal = Causal::bottom_right;
    const Tensor kc(DType::f32, Shape{Hkv, chunk, D}), vc(DType::f32, Shape{Hkv, chunk, D});
    fill_uniform(kc, 12);
    fill_uniform(vc, 13);
    const Tensor want(DType::f32, Shape{1, Hq, Lq, D});
    std::vector<double> medians;
    auto add = [&](Row r, const Tensor& o, const std::string& kernel, const std::string& note) {
        r.kernel = kernel;
        r.flop = c.flop;
        r.note = note;
        if (!medians.empty()) r.max_abs_diff = max_abs_diff(o, want);
        medians.push_back(r.timing.median_s);
        c.rows.push_back(std::move(r));
    };
    {
        KVCache kv(contiguous_config(Hkv, D, n));
        for (std::int64_t t = 0; t < n; t += chunk) kv.append(0, kc, vc);
        SdpaOptions fo = opt;
        fo.impl = Impl::flash;
        add(timed(ctx.cfg, "contiguous", [&] { decode_attention(q, kv, fo, want); }), want, "flash", "");
    }
    // pages: {page size, interleave with a second sequence, impl, pool dtype}. The float16 pool's
    // max|d| against the float32 contiguous row is K and V's rounding to float16.
    struct Variant { std::int64_t ps; bool frag; Impl impl; const char* name; DType storage = DType::f32; };
    for (const Variant& x : {Variant{16, false, Impl::automatic, "paged16"}, Variant{32, false, Impl::automatic, "paged32"},
                             Variant{128, false, Impl::automatic, "paged128"}, Variant{16, true, Impl::automatic, "paged16-frag"},
                             Variant{16, false, Impl::decode, "paged16-decode"},
                             Variant{16, false, Impl::automatic, "paged16-f16", DType::f16},
                             Variant{16, false, Impl::decode, "paged16-f16-decode", DType::f16}}) {
        PagedKVCacheConfig pc = paged_config(Hkv, D, x.ps, x.frag ? 2 : 1, n);
        pc.storage = x.storage;
        PagedKVCache cache(pc);
        const PagedKVCache::SeqId s = cache.add_sequence(), other = cache.add_sequence();
        for (std::int64_t t = 0; t < n; t += x.ps)
            for (PagedKVCache::SeqId id : {s, other})
                if (id == s || x.frag)
                    cache.append(id, kc.view().slice(1, t % chunk, x.ps), vc.view().slice(1, t % chunk, x.ps));
        SdpaOptions po = opt;
        po.impl = x.impl;
        const Tensor o(DType::f32, Shape{1, Hq, Lq, D});
        add(timed(ctx.cfg, x.name, [&] { paged_attention(q, cache, {s}, po, o); }), o,
            x.impl == Impl::decode ? "decode (pages, blocks of 16)" : "flash (pages)",
            x.frag ? "every other page" : x.storage == DType::f16 ? "float16 pool" : "");
    }
    c.note = "time / contiguous: paged16 " + format_double("%.3f", medians[1] / medians[0]) + ", paged32 " +
             format_double("%.3f", medians[2] / medians[0]) + ", paged128 " + format_double("%.3f", medians[3] / medians[0]) +
             ", paged16 fragmented " + format_double("%.3f", medians[4] / medians[0]) + "; decode blocks " +
             format_double("%.3f", medians[5] / medians[0]) + "; float16 pool: flash " +
             format_double("%.3f", medians[6] / medians[0]) + ", decode blocks " + format_double("%.3f", medians[7] / medians[0]);
    out.push_back(std::move(c));
}

}  // namespace

std::vector<BenchCase> serving_cases() {
    BenchCase v;
    v.id = "V1";
    v.what = "varlen prefill (mixed batch)";
    v.shape = "16 causal sequences, lengths uniform in 64..4096, H=16 D=64: packed vs padded";
    v.run = [](const Context& ctx, std::vector<CaseResult>& out) { run_varlen(ctx, out); };
    std::vector<BenchCase> cases{v};
    for (const auto& [id, hkv] : {std::pair<std::string, std::int64_t>{"P5", 32}, {"P7", 8}}) {
        BenchCase p;
        p.id = id;
        p.what = "paged decode step";
        p.shape = std::string("S").append(id, 1) + " sizes: contiguous vs pages of 16 / 32 (and fragmented)";
        p.run = [id = id, hkv = hkv](const Context& ctx, std::vector<CaseResult>& out) { run_paged_decode(ctx, id, hkv, out); };
        cases.push_back(p);
    }
    BenchCase cp;
    cp.id = "P2";
    cp.what = "chunked prefill on a paged cache";
    cp.shape = "512 new causal queries on 4096 cached tokens, Hq=16 Hkv=4 D=128: contiguous vs paged flash vs decode blocks; "
               "a float16 pool";
    cp.run = [](const Context& ctx, std::vector<CaseResult>& out) { run_chunked_prefill(ctx, out); };
    cases.push_back(cp);
    return cases;
}

}  // namespace attn::bench
