// --causal on every command that has a causal mask (attn sdpa, attn ring, attn mha): one set of
// forms with one meaning. `--causal none|top-left|bottom-right` says which; `--causal` alone means
// top-left (what "causal" means in PyTorch and in attn mha before it took values); no --causal,
// none. Every such command takes all three.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "attn/sdpa.hpp"

namespace attn::cli {

// Declares --causal on cmd, stored as its text in `value` (which holds "none" until given);
// `what` says what top-left and bottom-right mean for this command, and the sentence on the
// bare form is added here.
CLI::Option* add_causal_option(CLI::App* cmd, std::string& value, const std::string& what);

// The value of --causal (attn::parse_causal; its error names --causal).
Causal causal_option(const std::string& value);

}  // namespace attn::cli
