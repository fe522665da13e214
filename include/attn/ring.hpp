// attn::dist — sequence-parallel ring attention over MPI (docs/ring.md draws it).
//
// The sequence is split across the P ranks of a communicator: every rank keeps its own
// query rows in place and its own key/value rows travel once around the ring, one hop per
// step, with non-blocking MPI (double-buffered) while the block already received is
// computed with attn::sdpa. Each rank merges the partial results of the P blocks exactly
// by log-sum-exp, so the result equals single-process attention on the whole sequence.
//
//   rank r holds (local lengths nq_r, nk_r; global Lq = Σ nq_r, Lk = Σ nk_r):
//   q:   (B, Hq,  nq_r, Dk)   float32, float16 or bfloat16, any strides
//   k:   (B, Hkv, nk_r, Dk)   float32, float16 or bfloat16, any strides; Hq % Hkv == 0 (GQA)
//   v:   (B, Hkv, nk_r, Dv)   float32, float16 or bfloat16, any strides
//   out: (B, Hq,  nq_r, Dv)   float32, float16 or bfloat16, written completely (a 16-bit out is
//                             the float32 result rounded once more)
//   lse: (B, Hq,  nq_r)       optional float32/float64: log-sum-exp of each row over all Lk keys
// The K/V blocks travel around the ring in their own dtype (16-bit: half the bytes of float32)
// and the local kernels read them as they are (per tile, fp32 accumulation); the merge runs in
// double. Every rank must pass K and V in the same dtypes.
//
// Which global rows a rank holds is fixed by the Layout (rank_segments below); the local
// tensors are the rank's segments concatenated in order (take_rows builds them).
// Available only when attn is built with ATTN_WITH_MPI (target attn::dist).
#pragma once

#include <mpi.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string_view>
#include <vector>

#include "attn/error.hpp"
#include "attn/sdpa.hpp"
#include "attn/tensor.hpp"

namespace attn::dist {

// How a length-L sequence is cut over P ranks.
//   contiguous: rank r holds chunk r of P equal chunks. Causal work grows with r
//               (rank 0 sees one diagonal block, rank P−1 sees P of them).
//   zigzag:     the sequence is cut into 2P chunks; rank r holds chunk r and chunk 2P−1−r
//               (stored in that order). Every rank then does the same causal work.
// Chunk c of n covers rows [c·L/n, (c+1)·L/n) (integer division): lengths differ by at most 1,
// and a rank may hold no rows when L < n.
enum class Layout { contiguous, zigzag };

std::string_view layout_name(Layout layout);
Layout parse_layout(std::string_view name);  // "contiguous" or "zigzag"; throws attn::Error otherwise

// Global rows [start, start + length).
struct Segment {
    std::int64_t start = 0;
    std::int64_t length = 0;
};

// The segments of a length-L sequence that `rank` of `P` holds, in local storage order.
std::vector<Segment> rank_segments(std::int64_t L, int P, int rank, Layout layout);
std::int64_t rank_length(std::int64_t L, int P, int rank, Layout layout);  // Σ segment lengths

// Copy the rows of `segments` (dim 2 of a (B, H, L, D) view) into a new contiguous tensor
// (B, H, Σ lengths, D) — float32, or the global's dtype when that is float16/bfloat16 (copied
// exactly) — and back: put_rows writes local rows into `global` (any float dtype; a 16-bit
// global gets each value rounded to nearest even).
Tensor take_rows(const TensorView& global, const std::vector<Segment>& segments);
void put_rows(const TensorView& local, const std::vector<Segment>& segments, const TensorView& global);

// The masks mean what they mean in attn::sdpa (include/attn/sdpa.hpp), on global positions:
// the answer is single-process sdpa on the whole sequence with the same options.
struct RingOptions {
    std::optional<double> scale;             // default 1/sqrt(Dk); must be finite
    Causal causal = Causal::none;            // top_left: query i sees keys 0..i; bottom_right: keys
                                             // 0..i + n_b − Lq (n_b = key_lengths[b], else Lk)
    Window window{};                         // sliding window around the same diagonal (window.align)
    std::optional<QueryOffset> query_offset; // replaces both alignments: d_b(i) = i + offset_b
                                             // (a (B,) view must hold the same values on every rank)
    Layout layout = Layout::zigzag;          // must match how q, k, v were cut
    std::optional<TensorView> key_lengths;   // (B,) int32/int64: sequence b has valid keys 0..len−1
                                             // (global positions; the same on every rank)
    Impl impl = Impl::automatic;             // the local kernel: automatic, reference or flash (the
                                             // backward: automatic or flash; see ring_attention_backward)
    // Score modifiers, as in SdpaOptions (docs/conventions.md, "Score modifiers") on the whole
    // sequence, the same on every rank (docs/ring.md, "Score modifiers").
    double softcap = 0.0;                    // c > 0: s = c·tanh(s / c) in every block
    std::optional<TensorView> alibi_slopes;  // (Hq,) or (B, Hq) float32: s −= m_h·|d_b(i) − j| on
                                             // global positions (d_b: bottom-right, or query_offset)
    std::optional<TensorView> sinks;         // (Hq,) float32, finite: one extra logit per head,
                                             // counted once per row (in the log-sum-exp merge)
    // Dropout on the attention weights (training), as SdpaOptions::dropout_p/dropout_seed on the
    // whole sequence: weight (b, h, i, j) of GLOBAL positions i, j is kept or dropped exactly as
    // single-process sdpa keeps it with the same seed (each block call carries its place as
    // SdpaOptions::dropout_origin), whatever P and the layout. The backward must get the same two.
    double dropout_p = 0.0;                  // 0 <= p < 1; the same on every rank
    std::optional<std::uint64_t> dropout_seed;  // the same on every rank; needed when dropout_p > 0
};

// What one rank measured in ring_attention (seconds, wall clock).
struct RingStats {
    double total_seconds = 0;    // the whole call, including argument checks
    double compute_seconds = 0;  // attn::sdpa on the received blocks + the log-sum-exp merges
    double compute_cpu_seconds = 0;  // the same span in process CPU time (all threads): the work
                                     // itself, unaffected by other processes sharing the cores
    double wait_seconds = 0;     // blocked in MPI_Waitall for a K/V block not yet arrived
    std::int64_t sdpa_calls = 0;
    std::int64_t score_entries = 0;  // Σ visible-block rows × keys over sdpa calls (B·Hq units)
    std::int64_t bytes_sent = 0;     // K/V bytes this rank sent around the ring
    int steps = 0;                   // ring steps run: P, fewer when a window leaves the farther
                                     // blocks unseen (docs/ring.md, "Windows on the ring")
    std::string kernel;              // attn::sdpa's kernel (last call)
};

// Runs on every rank of `comm` (collective). Every argument is checked on every rank and
// across ranks (equal B, heads, head dims, options; local lengths as the layout gives them);
// if any rank finds a problem, every rank throws attn::Error with the same message, before
// any output is written (attn::OutOfMemory on every rank when one cannot allocate the ring's
// buffers).
void ring_attention(MPI_Comm comm, const TensorView& q, const TensorView& k, const TensorView& v,
                    const RingOptions& options, const TensorView& out, const TensorView* lse = nullptr,
                    RingStats* stats = nullptr);

// The gradients of ring_attention (training), collective like it: from the forward's local
// out and lse rows and dO = ∂loss/∂O (grad_out, this rank's rows), every rank writes
//   dq: like q (its query rows), dk: like k, dv: like v (its own K/V rows), each float32, float16
//   or bfloat16 (16-bit: the float32 gradient rounded once), any strides; out and grad_out
//   float32, float16 or bfloat16. K/V travel in their dtype; the dK/dV partial sums travel in
//   float32 (rounded once, at home).
// Equal to single-process attn::sdpa_backward on the whole sequence with the same options. Each
// rank recomputes its blocks with the backward kernel from the global lse; dK/dV partial sums
// travel around the ring with their K/V block and come home to the block's owner. The sums run in
// an order fixed by the ring: bit-identical across runs for a given P (docs/ring.md, "Backward").
// lse: (B, Hq, nq_r) float32 or float64. out/lse must be ring_attention's with the same options,
// except impl: the backward takes automatic or flash (the reference backward normalises a block
// over its own keys, not the global lse); a forward run with impl = reference pairs with a
// backward with impl = automatic.
// dsinks: (Hq,) float32/float64, optional, only with options.sinks: ∂loss/∂σ_h over the WHOLE
// sequence (every rank gets the same values: the ranks' partial sums added in rank order).
// out, lse and grad_out are inputs (broadcast views too), the gradients outputs: sdpa_backward's rule.
void ring_attention_backward(MPI_Comm comm, const TensorView& q, const TensorView& k, const TensorView& v,
                             const TensorView& out, const TensorView& lse, const TensorView& grad_out,
                             const RingOptions& options, const TensorView& dq, const TensorView& dk, const TensorView& dv,
                             RingStats* stats = nullptr, const TensorView* dsinks = nullptr);

// Runs `fn` on every rank of `comm` (collective). If it throws on any rank, every rank
// throws the message of the lowest failing rank — as attn::OutOfMemory when that rank ran out
// of memory (std::bad_alloc), else as attn::Error — so that all ranks take the same branch
// afterwards and none waits forever for a failed peer. An attn::Interrupted (fn's call saw its
// thread's attn::ScopedInterruptFlag set) comes first, whatever the other ranks threw: every rank
// throws attn::Interrupted naming the lowest interrupted rank ("interrupted: rank 1 was
// interrupted (…), so the collective call stopped on every rank …").
// MPI_COMM_NULL or an intercommunicator is an attn::Error naming comm, thrown at once on the rank
// that passed it (as by ring_attention and its backward): that rank has no communicator to tell
// the others through, and ranks that passed one including it wait for it, as in any collective
// a rank skips (docs/ring.md, "Errors").
void run_collectively(MPI_Comm comm, const std::function<void()>& fn);

}  // namespace attn::dist
