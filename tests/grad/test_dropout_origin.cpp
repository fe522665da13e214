// SdpaOptions::dropout_origin: a piece of a problem (a slice of the batch, the heads, the rows
// and the keys) called with its place as the origin drops exactly what the whole problem drops
// with the same seed — forward (reference, flash on every ISA row) and backward (dQ of a row
// slice, dK/dV of a key slice, given the whole's O and lse: what a ring block computes). Without
// the origin the piece's mask is another one (checked, so these tests can fail). Bad origins are
// refused with a message naming the field.
#include <gtest/gtest.h>

#include <random>
#include <string>

#include "attn/error.hpp"
#include "attn/sdpa.hpp"
#include "attn/sdpa_backward.hpp"
#include "common/util.hpp"
#include "core/cpu_features.hpp"
#include "kernels/isa.hpp"

namespace {

using namespace attn;
using attn::test::max_abs;
using attn::test::max_abs_diff;
using attn::test::poisoned;
using attn::test::randn;

// The whole problem: B = 3, Hq = 4 over Hkv = 2, Lq = 37, Lk = 45. The piece: batch [1, 3),
// query heads [2, 4) (= KV head 1), rows [5, 26), keys [7, 40) — a key origin that is not a
// multiple of 4 (a Philox block spans the piece's first key and the three before it).
constexpr std::int64_t B = 3, Hq = 4, Hkv = 2, Lq = 37, Lk = 45, Dk = 8, Dv = 6;
constexpr std::int64_t b0 = 1, nb = 2, h0 = 2, nh = 2, r0 = 5, nr = 21, k0 = 7, nk = 33;

struct Whole {
    Tensor q, k, v, dout;
    SdpaOptions opt;
    Whole() {
        std::mt19937_64 rng(2026);
        q = randn(DType::f32, Shape{B, Hq, Lq, Dk}, rng);
        k = randn(DType::f32, Shape{B, Hkv, Lk, Dk}, rng);
        v = randn(DType::f32, Shape{B, Hkv, Lk, Dv}, rng);
        dout = randn(DType::f32, Shape{B, Hq, Lq, Dv}, rng);
        opt.dropout_p = 0.4;
        opt.dropout_seed = 0xfedcba9876543210ULL;
    }
    TensorView piece_q(std::int64_t rows0, std::int64_t rows) const {
        return q.view().slice(0, b0, nb).slice(1, h0, nh).slice(2, rows0, rows);
    }
    TensorView piece_kv(const Tensor& t, std::int64_t keys0, std::int64_t keys) const {
        return t.view().slice(0, b0, nb).slice(1, h0 / (Hq / Hkv), 1).slice(2, keys0, keys);
    }
};

// The zero pattern of the piece's weights against the whole's at the same global (b, h, i, j).
std::int64_t mismatches(const Tensor& piece_w, const Tensor& whole_w) {
    std::int64_t bad = 0;
    for (std::int64_t b = 0; b < nb; ++b)
        for (std::int64_t h = 0; h < nh; ++h)
            for (std::int64_t i = 0; i < nr; ++i)
                for (std::int64_t j = 0; j < nk; ++j) {
                    const float p = piece_w.data_as<float>()[((b * nh + h) * nr + i) * nk + j];
                    const float w = whole_w.data_as<float>()[(((b0 + b) * Hq + h0 + h) * Lq + r0 + i) * Lk + k0 + j];
                    bad += std::isnan(p) || (p == 0.0f) != (w == 0.0f);
                }
    return bad;
}

TEST(DropoutOrigin, ForwardPieceDropsWhatTheWholeDrops) {
    const Whole w;
    for (const Impl impl : {Impl::reference, Impl::flash}) {
        for (const detail::KernelSet* row : detail::runnable_kernel_sets()) {
            const detail::ScopedKernelSet use(*row);
            SdpaOptions o = w.opt;
            o.impl = impl;
            Tensor wo = poisoned(DType::f32, Shape{B, Hq, Lq, Dv}), ww = poisoned(DType::f32, Shape{B, Hq, Lq, Lk});
            const TensorView wwv = ww.view();
            sdpa(w.q, w.k, w.v, o, wo, nullptr, &wwv);
            std::int64_t zeros = 0;
            for (std::int64_t e = 0; e < ww.numel(); ++e) zeros += ww.data_as<float>()[e] == 0.0f;
            ASSERT_GT(zeros, ww.numel() / 4) << "p = 0.4 should drop about 40% of the weights";

            auto piece = [&](const DropoutOrigin& origin) {
                SdpaOptions po = o;
                po.dropout_origin = origin;
                Tensor out = poisoned(DType::f32, Shape{nb, nh, nr, Dv}), pw = poisoned(DType::f32, Shape{nb, nh, nr, nk});
                const TensorView pwv = pw.view();
                sdpa(w.piece_q(r0, nr), w.piece_kv(w.k, k0, nk), w.piece_kv(w.v, k0, nk), po, out, nullptr, &pwv);
                return pw;
            };
            const std::string what = std::string(impl_name(impl)) + " on " + std::string(detail::isa_name(row->isa));
            EXPECT_EQ(mismatches(piece({b0, h0, r0, k0}), ww), 0) << what << ": the piece at its origin";
            EXPECT_GT(mismatches(piece({}), ww), nb * nh * nr * nk / 10) << what << ": without the origin the mask must differ";
            if (impl == Impl::reference) break;  // the reference has no ISA rows
        }
    }
}

// Backward: the whole's gradients by the double reference; the pieces get the whole's O and lse.
TEST(DropoutOrigin, BackwardPiecesGiveTheWholesGradients) {
    const Whole w;
    const Tensor q64 = attn::test::to_storage(w.q, DType::f64), k64 = attn::test::to_storage(w.k, DType::f64),
                 v64 = attn::test::to_storage(w.v, DType::f64), do64 = attn::test::to_storage(w.dout, DType::f64);
    SdpaOptions ref = w.opt;
    ref.impl = Impl::reference;
    Tensor o64(DType::f64, Shape{B, Hq, Lq, Dv}), l64(DType::f64, Shape{B, Hq, Lq});
    const TensorView l64v = l64.view();
    sdpa(q64, k64, v64, ref, o64, &l64v);
    Tensor dq = poisoned(DType::f64, q64.shape()), dk = poisoned(DType::f64, k64.shape()), dv = poisoned(DType::f64, v64.shape());
    sdpa_backward(q64, k64, v64, o64, l64, do64, ref, dq, dk, dv);
    const Tensor o32 = attn::test::to_storage(o64, DType::f32), l32 = attn::test::to_storage(l64, DType::f32);
    auto rows = [&](const Tensor& t, std::int64_t i0, std::int64_t n) {
        return t.view().slice(0, b0, nb).slice(1, h0, nh).slice(2, i0, n);
    };
    auto lse_rows = [&](const Tensor& t, std::int64_t i0, std::int64_t n) {
        return t.view().slice(0, b0, nb).slice(1, h0, nh).slice(2, i0, n);
    };
    auto check = [&](const TensorView& got, const TensorView& want, const std::string& what) {
        const double scale = max_abs(want), err = max_abs_diff(got, want);
        EXPECT_LE(err, 1e-5 * scale) << what << ": max error " << err << " of max |ref| " << scale;
        return err / scale;
    };

    for (const Impl impl : {Impl::reference, Impl::flash}) {
        for (const detail::KernelSet* row : detail::runnable_kernel_sets()) {
            const detail::ScopedKernelSet use(*row);
            const std::string what = std::string(impl_name(impl)) + " on " + std::string(detail::isa_name(row->isa));
            for (const bool with_origin : {true, false}) {
                // dQ of rows [r0, r0 + nr): the piece sees every key.
                SdpaOptions o = w.opt;
                o.impl = impl;
                if (with_origin) o.dropout_origin = {b0, h0, r0, 0};
                Tensor gq = poisoned(DType::f32, Shape{nb, nh, nr, Dk}), gk = poisoned(DType::f32, Shape{nb, 1, Lk, Dk}),
                       gv = poisoned(DType::f32, Shape{nb, 1, Lk, Dv});
                sdpa_backward(w.piece_q(r0, nr), w.piece_kv(w.k, 0, Lk), w.piece_kv(w.v, 0, Lk), rows(o32, r0, nr),
                              lse_rows(l32, r0, nr), rows(w.dout, r0, nr), o, gq, gk, gv);
                const TensorView want_dq = dq.view().slice(0, b0, nb).slice(1, h0, nh).slice(2, r0, nr);
                if (with_origin) {
                    check(gq, want_dq, what + ": dQ of the row piece");
                } else {
                    EXPECT_GT(max_abs_diff(gq, want_dq), 1e-2 * max_abs(want_dq)) << what << ": without the origin dQ must differ";
                }
                // dK/dV of keys [k0, k0 + nk), every row: P from the whole's lse (flash only — the
                // reference recomputes its own softmax over the piece's keys).
                if (impl == Impl::flash) {
                    SdpaOptions ko = w.opt;
                    ko.impl = impl;
                    if (with_origin) ko.dropout_origin = {b0, h0, 0, k0};
                    Tensor hq = poisoned(DType::f32, Shape{nb, nh, Lq, Dk}), hk = poisoned(DType::f32, Shape{nb, 1, nk, Dk}),
                           hv = poisoned(DType::f32, Shape{nb, 1, nk, Dv});
                    sdpa_backward(w.piece_q(0, Lq), w.piece_kv(w.k, k0, nk), w.piece_kv(w.v, k0, nk), rows(o32, 0, Lq),
                                  lse_rows(l32, 0, Lq), rows(w.dout, 0, Lq), ko, hq, hk, hv);
                    const TensorView want_dk = dk.view().slice(0, b0, nb).slice(1, 1, 1).slice(2, k0, nk);
                    const TensorView want_dv = dv.view().slice(0, b0, nb).slice(1, 1, 1).slice(2, k0, nk);
                    if (with_origin) {
                        check(hk, want_dk, what + ": dK of the key piece");
                        check(hv, want_dv, what + ": dV of the key piece");
                    } else {
                        EXPECT_GT(max_abs_diff(hv, want_dv), 1e-2 * max_abs(want_dv)) << what << ": without the origin dV must differ";
                    }
                }
            }
            if (impl == Impl::reference) break;
        }
    }
}

TEST(DropoutOrigin, BadOriginsAreRefusedNamingTheField) {
    const Whole w;
    const struct {
        DropoutOrigin origin;
        const char* expect;
    } cases[] = {{{-1, 0, 0, 0}, "sdpa: dropout_origin.batch: must be >= 0 with batch + B <= 2^32 (B = 3) but got -1"},
                 {{0, (std::int64_t{1} << 32) - 3, 0, 0}, "dropout_origin.head: must be >= 0 with head + Hq <= 2^32 (Hq = 4)"},
                 {{0, 0, (std::int64_t{1} << 32) - 36, 0}, "dropout_origin.row: must be >= 0 with row + Lq <= 2^32 (Lq = 37)"},
                 {{0, 0, 0, (std::int64_t{1} << 34) - 44}, "dropout_origin.key: must be >= 0 with key + Lk <= 2^34 (Lk = 45)"}};
    for (const auto& c : cases) {
        SdpaOptions o = w.opt;
        o.dropout_origin = c.origin;
        Tensor out = poisoned(DType::f32, Shape{B, Hq, Lq, Dv});
        try {
            sdpa(w.q, w.k, w.v, o, out);
            ADD_FAILURE() << "no error; expected: " << c.expect;
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find(c.expect), std::string::npos) << e.what();
        }
        EXPECT_TRUE(attn::test::still_poisoned(out)) << c.expect;
    }
    // The largest origins that fit are accepted.
    SdpaOptions o = w.opt;
    o.dropout_origin = {(std::int64_t{1} << 32) - B, (std::int64_t{1} << 32) - Hq, (std::int64_t{1} << 32) - Lq,
                        (std::int64_t{1} << 34) - Lk};
    Tensor out(DType::f32, Shape{B, Hq, Lq, Dv});
    EXPECT_NO_THROW(sdpa(w.q, w.k, w.v, o, out));
}

}  // namespace
