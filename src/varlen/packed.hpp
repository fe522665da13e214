// Packed variable-length batches (attn/sdpa_varlen.hpp): the checks of cu_seqlens and of the
// packed (T, H, D) tensors, and the per-sequence views that turn sequence b into an ordinary
// (1, H, L_b, D) sdpa problem — strided views into the packed buffers, never a copy.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "attn/sdpa.hpp"
#include "../core/check.hpp"

namespace attn::detail {

// Sequence b: queries [q0, q0 + lq) and keys [k0, k0 + lk) of the packed tensors.
struct PackedSequence {
    std::int64_t q0 = 0, lq = 0, k0 = 0, lk = 0;
};

struct PackedBatch {
    std::vector<PackedSequence> seqs;
    std::int64_t Tq = 0, Tk = 0, Hq = 0, Hkv = 0, Dk = 0, Dv = 0;
};

// Checks q (Tq, Hq, Dk), k (Tk, Hkv, Dk) and v (Tk, Hkv, Dv) alone and fills the sizes (not seqs):
// check_packed's first step, and sdpa_varlen_output_shapes'.
PackedBatch check_packed_qkv(std::string_view op, const TensorView& q, const TensorView& k, const TensorView& v);

// Checks q (Tq, Hq, Dk), k (Tk, Hkv, Dk), v (Tk, Hkv, Dv), out (Tq, Hq, Dv), lse (Tq, Hq),
// both cu_seqlens ((N+1,) int32/int64, cu[0] = 0, non-decreasing, last = T) and the options a
// packed batch cannot take (bool_mask, additive_mask, key_lengths; query_offset per sequence
// must be (N,), per-sequence alibi_slopes (N, Hq)). out is float32/float64, or also
// float16/bfloat16 with sixteen_bit_out; one address per element of each unless the call reads
// them (OutLse::read: the backward). Throws attn::Error prefixed by `op`; reads nothing but the
// cu_seqlens values.
PackedBatch check_packed(std::string_view op, const TensorView& q, const TensorView& k, const TensorView& v,
                         const TensorView& cu_seqlens_q, const TensorView& cu_seqlens_k, const SdpaOptions& options,
                         const TensorView& out, const TensorView* lse, bool sixteen_bit_out = false,
                         OutLse out_lse = OutLse::written);

// Rows [start, start + len) of a packed (T, H, D) view as a (1, H, len, D) view.
TensorView sequence_rows(const TensorView& packed, std::int64_t start, std::int64_t len);
// Rows [start, start + len) of a packed (T, H) lse as a (1, H, len) view.
TensorView sequence_lse(const TensorView& packed_lse, std::int64_t start, std::int64_t len);

// Sequence b's options: the caller's, with a per-sequence query_offset narrowed to entry b,
// per-sequence ALiBi slopes narrowed to row b ((1, Hq)) and the dropout seed of sequence b
// (varlen_dropout_seed).
SdpaOptions sequence_options(const SdpaOptions& options, std::int64_t b);

// The rows of a sequence without keys: out 0, lse −inf — or σ_h in head h with sinks (the
// sink is then the row's only logit: scores.hpp).
void fill_keyless(const SdpaOptions& options, const TensorView& out_rows, const TensorView* lse_rows);

// Writes `value` to every element of a float32/float64 view (out = 0, lse = −inf, zero
// gradients for the rows a sequence without keys or queries owns).
void fill(const TensorView& t, double value);

}  // namespace attn::detail
