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

std::string unknown_command(const CLI::App& app, int argc, const char* const* argv) {
    std::string names;
    for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
        names += (names.empty() ? "" : ", ") + sub->get_name();
    }
    if (argc < 2) return "a subcommand is required: one of " + names + " (attn --help)";
    const std::string first = argv[1];
    if (!first.empty() && first[0] == '-') return "";  // --help, --version, or an option CLI11 names
    for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
        if (sub->check_name(first)) return "";
    }
    return "unknown subcommand '" + first + "': expected one of " + names + " (attn --help)";
}

}  // namespace attn::cli
