#include "interruptible.hpp"

#include <atomic>

namespace attn_py {
namespace {

// Set by on_sigint, watched by the main thread's call; cleared when a call starts.
std::atomic<bool> g_sigint{false};
// The handler on_sigint replaced, which it runs after setting the flag (Python's). Atomic: a
// SIGINT may reach another thread while the main thread installs the handler; in that window the
// previous call's value is read — the same handler, or none before the first call (the
// translator in module.cpp raises KeyboardInterrupt itself then).
std::atomic<void (*)(int)> g_chain_handler{nullptr};
std::atomic<void (*)(int, siginfo_t*, void*)> g_chain_action{nullptr};
// The handler reads these: only lock-free atomics are async-signal-safe.
static_assert(std::atomic<bool>::is_always_lock_free && std::atomic<void (*)(int)>::is_always_lock_free &&
              std::atomic<void (*)(int, siginfo_t*, void*)>::is_always_lock_free);

unsigned long g_main_thread = 0;
// _signal.getsignal, the C function under signal.getsignal: that one turns the handler into an
// enum member where it can, by trying and failing — 2.3 µs a call against 16 ns (Python 3.11).
PyObject* g_getsignal = nullptr;
PyObject* g_default_int_handler = nullptr;  // signal.default_int_handler
PyObject* g_sigint_number = nullptr;        // SIGINT, a Python int

extern "C" void on_sigint(int sig, siginfo_t* info, void* context) {
    g_sigint.store(true, std::memory_order_relaxed);
    if (auto action = g_chain_action.load(std::memory_order_relaxed)) action(sig, info, context);
    else if (auto handler = g_chain_handler.load(std::memory_order_relaxed)) handler(sig);
}

// Python's main thread (where its signal handlers run) with SIGINT's Python handler the default
// one, which raises KeyboardInterrupt: a script, the REPL, Jupyter while a cell runs. Any other
// Python handler (or SIG_IGN, SIG_DFL) asked for something else than stopping: the call runs to
// its end, as before. With the GIL held.
bool stops_on_sigint() {
    if (PyThread_get_thread_ident() != g_main_thread || PyInterpreterState_Get() != PyInterpreterState_Main()) return false;
    PyObject* handler = PyObject_CallOneArg(g_getsignal, g_sigint_number);
    if (handler == nullptr) {
        PyErr_Clear();
        return false;
    }
    const bool stops = handler == g_default_int_handler;
    Py_DECREF(handler);
    return stops;
}

}  // namespace

void remember_main_thread() {
    namespace py = pybind11;
    const py::module_ signal = py::module_::import("_signal");
    g_main_thread = py::module_::import("threading").attr("main_thread")().attr("ident").cast<unsigned long>();
    // Kept for the life of the process (the module is never unloaded).
    g_getsignal = py::object(signal.attr("getsignal")).release().ptr();
    g_default_int_handler = py::object(signal.attr("default_int_handler")).release().ptr();
    g_sigint_number = py::int_(SIGINT).release().ptr();
}

InterruptibleCall::InterruptibleCall(double work) : eligible_(stops_on_sigint()) {
    nogil_.emplace();
    arm(work);
}

void InterruptibleCall::arm(double work) {
    if (eligible_ && !installed_ && work >= kWorthInterrupting) install();
}

void InterruptibleCall::install() {
    struct sigaction ours {};
    ours.sa_sigaction = on_sigint;
    sigemptyset(&ours.sa_mask);
    ours.sa_flags = SA_SIGINFO | SA_ONSTACK;  // SA_ONSTACK as Python's own handler
    g_sigint.store(false, std::memory_order_relaxed);
    // One system call installs ours and reads the old one (each costs about a microsecond or more).
    if (sigaction(SIGINT, &ours, &previous_) != 0) return;
    if ((previous_.sa_flags & SA_SIGINFO) != 0) {
        g_chain_action.store(previous_.sa_sigaction, std::memory_order_relaxed);
        g_chain_handler.store(nullptr, std::memory_order_relaxed);
    } else if (previous_.sa_handler != SIG_DFL && previous_.sa_handler != SIG_IGN) {
        g_chain_handler.store(previous_.sa_handler, std::memory_order_relaxed);
        g_chain_action.store(nullptr, std::memory_order_relaxed);
    } else {  // no C handler behind Python's (embedded without signal handling): left as it was
        sigaction(SIGINT, &previous_, nullptr);
        return;
    }
    installed_ = true;
    watch_.emplace(g_sigint);
}

InterruptibleCall::~InterruptibleCall() {
    nogil_.reset();  // the GIL back first, as pybind11's own scope would
    if (installed_) sigaction(SIGINT, &previous_, nullptr);
}

}  // namespace attn_py
