// The one dispatch point: chooses a forward kernel for a validated problem and says why.
#pragma once

#include "attn/sdpa.hpp"
#include "../sdpa/problem.hpp"

namespace attn::detail {

void run_forward(const SdpaProblem& problem, Impl requested, SdpaReport* report);
// Whether run_forward(problem, requested, ...) runs the flash kernel (and does not throw):
// sdpa_varlen batches those sequences into one flash call (flash_forward_batch), and
// paged_attention runs flash on the pages for them: one rule for every entry point.
bool runs_flash(const SdpaProblem& problem, Impl requested);

// "Q float16, K float32, V float32, out float16": the dtypes a report's explanation names.
std::string dtypes_of(const SdpaProblem& p);

}  // namespace attn::detail
