#include "threads_option.hpp"

#include <string>

#include "attn/error.hpp"
#include "attn/threads.hpp"
#include "number_text.hpp"

namespace attn::cli {

int thread_count(std::int64_t n) {
    // 0 is "not given" (docs/environment.md, "One thread setting"), as attn::set_num_threads(0).
    if (n < 0 || n > 4096) {
        throw Error("--threads: expected a thread count from 1 to 4096 (0: the default) but got " + given_number("--threads", n));
    }
    return static_cast<int>(n);
}

void add_threads_option(CLI::App* cmd) {
    cmd->add_option_function<std::int64_t>(
        "--threads", [](const std::int64_t& n) { attn::set_num_threads(thread_count(n)); },
        "threads to compute on (default, or 0: ATTN_NUM_THREADS, else OMP_NUM_THREADS, else every CPU)");
}

}  // namespace attn::cli
