// sdpa_varlen in two steps: the checks, which build every sequence's problem, then the run. A
// caller with work of its own before the attention (MultiHeadAttention::forward_packed: the
// projections) checks first on stand-ins of the tensors it has yet to compute, and runs the
// checked call on them once computed — refused before its work, and checked once, as forward_into
// does with check_call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "attn/sdpa.hpp"
#include "../sdpa/problem.hpp"
#include "packed.hpp"

namespace attn::detail {

// A packed call, checked and cut into the problems of its sequences with queries and keys.
struct VarlenCall {
    PackedBatch pb;
    std::vector<SdpaProblem> problems;
    std::vector<std::size_t> sequence;  // the sequence of problems[i]
    std::vector<std::int64_t> keyless;  // Lq_b > 0 = Lk_b: rows that see no key
};

// Every check sdpa_varlen makes before it computes — check_packed's, each sequence's
// make_problem, and that a requested kernel can run the call — but the outputs' overlap with the
// inputs (run_varlen_call's), and nothing computed. q, k and v are never read: they may be
// stand-ins with the call's shapes, dtypes and inner strides, as long as each sequence's view of
// them (sequence_rows) stays inside the memory they view — stride-0 rows do. out and lse are the
// call's own (or views of their shapes inside real memory): their sequences' views are taken too.
VarlenCall check_varlen_call(const TensorView& q, const TensorView& k, const TensorView& v,
                             const TensorView& cu_seqlens_q, const TensorView& cu_seqlens_k, const SdpaOptions& options,
                             const TensorView& out, const TensorView* lse);

// Runs `call` on q, k, v, out and lse of the shapes and dtypes it was checked with (the same
// tensors, or those the stand-ins stood for): checks that the outputs share no memory with the
// inputs, then writes.
void run_varlen_call(VarlenCall call, const TensorView& q, const TensorView& k, const TensorView& v,
                     const TensorView& cu_seqlens_q, const TensorView& cu_seqlens_k, const SdpaOptions& options,
                     const TensorView& out, const TensorView* lse, SdpaReport* report = nullptr);

}  // namespace attn::detail
