// --threads N, on every subcommand that computes: attn's one thread setting
// (attn::set_num_threads, include/attn/threads.hpp), applied while the options are parsed,
// before the command runs.
#pragma once

#include <CLI/CLI.hpp>

namespace attn::cli {

void add_threads_option(CLI::App* cmd);

}  // namespace attn::cli
