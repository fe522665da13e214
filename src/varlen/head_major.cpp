// Head-major K/V copies for sdpa_varlen (head_major.hpp explains why).
#include "head_major.hpp"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <optional>

#include "attn/sdpa_varlen.hpp"
#include "attn/threads.hpp"
#include "../core/check.hpp"
#include "../core/checked_size.hpp"

namespace attn::detail {
namespace {

// A key tile is reused by every query block that sees it: with fewer than this many queries
// (and keys) the copy costs about as much as it saves.
constexpr std::int64_t kMinRows = 256;

bool strided_f32(const TensorView& t) {
    return t.dtype() == DType::f32 && t.stride(3) == 1 && t.stride(2) != t.dim(3);
}

// Bytes of float32 copies of p's K and V; nullopt when they cannot be counted in 64 bits —
// broadcast (stride-0) K/V can have far more elements than memory.
std::optional<std::int64_t> kv_bytes(const SdpaProblem& p) {
    const auto d = size_add(p.Dk, p.Dv), rows = size_mul(p.Hkv, p.Lk);
    const auto floats = d && rows ? size_mul(*rows, *d) : std::nullopt;
    return floats ? size_mul(*floats, static_cast<std::int64_t>(sizeof(float))) : std::nullopt;
}

// The rows of src into dst (float32 (1, H, L, D), unit inner strides), split over the threads
// of the enclosing parallel region (no barrier at the end).
void copy_rows_for(const TensorView& src, const TensorView& dst) {
    ATTN_DASSERT(src.stride(3) == 1 && dst.stride(3) == 1 && src.shape() == dst.shape());
    const std::int64_t L = src.dim(2), rows = src.dim(1) * L;
    const auto bytes = sizeof(float) * static_cast<std::size_t>(src.dim(3));
    const float* s = src.data_as<const float>();
    float* d = dst.data_as<float>();
#pragma omp for schedule(static) nowait
    for (std::int64_t r = 0; r < rows; ++r) {
        const std::int64_t h = r / L, j = r % L;
        std::memcpy(d + dst.offset(0, h, j, 0), s + src.offset(0, h, j, 0), bytes);
    }
}

// The buffer kept between calls (HeadMajorScratch) and its size in bytes.
std::mutex kept_mutex;
std::unique_ptr<HugeBuffer> kept;
std::int64_t kept_bytes = 0;

std::atomic<std::int64_t> budget{kHeadMajorBudget};

}  // namespace

HeadMajorScratch::HeadMajorScratch(std::int64_t bytes, const char* what) {
    {
        std::unique_ptr<HugeBuffer> small;  // freed outside the lock, before the new allocation
        const std::lock_guard<std::mutex> lock(kept_mutex);
        if (kept != nullptr && kept_bytes >= bytes) {
            buf_ = std::move(kept);
            bytes_ = kept_bytes;
            kept_bytes = 0;
            return;
        }
        small = std::move(kept);
        kept_bytes = 0;
    }
    buf_ = std::make_unique<HugeBuffer>(bytes, what);
    bytes_ = bytes;
}

HeadMajorScratch::~HeadMajorScratch() {
    std::unique_ptr<HugeBuffer> drop;  // the smaller of the kept and this one, freed outside the lock
    const std::lock_guard<std::mutex> lock(kept_mutex);
    if (kept == nullptr || kept_bytes < bytes_) {
        drop = std::move(kept);
        kept = std::move(buf_);
        kept_bytes = bytes_;
    } else {
        drop = std::move(buf_);
    }
}

}  // namespace attn::detail

namespace attn {

void release_varlen_scratch() {
    std::unique_ptr<detail::HugeBuffer> drop;  // freed outside the lock
    const std::lock_guard<std::mutex> lock(detail::kept_mutex);
    drop = std::move(detail::kept);
    detail::kept_bytes = 0;
}

std::int64_t varlen_scratch_bytes() {
    const std::lock_guard<std::mutex> lock(detail::kept_mutex);
    return detail::kept_bytes;
}

}  // namespace attn

namespace attn::detail {

std::int64_t head_major_budget() { return budget.load(std::memory_order_relaxed); }

ScopedHeadMajorBudget::ScopedHeadMajorBudget(std::int64_t bytes) : saved_(budget.exchange(bytes)) {}
ScopedHeadMajorBudget::~ScopedHeadMajorBudget() { budget.store(saved_); }

bool head_major_pays(const SdpaProblem& p) {
    return p.paged == nullptr && p.B == 1 && p.Lq >= kMinRows && p.Lk >= kMinRows && strided_f32(p.k) &&
           strided_f32(p.v);
}

bool head_major_backward_pays(const SdpaProblem& p) {
    return p.paged == nullptr && p.B == 1 && p.Lq >= kMinRows && p.Lk >= kMinRows;
}

bool strided_rows(const TensorView& t) { return strided_f32(t); }

TensorView head_major_view(const TensorView& like, float* dst) {
    const std::int64_t H = like.dim(1), L = like.dim(2), D = like.dim(3);
    return TensorView(dst, DType::f32, Shape{1, H, L, D}, Strides{H * L * D, L * D, D, 1});
}

TensorView copy_head_major(const TensorView& src, float* dst) {
    const TensorView d = head_major_view(src, dst);
#pragma omp parallel num_threads(num_threads())
    copy_rows_for(src, d);
    return d;
}

std::unique_ptr<HeadMajorScratch> head_major_kv(std::vector<SdpaProblem>& ps) {
    const std::int64_t limit = head_major_budget();
    std::vector<std::size_t> copy;
    for (std::size_t i = 0; i < ps.size(); ++i)
        if (head_major_pays(ps[i])) copy.push_back(i);
    std::stable_sort(copy.begin(), copy.end(), [&](std::size_t a, std::size_t b) { return ps[a].Lk > ps[b].Lk; });
    std::vector<std::int64_t> at;  // float offset of each copied problem's K in the buffer
    std::int64_t total = 0;        // bytes, <= limit
    for (std::size_t n = 0; n < copy.size(); ++n) {
        const auto need = kv_bytes(ps[copy[n]]);
        const auto sum = need ? size_add(total, *need) : std::nullopt;
        if (!sum || *sum > limit) {
            copy.resize(n);  // the rest (shorter ones) are read in place
            break;
        }
        at.push_back(total / static_cast<std::int64_t>(sizeof(float)));
        total = *sum;
    }
    if (copy.empty()) return nullptr;
    auto buf = std::make_unique<HeadMajorScratch>(total);
    float* base = buf->data();
    const auto ncopy = static_cast<std::int64_t>(copy.size());
#pragma omp parallel num_threads(num_threads())
    for (std::int64_t n = 0; n < ncopy; ++n) {
        const SdpaProblem& p = ps[copy[static_cast<std::size_t>(n)]];
        float* kd = base + at[static_cast<std::size_t>(n)];
        copy_rows_for(p.k, head_major_view(p.k, kd));
        copy_rows_for(p.v, head_major_view(p.v, kd + p.Hkv * p.Lk * p.Dk));
    }
    for (std::size_t n = 0; n < copy.size(); ++n) {
        SdpaProblem& p = ps[copy[n]];
        float* kd = base + at[n];
        p.k = head_major_view(p.k, kd);
        p.v = head_major_view(p.v, kd + p.Hkv * p.Lk * p.Dk);
    }
    return buf;
}

}  // namespace attn::detail
