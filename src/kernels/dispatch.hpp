// The one dispatch point: chooses a forward kernel for a validated problem and says why.
#pragma once

#include "attn/sdpa.hpp"
#include "../sdpa/problem.hpp"

namespace attn::detail {

struct KernelSet;

// The forward in two steps: the choice of a kernel with the report's text, then the kernel.
// The choice is all the forward allocates before its kernel (its strings: a decline, an ISA's
// reason, the report's text), so a caller can take it where a refusal is named as bookkeeping
// (sdpa: detail::naming_bookkeeping) — nothing is written yet — while each kernel names the
// buffers it sizes itself (attn::OutOfMemory), and after the kernel the report only moves: a
// refused allocation never throws from a call whose output is written.
enum class ForwardKernel { decode, flash, reference };
struct ForwardChoice {
    ForwardKernel kernel = ForwardKernel::reference;
    const KernelSet* kernels = nullptr;  // decode and flash: the kernel table's row
    SdpaReport text;                     // the report's, when choose_forward was asked for it
};
// require_requested_kernel_runs, then the choice: decode (impl = decode, or auto where
// auto_decode_declines is empty), flash (impl = flash, or auto where it supports the call), else
// the reference. `report`: make the report's text too.
ForwardChoice choose_forward(const SdpaProblem& problem, Impl requested, bool report);
// Runs the chosen kernel; then *report = choice.text (moved), when report is not null.
void run_chosen(const SdpaProblem& problem, ForwardChoice& choice, SdpaReport* report);
// choose_forward, then run_chosen.
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
