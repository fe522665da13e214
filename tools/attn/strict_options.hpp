// One rule for every option value of the CLI, applied to the whole command tree at once (so
// a new option cannot forget it): an empty value is an error, never "the default"; a number
// is parsed strictly — decimal, the whole text, in range, finite — or refused with a message
// naming the option. CLI11 alone clamps (99999999999999999999 → INT64_MAX), wraps (-1 as an
// unsigned → 2^64 − 1), reads "010" as octal and takes "" as "not given".
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <CLI/CLI.hpp>

#include "attn/error.hpp"
#include "attn/sdpa.hpp"

namespace attn::cli {

// Why an empty value ("--out \"\"", "--causal=") is refused; the option's name goes before it.
inline constexpr const char* kEmptyValueRefused = "an empty value is not allowed (give a value, or leave the option out)";

// The strict parsers (also used directly by the fuzzer). Throw attn::Error "FLAG: ...".
std::int64_t parse_int64(const std::string& flag, const std::string& text);
std::uint64_t parse_uint64(const std::string& flag, const std::string& text);
double parse_finite_double(const std::string& flag, const std::string& text);

// A library parser's value for an option: its error names the value it parsed ("causal:
// expected …"); the CLI's names the option ("--causal: expected …").
template <class F>
auto with_flag(const char* flag, F&& parse) {
    try {
        return parse();
    } catch (const Error& e) {
        const std::string m = e.what();
        const std::size_t colon = m.find(": ");
        throw Error(std::string(flag) + ": " + (colon == std::string::npos ? m : m.substr(colon + 2)));
    }
}

// The dropout probability and its seed, checked by the library's rule and in its words with the
// options for its arguments (detail::require_dropout as `op`): p in [0, 1) — "sdpa: --dropout:
// must be in [0, 1) but got 1.5" — and p > 0 needs the seed — "sdpa: --seed: --dropout = 0.25
// needs a seed (--seed N): …", the keep mask is a function of it and a default would drop the same weights
// in every run. Then the CLI's own rule: a seed needs p > 0 (it would change nothing). Returns
// the seed (0 without dropout).
std::uint64_t dropout_seed(std::string_view op, const char* dropout_flag, double p, const char* seed_flag,
                           const std::optional<std::uint64_t>& seed);

// --window-align: top-left (the default) or bottom-right. Only with --window-left/--window-right,
// as --seed only with --dropout: alone it would change nothing and let a slip pass for a setting.
Align window_align_option(const std::optional<std::string>& text, std::int64_t left, std::int64_t right);

// --query-offset N (`offset`) / --query-offsets F.npy (`offsets_file`; "" = not given): when
// either is given, only with what measures from the diagonal it places — --causal, a window,
// ALiBi (--alibi, --alibi-slopes) — as --seed only with --dropout: alone it changes nothing (key
// lengths cut keys whatever the offset). Python's query_offset= is not refused, as dropout_seed=
// is not: code that passes it whatever the mask (ONNX's past length) keeps working; the CLI's
// rule catches a slip on the command line.
void require_query_offset_use(const std::optional<std::int64_t>& offset, const std::string& offsets_file, Causal causal,
                              std::int64_t window_left, std::int64_t window_right, bool alibi);

// Attaches the rule to every option of app and its subcommands, by CLI11 type: INT options
// must hold std::int64_t, UINT options std::uint64_t, FLOAT options double (so the ranges
// checked here are the ranges stored). Call after every option is declared.
void make_options_strict(CLI::App& app);

}  // namespace attn::cli
