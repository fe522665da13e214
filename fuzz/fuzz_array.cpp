// libFuzzer target: the Python module's array conversion followed by attn::sdpa, as
// attn.scaled_dot_product_attention does it (python/sdpa.cpp, python/options.cpp), and then,
// on half the inputs whose forward succeeded, attn::sdpa_backward on the same arrays (as
// attn.scaled_dot_product_attention_backward does it) — on arrays described by raw bytes:
// dtype kind and itemsize, rank, dims and byte strides.
//
// Every array is one numpy could hand over: its dims and strides only address bytes inside
// its buffer (which the target allocates to fit, so ASan sees any read outside). Strides may
// be negative, zero (broadcast) or not a multiple of the item size; the byte order may be
// swapped and the data pointer misaligned (all three are copied to C order, as view_of does:
// the copy's byte swap is not modelled — it only changes which values the bytes are). Values are raw bytes: NaN, Inf, huge lengths. The call may succeed or
// throw attn::Error; a crash, a sanitizer report or any other exception is a finding.
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <optional>
#include <typeinfo>
#include <vector>

#include "array_layout.hpp"
#include "attn/error.hpp"
#include "attn/sdpa.hpp"
#include "attn/sdpa_backward.hpp"

namespace {

using i128 = __int128;

// Inputs whose output or work is larger are skipped: they test nothing the small ones do not,
// and the fuzzer must stay fast. Sizes themselves are not limited (zero-element arrays with
// huge dims, broadcast dims of any size are generated).
// The reference backward, the slowest path, takes about 40 ms of CPU at kMaxWork under the
// sanitizers (fuzz/README.md); the earlier 2^20, which the sizes past 9 now reach, 4 times that.
constexpr i128 kMaxWork = 1 << 18;     // B·H·Lq·Lk·(Dk + Dv + 1)
constexpr i128 kMaxBuffer = 1 << 20;   // bytes an array's dims and strides may address
// Bytes of an array (or of the backward's gradient) read from the input; a larger one repeats
// them. Arrays of hundreds of keys then fit an input of a few KiB (max_len 8192), and each costs
// the input at most this much, so the arrays after it keep their own bytes.
constexpr std::size_t kMaxInputBytes = 1024;

// Sizes are compared in 128 bits, saturated at ±2^100 (beyond every limit below).
constexpr i128 kHuge = i128{1} << 100;
i128 sat(i128 x) { return x > kHuge ? kHuge : (x < -kHuge ? -kHuge : x); }
i128 mul(i128 a, i128 b) {  // |a|, |b| <= 2^100 after sat; split so the product cannot overflow
    if (a == 0 || b == 0) return 0;
    const i128 aa = a < 0 ? -a : a, bb = b < 0 ? -b : b;
    if (aa > kHuge / bb) return (a < 0) != (b < 0) ? -kHuge : kHuge;
    return a * b;
}

struct Array {
    std::vector<unsigned char> memory;  // what numpy would own
    attn::TensorView view;
};

// The kernels change paths at multiples of 64 rows or keys (the backward's tiles, decode's key
// blocks, flash's key blocks; flash splits 512 keys or more of a few query blocks): sizes past
// 9 are drawn up to two blocks, and next to a multiple of 64 up to 4097.
std::int64_t dim_value(FuzzedDataProvider& p) {
    switch (p.ConsumeIntegralInRange(0, 7)) {
        case 0: return p.ConsumeIntegral<std::int64_t>() & 0x7fffffffffffffff;  // any size
        case 1: return std::int64_t{1} << p.ConsumeIntegralInRange(20, 62);
        case 2: return p.ConsumeIntegralInRange<std::int64_t>(10, 130);
        case 3: return 64 * p.ConsumeIntegralInRange<std::int64_t>(2, 64) + p.ConsumeIntegralInRange<std::int64_t>(-1, 1);
        default: return p.ConsumeIntegralInRange<std::int64_t>(0, 9);
    }
}

// n bytes at dst: the input's next (at most kMaxInputBytes), repeated to fill; zeros when the
// input has none left.
void fill_from_input(FuzzedDataProvider& p, unsigned char* dst, std::size_t n) {
    const std::vector<std::uint8_t> bytes = p.ConsumeBytes<std::uint8_t>(std::min(n, kMaxInputBytes));
    if (bytes.empty()) {
        std::memset(dst, 0, n);
        return;
    }
    std::memcpy(dst, bytes.data(), std::min(bytes.size(), n));
    for (std::size_t done = bytes.size(); done < n; done *= 2) std::memcpy(dst + done, dst, std::min(done, n - done));  // doubling
}

std::int64_t stride_value(FuzzedDataProvider& p, std::int64_t contiguous, std::int64_t itemsize) {
    switch (p.ConsumeIntegralInRange(0, 7)) {
        case 0: return 0;                                                        // broadcast
        case 1: return -contiguous;                                              // reversed
        case 2: return p.ConsumeIntegralInRange<std::int64_t>(-64, 64);          // anything small
        case 3: return p.ConsumeIntegral<std::int64_t>();                        // anything
        case 4: {  // padded rows
            const __int128 padded = static_cast<__int128>(contiguous) * p.ConsumeIntegralInRange<std::int64_t>(1, 4) + itemsize;
            return padded > INT64_MAX ? INT64_MAX : static_cast<std::int64_t>(padded);
        }
        default: return contiguous;
    }
}

// One array argument, converted as convert.cpp's input() does. nullopt: refused (a TypeError
// or ValueError in Python — fine) or not an array numpy could have (skipped).
std::optional<Array> make_array(FuzzedDataProvider& p, const char* name, int min_rank, int max_rank) {
    static const char kinds[] = {'f', 'f', 'f', 'i', 'b', 'u', 'c', 'V', 'O'};
    attn_py::RawArray raw;
    raw.kind = p.PickValueInArray(kinds);
    raw.itemsize = p.PickValueInArray({1, 2, 4, 8, 16, 3});
    raw.dtype_name = std::string(1, raw.kind) + std::to_string(raw.itemsize);
    raw.native_order = p.ConsumeIntegralInRange(0, 3) != 0;  // mostly native: strides read in place
    const bool misalign = raw.itemsize > 1 && p.ConsumeIntegralInRange(0, 3) == 0;  // np.frombuffer(b, offset=1)
    raw.aligned = !misalign;
    const int ndim = p.ConsumeIntegralInRange(0, 5);
    for (int i = 0; i < ndim; ++i) raw.shape.push_back(dim_value(p));
    raw.byte_strides.assign(raw.shape.size(), 0);
    i128 contiguous = raw.itemsize, numel = 1, lo = 0, hi = 0;  // lowest and highest byte offset addressed
    for (int i = ndim - 1; i >= 0; --i) {
        const auto u = static_cast<std::size_t>(i);
        const std::int64_t c = contiguous > INT64_MAX ? INT64_MAX : static_cast<std::int64_t>(contiguous);
        raw.byte_strides[u] = stride_value(p, c, raw.itemsize);
        contiguous = mul(contiguous, std::max<i128>(raw.shape[u], 1));
        numel = mul(numel, raw.shape[u]);
        const i128 span = mul(raw.byte_strides[u], raw.shape[u] == 0 ? 0 : raw.shape[u] - 1);
        (span < 0 ? lo : hi) = sat((span < 0 ? lo : hi) + span);
    }
    // numpy's own limit: the array's nominal byte size fits in a signed size.
    if (mul(numel, raw.itemsize) > INT64_MAX) return std::nullopt;
    Array a;
    std::size_t base = 0;
    if (numel != 0) {
        if (hi - lo + raw.itemsize > kMaxBuffer) return std::nullopt;
        a.memory.resize(static_cast<std::size_t>(hi - lo + raw.itemsize) + (misalign ? 1 : 0));
        base = static_cast<std::size_t>(-lo) + (misalign ? 1 : 0);
        fill_from_input(p, a.memory.data(), a.memory.size());
    } else {
        a.memory.resize(16);  // numpy keeps a small allocation for an empty array
    }
    const attn_py::ArrayLayout l = attn_py::layout_of(raw, name, min_rank, max_rank, "an array");
    if (l.refusal != attn_py::ArrayLayout::Refusal::none) return std::nullopt;
    if (l.needs_copy) {  // np.ascontiguousarray: element by element, in C order
        if (mul(numel, raw.itemsize) > kMaxBuffer) return std::nullopt;  // a MemoryError in Python, or just slow
        std::vector<unsigned char> copy(static_cast<std::size_t>(numel * raw.itemsize));
        std::int64_t idx[attn::kMaxRank] = {};
        for (std::size_t e = 0; e < static_cast<std::size_t>(numel); ++e) {
            std::int64_t off = 0;
            for (int i = 0; i < ndim; ++i) off += idx[i] * raw.byte_strides[static_cast<std::size_t>(i)];
            std::memcpy(copy.data() + e * static_cast<std::size_t>(raw.itemsize), a.memory.data() + base + off,
                        static_cast<std::size_t>(raw.itemsize));
            for (int i = ndim - 1; i >= 0 && ++idx[i] == raw.shape[static_cast<std::size_t>(i)]; --i) idx[i] = 0;
        }
        a.memory = std::move(copy);
        a.view = attn::TensorView(a.memory.data(), l.dtype, l.shape);
    } else {
        a.view = attn::TensorView(a.memory.data() + base, l.dtype, l.shape, l.strides);
    }
    return a;
}

void run(FuzzedDataProvider& p) {
    const auto q = make_array(p, "query", 2, 4);
    const auto k = make_array(p, "key", 2, 4);
    const auto v = make_array(p, "value", 2, 4);
    if (!q || !k || !v) return;
    const int rank = q->view.rank();
    if (k->view.rank() != rank || v->view.rank() != rank) return;  // ValueError in Python

    attn::SdpaOptions opt;
    std::optional<Array> mask, lengths, offsets;
    if (p.ConsumeBool()) {
        mask = make_array(p, "attn_mask", 0, 4);
        if (!mask) return;
        if (mask->view.dtype() == attn::DType::boolean) opt.bool_mask = mask->view;
        else if (mask->view.dtype() == attn::DType::f32 || mask->view.dtype() == attn::DType::f64) opt.additive_mask = mask->view;
        else return;  // TypeError in Python
    }
    if (p.ConsumeBool()) {
        lengths = make_array(p, "key_lengths", 1, 1);
        if (!lengths) return;
        opt.key_lengths = lengths->view;
    }
    switch (p.ConsumeIntegralInRange(0, 2)) {
        case 1: opt.query_offset = p.ConsumeIntegralInRange<std::int64_t>(-20, 20); break;
        case 2:
            offsets = make_array(p, "query_offset", 1, 1);
            if (!offsets) return;
            opt.query_offset = attn::QueryOffset(offsets->view);
            break;
        default: break;
    }
    opt.causal = p.PickValueInArray({attn::Causal::none, attn::Causal::top_left, attn::Causal::bottom_right});
    opt.impl = p.PickValueInArray({attn::Impl::automatic, attn::Impl::reference, attn::Impl::flash, attn::Impl::decode});
    if (p.ConsumeBool()) {
        opt.window.left = p.ConsumeIntegralInRange<std::int64_t>(-1, 12);
        opt.window.right = p.ConsumeIntegralInRange<std::int64_t>(-1, 12);
        opt.window.align = p.ConsumeBool() ? attn::Align::top_left : attn::Align::bottom_right;
    }
    if (p.ConsumeBool()) opt.scale = p.ConsumeFloatingPoint<double>();
    if (p.ConsumeBool()) opt.dropout_p = p.PickValueInArray({0.0, 0.5, 1.0, -0.1});
    // A seed or none, as Python's dropout_seed=None: dropout_p > 0 without one is an error path too.
    if (p.ConsumeBool()) opt.dropout_seed = p.ConsumeIntegral<std::uint64_t>();

    // The outputs, shaped as python/sdpa.cpp shapes them (before sdpa checks anything).
    using attn_py::expand_rank;
    const attn::TensorView qv = expand_rank(q->view, 4), kv = expand_rank(k->view, 4), vv = expand_rank(v->view, 4);
    const i128 B = qv.dim(0), H = qv.dim(1), Lq = qv.dim(2), Lk = kv.dim(2), Dk = qv.dim(3), Dv = vv.dim(3);
    if (mul(mul(mul(B, H), mul(Lq, std::max<i128>(Lk, 1))), Dk + Dv + 1) > kMaxWork) return;
    const attn::DType odt = q->view.dtype() == attn::DType::f64 ? attn::DType::f64 : attn::DType::f32;
    attn::Tensor out(odt, attn::Shape{qv.dim(0), qv.dim(1), qv.dim(2), vv.dim(3)});
    attn::Tensor lse(odt, attn::Shape{qv.dim(0), qv.dim(1), qv.dim(2)});
    attn::Tensor w(odt, attn::Shape{qv.dim(0), qv.dim(1), qv.dim(2), kv.dim(2)});
    attn::TensorView lv = lse.view(), wv = w.view();
    const bool want_lse = p.ConsumeBool(), want_w = p.ConsumeBool();
    try {
        attn::sdpa(qv, kv, vv, opt, out.view(), want_lse ? &lv : nullptr, want_w ? &wv : nullptr);
    } catch (const attn::Error&) {
        return;
    }

    // attn.scaled_dot_product_attention_backward on the same arrays and options, with the
    // forward's out and lse and a gradient of raw bytes (python/sdpa.cpp's sdpa_backward_py).
    if (!p.ConsumeBool()) return;
    opt.impl = p.PickValueInArray({attn::Impl::automatic, attn::Impl::reference, attn::Impl::flash});
    try {
        if (!want_lse) attn::sdpa(qv, kv, vv, opt, out.view(), &lv, nullptr);
    } catch (const attn::Error&) {
        return;  // the impl picked for the backward may refuse what the forward's impl accepted
    }
    attn::Tensor grad(odt, out.shape());
    fill_from_input(p, static_cast<unsigned char*>(grad.data()), grad.nbytes());
    attn::Tensor dq(odt, qv.shape()), dk(odt, kv.shape()), dv(odt, vv.shape());
    try {
        attn::sdpa_backward(qv, kv, vv, out, lse, grad, opt, dq, dk, dv);
    } catch (const attn::Error&) {
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    FuzzedDataProvider p(data, size);
    try {
        run(p);
    } catch (const attn::Error&) {  // e.g. from Shape or Tensor, as the Python layer would raise it
    } catch (const std::bad_alloc&) {  // MemoryError in Python
    } catch (const std::exception& e) {
        std::fprintf(stderr, "attn fuzz: FINDING: %s: %s\n", typeid(e).name(), e.what());
        std::abort();
    }
    return 0;
}
