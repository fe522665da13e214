// KVCache: storage and bookkeeping. Every operation checks all of its arguments and that
// the result fits before it writes anything.
#include "attn/kv_cache.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>

#include "attn/half.hpp"
#include "../core/allocate.hpp"
#include "../core/check.hpp"
#include "../core/checked_size.hpp"
#include "../core/float_env.hpp"
#include "huge_buffer.hpp"
#include "rows.hpp"
#include "shared_config.hpp"

namespace attn {

constexpr std::string_view kOp = "KVCache";

// One of K or V: (B, Hkv, capacity, D) in the storage dtype, C order (huge_buffer.hpp).
struct KVCache::Buffer : detail::HugeBuffer {
    using HugeBuffer::HugeBuffer;
};

KVCache::KVCache(const KVCacheConfig& config) : config_(config) {
    using detail::fail;
    if (config_.batch < 1) fail(kOp, "batch must be >= 1 but got ", config_.batch);
    detail::resolve_kv_heads(kOp, config_);
    if (config_.capacity < 1) fail(kOp, "capacity must be >= 1 but got ", config_.capacity);
    detail::require_kv_storage(kOp, config_.storage);
    if (config_.max_capacity < 0 || (config_.max_capacity > 0 && config_.max_capacity < config_.capacity)) {
        fail(kOp, "max_capacity must be 0 (no limit) or >= capacity ", config_.capacity, " but got ",
             config_.max_capacity);
    }
    // A limit the cache could never reach is as wrong as a capacity it cannot hold.
    if (config_.max_capacity > 0) (void)storage_bytes("max_capacity", config_.max_capacity);
    grow_to("capacity", config_.capacity);  // first: it checks the sizes, batch included
    lengths_.assign(static_cast<std::size_t>(config_.batch), 0);
}

// The moved-from cache is empty (batch 0, capacity 0, no storage); require_storage refuses it.
KVCache::KVCache(KVCache&& o) noexcept
    : config_(o.config_), capacity_(o.capacity_), lengths_(std::move(o.lengths_)), k_(std::move(o.k_)), v_(std::move(o.v_)) {
    o.become_empty();
}

KVCache& KVCache::operator=(KVCache&& o) noexcept {
    if (this != &o) {
        config_ = o.config_;
        capacity_ = o.capacity_;
        lengths_ = std::move(o.lengths_);
        k_ = std::move(o.k_);
        v_ = std::move(o.v_);
        o.become_empty();
    }
    return *this;
}

KVCache::~KVCache() = default;

void KVCache::become_empty() noexcept {
    config_.batch = 0;
    capacity_ = 0;
    lengths_.clear();
    k_.reset();
    v_.reset();
}

void KVCache::require_storage(const char* op) const {
    if (k_ == nullptr) detail::fail(kOp, op, ": this cache was moved from (it holds no storage)");
}

void KVCache::require_sequence(const char* op, std::int64_t b) const {
    require_storage(op);
    if (b < 0 || b >= config_.batch)
        detail::fail(kOp, op, ": sequence index must be in [0, ", config_.batch, ") but got ", b);
}

std::int64_t KVCache::length(std::int64_t b) const {
    require_sequence("length", b);
    return lengths_[static_cast<std::size_t>(b)];
}

std::int64_t KVCache::max_length() const {
    require_storage("max_length");
    return *std::max_element(lengths_.begin(), lengths_.end());
}

TensorView KVCache::keys() const {
    require_storage("keys");
    return {k_->data, config_.storage, Shape{config_.batch, config_.kv_heads, capacity_, config_.head_dim}};
}

TensorView KVCache::values() const {
    require_storage("values");
    return {v_->data, config_.storage, Shape{config_.batch, config_.kv_heads, capacity_, config_.value_dim}};
}

// Bytes of the keys and of the values at `cap` positions per sequence. Every size the cache
// allocates or indexes is below these, so this is the one overflow check it needs; `arg`
// names the user's argument ("capacity", "reserve: capacity", ...) in the error.
std::array<std::int64_t, 2> KVCache::storage_bytes(std::string_view arg, std::int64_t cap) const {
    const std::size_t es = dtype_size(config_.storage);
    const std::string a(arg);
    const std::int64_t k = detail::checked_bytes(
        kOp, a + " " + std::to_string(cap) + ": keys (B, Hkv, capacity, Dk)",
        Shape{config_.batch, config_.kv_heads, cap, config_.head_dim}, es);
    const std::int64_t v = detail::checked_bytes(
        kOp, a + " " + std::to_string(cap) + ": values (B, Hkv, capacity, Dv)",
        Shape{config_.batch, config_.kv_heads, cap, config_.value_dim}, es);
    return {k, v};
}

// Reallocate to `cap` positions per sequence, keeping every sequence's written prefix. Both
// buffers are allocated before anything changes, so a failure leaves the cache as it was.
// Returns the old buffers: the caller decides when they are freed.
KVCache::Retired KVCache::grow_to(std::string_view arg, std::int64_t cap) {
    const auto [kbytes, vbytes] = storage_bytes(arg, cap);
    const std::string shape = " = (" + std::to_string(config_.batch) + ", " + std::to_string(config_.kv_heads) + ", " +
                              std::to_string(cap) + ", ";
    const std::string dtype = ") " + std::string(dtype_name(config_.storage));
    auto nk = std::make_unique<Buffer>(kbytes, "KVCache keys (B, Hkv, capacity, Dk)" + shape +
                                                   std::to_string(config_.head_dim) + dtype);
    auto nv = std::make_unique<Buffer>(vbytes, "KVCache values (B, Hkv, capacity, Dv)" + shape +
                                                   std::to_string(config_.value_dim) + dtype);
    if (k_) {
        const std::size_t es = dtype_size(config_.storage);
        const std::int64_t rows = config_.batch * config_.kv_heads;  // <= the checked byte counts
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
    Retired old{std::move(k_), std::move(v_)};
    k_ = std::move(nk);
    v_ = std::move(nv);
    capacity_ = cap;
    return old;
}

void KVCache::reserve(std::int64_t cap) {
    require_storage("reserve");
    if (cap < 1) detail::fail(kOp, "reserve: capacity must be >= 1 but got ", cap);
    if (config_.max_capacity > 0 && cap > config_.max_capacity) {
        detail::fail(kOp, "reserve: capacity ", cap, " exceeds max_capacity ", config_.max_capacity);
    }
    if (cap > capacity_) grow_to("reserve: capacity", cap);
}

// The positions sequence b needs for `extra` more tokens; throws unless they fit (growing
// first when allowed).
std::int64_t KVCache::check_fits(const char* op, std::int64_t b, std::int64_t extra) const {
    const std::int64_t len = lengths_[static_cast<std::size_t>(b)];
    // Runs per sequence on every append (and require_room): the message's name is built only to throw it.
    const std::optional<std::int64_t> sum = detail::size_add(len, extra);
    const std::int64_t need =
        sum ? *sum
            : detail::checked_add(kOp, std::string(op) + ": length of sequence " + std::to_string(b) + " + new tokens", len, extra);
    if (need <= capacity_) return need;
    if (!config_.grow) {
        detail::fail(kOp, op, ": sequence ", b, " holds ", len, " of ", capacity_, " positions; ", extra, " more need ",
                     need, " (nothing was written; enable growth, reserve() more, or truncate first)");
    }
    if (config_.max_capacity > 0 && need > config_.max_capacity) {
        detail::fail(kOp, op, ": sequence ", b, " would need ", need, " positions but max_capacity is ",
                     config_.max_capacity, " (nothing was written)");
    }
    return need;
}

// The capacity a growth to `need` (> capacity) positions allocates: the current one doubled
// (amortised O(1) appends), but never beyond max_capacity or a size whose bytes cannot be
// counted; never less than `need`, which check_fits has allowed. Throws, naming `op`, the error
// grow_to would raise when need's own bytes cannot be counted (a cache without max_capacity):
// require_room raises it before its caller's work, as the append would after it.
std::int64_t KVCache::grown_capacity(const char* op, std::int64_t need) const {
    std::int64_t cap = need;
    if (const auto doubled = detail::size_mul(capacity_, 2); doubled && *doubled > need) {
        const std::int64_t limited = config_.max_capacity > 0 ? std::min(*doubled, config_.max_capacity) : *doubled;
        const std::size_t es = dtype_size(config_.storage);
        const std::int64_t dmax = std::max(config_.head_dim, config_.value_dim);
        if (detail::shape_bytes(Shape{config_.batch, config_.kv_heads, limited, dmax}, es)) cap = limited;
    }
    (void)storage_bytes(std::string(op) + ": capacity", cap);
    return cap;
}

// The positions every sequence needs for `tokens` more; throws unless they fit, growing first
// when allowed (the growth's size included).
std::int64_t KVCache::room_for_all(const char* op, std::int64_t tokens) const {
    std::int64_t need = 0;
    for (std::int64_t b = 0; b < config_.batch; ++b) need = std::max(need, check_fits(op, b, tokens));
    if (need > capacity_) (void)grown_capacity(op, need);
    return need;
}

void KVCache::require_room(std::int64_t tokens) const {
    require_storage("append");
    (void)room_for_all("append", tokens);
}

KVCache::Retired KVCache::grow_for(const char* op, std::int64_t need) {
    if (need <= capacity_) return {};
    return grow_to(std::string(op) + ": capacity", grown_capacity(op, need));
}

namespace {

// `expected` holds T (the new tokens) at index t_dim. A tensor of the other rank is most likely
// meant for the other append, so the message says T (not a number) and names that overload.
void check_new(const TensorView& t, const char* op, const char* name, const Shape& expected, int t_dim,
               const char* layout) {
    // T = 0 appends nothing: an empty tensor's pointer, null or not, is never read.
    detail::require_data(std::string(kOp) + ": " + op, t, name);
    detail::require_floating(std::string(kOp) + ": " + op, t, name);
    if (t.rank() != expected.rank) {
        std::string dims = "(";
        for (int i = 0; i < expected.rank; ++i)
            dims += (i > 0 ? ", " : "") + (i == t_dim ? std::string("T") : std::to_string(expected[i]));
        detail::fail(kOp, op, ": ", name, " must have rank ", expected.rank, ", ", layout, " = ", dims + ")", " but got ",
                     t.shape(), expected.rank == 4 ? " (append(b, k_new, v_new) takes one sequence's (Hkv, T, D))"
                                                   : " (append(k_new, v_new) takes every sequence's (B, Hkv, T, D))");
    }
    if (!(t.shape() == expected)) {
        detail::fail(kOp, op, ": ", name, " must have shape ", layout, " = ", expected, " but got ", t.shape());
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
    const detail::IeeeSubnormals ieee;  // rows read through double: DAZ made a bf16 subnormal 0 (core/float_env.hpp)
    for (std::int64_t h = 0; h < config_.kv_heads; ++h) {
        const std::int64_t bh = b * config_.kv_heads + h;
        for (std::int64_t t = 0; t < T; ++t) {
            const std::int64_t kofs = lead ? k.offset(bk, h, t, 0) : k.offset(h, t, 0);
            const std::int64_t vofs = lead ? v.offset(bk, h, t, 0) : v.offset(h, t, 0);
            char* kd = static_cast<char*>(k_->data) +
                       static_cast<std::size_t>((bh * capacity_ + len + t) * config_.head_dim) * es;
            char* vd = static_cast<char*>(v_->data) +
                       static_cast<std::size_t>((bh * capacity_ + len + t) * config_.value_dim) * es;
            detail::convert_row(k, kofs, k.stride(lead + 2), config_.head_dim, config_.storage, kd);
            detail::convert_row(v, vofs, v.stride(lead + 2), config_.value_dim, config_.storage, vd);
        }
    }
}

void KVCache::append(const TensorView& k_new, const TensorView& v_new) {
    require_storage("append");
    const std::int64_t T = k_new.rank() == 4 ? k_new.dim(2) : 0;
    check_new(k_new, "append", "k_new", Shape{config_.batch, config_.kv_heads, T, config_.head_dim}, 2, "(B, Hkv, T, Dk)");
    check_new(v_new, "append", "v_new", Shape{config_.batch, config_.kv_heads, T, config_.value_dim}, 2, "(B, Hkv, T, Dv)");
    const Retired old = grow_for("append", room_for_all("append", T));  // freed after the rows are written: k_new may view them
    for (std::int64_t b = 0; b < config_.batch; ++b) {
        write_rows(b, k_new, v_new, b);
        lengths_[static_cast<std::size_t>(b)] += T;
    }
}

void KVCache::append(std::int64_t b, const TensorView& k_new, const TensorView& v_new) {
    require_sequence("append", b);
    const std::int64_t T = k_new.rank() == 3 ? k_new.dim(1) : 0;
    check_new(k_new, "append", "k_new", Shape{config_.kv_heads, T, config_.head_dim}, 1, "(Hkv, T, Dk)");
    check_new(v_new, "append", "v_new", Shape{config_.kv_heads, T, config_.value_dim}, 1, "(Hkv, T, Dv)");
    const Retired old = grow_for("append", check_fits("append", b, T));  // see append above
    write_rows(b, k_new, v_new, 0);
    lengths_[static_cast<std::size_t>(b)] += T;
}

void KVCache::truncate(std::int64_t b, std::int64_t new_length) {
    require_sequence("truncate", b);
    const std::int64_t len = lengths_[static_cast<std::size_t>(b)];
    if (new_length < 0 || new_length > len) {
        detail::fail(kOp, "truncate: new length of sequence ", b, " must be in [0, ", len, "] but got ", new_length);
    }
    lengths_[static_cast<std::size_t>(b)] = new_length;
}

void KVCache::truncate_all(std::int64_t new_length) {
    require_storage("truncate_all");
    if (new_length < 0) detail::fail(kOp, "truncate_all: new length must be >= 0 but got ", new_length);
    for (auto& len : lengths_) len = std::min(len, new_length);
}

void KVCache::reset() {
    require_storage("reset");
    std::fill(lengths_.begin(), lengths_.end(), 0);
}

void KVCache::reset(std::int64_t b) {
    require_sequence("reset", b);
    lengths_[static_cast<std::size_t>(b)] = 0;
}

}  // namespace attn
