#include "interrupt.hpp"

#include <omp.h>

#include "attn/error.hpp"

namespace attn {
namespace {

const std::atomic<bool> g_never{false};
thread_local const std::atomic<bool>* t_flag = nullptr;  // this thread's innermost ScopedInterruptFlag's

}  // namespace

ScopedInterruptFlag::ScopedInterruptFlag(const std::atomic<bool>& flag) noexcept : previous_(t_flag) { t_flag = &flag; }

ScopedInterruptFlag::~ScopedInterruptFlag() { t_flag = previous_; }

namespace detail {

Interrupt::Interrupt() noexcept : flag_(t_flag != nullptr && !omp_in_parallel() ? t_flag : &g_never) {}

void Interrupt::throw_if_requested() const {
    if (seen_.load(std::memory_order_relaxed)) throw Interrupted();
}

NotInterruptible::NotInterruptible() noexcept : off_(g_never) {}

}  // namespace detail
}  // namespace attn
