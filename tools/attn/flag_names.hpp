// The library names its arguments ("sdpa: additive_mask: shape … cannot be broadcast"); the
// user of a command gave flags. A command's errors from the library name the flag instead:
// "sdpa: --mask: shape … cannot be broadcast".
#pragma once

#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>

#include "attn/error.hpp"

namespace attn::cli {

// One library argument and the command's flag for it.
using FlagName = std::pair<std::string_view, std::string_view>;

// `message` with the argument after "op: " (or "op: rank N: ", ring's) replaced by its flag,
// for the first of `ops` it starts with; unchanged when no argument of `names` follows.
std::string with_flag_names(const std::string& message, std::initializer_list<std::string_view> ops,
                            std::initializer_list<FlagName> names);

// Runs a command's body; an attn::Error from it is rethrown with_flag_names.
template <class Body>
void naming_flags(Body&& body, std::initializer_list<std::string_view> ops, std::initializer_list<FlagName> names) {
    try {
        body();
    } catch (const Error& e) {
        throw Error(with_flag_names(e.what(), ops, names));
    }
}

}  // namespace attn::cli
