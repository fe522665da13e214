// The attn CLI: one function per subcommand registers it on the app.
// Errors: a subcommand throws attn::Error; main() prints `attn: error: <message>` and exits 2.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

namespace attn::cli {

// Every subcommand below, the version flag and "exactly one subcommand" (commands.cpp).
void add_commands(CLI::App& app);

// "" when argv names a command (or asks for --help/--version) and every "--name" after it is one
// of that command's options; else the one-line error naming what was given: an unknown command
// (and the commands there are) or the first unknown option.
std::string unknown_command(const CLI::App& app, int argc, const char* const* argv);

// True when argv names a command and holds "--help" or "-h" as a word of its own anywhere
// before "--" — also where an option's value would be (`attn demo --heatmap --help`): the user
// asks for the command's help, which main() then prints (exit 0). `--heatmap=--help` is a value.
bool asks_for_help(const CLI::App& app, int argc, const char* const* argv);

// True for `attn ring` on an MPI rank other than 0, known from the launcher's environment
// before MPI starts: such a rank keeps an option error to itself (rank 0 prints the one line
// every rank would print) and waits a moment before it exits, so that mpirun, which kills the
// job when a rank exits non-zero, does not kill rank 0 before it has printed.
bool silent_ring_rank(int argc, const char* const* argv);

// Prints `attn: error: <message><suffix>` on stderr as one line: control bytes of the message
// (a file name with a newline, an ESC) are escaped as \xNN — it made several lines, or a
// terminal command. Every error line of the CLI goes through here.
void print_error_line(const std::string& message, const std::string& suffix = "");

// Flushes stdout: "" when everything printed so far reached it, else "stdout: write failed
// (<reason>)". What a command prints (help, the demo's walkthrough, bench's report) must arrive:
// `attn demo > /dev/full` exited 0 while every write failed. SIGPIPE is ignored (signals.cpp),
// so a closed pipe is EPIPE here.
std::string stdout_write_error();

void add_bench_command(CLI::App& app);
void add_sdpa_command(CLI::App& app);
void add_mha_command(CLI::App& app);
void add_ring_command(CLI::App& app);  // attn ring: ring attention over MPI (cmd_ring.cpp)
void add_demo_command(CLI::App& app);
void add_heatmap_command(CLI::App& app);

}  // namespace attn::cli
