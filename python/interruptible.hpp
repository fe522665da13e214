// A call into attn with the GIL released that Ctrl-C stops (README.md, "Python"). Python runs its
// signal handlers only on the main thread and only between bytecodes, so a SIGINT during a long
// call would be seen when the call ends. On the main thread, for the call's duration, this holds
// a SIGINT handler that sets the flag the call watches (attn/interrupt.hpp) and then runs the
// handler it replaced — Python's, which trips Python's own flag —, and puts the old one back
// after; the call then throws attn::Interrupted, which module.cpp's translator turns into what
// Python's handler raises (KeyboardInterrupt). Elsewhere — another thread, or a Python SIGINT
// handler other than signal.default_int_handler — it only releases the GIL: the call runs to its
// end, as before.
#pragma once

#include <pybind11/pybind11.h>
#include <signal.h>

#include <optional>

#include "attn/interrupt.hpp"
#include "attn/tensor.hpp"

namespace attn_py {

//
// Only a call long enough for Ctrl-C to matter: installing and restoring the handler are two
// system calls, measured at ~9 µs per call on a sandboxed 2-vCPU test machine — a quarter of a
// one-token decode step there. A call of fewer than kWorthInterrupting multiply-adds (~1 ms of
// flash) runs as before: a SIGINT during it is seen when it returns, that much later.
inline constexpr double kWorthInterrupting = 1 << 25;

// Multiply-adds of attention (the scores and the weighted sum): q's rows (every dim but the last:
// B·Hq·Lq, or the packed Tq·Hq) × keys × (Dk + Dv). A bound where `keys` is one (a cache's capacity).
inline double attention_work(const attn::TensorView& q, std::int64_t keys, std::int64_t dv) {
    double rows = 1;
    for (int d = 0; d + 1 < q.rank(); ++d) rows *= static_cast<double>(q.dim(d));
    return q.rank() == 0 ? 0 : rows * static_cast<double>(keys) * static_cast<double>(q.dim(q.rank() - 1) + dv);
}

class InterruptibleCall {
public:
    // With the GIL held; releases it. `work`: the call's multiply-adds, about (0: not yet known).
    explicit InterruptibleCall(double work);
    ~InterruptibleCall();
    InterruptibleCall(const InterruptibleCall&) = delete;
    InterruptibleCall& operator=(const InterruptibleCall&) = delete;
    // The work known only once a lock is held (a KV cache's length): without the GIL, before the call.
    void arm(double work);

private:
    void install();
    bool eligible_ = false;  // the main thread, SIGINT's Python handler the default one
    struct sigaction previous_ {};
    bool installed_ = false;
    std::optional<attn::ScopedInterruptFlag> watch_;
    std::optional<pybind11::gil_scoped_release> nogil_;  // released once the handler is in, taken back first
};

// module.cpp, at import: Python's main thread, and _signal.getsignal to ask for SIGINT's handler.
void remember_main_thread();

}  // namespace attn_py
