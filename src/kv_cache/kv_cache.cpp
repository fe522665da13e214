// KVCache: storage and bookkeeping. Every operation checks all of its arguments and that
// the result fits before it writes anything.
#include "attn/kv_cache.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>

#include "attn/error.hpp"
#include "attn/half.hpp"

namespace attn {
namespace {

std::string num(std::int64_t v) { return std::to_string(v); }

[[noreturn]] void fail(const std::string& msg) { throw Error("KVCache: " + msg); }

}  // namespace

// One of K or V: (B, Hkv, capacity, D) in the storage dtype, C order. Large buffers are
// 2 MiB aligned and advised to use transparent huge pages: decode streams the whole cache
// every step, and first-touch faults on 4 KiB pages cost far more than the kernel
// (measured: ≈ 2 GB/s with 4 KiB pages against ≈ 12 GB/s with huge pages).
struct KVCache::Buffer {
    void* data = nullptr;
    std::size_t bytes = 0;

    explicit Buffer(std::size_t n) : bytes(n) {
        constexpr std::size_t kHuge = std::size_t{2} << 20;
        const std::size_t align = n >= kHuge ? kHuge : 64;
        const std::size_t padded = std::max<std::size_t>(align, (n + align - 1) / align * align);
        data = std::aligned_alloc(align, padded);
        if (data == nullptr) throw std::bad_alloc();
        if (align == kHuge) madvise(data, padded, MADV_HUGEPAGE);  // advice only: failure is harmless
    }
    ~Buffer() { std::free(data); }
    Buffer(const Buffer&) = delete;
    Buffer& operator=(const Buffer&) = delete;
};

KVCache::KVCache(const KVCacheConfig& config) : config_(config) {
    if (config_.value_dim == 0) config_.value_dim = config_.head_dim;
    if (config_.batch < 1) fail("batch must be >= 1 but got " + num(config_.batch));
    if (config_.kv_heads < 1) fail("kv_heads must be >= 1 but got " + num(config_.kv_heads));
    if (config_.head_dim < 1) fail("head_dim must be >= 1 but got " + num(config_.head_dim));
    if (config_.value_dim < 1) fail("value_dim must be >= 1 (or 0 = head_dim) but got " + num(config_.value_dim));
    if (config_.capacity < 1) fail("capacity must be >= 1 but got " + num(config_.capacity));
    if (config_.storage != DType::f32 && config_.storage != DType::f16 && config_.storage != DType::bf16) {
        fail("storage must be float32, float16 or bfloat16 but got " + std::string(dtype_name(config_.storage)));
    }
    if (config_.max_capacity < 0 || (config_.max_capacity > 0 && config_.max_capacity < config_.capacity)) {
        fail("max_capacity must be 0 (no limit) or >= capacity " + num(config_.capacity) + " but got " +
             num(config_.max_capacity));
    }
    lengths_.assign(static_cast<std::size_t>(config_.batch), 0);
    grow_to(config_.capacity);
}

KVCache::KVCache(KVCache&&) noexcept = default;
KVCache& KVCache::operator=(KVCache&&) noexcept = default;
KVCache::~KVCache() = default;

std::int64_t KVCache::length(std::int64_t b) const {
    if (b < 0 || b >= config_.batch) fail("sequence index must be in [0, " + num(config_.batch) + ") but got " + num(b));
    return lengths_[static_cast<std::size_t>(b)];
}

std::int64_t KVCache::max_length() const { return *std::max_element(lengths_.begin(), lengths_.end()); }

TensorView KVCache::keys() const {
    return {k_->data, config_.storage, Shape{config_.batch, config_.kv_heads, capacity_, config_.head_dim}};
}

TensorView KVCache::values() const {
    return {v_->data, config_.storage, Shape{config_.batch, config_.kv_heads, capacity_, config_.value_dim}};
}

// Reallocate to `cap` positions per sequence, keeping every sequence's written prefix.
void KVCache::grow_to(std::int64_t cap) {
    const std::size_t es = dtype_size(config_.storage);
    const std::int64_t rows = config_.batch * config_.kv_heads;
    auto nk = std::make_unique<Buffer>(static_cast<std::size_t>(rows * cap * config_.head_dim) * es);
    auto nv = std::make_unique<Buffer>(static_cast<std::size_t>(rows * cap * config_.value_dim) * es);
    if (k_) {
        for (std::int64_t bh = 0; bh < rows; ++bh) {
            const std::int64_t len = lengths_[static_cast<std::size_t>(bh / config_.kv_heads)];
            std::memcpy(static_cast<char*>(nk->data) + static_cast<std::size_t>(bh * cap * config_.head_dim) * es,
                        static_cast<const char*>(k_->data) + static_cast<std::size_t>(bh * capacity_ * config_.head_dim) * es,
                        static_cast<std::size_t>(len * config_.head_dim) * es);
            std::memcpy(static_cast<char*>(nv->data) + static_cast<std::size_t>(bh * cap * config_.value_dim) * es,
                        static_cast<const char*>(v_->data) + static_cast<std::size_t>(bh * capacity_ * config_.value_dim) * es,
                        static_cast<std::size_t>(len * config_.value_dim) * es);
        }
    }
    k_ = std::move(nk);
    v_ = std::move(nv);
    capacity_ = cap;
}

void KVCache::reserve(std::int64_t cap) {
    if (cap < 1) fail("reserve: capacity must be >= 1 but got " + num(cap));
    if (config_.max_capacity > 0 && cap > config_.max_capacity) {
        fail("reserve: capacity " + num(cap) + " exceeds max_capacity " + num(config_.max_capacity));
    }
    if (cap > capacity_) grow_to(cap);
}

// Throws unless `extra` more tokens fit sequence b (growing first when allowed).
void KVCache::check_fits(const char* op, std::int64_t b, std::int64_t extra) const {
    const std::int64_t need = lengths_[static_cast<std::size_t>(b)] + extra;
    if (need <= capacity_) return;
    if (!config_.grow) {
        fail(std::string(op) + ": sequence " + num(b) + " holds " + num(lengths_[static_cast<std::size_t>(b)]) +
             " of " + num(capacity_) + " positions; " + num(extra) + " more need " + num(need) +
             " (nothing was written; enable growth, reserve() more, or truncate first)");
    }
    if (config_.max_capacity > 0 && need > config_.max_capacity) {
        fail(std::string(op) + ": sequence " + num(b) + " would need " + num(need) + " positions but max_capacity is " +
             num(config_.max_capacity) + " (nothing was written)");
    }
}

namespace {

// Converts `count` elements of a row (stride `stride` elements, any float dtype) into the
// storage type at dst. The common cases (same dtype, float32 source) avoid the generic load.
void convert_row(const TensorView& src, std::int64_t offset, std::int64_t stride, std::int64_t count, DType dst_type,
                 void* dst) {
    const DType st = src.dtype();
    if (st == dst_type && stride == 1) {
        std::memcpy(dst, static_cast<const char*>(src.data()) + offset * static_cast<std::int64_t>(dtype_size(st)),
                    static_cast<std::size_t>(count) * dtype_size(st));
        return;
    }
    for (std::int64_t d = 0; d < count; ++d) {
        const std::int64_t off = offset + d * stride;
        const float x = st == DType::f32 ? src.data_as<const float>()[off] : static_cast<float>(src.load_as_double(off));
        switch (dst_type) {
            case DType::f32: static_cast<float*>(dst)[d] = x; break;
            case DType::f16: static_cast<std::uint16_t*>(dst)[d] = float_to_f16(x); break;
            default: static_cast<std::uint16_t*>(dst)[d] = float_to_bf16(x); break;
        }
    }
}

void check_new(const TensorView& t, const char* op, const char* name, int rank, const Shape& expected,
               const char* layout) {
    if (t.data() == nullptr) fail(std::string(op) + ": " + name + " data pointer is null");
    if (!is_floating(t.dtype())) {
        fail(std::string(op) + ": " + name + " dtype must be a float type but got " + std::string(dtype_name(t.dtype())));
    }
    if (t.rank() != rank || !(t.shape() == expected)) {
        fail(std::string(op) + ": " + name + " must have shape " + layout + " = " + expected.str() + " but got " +
             t.shape().str());
    }
}

}  // namespace

// k: (Hkv, T, Dk) rows of sequence b, as a view of dims 1.. of a (B, Hkv, T, D) tensor or
// a rank-3 tensor; `lead` is the number of leading dims (1 for the batch dim, 0 for none).
void KVCache::write_rows(std::int64_t b, const TensorView& k, const TensorView& v, std::int64_t bk) {
    const std::size_t es = dtype_size(config_.storage);
    const int lead = k.rank() - 3;
    const std::int64_t T = k.dim(lead + 1);
    const std::int64_t len = lengths_[static_cast<std::size_t>(b)];
    for (std::int64_t h = 0; h < config_.kv_heads; ++h) {
        const std::int64_t bh = b * config_.kv_heads + h;
        for (std::int64_t t = 0; t < T; ++t) {
            const std::int64_t kofs = lead ? k.offset(bk, h, t, 0) : k.offset(h, t, 0);
            const std::int64_t vofs = lead ? v.offset(bk, h, t, 0) : v.offset(h, t, 0);
            char* kd = static_cast<char*>(k_->data) +
                       static_cast<std::size_t>((bh * capacity_ + len + t) * config_.head_dim) * es;
            char* vd = static_cast<char*>(v_->data) +
                       static_cast<std::size_t>((bh * capacity_ + len + t) * config_.value_dim) * es;
            convert_row(k, kofs, k.stride(lead + 2), config_.head_dim, config_.storage, kd);
            convert_row(v, vofs, v.stride(lead + 2), config_.value_dim, config_.storage, vd);
        }
    }
}

void KVCache::append(const TensorView& k_new, const TensorView& v_new) {
    const std::int64_t T = k_new.rank() == 4 ? k_new.dim(2) : -1;
    check_new(k_new, "append", "k_new", 4, Shape{config_.batch, config_.kv_heads, std::max<std::int64_t>(T, 0), config_.head_dim},
              "(B, Hkv, T, Dk)");
    check_new(v_new, "append", "v_new", 4, Shape{config_.batch, config_.kv_heads, T, config_.value_dim},
              "(B, Hkv, T, Dv)");
    std::int64_t need = 0;
    for (std::int64_t b = 0; b < config_.batch; ++b) {
        check_fits("append", b, T);
        need = std::max(need, lengths_[static_cast<std::size_t>(b)] + T);
    }
    if (need > capacity_) {
        std::int64_t cap = std::max(need, 2 * capacity_);
        if (config_.max_capacity > 0) cap = std::min(cap, config_.max_capacity);
        grow_to(cap);
    }
    for (std::int64_t b = 0; b < config_.batch; ++b) {
        write_rows(b, k_new, v_new, b);
        lengths_[static_cast<std::size_t>(b)] += T;
    }
}

void KVCache::append(std::int64_t b, const TensorView& k_new, const TensorView& v_new) {
    if (b < 0 || b >= config_.batch) {
        fail("append: sequence index must be in [0, " + num(config_.batch) + ") but got " + num(b));
    }
    const std::int64_t T = k_new.rank() == 3 ? k_new.dim(1) : -1;
    check_new(k_new, "append", "k_new", 3, Shape{config_.kv_heads, std::max<std::int64_t>(T, 0), config_.head_dim},
              "(Hkv, T, Dk)");
    check_new(v_new, "append", "v_new", 3, Shape{config_.kv_heads, T, config_.value_dim}, "(Hkv, T, Dv)");
    check_fits("append", b, T);
    const std::int64_t need = lengths_[static_cast<std::size_t>(b)] + T;
    if (need > capacity_) {
        std::int64_t cap = std::max(need, 2 * capacity_);
        if (config_.max_capacity > 0) cap = std::min(cap, config_.max_capacity);
        grow_to(cap);
    }
    write_rows(b, k_new, v_new, 0);
    lengths_[static_cast<std::size_t>(b)] += T;
}

void KVCache::truncate(std::int64_t b, std::int64_t new_length) {
    const std::int64_t len = length(b);
    if (new_length < 0 || new_length > len) {
        fail("truncate: new length of sequence " + num(b) + " must be in [0, " + num(len) + "] but got " +
             num(new_length));
    }
    lengths_[static_cast<std::size_t>(b)] = new_length;
}

void KVCache::truncate_all(std::int64_t new_length) {
    if (new_length < 0) fail("truncate_all: new length must be >= 0 but got " + num(new_length));
    for (auto& len : lengths_) len = std::min(len, new_length);
}

void KVCache::reset() { std::fill(lengths_.begin(), lengths_.end(), 0); }

void KVCache::reset(std::int64_t b) {
    (void)length(b);  // checks the index
    lengths_[static_cast<std::size_t>(b)] = 0;
}

}  // namespace attn
