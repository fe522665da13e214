// What each ring entry point (ring_attention in ring.cpp, ring_attention_backward in
// ring_backward.cpp) holds for its whole run, and how a failure inside the ring ends the job:
// written once so that the forward and the backward cannot drift apart on either.
#pragma once

#include <mpi.h>

#include <cstdio>
#include <exception>
#include <string>
#include <string_view>

#include "../core/interrupt.hpp"
#include "../core/threads.hpp"
#include "ring_setup.hpp"

namespace attn::dist::detail {

// Constructed first thing in the entry point, in this order: attn::num_threads() for every
// kernel of the call; no interruption (a rank stopped alone would leave its peers waiting);
// the call's start (RingStats::total_seconds); a private duplicate of the caller's
// communicator (collective); the context setup_ring fills, on that communicator.
struct RingCall {
    const attn::detail::ComputeThreads compute_threads;
    const attn::detail::NotInterruptible whole_ring;
    const Clock::time_point start = Clock::now();
    const PrivateComm private_comm;
    RingContext ctx;

    RingCall(MPI_Comm user_comm, std::string_view op) : private_comm(user_comm, op) { ctx.comm = private_comm.comm; }
};

// A rank that fails inside the ring, after the agreed checks, cannot tell its peers (they
// wait for its next block): it says so on stderr and aborts every rank.
inline void abort_ring(MPI_Comm comm, std::string_view op, int rank, const std::exception& e) {
    std::fprintf(stderr, "attn: error: %s: rank %d failed inside the ring: %s (aborting all ranks)\n", std::string(op).c_str(),
                 rank, e.what());
    MPI_Abort(comm, 2);
}

}  // namespace attn::dist::detail
