// --threads N, on every subcommand that computes: attn's one thread setting
// (attn::set_num_threads, include/attn/threads.hpp), applied while the options are parsed,
// before the command runs.
#pragma once

#include <cstdint>

#include <CLI/CLI.hpp>

namespace attn::cli {

void add_threads_option(CLI::App* cmd);

// A --threads value checked by attn's one rule (1 to 4096, the range of attn::set_num_threads and
// ATTN_NUM_THREADS; more than the CPUs is allowed: threads then take turns; 0 means the default
// count): the error names --threads.
int thread_count(std::int64_t n);

}  // namespace attn::cli
