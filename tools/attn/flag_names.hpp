// The library names its arguments ("sdpa: additive_mask: shape … cannot be broadcast"); the
// user of a command gave flags. A command's errors from the library name the flag instead:
// "sdpa: --mask: shape … cannot be broadcast".
#pragma once

#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "attn/error.hpp"
#include "number_text.hpp"

namespace attn::cli {

// One library argument and the command's flag for it.
using FlagName = std::pair<std::string_view, std::string_view>;

// `message` with the argument after "op: " (or "op: rank N: ", ring's) replaced by its flag,
// for the first of `ops` it starts with, and so is every name with an underscore that stands as a
// word in the text after it ("MultiHeadAttention: state_dict does not fit" → "--params does not
// fit"); unchanged for a message of none of `ops`.
std::string with_flag_names(const std::string& message, std::initializer_list<std::string_view> ops,
                            const std::vector<FlagName>& names);

// The flags of the attention arguments `attn sdpa` and `attn ring` share (Q → --q, key_lengths →
// --key-lengths, …), one list for both commands: the one of the two spellings the user gave for
// query offsets (--query-offsets F.npy, else --query-offset N) and ALiBi (--alibi, else
// --alibi-slopes). A command appends the arguments only it has.
std::vector<FlagName> attention_flag_names(bool query_offsets_file, bool alibi);

// Runs a command's body; an attn::Error from it is rethrown with_flag_names, the numbers it
// quotes as the user gave them (with_given_numbers).
template <class Body>
void naming_flags(Body&& body, std::initializer_list<std::string_view> ops, const std::vector<FlagName>& names) {
    try {
        body();
    } catch (const Error& e) {
        throw Error(with_given_numbers(with_flag_names(e.what(), ops, names)));
    }
}

}  // namespace attn::cli
