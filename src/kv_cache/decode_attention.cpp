// decode_attention: attention of new queries against everything in a KVCache. The call
// is an sdpa problem (make_problem, the same checks and the same alignment rule) whose K
// and V are the cache's filled rows and whose key_lengths are the cache's lengths; the
// dispatch then picks decode or flash as for any sdpa call (decode for fewer rows per KV head
// than one flash panel with 16-bit K/V, two with float32: detail::auto_decode_declines).
#include "attn/decode.hpp"

#include <algorithm>
#include <vector>

#include "../core/allocate.hpp"
#include "../core/check.hpp"
#include "../kernels/dispatch.hpp"
#include "../sdpa/problem.hpp"
#include "../core/threads.hpp"

namespace attn {

void decode_attention(const TensorView& q, const KVCache& cache, const SdpaOptions& options, const TensorView& out,
                      const TensorView* lse) {
    const detail::ComputeThreads compute_threads;  // attn::num_threads() for every kernel below
    constexpr std::string_view op = "decode_attention";
    // The cache's lengths, which the problem's key_lengths view: they live until the kernel is done.
    std::vector<std::int64_t> lengths;
    detail::SdpaProblem p;
    detail::ForwardChoice choice;
    // Up to the kernel, the call allocates only its checks' lists and messages, the lengths and
    // the choice's strings: a refusal there is attn::OutOfMemory saying so, nothing written yet.
    detail::naming_bookkeeping("decode_attention's argument checks and the cache's lengths", [&] {
        if (options.key_lengths) {
            detail::fail(op, "options.key_lengths: must be unset (the cache's lengths are the key lengths)");
        }
        // A moved-from cache has batch 0 (a live one at least 1): said so, not as a batch mismatch.
        if (cache.batch() == 0) detail::fail(op, "cache: holds no storage (it was moved from)");
        detail::require_rank(op, q, "Q", 4, "(B, Hq, Lq, Dk)");
        detail::require_query_fits_cache(op, q, cache.kv_heads(), cache.head_dim());
        if (q.dim(0) != cache.batch()) {
            detail::fail(op, "Q: batch ", q.dim(0), " does not match the cache's batch ", cache.batch());
        }
        // Fewer positions than new queries under causal masking: the new tokens were not appended (the
        // rule would silently give rows with no key). An empty sequence is an idle slot of the batch:
        // it refused every other sequence's step, so it takes the rule (out 0, lse −inf).
        if (options.causal != Causal::none && !options.query_offset) {
            for (std::int64_t b = 0; b < cache.batch(); ++b) {
                if (cache.length(b) > 0 && cache.length(b) < q.dim(2)) {
                    detail::fail(op, "cache: sequence ", b, " holds ", cache.length(b), " positions but there are ",
                                 q.dim(2), " new queries; append the new tokens' K and V to the cache before "
                                 "decode_attention");
                }
            }
        }
        // Only the filled rows are K and V (at least one row, so the views are never empty:
        // a sequence of length 0 sees no key through key_lengths).
        const std::int64_t n = std::max<std::int64_t>(1, cache.max_length());
        const TensorView k = cache.keys().slice(2, 0, n), v = cache.values().slice(2, 0, n);
        lengths = cache.lengths();
        SdpaOptions o = options;
        o.key_lengths = TensorView(lengths.data(), DType::i64, Shape{static_cast<std::int64_t>(lengths.size())});
        p = detail::make_problem(q, k, v, o, out, lse, nullptr, op);
        detail::require_outputs_apart(p, options, op);  // the cache's K/V too
        choice = detail::choose_forward(p, options.impl, false);
    });
    detail::run_chosen(p, choice, nullptr);
}

}  // namespace attn
