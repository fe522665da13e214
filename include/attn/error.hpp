// attn::Error — the one exception type for user errors (bad arguments, bad files).
// Internal invariants are debug asserts; user input is always checked and reported
// with a message that names the argument, the expectation and what was given.
//
// attn::OutOfMemory — a valid size that the system could not allocate. It is a
// std::bad_alloc (code that handles running out of memory keeps working; Python raises
// MemoryError) whose message names what was being allocated and how many bytes.
//
// attn::Interrupted — a call stopped early because the caller asked it to: the flag of its
// thread's ScopedInterruptFlag (attn/interrupt.hpp) was set. Neither a bad argument nor a
// failure (Python raises KeyboardInterrupt); the call's outputs are partially written.
#pragma once

#include <new>
#include <stdexcept>
#include <string>

namespace attn {

class Error : public std::runtime_error {
public:
    explicit Error(const std::string& message) : std::runtime_error(message) {}
};

class OutOfMemory : public std::bad_alloc {
public:
    explicit OutOfMemory(std::string message) : message_(std::move(message)) {}
    const char* what() const noexcept override { return message_.c_str(); }

private:
    std::string message_;
};

class Interrupted : public std::runtime_error {
public:
    Interrupted() : std::runtime_error("interrupted: the call stopped before its work was done (its outputs are partially written)") {}
};

}  // namespace attn
