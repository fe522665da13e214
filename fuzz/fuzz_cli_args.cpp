// libFuzzer target: the attn command line, parsed and not run. The input is the argument
// list, arguments separated by NUL bytes (argv cannot hold a NUL): "sdpa\0--q\0q.npy\0...".
// The app is built by the CLI's own attn::cli::add_commands. Nothing runs: CLI11 calls the
// top app's parse-complete callback after every option is converted and every requirement
// checked, before any subcommand's callback (the computation), and that callback stops the
// parse. (Replacing the subcommands' callbacks instead would free their arguments, which the
// callbacks own.) Parsing may accept, or refuse with CLI11's ParseError
// or an attn::Error — anything else (a crash, a sanitizer report, another exception, which
// the CLI would print as a message the user cannot act on) is a finding.
#include <cstdint>
#include <exception>
#include <typeinfo>
#include <string>
#include <vector>

#include "attn/error.hpp"
#include "commands.hpp"
#include "scratch.hpp"

namespace {
struct Parsed {};  // thrown once parsing is complete, so that no subcommand runs
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    constexpr std::size_t kMaxArgs = 64;  // more gives nothing new, only slower inputs
    std::vector<std::string> args{"attn"};
    std::string cur;
    for (std::size_t i = 0; i < size && args.size() <= kMaxArgs; ++i) {
        if (data[i] == 0) {
            args.push_back(cur);
            cur.clear();
        } else {
            cur += static_cast<char>(data[i]);
        }
    }
    if (size != 0 && args.size() <= kMaxArgs) args.push_back(cur);
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);

    // Built once: much faster than per input, and CLI11 apps are made to be parsed again.
    static CLI::App& app = [] () -> CLI::App& {
        static CLI::App a{"attn"};
        attn::cli::add_commands(a);
        a.parse_complete_callback([] { throw Parsed{}; });
        return a;
    }();
    app.clear();  // also after a parse that threw
    try {
        // main()'s check before the parse: the unknown command or option, named.
        (void)attn::cli::unknown_command(app, static_cast<int>(args.size()), argv.data());
        app.parse(static_cast<int>(args.size()), argv.data());
    } catch (const Parsed&) {
    } catch (const CLI::ParseError&) {  // also --help and --version (CLI::Success)
    } catch (const attn::Error&) {
    } catch (const std::exception& e) {
        attn_fuzz::finding(std::string("parsing threw a ") + typeid(e).name() + ": " + e.what());
    }
    return 0;
}
