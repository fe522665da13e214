// The CLI's signal dispositions, set once at startup (a library must not take its host's
// signals, so this lives here and not in src/io):
//  - SIGINT, SIGTERM, SIGHUP, SIGQUIT: remove the staging files being written (only unlink,
//    which is async-signal-safe), then die of the same signal with its default action, so
//    the parent sees the usual status (e.g. 130 in a shell after Ctrl-C). The cleanup runs on
//    the main thread, the one that creates staging files: a worker thread that receives the
//    signal passes it on.
//  - SIGXFSZ (over `ulimit -f`) and SIGPIPE (a FIFO output whose reader left): ignored, so the
//    write fails with EFBIG / EPIPE and the usual one-line `attn: error: ...` is printed.
// A signal that was ignored when attn started (nohup, a background job) stays ignored.
#pragma once

namespace attn::cli {

void install_signal_handlers();

}  // namespace attn::cli
