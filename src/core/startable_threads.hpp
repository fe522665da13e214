// libgomp ends the process when it cannot create a parallel region's threads: it prints
// "libgomp: Thread creation failed: …" and calls exit(1) — a Python interpreter or a server that
// called attn dies with no exception (RLIMIT_NPROC reached, a cgroup's pids.max, an
// OMP_STACKSIZE the system will not map). attn checks ahead instead, the first time a thread's
// calls ask for a larger team than that thread has been checked for, and runs on the threads it
// could create (results do not depend on the thread count: only the speed changes).
#pragma once

namespace attn::detail {

// n (>= 1) when this thread's calls may run on n threads; the team the system let this thread
// create when a check found fewer, from then on (said once per process on stderr). Only the
// first ask for a larger team than this thread has been checked for creates (and joins) n - 1
// threads; every other ask is one thread-local load.
int startable_threads(int n);

// In a forked child (threads.cpp's fork handler), on the one thread fork() keeps: forgets that
// thread's check. The parent's threads are not the child's — libgomp creates the child's pool
// anew — and the child's limits are its own (a worker may lower RLIMIT_NPROC after fork), so the
// child's first larger team is checked again.
void forget_startable_threads() noexcept;

}  // namespace attn::detail
