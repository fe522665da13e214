#include "threads_option.hpp"

#include <string>

#include "attn/error.hpp"
#include "attn/threads.hpp"

namespace attn::cli {

int thread_count(std::int64_t n, bool zero_is_default) {
    if (n < (zero_is_default ? 0 : 1) || n > 4096) {
        throw Error(std::string("--threads: expected a thread count from 1 to 4096") + (zero_is_default ? " (0 = default)" : "") +
                    " but got " + std::to_string(n));
    }
    return static_cast<int>(n);
}

void add_threads_option(CLI::App* cmd) {
    cmd->add_option_function<std::int64_t>(
        "--threads", [](const std::int64_t& n) { attn::set_num_threads(thread_count(n)); },
        "threads to compute on (default: ATTN_NUM_THREADS, else OMP_NUM_THREADS, else every CPU)");
}

}  // namespace attn::cli
