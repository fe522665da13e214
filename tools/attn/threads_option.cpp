#include "threads_option.hpp"

#include <cstdint>
#include <string>

#include "attn/error.hpp"
#include "attn/threads.hpp"

namespace attn::cli {

void add_threads_option(CLI::App* cmd) {
    cmd->add_option_function<std::int64_t>(
        "--threads",
        [](const std::int64_t& n) {
            if (n < 1 || n > 4096) {
                throw Error("--threads: expected a thread count from 1 to 4096 but got " + std::to_string(n));
            }
            attn::set_num_threads(static_cast<int>(n));
        },
        "threads to compute on (default: ATTN_NUM_THREADS, else OMP_NUM_THREADS, else every CPU)");
}

}  // namespace attn::cli
