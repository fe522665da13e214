// The one dispatch point: chooses a forward kernel for a validated problem and says why.
#pragma once

#include "attn/sdpa.hpp"
#include "../sdpa/problem.hpp"

namespace attn::detail {

void run_forward(const SdpaProblem& problem, Impl requested, SdpaReport* report);

// "Q float16, K float32, V float32, out float16": the dtypes a report's explanation names.
std::string dtypes_of(const SdpaProblem& p);

}  // namespace attn::detail
