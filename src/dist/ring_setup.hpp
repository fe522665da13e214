// What ring_attention and ring_attention_backward share: the collective checks (phase 1),
// the global problem's bands, where a rank's segments sit in its local rows, packing a block
// into a ring buffer, and the per-call sdpa options of a block (BlockCall → SdpaOptions).
#pragma once

#include <mpi.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "attn/ring.hpp"
#include "../core/check.hpp"
#include "block_plan.hpp"

namespace attn::dist::detail {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0);
double cpu_now();  // process CPU time (all threads), seconds

// What every rank must agree on, plus its local lengths. Gathered from all ranks.
struct Descriptor {
    std::int64_t B, Hq, Hkv, Dk, Dv, nq, nk;
    std::int64_t causal, window_left, window_right, window_align, has_offset, offset_per_sequence, offset_value;
    std::int64_t layout, impl, has_key_lengths, has_scale, tensor_modifiers;  // 1: sinks, 2: alibi_slopes, kWantsDsinks
    std::int64_t dropout_seed;  // the seed's bits
    std::int64_t k_dtype, v_dtype;  // the K/V blocks travel in these (every rank's must match)
    std::int64_t backward;          // 1 in ring_attention_backward: ranks in the other call would wait for ever
    double scale, softcap, dropout_p;
};
inline constexpr int kDescriptorWords = 26;
// Descriptor::tensor_modifiers bit the backward sets when the caller asked for dsinks: their sum is
// collective, so a rank without them would leave the others waiting (a hang an exploratory test found).
inline constexpr std::int64_t kWantsDsinks = 4;
static_assert(sizeof(Descriptor) == kDescriptorWords * sizeof(std::int64_t));

// The caller's communicator, checked before its first use by `op` (attn::Error naming comm, on
// this rank alone: it has no one to tell): MPI_COMM_NULL — any MPI call on it is MPI's fatal
// error, which aborts the whole job — and an intercommunicator, whose sends and reductions
// cross to the other group (a silent wrong result).
void require_intracommunicator(MPI_Comm c, std::string_view op);

// A duplicate of the caller's communicator for the duration of one call (collective), so that
// no message of ours can match one of the caller's; require_intracommunicator first.
struct PrivateComm {
    MPI_Comm comm = MPI_COMM_NULL;
    PrivateComm(MPI_Comm c, std::string_view op);
    ~PrivateComm() { MPI_Comm_free(&comm); }
    PrivateComm(const PrivateComm&) = delete;
    PrivateComm& operator=(const PrivateComm&) = delete;
};

// A segment with where it starts in the rank's local rows.
struct Placed {
    Segment g;
    std::int64_t local = 0;
};
std::vector<Placed> place(const std::vector<Segment>& segs);

// Copy a (B, H, n, D) view (any strides) into contiguous memory at dst, element by element in
// its own dtype (a 16-bit K/V block travels in 16 bits); returns the bytes written.
std::int64_t pack(const TensorView& src, void* dst);

// The unit a K/V ring message is counted in: float32 words when K and V are both float32, else
// 16-bit halfwords (MPI counts are int: the unit keeps a float32 block's limit where it was).
struct WireUnit {
    MPI_Datatype type = MPI_FLOAT;
    std::int64_t bytes = 4;
};
WireUnit wire_unit(DType k, DType v);

// run_collectively, optionally naming the failing rank when not every rank failed:
// "ring_attention: rank 2: Q: …", the rank inserted after `op` when the message starts with it.
// An interrupted rank makes every rank throw attn::Interrupted naming it (include/attn/ring.hpp).
void agree(MPI_Comm comm, const std::function<void()>& fn, const std::string& op = {}, bool name_rank = false);

// Everything phase 1 establishes, the same on every rank (except the rank's own values).
struct RingContext {
    MPI_Comm comm = MPI_COMM_NULL;
    int P = 1, rank = 0;
    Descriptor mine{};
    std::vector<Descriptor> all;
    std::int64_t Lq = 0, Lk = 0;
    std::vector<std::int64_t> key_len, offsets;  // agreed per-sequence values (rank 0's)
    std::vector<double> sinks;                   // σ_h (Hq,), agreed (rank 0's); empty without sinks
    std::vector<float> slopes;                   // ALiBi m_{b,h} as (B, Hq), agreed; empty without ALiBi
    std::optional<TensorView> slopes_view() const {
        if (slopes.empty()) return std::nullopt;
        return TensorView(const_cast<float*>(slopes.data()), DType::f32, Shape{mine.B, mine.Hq});
    }
    // m_{b,h}·alibi_shift[b − c.b0]: what a call's scores (and lse) exceed the global ones by.
    double alibi_excess(const BlockCall& c, std::int64_t b, std::int64_t h) const {
        if (slopes.empty()) return 0.0;
        return static_cast<double>(slopes[static_cast<std::size_t>(b * mine.Hq + h)]) *
               static_cast<double>(c.alibi_shift[static_cast<std::size_t>(b - c.b0)]);
    }
    std::vector<Band> bands;                     // the global problem's band per sequence
    std::vector<Placed> q_segs;                  // this rank's query segments
    std::int64_t nk_max = 0, q_seg_max = 0;
    std::int64_t k_words_per_row = 0, v_words_per_row = 0;  // B·Hkv·Dk, B·Hkv·Dv (elements)
    DType k_dtype = DType::f32, v_dtype = DType::f32;       // the K/V blocks' dtypes (agreed)
    WireUnit unit;                                          // wire_unit(k_dtype, v_dtype)
    // Ring steps that any rank computes something in: 1 + the largest s such that some rank r
    // sees a key of rank (r − s) mod P's block. A K/V block never needs to travel further, so
    // the ring stops after `steps` steps (< P under a window narrower than the chunks, with the
    // contiguous layout: docs/ring.md, "Windows on the ring"). The same on every rank.
    int steps = 1;

    std::int64_t nk(int origin) const { return all[static_cast<std::size_t>(origin)].nk; }
    // A ring buffer holds one rank's block: K (B, Hkv, nk, Dk) then V (B, Hkv, nk, Dv), contiguous,
    // each in its own dtype. block_words: its elements (the float32 dK/dV accumulators' size).
    std::int64_t block_words(int origin) const { return nk(origin) * (k_words_per_row + v_words_per_row); }
    std::int64_t k_bytes(int origin) const { return nk(origin) * k_words_per_row * static_cast<std::int64_t>(dtype_size(k_dtype)); }
    // V starts at K's end rounded up to V's element size: float32 V after an odd number of
    // 16-bit K elements was read through a misaligned float* (undefined behaviour).
    std::int64_t v_offset(int origin) const {
        const auto align = static_cast<std::int64_t>(dtype_size(v_dtype));
        return (k_bytes(origin) + align - 1) / align * align;
    }
    std::int64_t block_bytes(int origin) const {
        return v_offset(origin) + nk(origin) * v_words_per_row * static_cast<std::int64_t>(dtype_size(v_dtype));
    }
    std::int64_t block_units(int origin) const { return block_bytes(origin) / unit.bytes; }  // the K/V message's count
    // Views of a ring buffer holding origin's block.
    TensorView k_view(void* buf, int origin) const {
        return TensorView(buf, k_dtype, Shape{mine.B, mine.Hkv, nk(origin), mine.Dk});
    }
    TensorView v_view(void* buf, int origin) const {
        return TensorView(static_cast<char*>(buf) + v_offset(origin), v_dtype, Shape{mine.B, mine.Hkv, nk(origin), mine.Dv});
    }
    std::int64_t buffer_bytes() const;  // the largest block's bytes (>= 1)
    std::vector<Placed> k_segs(int origin) const { return place(rank_segments(Lk, P, origin, static_cast<Layout>(mine.layout))); }
};

// Phase 1 on every rank of ctx.comm (already set): this rank's arguments (sdpa's checks through
// make_problem with op name `op`, plus what only the ring requires, plus `extra` — the
// backward's gradients), then the descriptors of all ranks and the per-sequence options, all
// agreed. On any failure every rank throws the same attn::Error; nothing has been written.
// out_lse: the forward writes out and lse, the backward reads them.
void setup_ring(RingContext& ctx, std::string_view op, const TensorView& q, const TensorView& k, const TensorView& v,
                const RingOptions& options, const TensorView& out, const TensorView* lse, attn::detail::OutLse out_lse,
                const std::function<void()>& extra);

// The sdpa options of one block call: the caller's scale and impl, the call's band as causal +
// query_offset + window.left, and its key lengths. Dropout (p, seed from base) gets the call's
// place in the global problem as its origin (sequence c.b0, global row and key of the call's
// first row and key), so every block drops what single-process sdpa drops. `call` must outlive the result (views).
// This is the one place a per-block option is derived: softcap carries over as is; ALiBi's
// base.alibi_slopes is the agreed (B, Hq), sliced to the call's sequences and measured from the
// call's offset (BlockCall::alibi_shift says by how much the call's lse is then too high); sinks
// are not per block (the forward's merge and the global lse carry them). Both directions call it.
SdpaOptions block_options(const SdpaOptions& base, const BlockCall& call);

// The options as single-process sdpa takes them (scale, causal, window, query_offset, softcap,
// ALiBi slopes, sinks, dropout p and seed; no key lengths: global positions, checked apart).
// Each rank's local problem is checked with them (make_problem), and the CLI checks their values
// with attn::detail::check_option_values before it reads a file: one rule, sdpa's.
SdpaOptions sdpa_options_of(const RingOptions& o);

// block_options' base, the same in both directions: the caller's scale, impl, softcap (per
// score: every block as is) and dropout (p, seed), and the agreed ALiBi slopes as (B, Hq).
// No sinks: the forward's merge starts every row with its sink, and the backward's global lse
// holds them.
SdpaOptions block_base_options(const RingOptions& o, const RingContext& ctx);

}  // namespace attn::dist::detail
