// Interrupting a long call: a flag the caller sets (from another thread or a signal handler) and
// the call watches — what the Python module's Ctrl-C uses (README.md, "Python").
//
//   std::atomic<bool> stop{false};            // set to true anywhere: a watchdog thread, a SIGINT handler
//   {
//       const attn::ScopedInterruptFlag watch(stop);
//       attn::sdpa(q, k, v, options, out);    // throws attn::Interrupted once `stop` is true
//   }
//
// While the scope lives, the calls made on its thread read the flag (a relaxed load) before each
// task of their parallel loops — a query block or key chunk of flash, a (batch, head) of the
// reference kernel, a chunk of decode, a block of the projection GEMM — and, once it is true,
// skip the tasks left and throw attn::Interrupted (attn/error.hpp) when the loop has ended. The
// reference kernel (its forward, backward and attn::reference_steps) reads it before each query
// row of each of its steps too, the forward before each row it writes of out, lse and the
// Lq x Lk weights and scores when asked, and reference_steps before each row it copies into its
// Lq x Lk results: one of its heads can take minutes. The outputs are then
// partially written, as after any error raised once computing has started (docs/errors.md); the
// arguments' checks come first, as always. The library never writes the flag: clear it before the
// next call that should run (once a call has seen it set, clearing it does not undo that: the call
// still throws). Calls on other threads, and calls outside a scope, do not read it; nor do calls
// made inside an OpenMP parallel region of the caller's (an exception must not leave one), nor ring
// attention (attn/ring.hpp): a rank that stopped alone would leave its peers waiting.
#pragma once

#include <atomic>

namespace attn {

// `flag` must outlive the scope. Nests (the innermost scope's flag counts); not copyable.
class ScopedInterruptFlag {
public:
    explicit ScopedInterruptFlag(const std::atomic<bool>& flag) noexcept;
    ~ScopedInterruptFlag();
    ScopedInterruptFlag(const ScopedInterruptFlag&) = delete;
    ScopedInterruptFlag& operator=(const ScopedInterruptFlag&) = delete;

private:
    const std::atomic<bool>* previous_;
};

}  // namespace attn
