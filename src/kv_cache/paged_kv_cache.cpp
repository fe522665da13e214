// PagedKVCache: the page pool, reference counts and page tables. Every operation checks its
// arguments, and that the pool can supply the pages it needs, before it changes anything.
#include "attn/paged_kv_cache.hpp"

#include <algorithm>
#include <cstring>
#include <functional>
#include <limits>
#include <string>

#include "../core/check.hpp"
#include "../core/checked_size.hpp"
#include "../core/float_env.hpp"
#include "huge_buffer.hpp"
#include "rows.hpp"
#include "shared_config.hpp"

namespace attn {
namespace {

constexpr std::string_view kOp = "PagedKVCache";

// ⌈a/b⌉ for a >= 0, b > 0, without the a + b − 1 that can overflow.
std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return a / b + (a % b != 0 ? 1 : 0); }

}  // namespace

struct PagedKVCache::Pool : detail::HugeBuffer {
    using HugeBuffer::HugeBuffer;
};

PagedKVCache::PagedKVCache(const PagedKVCacheConfig& config) : config_(config) {
    using detail::fail;
    detail::resolve_kv_heads(kOp, config_);
    if (config_.page_size < 1 || (config_.page_size & (config_.page_size - 1)) != 0 || config_.page_size > (1 << 20)) {
        fail(kOp, "page_size must be a power of two in [1, 2^20] but got ", config_.page_size);
    }
    if (config_.num_pages < 1 || config_.num_pages > std::numeric_limits<std::int32_t>::max()) {
        fail(kOp, "num_pages must be in [1, 2^31 - 1] but got ", config_.num_pages);
    }
    detail::require_kv_storage(kOp, config_.storage);
    // Named by the pool's shape and its factors (as KVCache's buffers are), not by running
    // products of them the user never wrote.
    const auto pool_bytes = [&](const char* what, std::int64_t D) {
        return detail::checked_bytes(kOp, what, Shape{config_.kv_heads, config_.num_pages, config_.page_size, D},
                                     dtype_size(config_.storage));
    };
    // Both sizes before either allocation: a value pool that cannot be counted is an attn::Error,
    // whatever the key pool's allocation would have said.
    const std::int64_t kbytes = pool_bytes("key pages (Hkv, num_pages, page_size, Dk)", config_.head_dim);
    const std::int64_t vbytes = pool_bytes("value pages (Hkv, num_pages, page_size, Dv)", config_.value_dim);
    keys_ = std::make_unique<Pool>(kbytes, "PagedKVCache key pages");
    values_ = std::make_unique<Pool>(vbytes, "PagedKVCache value pages");
    refcount_.assign(static_cast<std::size_t>(config_.num_pages), 0);
    // A min-heap (take_page): ascending is already one.
    for (std::int64_t p = 0; p < config_.num_pages; ++p) free_list_.push_back(static_cast<std::int32_t>(p));
}

// The moved-from cache has no pool and no sequence; require_pool refuses new ones and views.
PagedKVCache::PagedKVCache(PagedKVCache&& o) noexcept
    : config_(o.config_), keys_(std::move(o.keys_)), values_(std::move(o.values_)), refcount_(std::move(o.refcount_)),
      free_list_(std::move(o.free_list_)), seqs_(std::move(o.seqs_)), free_ids_(std::move(o.free_ids_)) {
    o.become_empty();
}

PagedKVCache& PagedKVCache::operator=(PagedKVCache&& o) noexcept {
    if (this != &o) {
        config_ = o.config_;
        keys_ = std::move(o.keys_);
        values_ = std::move(o.values_);
        refcount_ = std::move(o.refcount_);
        free_list_ = std::move(o.free_list_);
        seqs_ = std::move(o.seqs_);
        free_ids_ = std::move(o.free_ids_);
        o.become_empty();
    }
    return *this;
}

PagedKVCache::~PagedKVCache() = default;

void PagedKVCache::become_empty() noexcept {
    config_.num_pages = 0;
    keys_.reset();
    values_.reset();
    refcount_.clear();
    free_list_.clear();
    seqs_.clear();
    free_ids_.clear();
}

void PagedKVCache::require_pool(const char* op) const {
    if (keys_ == nullptr) detail::fail(kOp, op, ": this cache was moved from (it holds no pages)");
}

const PagedKVCache::Seq& PagedKVCache::seq(const char* op, SeqId s) const {
    require_pool(op);  // a moved-from cache says so, not "sequence s does not exist"
    if (!contains(s)) detail::fail(kOp, op, ": sequence ", s, " does not exist (never added, or freed)");
    return *seqs_[static_cast<std::size_t>(s)];
}

// The free list is a min-heap: the lowest-numbered free page first, so that a sequence's
// pages come out in order again after frees and truncates (a stack handed them out highest
// first, which split every run of pages decode reads as one stream: ~25 % slower steps).
std::int32_t PagedKVCache::take_page() {
    std::pop_heap(free_list_.begin(), free_list_.end(), std::greater<>());  // the caller checked free_pages()
    const std::int32_t p = free_list_.back();
    free_list_.pop_back();
    refcount_[static_cast<std::size_t>(p)] = 1;
    return p;
}

void PagedKVCache::release_page(std::int32_t page) {
    if (--refcount_[static_cast<std::size_t>(page)] != 0) return;
    free_list_.push_back(page);
    std::push_heap(free_list_.begin(), free_list_.end(), std::greater<>());
}

PagedKVCache::SeqId PagedKVCache::add_sequence() {
    require_pool("add_sequence");
    SeqId id;
    if (!free_ids_.empty()) {
        id = free_ids_.back();
        free_ids_.pop_back();
    } else {
        // free_ids_ can hold every id: free() then never allocates (it must not fail half-way).
        if (free_ids_.capacity() < seqs_.size() + 1) free_ids_.reserve(std::max(seqs_.size() + 1, 2 * free_ids_.capacity()));
        auto fresh = std::make_unique<Seq>();
        id = static_cast<SeqId>(seqs_.size());
        seqs_.push_back(std::move(fresh));
    }
    Seq& s = *seqs_[static_cast<std::size_t>(id)];
    s.live = true;
    s.length = 0;
    s.pages.clear();
    return id;
}

std::int64_t PagedKVCache::pages_needed(SeqId s, std::int64_t tokens) const {
    const Seq& q = seq("pages_needed", s);
    if (tokens < 0) detail::fail(kOp, "pages_needed: tokens must be >= 0 but got ", tokens);
    if (tokens > std::numeric_limits<std::int64_t>::max() / 2 - q.length) {  // append's limit: its lengths never reach it
        detail::fail(kOp, "pages_needed: ", tokens, " tokens do not fit a length counter");
    }
    const std::int64_t ps = config_.page_size;
    const std::int64_t fresh = ceil_div(q.length + tokens, ps) - ceil_div(q.length, ps);
    // Writing into a shared, partly filled last page copies it first.
    const bool cow = tokens > 0 && q.length % ps != 0 && refcount_[static_cast<std::size_t>(q.pages.back())] > 1;
    return fresh + (cow ? 1 : 0);
}

void PagedKVCache::append(SeqId s, const TensorView& k_new, const TensorView& v_new) {
    const Seq& cur = seq("append", s);
    const auto check = [&](const TensorView& t, const char* name, std::int64_t D, const char* layout) {
        // T = 0 appends nothing: an empty tensor's pointer, null or not, is never read.
        detail::require_data(std::string(kOp) + ": append", t, name);
        detail::require_floating(std::string(kOp) + ": append", t, name);
        if (t.rank() != 3 || t.dim(0) != config_.kv_heads || t.dim(2) != D) {
            detail::fail(kOp, "append: ", name, " must have shape ", layout, " = (", config_.kv_heads, ", T, ", D,
                         ") but got ", t.shape());
        }
    };
    check(k_new, "k_new", config_.head_dim, "(Hkv, T, Dk)");
    check(v_new, "v_new", config_.value_dim, "(Hkv, T, Dv)");
    const std::int64_t T = k_new.dim(1);
    if (v_new.dim(1) != T) detail::fail(kOp, "append: v_new has ", v_new.dim(1), " tokens but k_new has ", T);
    if (T > std::numeric_limits<std::int64_t>::max() / 2 - cur.length) {
        detail::fail(kOp, "append: ", T, " tokens do not fit a length counter");
    }
    const std::int64_t need = pages_needed(s, T);
    if (need > free_pages()) {
        detail::fail(kOp, "append: the page pool is exhausted: sequence ", s, " needs ", need, " more page",
                     need == 1 ? "" : "s", " for ", T, " token", T == 1 ? "" : "s", " but ", free_pages(), " of ",
                     config_.num_pages, " are free (free or truncate sequences, or use a larger pool); nothing was "
                     "written");
    }
    if (T == 0) return;

    Seq& q = *seqs_[static_cast<std::size_t>(s)];
    const std::int64_t ps = config_.page_size, Hkv = config_.kv_heads, Dk = config_.head_dim, Dv = config_.value_dim;
    const std::size_t es = dtype_size(config_.storage);
    // Element offsets in the (Hkv, num_pages, page_size, D) pools.
    const std::int64_t khead = config_.num_pages * ps * Dk, vhead = config_.num_pages * ps * Dv;
    auto* kpool = static_cast<char*>(keys_->data);
    auto* vpool = static_cast<char*>(values_->data);
    const auto at = [es](char* pool, std::int64_t elements) { return pool + static_cast<std::size_t>(elements) * es; };
    // The one allocation, before anything changes: out of memory leaves the cache as it was
    // (a page taken and then not stored would be lost to the pool for good). Geometric, as
    // push_back grows (an exact reserve reallocated on every new page: quadratic over a decode).
    if (const auto pages = static_cast<std::size_t>(ceil_div(q.length + T, ps)); pages > q.pages.capacity())
        q.pages.reserve(std::max(pages, 2 * q.pages.capacity()));
    if (q.length % ps != 0 && refcount_[static_cast<std::size_t>(q.pages.back())] > 1) {
        // Copy-on-write: this sequence's own copy of the shared last page.
        const std::int32_t old = q.pages.back(), copy = take_page();
        for (std::int64_t h = 0; h < Hkv; ++h) {
            std::memcpy(at(kpool, h * khead + copy * ps * Dk), at(kpool, h * khead + old * ps * Dk),
                        static_cast<std::size_t>(ps * Dk) * es);
            std::memcpy(at(vpool, h * vhead + copy * ps * Dv), at(vpool, h * vhead + old * ps * Dv),
                        static_cast<std::size_t>(ps * Dv) * es);
        }
        release_page(old);
        q.pages.back() = copy;
    }
    while (static_cast<std::int64_t>(q.pages.size()) < ceil_div(q.length + T, ps)) q.pages.push_back(take_page());
    const detail::IeeeSubnormals ieee;  // rows read through double: DAZ made a bf16 subnormal 0 (core/float_env.hpp)
    for (std::int64_t t = 0; t < T; ++t) {
        const std::int64_t j = q.length + t;
        const std::int64_t page = q.pages[static_cast<std::size_t>(j / ps)], row = j % ps;
        for (std::int64_t h = 0; h < Hkv; ++h) {
            detail::convert_row(k_new, k_new.offset(h, t, 0), k_new.stride(2), Dk, config_.storage,
                                at(kpool, h * khead + (page * ps + row) * Dk));
            detail::convert_row(v_new, v_new.offset(h, t, 0), v_new.stride(2), Dv, config_.storage,
                                at(vpool, h * vhead + (page * ps + row) * Dv));
        }
    }
    q.length += T;
}

PagedKVCache::SeqId PagedKVCache::fork(SeqId s) {
    // The allocations first (the page list, then the sequence slot): out of memory in either
    // leaves no half-made sequence behind (a live id with a length and no pages crashed the
    // next call that read it).
    std::vector<std::int32_t> pages = seq("fork", s).pages;
    const SeqId id = add_sequence();
    Seq& child = *seqs_[static_cast<std::size_t>(id)];
    child.length = seqs_[static_cast<std::size_t>(s)]->length;
    child.pages = std::move(pages);
    for (std::int32_t p : child.pages) ++refcount_[static_cast<std::size_t>(p)];
    return id;
}

void PagedKVCache::truncate(SeqId s, std::int64_t new_length) {
    const Seq& cur = seq("truncate", s);
    if (new_length < 0 || new_length > cur.length) {
        detail::fail(kOp, "truncate: new_length must be in [0, ", cur.length, "] (sequence ", s, "'s length) but got ",
                     new_length);
    }
    Seq& q = *seqs_[static_cast<std::size_t>(s)];
    const auto keep = static_cast<std::size_t>(ceil_div(new_length, config_.page_size));
    for (std::size_t i = keep; i < q.pages.size(); ++i) release_page(q.pages[i]);
    q.pages.resize(keep);
    q.length = new_length;
}

void PagedKVCache::free(SeqId s) {
    (void)seq("free", s);
    Seq& q = *seqs_[static_cast<std::size_t>(s)];
    for (std::int32_t p : q.pages) release_page(p);
    q.pages.clear();
    q.length = 0;
    q.live = false;
    free_ids_.push_back(s);
}

bool PagedKVCache::contains(SeqId s) const {
    return s >= 0 && s < static_cast<SeqId>(seqs_.size()) && seqs_[static_cast<std::size_t>(s)]->live;
}

std::int64_t PagedKVCache::length(SeqId s) const { return seq("length", s).length; }

const std::vector<std::int32_t>& PagedKVCache::page_table(SeqId s) const { return seq("page_table", s).pages; }

std::int64_t PagedKVCache::free_pages() const { return static_cast<std::int64_t>(free_list_.size()); }

std::int64_t PagedKVCache::pool_bytes() const {
    return config_.kv_heads * config_.num_pages * config_.page_size * (config_.head_dim + config_.value_dim) *
           static_cast<std::int64_t>(dtype_size(config_.storage));
}

std::int64_t PagedKVCache::shared_pages() const {
    std::int64_t n = 0;
    for (std::int32_t r : refcount_) n += r > 1;
    return n;
}

TensorView PagedKVCache::key_pages() const {
    require_pool("key_pages");
    return TensorView(keys_->data, config_.storage,
                      Shape{config_.kv_heads, config_.num_pages, config_.page_size, config_.head_dim});
}
TensorView PagedKVCache::value_pages() const {
    require_pool("value_pages");
    return TensorView(values_->data, config_.storage,
                      Shape{config_.kv_heads, config_.num_pages, config_.page_size, config_.value_dim});
}

}  // namespace attn
