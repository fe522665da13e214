// Packed batches: cu_seqlens checks and per-sequence views (packed.hpp).
#include "packed.hpp"

#include <cmath>

#include "attn/sdpa_varlen.hpp"
#include "../core/allocate.hpp"
#include "../core/check.hpp"
#include "../core/element_io.hpp"
#include "../sdpa/problem.hpp"

namespace attn::detail {
namespace {

// The offsets of one cu_seqlens vector, checked: (N+1,) int32/int64, cu[0] = 0,
// non-decreasing, cu[N] = T (the packed tensor's token count, named by `tensor`).
std::vector<std::int64_t> read_cu_seqlens(std::string_view op, const TensorView& cu, const char* name,
                                          std::int64_t T, const char* tensor) {
    if (cu.data() == nullptr) fail(op, name, ": data pointer is null");
    if (cu.dtype() != DType::i32 && cu.dtype() != DType::i64) {
        fail_type(op, name, ": dtype must be int32 or int64 but got ", dtype_name(cu.dtype()));
    }
    if (cu.rank() != 1 || cu.dim(0) < 1) {
        fail(op, name, ": expected shape (N+1,) with N >= 0 sequences but got ", cu.shape());
    }
    std::vector<std::int64_t> off;
    resize_or_throw(off, cu.dim(0), name);
    for (std::int64_t i = 0; i < cu.dim(0); ++i) off[static_cast<std::size_t>(i)] = load_int(cu, cu.offset(i));
    if (off[0] != 0) fail(op, name, ": entry 0 must be 0 but got ", off[0]);
    for (std::size_t i = 1; i < off.size(); ++i) {
        if (off[i] < off[i - 1]) {
            fail(op, name, ": must be non-decreasing but entry ", i, " = ", off[i], " < entry ", i - 1, " = ",
                 off[i - 1]);
        }
        if (off[i] > T) {
            fail(op, name, ": entry ", i, " = ", off[i], " is beyond ", tensor, "'s ", T, " tokens");
        }
    }
    if (off.back() != T) {
        fail(op, name, ": last entry must equal ", tensor, "'s token count ", T, " but got ", off.back(),
             " (every packed token belongs to one sequence)");
    }
    return off;
}

// Rank, dims and dtype, for every call: a sequence's make_problem checks again, but a batch
// whose sequences all lack queries or keys builds none (it accepted an int32 k and a bool v).
void require_packed(std::string_view op, const TensorView& t, const char* name, const char* layout) {
    require_rank(op, t, name, 3, layout);
    require_floating(op, t, name);
    for (int d = 1; d < 3; ++d) {
        if (t.dim(d) < 1) fail(op, name, ": ", d == 1 ? "heads" : "head dim", " must be >= 1 but got ", t.dim(d));
    }
}

}  // namespace

PackedBatch check_packed_qkv(std::string_view op, const TensorView& q, const TensorView& k, const TensorView& v) {
    require_packed(op, q, "q", "(Tq, Hq, Dk)");
    require_packed(op, k, "k", "(Tk, Hkv, Dk)");
    require_packed(op, v, "v", "(Tk, Hkv, Dv)");
    PackedBatch p;
    p.Tq = q.dim(0), p.Hq = q.dim(1), p.Dk = q.dim(2);
    p.Tk = k.dim(0), p.Hkv = k.dim(1), p.Dv = v.dim(2);
    if (k.dim(2) != p.Dk) fail(op, "k: head dim ", k.dim(2), " does not match q's head dim ", p.Dk);
    if (v.dim(0) != p.Tk) fail(op, "v: tokens ", v.dim(0), " do not match k's tokens ", p.Tk);
    if (v.dim(1) != p.Hkv) fail(op, "v: heads ", v.dim(1), " do not match k's heads ", p.Hkv);
    if (p.Hq % p.Hkv != 0) {
        fail(op, "q: heads ", p.Hq, " must be a multiple of k/v's heads ", p.Hkv, " (grouped-query attention)");
    }
    return p;
}

PackedBatch check_packed(std::string_view op, const TensorView& q, const TensorView& k, const TensorView& v,
                         const TensorView& cu_seqlens_q, const TensorView& cu_seqlens_k, const SdpaOptions& options,
                         const TensorView& out, const TensorView* lse, bool sixteen_bit_out, OutLse out_lse) {
    PackedBatch p = check_packed_qkv(op, q, k, v);
    require_rank(op, out, "out", 3, "(Tq, Hq, Dv)");
    require_shape(op, out, "out", Shape{p.Tq, p.Hq, p.Dv}, "(Tq, Hq, Dv)");
    if (!sixteen_bit_out) require_f32_or_f64(op, out, "out");
    else require_floating(op, out, "out");
    if (out_lse == OutLse::written) require_distinct_elements(op, out, "out");
    if (lse != nullptr) {
        require_rank(op, *lse, "lse", 2, "(Tq, Hq)");
        require_shape(op, *lse, "lse", Shape{p.Tq, p.Hq}, "(Tq, Hq)");
        require_f32_or_f64(op, *lse, "lse");
        if (out_lse == OutLse::written) require_distinct_elements(op, *lse, "lse");
    }

    const std::vector<std::int64_t> cq = read_cu_seqlens(op, cu_seqlens_q, "cu_seqlens_q", p.Tq, "q");
    const std::vector<std::int64_t> ck = read_cu_seqlens(op, cu_seqlens_k, "cu_seqlens_k", p.Tk, "k");
    if (cq.size() != ck.size()) {
        fail(op, "cu_seqlens_k: has ", ck.size(), " entries (", ck.size() - 1, " sequences) but cu_seqlens_q has ",
             cq.size(), " (", cq.size() - 1, " sequences)");
    }
    const auto N = static_cast<std::int64_t>(cq.size()) - 1;
    // Here, not only in each sequence's make_problem: a batch whose sequences all lack queries
    // or keys builds no problem, and its bad scale or dropout_p went unchecked.
    check_option_values(options, op);

    if (options.bool_mask) fail(op, "bool_mask: not supported for packed sequences (use causal, window, query_offset)");
    if (options.additive_mask) {
        fail(op, "additive_mask: not supported for packed sequences (use causal, window, query_offset)");
    }
    if (options.key_lengths) {
        fail(op, "key_lengths: not accepted for packed sequences: cu_seqlens_k gives every sequence's keys");
    }
    // Every sequence is a call of its own with its own seed (varlen_dropout_seed) at (0, 0, 0, 0):
    // an origin passed on to each of them placed every sequence at the same rows of one stream.
    if (const DropoutOrigin& o = options.dropout_origin; o.batch != 0 || o.head != 0 || o.row != 0 || o.key != 0) {
        fail(op, "dropout_origin: not accepted for packed sequences (sequence b draws from its own seed, "
                 "varlen_dropout_seed(dropout_seed, b), at (0, 0, 0, 0)) but got (",
             o.batch, ", ", o.head, ", ", o.row, ", ", o.key, ")");
    }
    // Softcap, sinks (Hq,) and per-head ALiBi slopes (Hq,) apply per sequence unchanged;
    // per-sequence slopes are (N, Hq): row b is sequence b's (sequence_options). Shapes and
    // values are checked here, for all N sequences: make_problem runs only for sequences with
    // queries and keys, and would name a sequence's (B, Hq) = (1, Hq) and its row 0.
    if (options.alibi_slopes) {
        const TensorView& a = *options.alibi_slopes;
        const bool per_head = a.rank() == 1 && a.dim(0) == p.Hq;
        const bool per_seq = a.rank() == 2 && a.dim(0) == N && a.dim(1) == p.Hq;
        if (!per_head && !per_seq)
            fail(op, "alibi_slopes: packed sequences take (Hq,) = (", p.Hq, ",) or (N, Hq) = (", N, ", ", p.Hq,
                 ") slopes (one row per sequence) but got ", a.shape());
        require_finite_f32(op, a, "alibi_slopes");
    }
    if (options.sinks) {  // also the lse of sequences without keys (fill_keyless), which build no problem
        const TensorView& sk = *options.sinks;
        if (!(sk.rank() == 1 && sk.dim(0) == p.Hq)) fail(op, "sinks: shape must be (Hq,) = (", p.Hq, ",) but got ", sk.shape());
        require_finite_f32(op, sk, "sinks");
    }
    if (options.query_offset && options.query_offset->per_sequence) {
        require_query_offsets(op, *options.query_offset->per_sequence, N, "N");
    }

    resize_or_throw(p.seqs, N, "the sequences' table");
    for (std::size_t b = 0; b < p.seqs.size(); ++b) {
        p.seqs[b] = {cq[b], cq[b + 1] - cq[b], ck[b], ck[b + 1] - ck[b]};
    }
    return p;
}

TensorView sequence_rows(const TensorView& packed, std::int64_t start, std::int64_t len) {
    const TensorView rows = packed.slice(0, start, len);
    return TensorView(rows.data(), rows.dtype(), Shape{1, rows.dim(1), len, rows.dim(2)},
                      Strides{0, rows.stride(1), rows.stride(0), rows.stride(2)});
}

TensorView sequence_lse(const TensorView& packed_lse, std::int64_t start, std::int64_t len) {
    const TensorView rows = packed_lse.slice(0, start, len);
    return TensorView(rows.data(), rows.dtype(), Shape{1, rows.dim(1), len}, Strides{0, rows.stride(1), rows.stride(0), 0});
}

SdpaOptions sequence_options(const SdpaOptions& options, std::int64_t b) {
    SdpaOptions o = options;
    if (o.query_offset && o.query_offset->per_sequence) {
        o.query_offset = QueryOffset(o.query_offset->per_sequence->slice(0, b, 1));
    }
    if (o.alibi_slopes && o.alibi_slopes->rank() == 2) o.alibi_slopes = o.alibi_slopes->slice(0, b, 1);  // (1, Hq)
    if (options.dropout_seed) o.dropout_seed = varlen_dropout_seed(*options.dropout_seed, b);
    return o;
}

void fill_keyless(const SdpaOptions& options, const TensorView& out_rows, const TensorView* lse_rows) {
    fill(out_rows, 0.0);
    if (lse_rows == nullptr) return;
    for (std::int64_t h = 0; h < lse_rows->dim(1); ++h) {
        const double sink = options.sinks ? options.sinks->load_as_double(options.sinks->offset(h)) : -INFINITY;
        fill(lse_rows->slice(1, h, 1), sink);
    }
}

void fill(const TensorView& t, double value) {
    const Shape& s = t.shape();
    std::int64_t n[kMaxRank] = {1, 1, 1, 1};
    for (int a = 0; a < s.rank; ++a) n[a] = s[a];
    for (std::int64_t i0 = 0; i0 < n[0]; ++i0)
        for (std::int64_t i1 = 0; i1 < n[1]; ++i1)
            for (std::int64_t i2 = 0; i2 < n[2]; ++i2)
                for (std::int64_t i3 = 0; i3 < n[3]; ++i3) {
                    const std::int64_t o = t.offset(i0, i1, i2, i3);
                    store(t, o, value);  // any float dtype (16-bit gradients too)
                }
}

}  // namespace attn::detail

namespace attn {

std::uint64_t varlen_dropout_seed(std::uint64_t seed, std::int64_t b) {
    // splitmix64 (Steele, Lea, Flood 2014) of seed + (b + 1)·φ·2^64.
    std::uint64_t z = seed + (static_cast<std::uint64_t>(b) + 1) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

}  // namespace attn
