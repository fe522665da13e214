// The one dispatch point: chooses a forward kernel for a validated problem and says why.
#pragma once

#include "attn/sdpa.hpp"
#include "../sdpa/problem.hpp"

namespace attn::detail {

void run_forward(const SdpaProblem& problem, Impl requested, SdpaReport* report);

}  // namespace attn::detail
