// The whole command line of `attn`, in one function: main() parses with it, and the CLI
// fuzz target (fuzz/fuzz_cli_args.cpp) parses with exactly the same options.
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

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

void print_error_line(const std::string& message, const std::string& suffix) {
    std::string line = "attn: error: ";
    for (const char ch : message + suffix) {
        const auto c = static_cast<unsigned char>(ch);
        if (c >= 0x20 && c != 0x7f) {
            line += ch;
        } else {
            char esc[5];
            std::snprintf(esc, sizeof esc, "\\x%02x", c);
            line += esc;
        }
    }
    std::fprintf(stderr, "%s\n", line.c_str());
}

std::string stdout_write_error() {
    errno = 0;
    const bool flush_failed = std::fflush(stdout) != 0;
    const int err = errno;
    if (!flush_failed && !std::ferror(stdout)) return "";
    return std::string("stdout: write failed") + (flush_failed && err != 0 ? std::string(" (") + std::strerror(err) + ")" : "");
}

bool silent_ring_rank(int argc, const char* const* argv) {
    if (argc < 2 || std::string_view(argv[1]) != "ring") return false;
    for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"}) {
        const char* v = std::getenv(name);
        if (v != nullptr && *v != '\0') return std::string_view(v) != "0";
    }
    return false;
}

namespace {

// The command `name` names, or null (CLI11 2.1 has only a throwing lookup).
const CLI::App* command_named(const CLI::App& app, const std::string& name) {
    for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
        if (sub->check_name(name)) return sub;
    }
    return nullptr;
}

}  // namespace

bool asks_for_help(const CLI::App& app, int argc, const char* const* argv) {
    if (argc < 3 || command_named(app, argv[1]) == nullptr) return false;
    for (int i = 2; i < argc; ++i) {
        const std::string_view word = argv[i];
        if (word == "--") return false;
        if (word == "--help" || word == "-h") return true;
    }
    return false;
}

std::string unknown_command(const CLI::App& app, int argc, const char* const* argv) {
    std::string names;
    for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
        names += (names.empty() ? "" : ", ") + sub->get_name();
    }
    if (argc < 2) return "a subcommand is required: one of " + names + " (attn --help)";
    const std::string first = argv[1];
    if (!first.empty() && first[0] == '-') {
        // --help, --version (and --opt=value forms): CLI11's; anything else would get its "A
        // subcommand is required", which does not name the word.
        const std::string name = first.substr(0, first.find('='));
        if (app.get_option_no_throw(name) != nullptr) return "";
        return "unknown option '" + first + "' before the subcommand: expected one of " + names + " (attn --help)";
    }
    if (const CLI::App* sub = command_named(app, first)) {
        // CLI11 reports an unknown option only after every required one is there: `attn sdpa
        // --bogus` said "--q is required". A misspelt option is the first thing to say; an
        // option of one value given twice comes next (CLI11 says "At Most 1 required but
        // received 2", which reads as if something were missing).
        std::vector<std::pair<const CLI::Option*, int>> seen;  // options of one value: times given
        const CLI::Option* repeated = nullptr;
        std::string repeated_name, missing_value;
        // A short option too ("-q", "-qQ.npy": its value attached; "-threads" reads as -t): attn
        // has none but -h, and `attn sdpa -q Q.npy …` said "--q is required". A negative number
        // is no option.
        const auto is_short = [](const std::string& word) {
            return word.size() >= 2 && word[0] == '-' && word[1] != '-' && word[1] != '.' &&
                   std::isdigit(static_cast<unsigned char>(word[1])) == 0;
        };
        const auto name_of = [&](const std::string& word) { return word.substr(0, is_short(word) ? 2 : word.find('=')); };
        const auto option_of = [&](const std::string& word) -> const CLI::Option* {
            if (!is_short(word) && (word.size() < 3 || word.compare(0, 2, "--") != 0)) return nullptr;
            const CLI::Option* opt = sub->get_option_no_throw(name_of(word));
            return opt != nullptr ? opt : app.get_option_no_throw(name_of(word));
        };
        for (int i = 2; i < argc; ++i) {
            const std::string word = argv[i];
            if (word == "--") break;
            if (!is_short(word) && (word.size() < 3 || word.compare(0, 2, "--") != 0)) continue;
            const std::size_t eq = word.find('=');
            const std::string name = name_of(word);
            const bool attached = is_short(word) ? word.size() > 2 : eq != std::string::npos;  // the value in the word
            const CLI::Option* opt = option_of(word);
            if (opt == nullptr) {
                return "unknown option '" + word.substr(0, eq) + "' of attn " + sub->get_name() + " (attn " +
                       sub->get_name() + " --help lists them)";
            }
            // `--causal=` and `--scale= 0.5`: CLI11 reads an empty attached value as no value at all
            // (the bare --causal's top-left; --scale then took the next word), while `--scale ""` is
            // refused — the empty value is refused in both forms.
            if (!is_short(word) && eq == word.size() - 1 && missing_value.empty()) {
                missing_value = name + ": " + kEmptyValueRefused;
            }
            if (opt->get_items_expected_max() == 1 && opt->get_multi_option_policy() == CLI::MultiOptionPolicy::Throw) {
                auto it = std::find_if(seen.begin(), seen.end(), [&](const auto& s) { return s.first == opt; });
                if (it == seen.end()) it = seen.insert(seen.end(), {opt, 0});
                if (++it->second == 2 && repeated == nullptr) {
                    repeated = opt;
                    repeated_name = name;
                }
            }
            // Its values are not options, whatever they look like (--title "--x", --tokens "--,a") —
            // unless one is an option of the command: CLI11 would take `--heatmap --threads 1` as the
            // file "--threads" and then stumble on the "1".
            const int values = attached ? 0 : std::max(0, opt->get_items_expected_min());
            for (int v = 1; v <= values && i + 1 < argc; ++v) {
                const std::string next = argv[i + 1];
                if (option_of(next) != nullptr) {  // read as an option in its turn
                    if (missing_value.empty()) {
                        missing_value = name + ": expected a value but the next word is the option " + name_of(next) +
                                        " (give a value that starts with '-' as " + name + "=VALUE)";
                    }
                    break;
                }
                ++i;
            }
        }
        if (!missing_value.empty()) return missing_value;
        for (const auto& [opt, count] : seen) {
            if (opt == repeated)
                return repeated_name + ": given " + std::to_string(count) + " times; give it once";
        }
        return "";
    }
    return "unknown subcommand '" + first + "': expected one of " + names + " (attn --help)";
}

}  // namespace attn::cli
