// --scale, on every command that takes a score scale (attn sdpa, attn ring): one option with one
// help text. The rule is the library's (SdpaOptions::scale, checked by sdpa's option checks with
// --scale in its messages; docs/conventions.md, "Shapes of attn::sdpa").
#pragma once

#include <optional>

#include <CLI/CLI.hpp>

namespace attn::cli {

CLI::Option* add_scale_option(CLI::App* cmd, std::optional<double>& scale);

}  // namespace attn::cli
