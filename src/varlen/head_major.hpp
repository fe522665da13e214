// Head-major K/V for the long sequences of a packed batch (sdpa_varlen's forward).
//
// Packed K/V are (T, H, D): consecutive keys of one head are H·D floats apart (4 KiB at
// H = 16, D = 64). The flash kernel reads its key tiles in place, so a 64-key tile of such a
// view has every row at the same 4 KiB offset modulo the L1 way size: all 64 rows fall into
// the same few L1 sets and the tile does not stay in L1 while the query panels of the block
// walk it (measured on V1: the varlen rows ran about 14 % fewer FLOP/s per tile than the same
// kernel on a padded head-major batch; dev/varlen_lab.cpp: 13 % more CPU time without the
// copies). Copying a sequence's K and V once into a head-major (1, H, L, D) buffer costs
// O(L·H·D) against the attention's O(Lq·Lk·H·D), and the kernels read the same values, so the
// result is bit-identical.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "attn/tensor.hpp"
#include "../kv_cache/huge_buffer.hpp"
#include "../sdpa/problem.hpp"

namespace attn::detail {

// True when copying p's K/V head-major is worth it: float32 K and V with a contiguous head
// dim but keys not adjacent (the packed layout), and enough queries and keys that every
// key tile is read by several query blocks.
bool head_major_pays(const SdpaProblem& p);

// The buffer of one call's copies (and the backward's staged gradients: staging.hpp). The process
// keeps one such buffer between calls (the largest returned: at most the budget, 256 MiB, for the
// copies alone, plus the size of dq, dk and dv for a backward) and the next call reuses it: a fresh buffer
// costs its page faults and the kernel's zeroing of every page on every call, and that cost
// grows with the threads (dev/varlen_lab.cpp on V1: 21 ms of system time per call on 1 thread,
// 166 ms on 2 — threads faulting on one address space — against 0–3 ms with the buffer reused;
// the copy itself is 17 ms of CPU time). Calls on different threads at once each get a buffer
// (one of them the kept one); only one is kept.
class HeadMajorScratch {
public:
    // The kept buffer when it is big enough; else a new one, `what` in its out-of-memory message.
    explicit HeadMajorScratch(std::int64_t bytes, const char* what = "sdpa_varlen head-major K/V");
    ~HeadMajorScratch();                            // kept for the next call (the larger of two)
    HeadMajorScratch(const HeadMajorScratch&) = delete;
    HeadMajorScratch& operator=(const HeadMajorScratch&) = delete;
    float* data() const { return static_cast<float*>(buf_->data); }

private:
    std::unique_ptr<HugeBuffer> buf_;
    std::int64_t bytes_ = 0;
};

// Replaces the K and V of the problems in `ps` that head_major_pays by head-major copies (same
// shapes and values), the sequences with the most keys first while the copies stay within
// head_major_budget() bytes, so that the whole batch can then run as one flash task list. The
// sequences past the budget are read in place (the same bits, a little slower). Returns the
// buffer holding the copies (null: nothing copied): keep it alive while `ps` run. One parallel
// region on attn::num_threads() threads. The buffer is a HugeBuffer: with 4 KiB pages the
// first-touch faults of a fresh 200 MiB buffer cost as much as the attention itself
// (dev/varlen_lab.cpp on V1: 840 ms of CPU time against 20 ms for the copy into touched memory).
inline constexpr std::int64_t kHeadMajorBudget = std::int64_t{256} << 20;
std::unique_ptr<HeadMajorScratch> head_major_kv(std::vector<SdpaProblem>& ps);

// The backward (varlen_backward.cpp): a task of the flash backward holds a key block and walks
// every query row of its heads, reading Q and dO rows and accumulating dQ rows in place —
// 4 KiB apart in the packed layout, the L1 set conflict above on the hot side. dev/varlen_lab.cpp
// on V1, 1 thread: 42 % more CPU time on packed views than on head-major tensors; Q, O, dO, dQ
// head-major recover all of it, K, V, dK, dV a third. True when sequence problem p is long
// enough for its backward to read Q, dO, K, V through head-major copies (those of them that
// strided_rows); the copies are O(L·H·D) against O(Lq·Lk·H·D). Its dQ, dK, dV are written
// head-major whatever its length: to the call's staged views (staging.hpp).
bool head_major_backward_pays(const SdpaProblem& p);
// float32 (1, H, L, D) rows with a contiguous head dim but keys not adjacent: the packed layout.
bool strided_rows(const TensorView& t);

// The contiguous (1, H, L, D) float32 view at dst with the shape of `like` (1, H, L, D).
TensorView head_major_view(const TensorView& like, float* dst);
// src (1, H, L, D) float32, unit inner stride, into dst as a contiguous (1, H, L, D) tensor, whose
// view is returned. One parallel region on attn::num_threads() threads. (The way back, from the
// backward's head-major gradients, is the staged views' commit: staging.hpp.)
TensorView copy_head_major(const TensorView& src, float* dst);

// The budget head_major_kv (and the backward's copies) use: kHeadMajorBudget, or a test's (ScopedHeadMajorBudget).
std::int64_t head_major_budget();

// Tests only: head_major_kv uses `bytes` as its budget while this lives (process-wide; not for
// concurrent use), so that the path past the budget can be tested on small batches.
class ScopedHeadMajorBudget {
public:
    explicit ScopedHeadMajorBudget(std::int64_t bytes);
    ~ScopedHeadMajorBudget();
    ScopedHeadMajorBudget(const ScopedHeadMajorBudget&) = delete;
    ScopedHeadMajorBudget& operator=(const ScopedHeadMajorBudget&) = delete;

private:
    std::int64_t saved_;
};

}  // namespace attn::detail
