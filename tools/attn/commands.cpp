// The whole command line of `attn`, in one function: main() parses with it, and the CLI
// fuzz target (fuzz/fuzz_cli_args.cpp) parses with exactly the same options.
#include <string>

#include "attn/version.hpp"
#include "commands.hpp"
#include "strict_options.hpp"

namespace attn::cli {

void add_commands(CLI::App& app) {
    app.set_version_flag("--version", std::string("attn ") + attn::kVersion);
    app.require_subcommand(1);
    add_bench_command(app);
    add_sdpa_command(app);
    add_mha_command(app);
    add_ring_command(app);
    add_demo_command(app);
    add_heatmap_command(app);
    make_options_strict(app);  // every option declared above: no empty values, strict numbers
}

}  // namespace attn::cli
