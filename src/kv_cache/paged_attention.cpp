// paged_attention: decode_attention's problem (make_problem: the same checks, the same
// alignment rule, key_lengths = the sequences' lengths) with K/V rows addressed through the
// page tables (kernels/paged_rows.hpp) instead of a contiguous view. Two kernels read pages,
// chosen as for any sdpa call (detail::auto_decode_declines): decode (a few rows per KV head)
// and flash (chunked prefill, or one flash panel's worth of rows per KV head, two with float32
// K/V; its key tiles read in place or packed page by page, 16-bit pages widened: the bits of
// flash on the contiguous cache). impl = decode runs a long query block as blocks of 16
// through the decode kernel, each an exact slice of the problem: its queries keep their
// diagonals (SdpaProblem::rows_before).
#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "attn/decode.hpp"
#include "attn/paged_kv_cache.hpp"
#include "../core/allocate.hpp"
#include "../core/check.hpp"
#include "../core/threads.hpp"
#include "../kernels/decode/decode.hpp"
#include "../kernels/dispatch.hpp"
#include "../kernels/flash/flash.hpp"
#include "../kernels/isa.hpp"
#include "../sdpa/problem.hpp"
#include "paged_layout.hpp"

namespace attn {
namespace {

constexpr std::string_view kOp = "paged_attention";

// The call's arguments, before any page is read.
void check_call(const TensorView& q, const PagedKVCache& cache, const std::vector<PagedKVCache::SeqId>& seqs,
                const SdpaOptions& options) {
    if (options.key_lengths) detail::fail(kOp, "options.key_lengths: must be unset (the sequences' lengths are the key lengths)");
    if (options.impl != Impl::automatic && options.impl != Impl::decode && options.impl != Impl::flash) {
        detail::fail(kOp, "impl: only the decode and flash kernels read pages; use auto, decode or flash but got ",
                     impl_name(options.impl));
    }
    // A moved-from cache has no pages (a live one at least 1): said so, not as unknown sequences.
    if (cache.num_pages() == 0) detail::fail(kOp, "cache: holds no pages (it was moved from)");
    detail::require_rank(kOp, q, "Q", 4, "(B, Hq, Lq, Dk)");
    detail::require_query_fits_cache(kOp, q, cache.kv_heads(), cache.head_dim());
    const std::int64_t B = q.dim(0), Lq = q.dim(2);
    if (static_cast<std::int64_t>(seqs.size()) != B) {
        detail::fail(kOp, "seqs: has ", seqs.size(), " sequence ids but Q's batch is ", B);
    }
    for (std::size_t b = 0; b < seqs.size(); ++b) {
        if (!cache.contains(seqs[b])) {
            detail::fail(kOp, "seqs: entry ", b, " = ", seqs[b], " is not a sequence of the cache (never added, or freed)");
        }
        const std::int64_t length = cache.length(seqs[b]);
        // Fewer positions than new queries: not appended yet. An empty sequence takes the rule
        // (out 0, lse −inf), as in decode_attention.
        if (options.causal != Causal::none && !options.query_offset && length > 0 && length < Lq) {
            detail::fail(kOp, "seqs: sequence ", seqs[b], " (entry ", b, ") holds ", length,
                         " positions but there are ", Lq, " new queries; append the new tokens' K and V before "
                         "paged_attention");
        }
    }
}

// Flash on the pages: automatic where sdpa's dispatch would run flash (detail::runs_flash:
// flash takes the problem and auto_decode_declines says decode is not the automatic choice —
// chunked prefill, or a flash panel's worth of rows per KV head, two with float32 K/V). The
// driver reads the pages of any pool (flash_operands.hpp, paged_tile_rows; the bf16-compute
// operands through kv_row_offset), so the result has the bits of flash on the contiguous
// cache. Otherwise decode, which must take the call (each reason says why not).
bool choose_flash(const detail::SdpaProblem& p, Impl impl) {
    if (impl == Impl::flash || detail::runs_flash(p, impl)) {
        const std::string flash_declines = detail::flash_decline_reason(p);
        if (!flash_declines.empty()) detail::fail(kOp, "impl: the flash kernel declines this call: ", flash_declines);
        return true;
    }
    // Decode takes every block of at most 16 queries once it takes the call: its other reasons
    // (dtypes, layouts, options) are the call's, checked once for all blocks.
    if (const std::string why = detail::decode_call_declines(p.q, p.k, p.v, p.dropout_p); !why.empty()) {
        if (impl == Impl::decode) detail::fail(kOp, "impl: the decode kernel declines this call: ", why);
        // auto reaches here only when flash declined too (runs_flash sends it to flash whenever
        // decode declines and flash does not): e.g. float64 Q, which only the reference reads —
        // and the reference reads no pages.
        detail::fail(kOp, "no kernel that reads pages takes this call: decode: ", why, "; flash: ", detail::flash_decline_reason(p));
    }
    return false;
}

// The decode kernel's blocks of at most 16 queries; each keeps the caller's diagonals and
// dropout rows (SdpaProblem::rows_before/rows_after).
std::vector<detail::SdpaProblem> decode_blocks(const detail::SdpaProblem& p) {
    const std::int64_t block = kMaxDecodeQueries, Lq = p.Lq;
    std::vector<detail::SdpaProblem> parts;
    for (std::int64_t i0 = 0; i0 < Lq; i0 += block) {
        detail::SdpaProblem s = p;
        const std::int64_t len = std::min(block, Lq - i0);
        if (len < Lq) {
            s.Lq = len;
            s.rows_before = i0;
            s.rows_after = Lq - i0 - len;
            s.q = p.q.slice(2, i0, len);
            s.out = p.out.slice(2, i0, len);
            if (p.lse) s.lse = p.lse->slice(2, i0, len);
            if (p.bool_mask) s.bool_mask = p.bool_mask->slice(2, i0, len);
            if (p.additive_mask) s.additive_mask = p.additive_mask->slice(2, i0, len);
        }
        ATTN_DASSERT(detail::decode_declines(s).empty());
        parts.push_back(s);
    }
    return parts;
}

}  // namespace

void paged_attention(const TensorView& q, const PagedKVCache& cache, const std::vector<PagedKVCache::SeqId>& seqs,
                     const SdpaOptions& options, const TensorView& out, const TensorView* lse) {
    const detail::ComputeThreads compute_threads;  // attn::num_threads() for every kernel below
    // The page tables and the views through them (paged_layout.hpp), made inside the checks.
    std::optional<detail::PagedLayout> pages;
    detail::SdpaProblem p;
    const detail::KernelSet* kernels = nullptr;  // the process's row (its first call sets it up: bookkeeping too)
    bool flash = false;
    std::vector<detail::SdpaProblem> parts;  // decode: the blocks of at most 16 queries
    // Up to the kernel, the call allocates its checks' lists and messages, the sequences' lengths
    // and page tables (named by their own refusal) and the decode blocks' list: a refusal there
    // is attn::OutOfMemory saying so (it was a bare std::bad_alloc), nothing written yet. The
    // kernels name their own buffers.
    detail::naming_bookkeeping("paged_attention's argument checks and the sequences' page tables", [&] {
        check_call(q, cache, seqs, options);
        pages.emplace(cache, seqs);
        SdpaOptions o = options;
        o.key_lengths = pages->key_lengths;
        p = detail::make_problem(q, pages->k, pages->v, o, out, lse, nullptr, kOp);
        // The whole pools are inputs: the call reads pages anywhere in them (the layout's views
        // reach only the first n rows of each head's pool).
        const TensorView key_pool = cache.key_pages(), value_pool = cache.value_pages();
        detail::require_outputs_apart(kOp, {{&q, "Q"}, {&key_pool, "the key pages"}, {&value_pool, "the value pages"}},
                                      options, {{&out, "out"}, {lse, "lse"}});
        kernels = &detail::kernel_set();
        flash = choose_flash(p, options.impl);
        if (!flash) parts = decode_blocks(p);
    });
    if (flash) {
        detail::SdpaProblem fp = p;
        fp.paged = &pages->rows;
        detail::flash_forward(fp, *kernels);
        return;
    }
    for (const detail::SdpaProblem& s : parts) detail::decode_forward(s, *kernels, 0, &pages->rows);
}

}  // namespace attn
