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

// What an Error is about, given where it is raised (never read from its message): `type` — an
// argument of a type or dtype the call does not take (an int32 Q, a float mask where a bool one
// goes, out_dtype int64) — or `value`, everything else (shapes, options, masks' contents, files,
// a file's tensor of a dtype attn does not read included: the file is a value). Bindings with one
// exception per kind map it (Python: TypeError, ValueError; docs/errors.md).
enum class ErrorKind { value, type };

class Error : public std::runtime_error {
public:
    explicit Error(const std::string& message, ErrorKind kind = ErrorKind::value)
        : std::runtime_error(message), kind_(kind) {}
    ErrorKind kind() const noexcept { return kind_; }

private:
    ErrorKind kind_;
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
    // A collective call's (attn::dist::run_collectively), on every rank: which rank was interrupted.
    explicit Interrupted(const std::string& message) : std::runtime_error(message) {}
};

}  // namespace attn
