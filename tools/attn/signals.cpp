#include "signals.hpp"

#include <pthread.h>
#include <signal.h>

#include <initializer_list>

#include "io/staging_files.hpp"

namespace attn::cli {
namespace {

pthread_t g_main_thread;  // set once, before any other thread exists

void on_termination(int sig) {
    // A process-directed signal goes to any thread that does not block it — often an idle
    // OpenMP worker. Staging files are created on the main thread, which blocks these signals
    // between creating a file and recording it (src/io/atomic_file.cpp); a worker that
    // cleaned up and exited here could miss a file created but not yet recorded. So a worker
    // hands the signal to the main thread, where it waits until the file is recorded.
    if (!pthread_equal(pthread_self(), g_main_thread)) {
        pthread_kill(g_main_thread, sig);
        return;
    }
    attn::detail::remove_staging_files();
    // Restore the default action; SA_NODEFER leaves the signal unblocked, so raise() ends the
    // process with `sig` as its cause.
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    ::sigaction(sig, &dfl, nullptr);
    ::raise(sig);
}

}  // namespace

void install_signal_handlers() {
    g_main_thread = pthread_self();
    for (const int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT}) {
        struct sigaction old {};
        if (::sigaction(sig, nullptr, &old) == 0 && old.sa_handler == SIG_IGN) continue;
        struct sigaction sa {};
        sa.sa_handler = on_termination;
        sigemptyset(&sa.sa_mask);
        sa.sa_flags = SA_NODEFER;
        ::sigaction(sig, &sa, nullptr);
    }
    ::signal(SIGXFSZ, SIG_IGN);
    ::signal(SIGPIPE, SIG_IGN);
}

}  // namespace attn::cli
