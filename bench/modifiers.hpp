// Score-modifier rows of `attn bench` (issue 13): the fast kernel's call again with softcap,
// ALiBi or sinks set, timed in the same run as its plain row and reported as a ratio to it
// (Row::ratio_to; finish_case computes the ratio, the report prints it with the target).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "attn/sdpa.hpp"

namespace attn::bench {

// One modifier row: `name` is "softcap", "alibi", "sinks" or several joined by '+'; `target`
// the bound on (this row's median) / (the plain row's median) that the issue sets.
struct ModifierRow {
    std::string name;
    double target = 0.0;
};

// Owners of the tensors the options point to.
struct ModifierTensors {
    Tensor alibi, sinks;
};

// Sets the modifiers of `name` on `opt` for Hq query heads: softcap 50 (Gemma 2's attention
// cap), the standard ALiBi slopes, sinks 0.5 per head. Throws attn::Error for an unknown name.
void set_modifiers(const std::string& name, std::int64_t Hq, SdpaOptions& opt, ModifierTensors& keep);

}  // namespace attn::bench
