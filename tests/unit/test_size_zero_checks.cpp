// make_problem with SizeZero::allowed — python/sdpa.cpp's _check_sdpa, which attn.torch runs for a
// call with an empty dim (the core has nothing to compute there): every option is checked as in a
// call with data, in the same words; only the "must be >= 1" rule of the sizes is lifted, and a KV
// head count of 0 is a clear error (or fine with no query heads), never a division by 0.
#include <gtest/gtest.h>

#include <string>

#include "attn/error.hpp"
#include "attn/sdpa.hpp"
#include "sdpa/problem.hpp"

namespace {

using attn::DType;
using attn::Shape;
using attn::Tensor;
using attn::detail::SizeZero;

// The message of make_problem on (B, Hq, 3, 8) · (B, Hkv, 5, 8) · (B, Hkv, 5, 6) with `o`; "" when it accepts.
std::string check(std::int64_t b, std::int64_t hq, std::int64_t hkv, const attn::SdpaOptions& o,
                  SizeZero zero = SizeZero::allowed) {
    const Tensor q(DType::f32, Shape{b, hq, 3, 8}), k(DType::f32, Shape{b, hkv, 5, 8}), v(DType::f32, Shape{b, hkv, 5, 6});
    Tensor out(DType::f32, Shape{b, hq, 3, 6});
    try {
        (void)attn::detail::make_problem(q.view(), k.view(), v.view(), o, out.view(), nullptr, nullptr, "sdpa",
                                         attn::detail::OutLse::written, zero);
    } catch (const attn::Error& e) {
        return e.what();
    }
    return "";
}

TEST(SizeZeroChecks, AnEmptyBatchGetsTheOptionChecksOfACallWithData) {
    attn::SdpaOptions bad_softcap;
    bad_softcap.softcap = -1.0;
    attn::SdpaOptions bad_window;
    bad_window.window.left = -2;
    attn::SdpaOptions bad_origin;
    bad_origin.dropout_origin.row = -1;
    for (const attn::SdpaOptions* o : {&bad_softcap, &bad_window, &bad_origin}) {
        const std::string with_data = check(2, 2, 2, *o);
        EXPECT_FALSE(with_data.empty());
        EXPECT_EQ(check(0, 2, 2, *o), with_data);
    }
    EXPECT_EQ(check(0, 2, 2, bad_origin),
              "sdpa: dropout_origin.row: must be >= 0 with row + Lq <= 2^32 (Lq = 3) but got -1");
    EXPECT_EQ(check(0, 2, 2, {}), "");
    EXPECT_EQ(check(0, 2, 2, {}, SizeZero::refused), "sdpa: Q: batch must be >= 1 but got 0");
}

// An empty tensor is never read, so its data pointer may be null (torch's is): where size 0 is
// allowed the call is accepted as with a pointer (it said "Q: data pointer is null"). A null
// pointer with elements is still refused.
TEST(SizeZeroChecks, EmptyInputsWithANullDataPointer) {
    Tensor out(DType::f32, Shape{0, 2, 3, 6});
    const auto call = [&](const attn::TensorView& q, const attn::TensorView& k, const attn::TensorView& v) -> std::string {
        try {
            (void)attn::detail::make_problem(q, k, v, {}, out.view(), nullptr, nullptr, "sdpa",
                                             attn::detail::OutLse::written, SizeZero::allowed);
        } catch (const attn::Error& e) {
            return e.what();
        }
        return "";
    };
    const attn::TensorView q(nullptr, DType::f32, Shape{0, 2, 3, 8}), k(nullptr, DType::f32, Shape{0, 2, 5, 8}),
        v(nullptr, DType::f32, Shape{0, 2, 5, 6});
    EXPECT_EQ(call(q, k, v), "");
    const Tensor k_data(DType::f32, Shape{1, 2, 5, 8});
    EXPECT_EQ(call(attn::TensorView(nullptr, DType::f32, Shape{1, 2, 3, 8}), k_data.view(), k_data.view()),
              "sdpa: Q: data pointer is null but its shape (1, 2, 3, 8) has elements");
    // Empty but of the wrong rank: the rank is what is wrong (it said "Q: data pointer is null").
    EXPECT_EQ(call(attn::TensorView(nullptr, DType::f32, Shape{0, 3, 8}), k, v),
              "sdpa: Q: expected a rank-4 tensor (B, Hq, Lq, Dk) but got shape (0, 3, 8)");
}

TEST(SizeZeroChecks, NoKeyValueHeads) {
    EXPECT_EQ(check(2, 2, 0, {}), "sdpa: Q: heads 2 must be a multiple of K/V's heads 0 (grouped-query attention)");
    EXPECT_EQ(check(2, 0, 0, {}), "");
}

}  // namespace
