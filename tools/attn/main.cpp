// attn — command-line front end of the library. See `attn --help`.
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <new>
#include <string>
#include <thread>

#include "attn/error.hpp"
#include "commands.hpp"
#include "signals.hpp"

int main(int argc, char** argv) {
    CLI::App app{"attn: scaled dot-product attention, computed correctly on every input, as fast as the CPU allows"};
    attn::cli::add_commands(app);  // every option strict: no empty values, strict numbers
    attn::cli::install_signal_handlers();
    const bool silent = attn::cli::silent_ring_rank(argc, argv);
    const auto report = [&](const char* message) {
        if (!silent) {
            attn::cli::print_error_line(message);
        } else {
            // Every rank fails alike; once one exits non-zero, mpirun kills the others. A silent
            // rank waits so that rank 0 has printed first (it exits at once, ending the wait).
            std::this_thread::sleep_for(std::chrono::seconds(3));
        }
        return 2;
    };
    // What a command printed must have reached stdout (--out files check their own writes).
    const auto flushed = [&](int status) {
        const std::string message = attn::cli::stdout_write_error();
        return message.empty() || status != 0 ? status : report(message.c_str());
    };
    try {
        // `attn demo --heatmap --help`: CLI11 would take --help as the file name, and the check
        // below would say --heatmap has no value. The command's help, as for `attn demo --help`.
        if (attn::cli::asks_for_help(app, argc, argv)) {
            const char* const help[] = {argv[0], argv[1], "--help"};
            app.parse(3, help);  // throws CLI::CallForHelp
        }
        // CLI11 would say only "A subcommand is required" for `attn bogus`, and "--q is required"
        // for `attn sdpa --bogus`: name the word.
        if (const std::string unknown = attn::cli::unknown_command(app, argc, argv); !unknown.empty()) {
            return report(unknown.c_str());  // once under mpirun, as every error
        }
        app.parse(argc, argv);
    } catch (const CLI::CallForHelp& e) {
        return flushed(app.exit(e));
    } catch (const CLI::CallForAllHelp& e) {
        return flushed(app.exit(e));
    } catch (const CLI::CallForVersion& e) {
        return flushed(app.exit(e));
    } catch (const CLI::ParseError& e) {
        return report(e.what());
    } catch (const attn::Error& e) {
        return report(e.what());
    } catch (const attn::OutOfMemory& e) {  // names the buffer and the bytes
        return report(e.what());
    } catch (const std::bad_alloc&) {
        return report("out of memory");
    } catch (const std::exception& e) {
        return report(e.what());
    }
    return flushed(0);
}
