// decode_attention: the decode kernel over a KVCache, with bottom-right causal alignment
// per sequence (include/attn/decode.hpp draws it).
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "attn/decode.hpp"
#include "attn/error.hpp"
#include "../kernels/decode/decode.hpp"

namespace attn {
namespace {

std::string num(std::int64_t v) { return std::to_string(v); }

[[noreturn]] void fail(const std::string& msg) { throw Error("decode_attention: " + msg); }

void require_f32(const TensorView& t, const char* name, const Shape& expected, const char* layout) {
    if (t.data() == nullptr) fail(std::string(name) + ": data pointer is null");
    if (t.dtype() != DType::f32) fail(std::string(name) + ": dtype must be float32 but got " + std::string(dtype_name(t.dtype())));
    if (!(t.shape() == expected)) {
        fail(std::string(name) + ": expected shape " + layout + " = " + expected.str() + " but got " + t.shape().str());
    }
}

}  // namespace

// q: (B, Hq, Lq, Dk), out: (B, Hq, Lq, Dv), lse: (B, Hq, Lq); cache (B, Hkv, n_b, D).
void decode_attention(const TensorView& q, const KVCache& cache, const DecodeOptions& options, const TensorView& out,
                      const TensorView* lse) {
    if (q.data() == nullptr) fail("q: data pointer is null");
    if (q.rank() != 4) fail("q: expected a rank-4 tensor (B, Hq, Lq, Dk) but got shape " + q.shape().str());
    const std::int64_t B = q.dim(0), Hq = q.dim(1), Lq = q.dim(2), Dk = q.dim(3);
    const std::int64_t Hkv = cache.kv_heads();
    if (q.dtype() != DType::f32) fail("q: dtype must be float32 but got " + std::string(dtype_name(q.dtype())));
    if (B != cache.batch()) fail("q: batch " + num(B) + " does not match the cache's batch " + num(cache.batch()));
    if (Hq < 1 || Hq % Hkv != 0) {
        fail("q: heads " + num(Hq) + " must be a positive multiple of the cache's KV heads " + num(Hkv));
    }
    if (Lq < 1 || Lq > kMaxDecodeQueries) {
        fail("q: length (new queries per sequence) must be in [1, " + num(kMaxDecodeQueries) + "] but got " + num(Lq) +
             " (run longer blocks through attn::sdpa)");
    }
    if (Dk != cache.head_dim()) fail("q: head dim " + num(Dk) + " does not match the cache's head dim " + num(cache.head_dim()));
    require_f32(out, "out", Shape{B, Hq, Lq, cache.value_dim()}, "(B, Hq, Lq, Dv)");
    if (lse != nullptr) require_f32(*lse, "lse", Shape{B, Hq, Lq}, "(B, Hq, Lq)");
    if (options.scale && !std::isfinite(*options.scale)) fail("scale: must be finite but got " + std::to_string(*options.scale));
    if (options.window_left < -1) fail("window_left: must be >= 0, or -1 for unbounded, but got " + num(options.window_left));

    // Visible positions of new query i of sequence b (length n): the causal diagonal is
    // n − Lq + i, the query's own position; a window keeps window_left keys before it.
    std::vector<std::int64_t> range(static_cast<std::size_t>(2 * B * Lq));
    for (std::int64_t b = 0; b < B; ++b) {
        const std::int64_t n = cache.length(b);
        if (options.causal && n < Lq) {
            fail("cache: sequence " + num(b) + " holds " + num(n) + " positions but there are " + num(Lq) +
                 " new queries; append the new tokens' K and V to the cache before decode_attention");
        }
        for (std::int64_t i = 0; i < Lq; ++i) {
            const std::int64_t diag = options.causal ? n - Lq + i : n - 1;
            std::int64_t lo = 0, hi = options.causal ? diag + 1 : n;
            if (options.window_left >= 0) lo = std::max<std::int64_t>(0, diag - options.window_left);
            range[static_cast<std::size_t>(2 * (b * Lq + i))] = lo;
            range[static_cast<std::size_t>(2 * (b * Lq + i) + 1)] = std::max(lo, hi);
        }
    }

    const TensorView k = cache.keys(), v = cache.values();
    detail::DecodeArgs a;
    a.B = B;
    a.Hq = Hq;
    a.Hkv = Hkv;
    a.Lq = Lq;
    a.Lk = std::max<std::int64_t>(1, cache.max_length());  // no position beyond is read
    a.Dk = Dk;
    a.Dv = cache.value_dim();
    a.group = Hq / Hkv;
    a.scale = static_cast<float>(options.scale ? *options.scale : 1.0 / std::sqrt(static_cast<double>(Dk)));
    a.q = q.data_as<const float>();
    for (int i = 0; i < 4; ++i) {
        a.qs[i] = q.stride(i);
        a.ks[i] = k.stride(i);
        a.vs[i] = v.stride(i);
        a.os[i] = out.stride(i);
    }
    a.kv = cache.storage();
    a.k = k.data();
    a.v = v.data();
    a.out = out.data_as<float>();
    if (lse != nullptr) {
        a.lse = lse->data_as<float>();
        for (int i = 0; i < 3; ++i) a.ls[i] = lse->stride(i);
    }
    a.range = range.data();
    detail::run_decode(a, detail::DecodeTuning{});
}

}  // namespace attn
