// libgomp ends the process when it cannot create a parallel region's threads: it prints
// "libgomp: Thread creation failed: …" and calls exit(1) — a Python interpreter or a server that
// called attn dies with no exception (RLIMIT_NPROC reached, a cgroup's pids.max, an
// OMP_STACKSIZE the system will not map). It has no hook that could turn that into an error, so
// attn checks ahead, right where libgomp would create threads, and runs on the threads it could
// create (results do not depend on the thread count: only the speed changes).
//
// libgomp keeps one pool per calling thread and creates threads whenever a region asks for more
// than the pool holds: the first time, and again after a smaller team (1 < k < pool) made the
// pool's other threads end (libgomp shrinks the pool to each team it starts). So attn keeps, per
// calling thread, the team its calls left the pool at, and checks each growth, not only the
// first: a call that asks for more first creates (and joins) the extra threads itself, then has
// libgomp start its pool on them at once (start_team). Within a call no region starts a team
// between 1 and the call's count (parallel_for.hpp, gemm_driver.hpp), so the pool keeps its size.
// What is left: threads the system refuses in the microseconds between the check and libgomp's
// creation (another process of the user, or another thread of this one, taking the last ones),
// and a program's own OpenMP regions on the thread, which attn does not see.
#pragma once

namespace attn::detail {

// n (>= 1) when this thread's calls may run on n threads; the team the system let this thread
// create when a check found fewer, from then on (said once per process on stderr). Asking for
// more than this thread's pool holds checks (creates and joins the extra threads); every other
// ask is two thread-local loads. Does not start libgomp's pool (attn::num_threads() is a query).
int startable_threads(int n);

// startable_threads(n) for a call about to compute: when its team is larger than this thread's
// pool, libgomp's pool is started on it right after the check (a region whose threads only count
// themselves), and the pool's size is kept. Only ComputeThreads calls it.
int start_team(int n);

// In a forked child (threads.cpp's fork handler), on the one thread fork() keeps: forgets that
// thread's check and pool. The parent's threads are not the child's — libgomp creates the
// child's pool anew — and the child's limits are its own (a worker may lower RLIMIT_NPROC after
// fork), so the child's first larger team is checked again.
void forget_startable_threads() noexcept;

}  // namespace attn::detail
