// How a CLI message quotes a number the user gave: in the user's words. The strict parser
// (strict_options.cpp) hands CLI11 each number's canonical text — detail::shortest of the double
// it reads as, or the integer in decimal — so the library, and CLI11's conversion, see "5e-324"
// where the user wrote "3e-324". A message quotes what was written, and, where that is another
// number than the one it reads as, that number too: "3e-324 (reads as 5e-324)"; "1e39" stays
// "1e39" (not "1e+39"), and "0.1" stays "0.1" (its double's shortest form).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <CLI/CLI.hpp>

namespace attn::cli {

// Records, under every name of `opt`, the text the user wrote and the canonical text it became.
void record_number_text(const CLI::Option& opt, const std::string& written, const std::string& canonical);

// The number `flag` was given as, for a message: as written, with " (reads as C)" when it is
// another number than its canonical text C; shortest(value) when the flag was not given (its default).
std::string given_number(std::string_view flag, double value);
std::string given_number(std::string_view flag, std::int64_t value);  // an INT option's: "+7", "007" as written

// `message` (a library error, its arguments renamed to flags: flag_names.hpp) with each given
// number it quotes in canonical form — "FLAG: … got C" and "FLAG = C", as the library words it —
// quoted by given_number's rule instead.
std::string with_given_numbers(const std::string& message);

}  // namespace attn::cli
