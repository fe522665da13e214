// The values of SdpaOptions that need no tensor — scale, a scalar query_offset, window,
// dropout_p (with its seed) and softcap — each in its range, checked in one place by every
// caller: make_problem (its first option check), the packed entry points (sdpa_varlen and its
// backward, for all sequences up front) and the CLI, which checks them right after parsing, before
// it reads a file (a bad --softcap is named before gigabytes of Q/K/V are read, and before a
// missing input is). The CLI renames the field in the message to its option (flag_names.hpp), so
// the words are the library's in both.
#pragma once

#include <string_view>

#include "attn/sdpa.hpp"

namespace attn::detail {

// Throws attn::Error "<kOp>: <field>: <expectation> but got <value>" for the first value out of
// range (also the enums impl, causal and window.align, in case of a cast from a wrong integer).
void check_option_values(const SdpaOptions& options, std::string_view kOp);

// Its rule for softcap, the one every caller that takes a softcap keeps to (the MHA layer's
// config too): 0 (off) or a normal finite float32, else
// "<kOp>: softcap: must be 0 (off) or a finite float32 in [1.1754944e-38, 3.4028235e38] but got C".
void require_softcap(double softcap, std::string_view kOp);

}  // namespace attn::detail
