// attn::Error — the one exception type for user errors (bad arguments, bad files).
// Internal invariants are debug asserts; user input is always checked and reported
// with a message that names the argument, the expectation and what was given.
#pragma once

#include <stdexcept>
#include <string>

namespace attn {

class Error : public std::runtime_error {
public:
    explicit Error(const std::string& message) : std::runtime_error(message) {}
};

}  // namespace attn
