// The one dispatch point: chooses a forward kernel for a validated problem and says why.
#pragma once

#include "attn/sdpa.hpp"
#include "../sdpa/problem.hpp"

namespace attn::detail {

void run_forward(const SdpaProblem& problem, Impl requested, SdpaReport* report);
// run_forward's first step: impl = decode or flash naming a kernel that cannot run the problem is
// an error saying why ("sdpa: impl: flash cannot run this call: …"), before anything is written.
// Also for a call that is only checked (python/sdpa.cpp's _check_sdpa: attn.torch's empty calls).
void require_requested_kernel_runs(const SdpaProblem& problem, Impl requested);
// Whether run_forward(problem, requested, ...) runs the flash kernel (and does not throw):
// sdpa_varlen batches those sequences into one flash call (flash_forward_batch), and
// paged_attention runs flash on the pages for them: one rule for every entry point.
bool runs_flash(const SdpaProblem& problem, Impl requested);

// "Q float16, K float32, V float32, out float16": the dtypes a report's explanation names.
std::string dtypes_of(const SdpaProblem& p);

// The fast kernels (flash forward and backward, decode) keep per-thread tiles of up to 64 rows
// of each head dim; past this many columns that is gigabytes per thread (and a stride-0 head
// dim of 2^62, a legal view, wrapped the flash workspace's byte count: a heap overflow). Such
// calls are the reference's. No model comes near: head dims are 64-256.
inline constexpr std::int64_t kMaxFastHeadDim = std::int64_t{1} << 16;
// "" when Dk and Dv are within kMaxFastHeadDim, else why a fast kernel declines.
std::string head_dims_decline(std::int64_t Dk, std::int64_t Dv);

}  // namespace attn::detail
