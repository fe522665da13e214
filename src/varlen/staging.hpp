// Staged outputs: how a packed batch whose sequences run one kernel call each stays all or nothing.
//
// sdpa_varlen's decode and reference sequences and every sequence of sdpa_varlen_backward run a
// kernel call of their own, and each call sizes its own buffers (the decode kernel's scratch, the
// reference's Lq x Lk steps, the backward's per-thread tiles, a zeroed copy of a head holding a
// NaN, sized only where the kernel meets it). Sequence b's call can therefore be refused memory
// after sequences 0 .. b−1 have run: written straight into the caller's tensors, their rows were
// left written by a call that failed. Each sequence writes a contiguous staged copy of its output
// views instead, and the staged views are copied into the caller's tensors only once every
// sequence has run — a copy that allocates nothing, so a call writes every row or none. A kernel
// writes the same values whatever its output's strides (docs/kernels.md, "Parallel split and
// scaling"), and the copy moves bits: the result is bit-identical. The copy is O(T·H·D) against
// the kernels' O(Lq·Lk·H·D); docs/serving.md ("Packed sequences") has its measured cost.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string_view>
#include <vector>

#include "attn/tensor.hpp"

namespace attn::detail {

class StagedOutputs {
public:
    // Stages `target`, a sequence's (1, H, L, D) output or (1, H, L) lse view: a contiguous view of
    // its dtype and shape will stand in for it. Returns the index of the staged view. Allocates
    // (its lists): a caller's bookkeeping step.
    std::size_t add(const TensorView& target);
    // The bytes every staged view needs together (each starts on a 64-byte boundary).
    std::int64_t bytes() const { return bytes_; }
    // Puts the staged views at `base` (bytes() bytes, 64-byte aligned, kept alive by the caller) —
    // or in a buffer of their own, an attn::OutOfMemory naming `what` when the system refuses it.
    void place(void* base);
    void allocate(std::string_view what);
    // Staged view i (after place or allocate).
    const TensorView& staged(std::size_t i) const { return staged_[i]; }
    // Copies every staged view into its target, bit for bit. Allocates nothing and cannot fail;
    // one parallel region on attn::num_threads() threads when there is enough to copy (the few
    // rows of a decode batch are copied by the calling thread: a fork/join would cost more).
    void commit() const;

private:
    struct Free {
        void operator()(void* p) const { std::free(p); }
    };
    std::vector<TensorView> targets_, staged_;
    std::vector<std::int64_t> at_;  // byte offset of each staged view
    std::int64_t bytes_ = 0;
    std::unique_ptr<void, Free> own_;
};

}  // namespace attn::detail
