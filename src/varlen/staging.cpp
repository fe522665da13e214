// Staged outputs of a packed batch (staging.hpp says why).
#include "staging.hpp"

#include <cstring>

#include "attn/threads.hpp"
#include "../core/allocate.hpp"
#include "../core/check.hpp"

namespace attn::detail {
namespace {

// Below this many bytes the calling thread copies alone.
constexpr std::int64_t kParallelBytes = std::int64_t{1} << 20;

// Row r = (head h, position l) of staged view `from` into `to` ((1, H, L, D) or (1, H, L), one
// dtype): one memcpy when both have a unit stride along D, else one per element (an lse, a
// strided output).
void copy_row(const TensorView& from, const TensorView& to, std::int64_t r) {
    const std::int64_t L = from.dim(2), h = r / L, l = r % L;
    const std::int64_t item = static_cast<std::int64_t>(dtype_size(from.dtype()));
    const auto* src = static_cast<const char*>(from.data());
    auto* dst = static_cast<char*>(to.data());
    const std::int64_t D = from.rank() == 4 ? from.dim(3) : 1;
    if (from.rank() == 4 && from.stride(3) == 1 && to.stride(3) == 1) {
        std::memcpy(dst + item * to.offset(0, h, l), src + item * from.offset(0, h, l), static_cast<std::size_t>(item * D));
        return;
    }
    for (std::int64_t d = 0; d < D; ++d)
        std::memcpy(dst + item * to.offset(0, h, l, d), src + item * from.offset(0, h, l, d), static_cast<std::size_t>(item));
}

}  // namespace

std::size_t StagedOutputs::add(const TensorView& target) {
    ATTN_DASSERT((target.rank() == 3 || target.rank() == 4) && target.dim(0) == 1);
    const std::int64_t at = (bytes_ + 63) / 64 * 64;
    // No overflow: the target has one address per element (the outputs' check), so its bytes exist.
    bytes_ = at + target.numel() * static_cast<std::int64_t>(dtype_size(target.dtype()));
    targets_.push_back(target);
    at_.push_back(at);
    staged_.emplace_back();
    return targets_.size() - 1;
}

void StagedOutputs::place(void* base) {
    for (std::size_t i = 0; i < targets_.size(); ++i)
        staged_[i] = TensorView(static_cast<char*>(base) + at_[i], targets_[i].dtype(), targets_[i].shape());
}

void StagedOutputs::allocate(std::string_view what) {
    own_.reset(allocate_streamed(bytes_, what));
    place(own_.get());
}

void StagedOutputs::commit() const {
#pragma omp parallel num_threads(num_threads()) if (bytes_ >= kParallelBytes)
    for (std::size_t i = 0; i < targets_.size(); ++i) {
        const std::int64_t rows = targets_[i].dim(1) * targets_[i].dim(2);
#pragma omp for schedule(static) nowait
        for (std::int64_t r = 0; r < rows; ++r) copy_row(staged_[i], targets_[i], r);
    }
}

}  // namespace attn::detail
