// The staging files that exist right now (outputs being written beside their targets), so
// that a program killed by a termination signal can remove them instead of leaving hidden
// `.NAME.tmp.*` files behind. The library only keeps the list; a program that wants the
// cleanup calls remove_staging_files() from its signal handler (the attn CLI does; a library
// must not take over its host's signals).
#pragma once

namespace attn::detail {

// Records a staging file; returns a slot for untrack_staging_file, or -1 when the path is
// too long or every slot is taken (then the file is simply not removed on a signal).
int track_staging_file(const char* path) noexcept;
void untrack_staging_file(int slot) noexcept;  // -1 is ignored

// Unlinks every tracked staging file. Async-signal-safe: reads lock-free atomics and calls
// unlink(), nothing else, so it may run inside a signal handler on any thread.
void remove_staging_files() noexcept;

}  // namespace attn::detail
