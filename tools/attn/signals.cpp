#include "signals.hpp"

#include <signal.h>

#include <initializer_list>

#include "io/staging_files.hpp"

namespace attn::cli {
namespace {

void on_termination(int sig) {
    attn::detail::remove_staging_files();
    // SA_RESETHAND has restored the default action and SA_NODEFER leaves the signal
    // unblocked, so this ends the process with `sig` as its cause.
    ::raise(sig);
}

}  // namespace

void install_signal_handlers() {
    for (const int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT}) {
        struct sigaction old {};
        if (::sigaction(sig, nullptr, &old) == 0 && old.sa_handler == SIG_IGN) continue;
        struct sigaction sa {};
        sa.sa_handler = on_termination;
        sigemptyset(&sa.sa_mask);
        sa.sa_flags = SA_RESETHAND | SA_NODEFER;
        ::sigaction(sig, &sa, nullptr);
    }
    ::signal(SIGXFSZ, SIG_IGN);
    ::signal(SIGPIPE, SIG_IGN);
}

}  // namespace attn::cli
