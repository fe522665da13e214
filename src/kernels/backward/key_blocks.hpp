// A key block's way in and out: its K and V rows packed for the tiles (pack_key_block) and its
// dK and dV rows stored once the pass is over (store_key_block).
// A part of the backward driver: only flash_backward.cpp includes it, and like the rest of the
// driver it has internal linkage (anonymous namespace).
#pragma once

#include <cstdint>
#include <tuple>

#include "../finite.hpp"
#include "../simd/convert.hpp"
#include "../store_row.hpp"
#include "backward_scratch.hpp"
#include "operands.hpp"

#ifndef ATTN_BACKWARD_DRIVER
#error "include key_blocks.hpp from flash_backward.cpp only"
#endif

namespace attn::detail {
namespace {

// Key block kb ([j0, j0 + bc)) of KV head hk packed for the tiles: Kᵀ and Vᵀ (d-major, keys
// contiguous, zero-padded to bcp) and K (key-major, padded to Dkp, NaN/±inf 0 for dS·K),
// from float32 rows in place or widened to float32 (convert.hpp); bf16 compute reads only their pairs, made from the bf16
// words (K and V are bf16 then).
void pack_key_block(const Plan& c, Scratch& s, KeyBlock& kb, std::int64_t b, std::int64_t hk) {
    const SdpaProblem& p = c.p;
    const std::int64_t j0 = kb.j0;
    const int bc = kb.bc, bcp = kb.bcp;
    if (c.bf16) {  // Kᵀ and Vᵀ pairs along d (for S, dP), K pairs along keys with NaN/±inf 0 (for dQ)
        const std::uint16_t* k16 = p.k.data_as<const std::uint16_t>() + p.k.offset(b, hk, j0, 0);
        const std::uint16_t* v16 = p.v.data_as<const std::uint16_t>() + p.v.offset(b, hk, j0, 0);
        bf16_pairs_t16(k16, p.k.stride(2), p.k.stride(3), bc, bcp, c.Dk, kb.ktp.data(), bcp);
        bf16_pairs_t16(v16, p.v.stride(2), p.v.stride(3), bc, bcp, c.Dv, kb.vtp.data(), bcp);
        bf16_pairs_z16(k16, p.k.stride(2), p.k.stride(3), bc, c.Dk, c.Dkp, kb.kpp.data(), c.Dkp);
        return;
    }
    const bool k_rows = p.k.dtype() == DType::f32 && p.k.stride(3) == 1;
    const bool v_rows = p.v.dtype() == DType::f32 && p.v.stride(3) == 1;
    if (k_rows) {  // float32 rows in place: Kᵀ by 4 × 4 blocks, K with NaN/±inf 0 (for dS·K)
        const float* k = p.k.data_as<const float>() + p.k.offset(b, hk, j0, 0);
        transpose_rows(k, p.k.stride(2), bc, c.Dk, kb.kt.data(), bcp);
        for (int j = 0; j < bc; ++j)
            finite_rows(k + j * p.k.stride(2), 0, 1, static_cast<int>(c.Dk), kb.kp.data() + static_cast<std::ptrdiff_t>(j) * c.Dkp);
    }
    if (v_rows)
        transpose_rows(p.v.data_as<const float>() + p.v.offset(b, hk, j0, 0), p.v.stride(2), bc, c.Dv, kb.vt.data(), bcp);
    for (int j = 0; j < (k_rows ? 0 : bc); ++j) {
        float* kr = kb.kp.data() + static_cast<std::ptrdiff_t>(j) * c.Dkp;
        widen_row(p.k, p.k.offset(b, hk, j0 + j, 0), p.k.stride(3), c.Dk, kr);
        for (std::int64_t d = 0; d < c.Dk; ++d) {
            kb.kt[static_cast<std::size_t>(d * bcp + j)] = kr[d];
            if (nonfinite_f32(kr[d])) kr[d] = 0.0f;  // for dS·K
        }
    }
    for (int j = 0; j < (v_rows ? 0 : bc); ++j) {
        widen_row(p.v, p.v.offset(b, hk, j0 + j, 0), p.v.stride(3), c.Dv, s.vrow.data());
        for (std::int64_t d = 0; d < c.Dv; ++d) kb.vt[static_cast<std::size_t>(d * bcp + j)] = s.vrow[static_cast<std::size_t>(d)];
    }
    for (int j = bc; j < bcp; ++j) {
        for (std::int64_t d = 0; d < c.Dk; ++d) kb.kt[static_cast<std::size_t>(d * bcp + j)] = 0.0f;
        for (std::int64_t d = 0; d < c.Dv; ++d) kb.vt[static_cast<std::size_t>(d * bcp + j)] = 0.0f;
    }
}

// The task's dK (times split.grads) and dV rows of key block kb, written once: streamed past the
// caches where Plan::stream_dkv and stream_rows allow (the task ends the streams:
// end_streams), else row by row (store_row).
void store_key_block(const Plan& c, const KeyBlock& kb, std::int64_t b, std::int64_t hk) {
    for (auto [t, src, ld, D, f] : {std::tuple{&c.bp.dk, kb.dk.data(), c.Dkp, c.Dk, c.split.grads},
                                    std::tuple{&c.bp.dv, kb.dv.data(), c.Dvp, c.Dv, 1.0f}}) {
        if (c.stream_dkv && t->dtype() == DType::f32 && t->stride(3) == 1 &&
            stream_rows(t->data_as<float>() + t->offset(b, hk, kb.j0, 0), t->stride(2), src, ld, kb.bc, D, f))
            continue;
        for (int j = 0; j < kb.bc; ++j) store_row(*t, t->offset(b, hk, kb.j0 + j, 0), t->stride(3), src + j * ld, 1, D, f);
    }
}

}  // namespace
}  // namespace attn::detail
