// A task's query heads, prepared once per task (prepare_head): their Q and dO rows (in place,
// widened, zeroed copies, bf16 pairs: prepare_rows) and per row −lse and D = rowsum(dO ∘ O).
// A part of the backward driver: only flash_backward.cpp includes it, and like the rest of the
// driver it has internal linkage (anonymous namespace).
#pragma once

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>

#include "../../core/allocate.hpp"
#include "../../core/element_io.hpp"
#include "../finite.hpp"
#include "backward_scratch.hpp"
#include "operands.hpp"

#ifndef ATTN_BACKWARD_DRIVER
#error "include query_heads.hpp from flash_backward.cpp only"
#endif

namespace attn::detail {
namespace {

// Σ a[d]·b[d] in double: 8 partial sums (d mod 8) added in a fixed order, so the compiler
// vectorises it and the result depends on n only.
double dot_f64(const float* a, const float* b, std::int64_t n) {
    double acc[8] = {};
    std::int64_t d = 0;
    for (; d + 8 <= n; d += 8)
        for (int l = 0; l < 8; ++l) acc[l] += static_cast<double>(a[d + l]) * static_cast<double>(b[d + l]);
    for (int l = 0; d < n; ++d, ++l) acc[l] += static_cast<double>(a[d]) * static_cast<double>(b[d]);
    return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

// The rows of Q, or of dO, of query head g of the task's group (head h of batch b), once per
// task: in place, widened, the zeroed copy for a head holding a NaN/±inf, and for bf16 compute
// the bf16 rows and pairs (bf16 rows with no NaN/±inf read in place: no float32 copy at all).
// finite: the rows are known to hold no NaN/±inf (dO's, by D: prepare_head), so not scanned.
void prepare_rows(const Plan& c, const Plan::RowsPlan& r, HeadRows& o, std::int64_t b, std::int64_t h, std::size_t g,
                  bool finite = false) {
    const TensorView& t = *r.t;
    const std::int64_t Lq = c.Lq;
    const int Dp = r.Dp;
    const std::size_t head = r.head, total = c.group * head;
    std::uint32_t* pairs = c.bf16 ? o.pairs.data() + g * static_cast<std::size_t>(c.Lq2 * Dp) : nullptr;
    const std::uint16_t* in16 = r.bf16_direct ? t.data_as<const std::uint16_t>() + t.offset(b, h, 0, 0) : nullptr;
    if (in16 && any_nonfinite16(in16, t.stride(2), Lq, Dp, kBF16Exponent)) in16 = nullptr;
    o.at[g] = r.direct ? r.in_place.row(b, h, 0) : o.f32.data() + g * head;
    o.ld[g] = r.direct ? r.in_place.si : Dp;
    if (in16) {
        o.nonfinite[g] = 0;
        o.at16[g] = in16;
        o.ld16[g] = t.stride(2);
        bf16_pairs16(in16, t.stride(2), Lq, Dp, pairs, Dp);
    } else {
        if (!r.direct) widen_rows(t, b, h, Lq, Dp, o.f32.data() + g * head);
        if ((o.nonfinite[g] = !finite && any_nonfinite(o.at[g], o.ld[g], Lq, Dp))) {
            // Sized by the first head that needs it, inside the parallel region (most calls have
            // no NaN/±inf: no copy at all); a refusal is said after the region (flash_backward).
            if (o.z.size() < total) resize_or_throw(o.z, static_cast<std::int64_t>(total), r.zeroed_copy);
            finite_rows(o.at[g], o.ld[g], Lq, Dp, o.z.data() + g * head);
        }
    }
    o.z_at[g] = o.nonfinite[g] ? o.z.data() + g * head : o.at[g];
    o.z_ld[g] = o.nonfinite[g] ? Dp : o.ld[g];
    if (c.bf16 && !in16) {  // bf16 rows (for S, dP) and row pairs (for dK, dV: the zeroed copies)
        bf16_rows(o.at[g], o.ld[g], Lq, Dp, o.b16.data() + g * head, Dp);
        bf16_pairs(o.z_at[g], o.z_ld[g], Lq, Dp, pairs, Dp);
        o.at16[g] = o.b16.data() + g * head;
        o.ld16[g] = Dp;
    }
}

// Query head g of the task's group (head h of batch b), once per task: its Q and dO rows, and
// per row −lse and D = rowsum(dO ∘ O). The task of the first chunk also keeps D for the
// sinks' gradient.
void prepare_head(const Plan& c, Scratch& s, std::int64_t b, std::int64_t h, std::size_t g, std::int64_t chunk,
                  float* Dall) {
    const SdpaProblem& p = c.p;
    const std::int64_t Lq = c.Lq;
    // Per row: −lse (the float32 lse negated: exact; a row with no visible key −inf, +inf
    // lse −FLT_MAX as before: a visible +inf score keeps P = inf, others 0); the tile
    // subtracts it before scaling by log2 e (tile.hpp, kTileLog2e); D = rowsum(dO ∘ O) over
    // rows as float32 (exact; read in place when float32 with unit stride) summed in 8 fixed
    // double lanes.
    // D also scans dO: a NaN/±inf in a dO row makes its sum in double NaN or ±inf (x·±inf is
    // ±inf or NaN, and nothing brings a sum back from either), and products and sums of finite
    // float32 values stay finite in double (|Σ| ≤ Dv·FLT_MAX² ≪ DBL_MAX). So every D finite in
    // double (before its float32 rounding) means finite dO rows: prepare_rows skips their scan,
    // one read of the head's dO rows fewer (docs/kernels-lab.md#bwd-11).
    bool dO_finite = true;
    for (std::int64_t i = 0; i < Lq; ++i) {
        const std::size_t gi = g * static_cast<std::size_t>(Lq) + static_cast<std::size_t>(i);
        const double lse = load(*p.lse, p.lse->offset(b, h, i));
        const double nl = std::clamp(-lse, -static_cast<double>(FLT_MAX), static_cast<double>(FLT_MAX));
        s.nl[gi] = lse == -INFINITY ? kNegInf : static_cast<float>(std::isnan(lse) ? lse : nl);
        const double d = dot_f64(f32_row(c.bp.grad_out, b, h, i, s.w.data()), f32_row(p.out, b, h, i, s.w.data() + c.Dv), c.Dv);
        dO_finite = dO_finite && std::isfinite(d);
        s.dd[gi] = static_cast<float>(d);
        if (chunk == 0 && Dall != nullptr) Dall[static_cast<std::size_t>((b * c.Hq + h) * Lq + i)] = s.dd[gi];
    }
    prepare_rows(c, c.q, s.q, b, h, g);
    prepare_rows(c, c.dO, s.dO, b, h, g, dO_finite);
}

}  // namespace
}  // namespace attn::detail
