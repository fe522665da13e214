// --threads N, on every subcommand that computes: attn's one thread setting
// (attn::set_num_threads, include/attn/threads.hpp), applied while the options are parsed,
// before the command runs.
#pragma once

#include <cstdint>

#include <CLI/CLI.hpp>

namespace attn::cli {

void add_threads_option(CLI::App* cmd);

// A --threads value checked by attn's one rule (1 to 4096, the range of attn::set_num_threads and
// ATTN_NUM_THREADS; more than the CPUs is allowed: threads then take turns): the error names
// --threads. zero_is_default: 0 is accepted too and means the default count (attn bench's
// --threads, which runs its own timing loops on it).
int thread_count(std::int64_t n, bool zero_is_default = false);

}  // namespace attn::cli
