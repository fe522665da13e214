// How many threads attn computes on — one setting for every kernel: the sdpa forward (flash,
// reference, decode), the backward, decode_attention, the MultiHeadAttention GEMMs and ring
// attention's local work.
//
//   n = set_num_threads(n) if called with n >= 1
//       else ATTN_NUM_THREADS (an integer >= 1) if set
//       else OpenMP's default (OMP_NUM_THREADS, else every CPU)
//
// Results do not depend on it: every kernel splits its work by the shape, never by the thread
// count. Three splits — flash's and decode's key chunks, the backward's chunks of key blocks —
// also follow the process's CPU count, so processes with CPU sets (or machines) of other sizes
// can get other float32 sums in the last bits (docs/environment.md).
#pragma once

#include "attn/error.hpp"

namespace attn {

// Process-wide. n >= 1 sets the count; n = 0 goes back to the default above. Throws attn::Error
// for n < 0 or n > 4096.
void set_num_threads(int n);

// The count attn's next call on this thread will use: the one above, or fewer once the system
// refused to create that many threads for this thread's calls (docs/environment.md, "Threads the
// system will not create"; said once on stderr).
int num_threads();

// For the duration of its scope, calls from this thread use n threads (n >= 1; 0 = no
// change): what the CLI's --threads and Python's threads= use. Nests; not copyable.
class ScopedNumThreads {
public:
    explicit ScopedNumThreads(int n);
    ~ScopedNumThreads();
    ScopedNumThreads(const ScopedNumThreads&) = delete;
    ScopedNumThreads& operator=(const ScopedNumThreads&) = delete;

private:
    int previous_;
};

}  // namespace attn
