// Packed (varlen) test cases: random sequence lengths, packed (T, H, D) tensors, and the two
// oracles' inputs — each sequence on its own (copied into contiguous (1, H, L, D) tensors)
// and the padded batch (N, H, Lmax, D) with key lengths. Copies are explicit stride
// arithmetic (common/util.hpp), so the oracles share no code with src/varlen.
#pragma once

#include <cstdint>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "attn/sdpa.hpp"
#include "common/util.hpp"

namespace attn::test {

struct VarlenCase {
    std::vector<std::int64_t> lq, lk;  // per sequence
    std::int64_t Hq = 1, Hkv = 1, Dk = 8, Dv = 8;
    Causal causal = Causal::none;
    Window window{};
    int offsets = 0;  // 0: none, 1: one query_offset for all, 2: one per sequence
    std::int64_t offset_value = 0;
    double dropout = 0.0;
    // Score modifiers: sinks (Hq,), softcap, ALiBi slopes (0 none, 1 per head (Hq,), 2 per
    // sequence (N, Hq)).
    bool sinks = false;
    double softcap = 0.0;
    int alibi = 0;

    std::int64_t N() const { return static_cast<std::int64_t>(lq.size()); }
    std::int64_t Tq() const { return sum(lq); }
    std::int64_t Tk() const { return sum(lk); }
    static std::int64_t sum(const std::vector<std::int64_t>& x) {
        std::int64_t s = 0;
        for (auto e : x) s += e;
        return s;
    }
    std::string str() const {
        std::ostringstream s;
        s << "N=" << N() << " Hq=" << Hq << " Hkv=" << Hkv << " Dk=" << Dk << " Dv=" << Dv
          << " causal=" << static_cast<int>(causal) << " window=(" << window.left << "," << window.right << ","
          << static_cast<int>(window.align) << ") offsets=" << offsets << " dropout=" << dropout << " sinks=" << sinks
          << " softcap=" << softcap << " alibi=" << alibi << " lq/lk=";
        for (std::size_t b = 0; b < lq.size(); ++b) s << (b ? " " : "") << lq[b] << "/" << lk[b];
        return s.str();
    }
};

// cu_seqlens of lengths: (N+1,) int32 or int64.
inline Tensor cu_seqlens(const std::vector<std::int64_t>& len, DType dt = DType::i32) {
    Tensor t(dt, Shape{static_cast<std::int64_t>(len.size()) + 1});
    std::int64_t acc = 0;
    for (std::size_t i = 0; i <= len.size(); ++i) {
        if (dt == DType::i32) t.data_as<std::int32_t>()[i] = static_cast<std::int32_t>(acc);
        else t.data_as<std::int64_t>()[i] = acc;
        if (i < len.size()) acc += len[i];
    }
    return t;
}

// Rows [start, start + len) of packed (T, H, D) copied into a fresh (1, H, len, D) tensor
// (or into batch row b of a padded (N, H, Lmax, D) tensor with copy_rows_into).
inline void copy_rows_into(const TensorView& packed, std::int64_t start, std::int64_t len, const TensorView& dst,
                           std::int64_t b) {
    for (std::int64_t t = 0; t < len; ++t)
        for (std::int64_t h = 0; h < packed.dim(1); ++h)
            for (std::int64_t d = 0; d < packed.dim(2); ++d)
                store(dst, offset_of(dst, Index{b, h, t, d}), load(packed, offset_of(packed, Index{start + t, h, d, 0})));
}

inline Tensor rows_of(const TensorView& packed, std::int64_t start, std::int64_t len, DType dt = DType::f32) {
    Tensor t(dt, Shape{1, packed.dim(1), len, packed.dim(2)});
    copy_rows_into(packed, start, len, t, 0);
    return t;
}

// A random case: N sequences, lengths from `lens` (0 included: sequences without queries or
// keys must work), GQA, every causal alignment, windows, query offsets.
template <class Rng>
VarlenCase random_varlen_case(Rng& rng, const std::vector<std::int64_t>& lens, bool allow_dropout) {
    auto pick = [&](const std::vector<std::int64_t>& xs) { return xs[rng() % xs.size()]; };
    VarlenCase c;
    const std::int64_t N = pick({1, 2, 3, 5, 8});
    for (std::int64_t b = 0; b < N; ++b) {
        c.lq.push_back(pick(lens));
        c.lk.push_back(rng() % 3 == 0 ? c.lq.back() : pick(lens));
    }
    if (c.Tq() == 0) c.lq[0] = 1;  // the padded oracle needs Lmax >= 1
    if (c.Tk() == 0) c.lk[0] = 1;
    c.Hkv = pick({1, 2});
    c.Hq = c.Hkv * pick({1, 2, 3});
    c.Dk = pick({1, 8, 16, 33, 64});
    c.Dv = rng() % 3 == 0 ? pick({4, 16, 64}) : c.Dk;
    c.causal = static_cast<Causal>(rng() % 3);
    // One alignment per case, so the padded oracle can express it with one query_offset.
    const Align align = c.causal == Causal::bottom_right ? Align::bottom_right : Align::top_left;
    if (rng() % 4 == 0) c.window = Window{static_cast<std::int64_t>(rng() % 20), static_cast<std::int64_t>(rng() % 4) - 1, align};
    c.offsets = rng() % 4 == 0 ? static_cast<int>(1 + rng() % 2) : 0;
    c.offset_value = static_cast<std::int64_t>(rng() % 9) - 2;
    if (allow_dropout && rng() % 4 == 0) c.dropout = 0.2;
    return c;
}

// random_varlen_case with score modifiers: sinks, softcap, ALiBi per head or per sequence.
// With ALiBi every sequence has Lk_b = Lq_b, so that the padded oracle's one query_offset
// per sequence (0 for top-left) is also the ALiBi diagonal varlen uses (Lk_b − Lq_b).
template <class Rng>
VarlenCase random_modifier_case(Rng& rng, const std::vector<std::int64_t>& lens, bool allow_dropout) {
    VarlenCase c = random_varlen_case(rng, lens, allow_dropout);
    c.sinks = rng() % 3 != 0;
    if (rng() % 3 == 0) c.softcap = 4.0;
    c.alibi = static_cast<int>(rng() % 3);
    if (!c.sinks && c.softcap == 0.0 && c.alibi == 0) c.sinks = true;
    if (c.alibi != 0) {
        c.lk = c.lq;
        if (c.Tk() == 0) c.lq[0] = c.lk[0] = 1;
    }
    return c;
}

}  // namespace attn::test
