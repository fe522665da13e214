// attn/tensor.hpp: Shape, contiguous strides, views (transpose, slice, broadcast_to), the
// owning aligned Tensor, and the (B, L, H, D) → (B, H, L, D) stride view that is never a copy.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>

#include "attn/error.hpp"
#include "attn/tensor.hpp"

namespace {

using attn::DType;
using attn::Error;
using attn::Shape;
using attn::Strides;
using attn::Tensor;
using attn::TensorView;

// Runs f, expects attn::Error, returns its message (empty if nothing was thrown).
template <class F>
std::string error_of(F&& f) {
    try {
        f();
    } catch (const Error& e) {
        return e.what();
    }
    ADD_FAILURE() << "expected attn::Error";
    return {};
}

TEST(Shape, RankNumelAndText) {
    EXPECT_EQ(Shape{}.rank, 0);
    EXPECT_EQ(Shape{}.numel(), 1);  // a scalar holds one element
    EXPECT_EQ(Shape{}.str(), "()");
    EXPECT_EQ((Shape{7}).str(), "(7,)");
    EXPECT_EQ((Shape{2, 8, 512, 64}).str(), "(2, 8, 512, 64)");
    EXPECT_EQ((Shape{2, 3, 5}).numel(), 30);
    EXPECT_EQ((Shape{2, 0, 5}).numel(), 0);
    EXPECT_TRUE((Shape{2, 3}) == (Shape{2, 3}));
    EXPECT_FALSE((Shape{2, 3}) == (Shape{3, 2}));
    EXPECT_FALSE((Shape{2, 3}) == (Shape{2, 3, 1}));
}

TEST(Shape, RejectsRankAboveFourAndNegativeDims) {
    const std::string rank = error_of([] { Shape s{1, 2, 3, 4, 5}; });
    EXPECT_NE(rank.find("rank must be at most 4 but got 5"), std::string::npos) << rank;
    const std::string neg = error_of([] { Shape s{2, -3}; });
    EXPECT_NE(neg.find("must be >= 0 but got -3"), std::string::npos) << neg;
}

// Shape::rank is a public field: a rank outside 0..4 set by hand is an error, never a read or
// write past the four dims (a review found both).
TEST(Shape, RankSetByHandOutsideZeroToFourIsAnError) {
    for (const int r : {5, 7, -1}) {
        Shape s;
        s.rank = r;
        EXPECT_EQ(s.str(), "(a shape of rank " + std::to_string(r) + ")");
        EXPECT_NE(error_of([&] { (void)s.numel(); }).find("rank must be in [0, 4] but got " + std::to_string(r)), std::string::npos);
        EXPECT_EQ(error_of([&] { TensorView v(nullptr, DType::f32, s, Strides{}); }),
                  "TensorView: shape: rank must be in [0, 4] but got " + std::to_string(r));
        EXPECT_EQ(error_of([&] { TensorView v(nullptr, DType::f32, s); }), "shape: rank must be in [0, 4] but got " + std::to_string(r));
        EXPECT_FALSE(s == s);
    }
}

// A default TensorView (or Tensor) has rank 0 — one element — and no data: converting it is an
// error naming that, not a read through a null pointer.
TEST(Tensor, ToDtypeOfAViewWithoutDataIsAnError) {
    EXPECT_NE(error_of([] { (void)attn::to_dtype(TensorView(), DType::f32); }).find("to_dtype: tensor: data pointer is null"),
              std::string::npos);
    EXPECT_EQ(attn::to_dtype(TensorView(nullptr, DType::f32, Shape{0, 3}), DType::f64).numel(), 0);  // empty: fine
}

// A moved-from Tensor is empty, as Tensor(): the implicit move left its view naming the memory
// the other Tensor owns (and frees), so a "no data" check passed on a dangling pointer.
TEST(Tensor, MovedFromHasNoData) {
    Tensor a(DType::f32, Shape{2, 3}, true);
    void* data = a.data();
    Tensor b = std::move(a);
    EXPECT_EQ(b.data(), data);
    EXPECT_TRUE(b.shape() == (Shape{2, 3}));
    EXPECT_EQ(a.data(), nullptr);  // NOLINT(bugprone-use-after-move): the point of the test
    EXPECT_EQ(a.view().data(), nullptr);
    Tensor c(DType::f16, Shape{4}, true);
    c = std::move(b);
    EXPECT_EQ(c.data(), data);
    EXPECT_EQ(b.data(), nullptr);  // NOLINT(bugprone-use-after-move)
}

TEST(Strides, ContiguousIsRowMajor) {
    const Strides s = attn::contiguous_strides(Shape{2, 3, 5, 7});
    EXPECT_EQ(s[0], 105);
    EXPECT_EQ(s[1], 35);
    EXPECT_EQ(s[2], 7);
    EXPECT_EQ(s[3], 1);
    const Strides s1 = attn::contiguous_strides(Shape{9});
    EXPECT_EQ(s1[0], 1);
}

TEST(TensorView, DefaultsAndContiguity) {
    float buf[24];
    TensorView v(buf, DType::f32, Shape{2, 3, 4});
    EXPECT_EQ(v.rank(), 3);
    EXPECT_EQ(v.numel(), 24);
    EXPECT_EQ(v.stride(0), 12);
    EXPECT_EQ(v.stride(1), 4);
    EXPECT_EQ(v.stride(2), 1);
    EXPECT_EQ(v.stride(3), 0);  // unused trailing strides are zero, so offset() ignores them
    EXPECT_TRUE(v.is_contiguous());
    EXPECT_EQ(v.offset(1, 2, 3), 12 + 8 + 3);
    EXPECT_FALSE(v.transpose(0, 2).is_contiguous());
    EXPECT_TRUE(TensorView().empty());
}

TEST(TensorView, TransposeSwapsShapeAndStridesOverTheSameData) {
    float buf[6] = {0, 1, 2, 3, 4, 5};
    const TensorView v(buf, DType::f32, Shape{2, 3});
    const TensorView t = v.transpose(0, 1);
    EXPECT_EQ(t.data(), v.data());
    EXPECT_EQ(t.shape(), (Shape{3, 2}));
    for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 3; ++j) EXPECT_EQ(t.data_as<float>()[t.offset(j, i)], buf[i * 3 + j]);
    const std::string e = error_of([&] { (void)v.transpose(0, 2); });
    EXPECT_NE(e.find("transpose: dimension 2 is out of range for a rank-2 tensor"), std::string::npos) << e;
    const std::string neg = error_of([&] { (void)v.transpose(-1, 0); });
    EXPECT_NE(neg.find("dimension -1 is out of range"), std::string::npos) << neg;
}

TEST(TensorView, SliceMovesThePointerAndKeepsStrides) {
    double buf[4 * 5];
    for (int i = 0; i < 20; ++i) buf[i] = i;
    const TensorView v(buf, DType::f64, Shape{4, 5});
    const TensorView s = v.slice(1, 2, 3);  // columns 2, 3, 4
    EXPECT_EQ(s.shape(), (Shape{4, 3}));
    EXPECT_EQ(s.stride(0), 5);
    EXPECT_EQ(s.stride(1), 1);
    EXPECT_EQ(s.data_as<double>(), buf + 2);
    EXPECT_FALSE(s.is_contiguous());
    for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 3; ++j) EXPECT_EQ(s.data_as<double>()[s.offset(i, j)], buf[i * 5 + 2 + j]);
    const TensorView rows = v.slice(0, 1, 2);  // rows 1, 2: still contiguous
    EXPECT_EQ(rows.data_as<double>(), buf + 5);
    EXPECT_TRUE(rows.is_contiguous());
    EXPECT_EQ(v.slice(1, 5, 0).numel(), 0);  // an empty slice at the end is fine

    const std::string past = error_of([&] { (void)v.slice(1, 3, 3); });
    EXPECT_NE(past.find("slice: range [3, 6) does not fit dimension 1 of size 5"), std::string::npos) << past;
    const std::string neg = error_of([&] { (void)v.slice(0, -1, 2); });
    EXPECT_NE(neg.find("does not fit dimension 0 of size 4"), std::string::npos) << neg;
    const std::string dim = error_of([&] { (void)v.slice(2, 0, 1); });
    EXPECT_NE(dim.find("slice: dimension 2 is out of range for a rank-2 tensor"), std::string::npos) << dim;
}

TEST(TensorView, BroadcastToGivesStrideZeroForSizeOneAndMissingDims) {
    std::uint8_t buf[2 * 5] = {};
    const TensorView m(buf, DType::boolean, Shape{2, 1, 1, 5});  // (B, 1, 1, Lk) padding mask
    const TensorView b = m.broadcast_to(Shape{2, 3, 4, 5}, "mask");
    EXPECT_EQ(b.shape(), (Shape{2, 3, 4, 5}));
    EXPECT_EQ(b.stride(0), 5);
    EXPECT_EQ(b.stride(1), 0);
    EXPECT_EQ(b.stride(2), 0);
    EXPECT_EQ(b.stride(3), 1);
    EXPECT_EQ(b.data(), m.data());

    const TensorView lq_lk(buf, DType::boolean, Shape{2, 5});  // (Lq, Lk): leading dims missing
    const TensorView c = lq_lk.broadcast_to(Shape{3, 7, 2, 5}, "mask");
    EXPECT_EQ(c.stride(0), 0);
    EXPECT_EQ(c.stride(1), 0);
    EXPECT_EQ(c.stride(2), 5);
    EXPECT_EQ(c.stride(3), 1);

    const TensorView scalar(buf, DType::boolean, Shape{});
    const TensorView d = scalar.broadcast_to(Shape{2, 2}, "mask");
    EXPECT_EQ(d.stride(0), 0);
    EXPECT_EQ(d.stride(1), 0);

    // A strided source keeps its strides where sizes match.
    float fb[4 * 6];
    const TensorView col = TensorView(fb, DType::f32, Shape{4, 6}).slice(1, 1, 1);  // (4, 1), stride 6
    const TensorView e = col.broadcast_to(Shape{4, 3}, "bias");
    EXPECT_EQ(e.stride(0), 6);
    EXPECT_EQ(e.stride(1), 0);
}

TEST(TensorView, BroadcastToErrorsNameTheTensorAndBothShapes) {
    std::uint8_t buf[64] = {};
    const TensorView m(buf, DType::boolean, Shape{2, 3, 5});
    const std::string bad = error_of([&] { (void)m.broadcast_to(Shape{2, 4, 4, 5}, "bool_mask"); });
    EXPECT_NE(bad.find("bool_mask: shape (2, 3, 5) cannot be broadcast to (2, 4, 4, 5)"), std::string::npos) << bad;
    EXPECT_NE(bad.find("(dimension 0 is 2, expected 1 or 4)"), std::string::npos) << bad;

    const std::string last = error_of([&] { (void)m.broadcast_to(Shape{2, 3, 6}, "additive_mask"); });
    EXPECT_NE(last.find("additive_mask: shape (2, 3, 5) cannot be broadcast to (2, 3, 6)"), std::string::npos) << last;
    EXPECT_NE(last.find("dimension 2 is 5, expected 1 or 6"), std::string::npos) << last;
    // A target dim of 1 said "expected 1 or 1".
    const std::string one = error_of([&] { (void)m.broadcast_to(Shape{2, 3, 1}, "m"); });
    EXPECT_NE(one.find("m: shape (2, 3, 5) cannot be broadcast to (2, 3, 1) (dimension 2 is 5, expected 1)"), std::string::npos) << one;

    const std::string rank = error_of([&] { (void)m.broadcast_to(Shape{3, 5}, "mask"); });
    EXPECT_NE(rank.find("mask: shape (2, 3, 5) has more dimensions than (3, 5)"), std::string::npos) << rank;

    // Shape's fields are public: a target of rank 5 indexed past its dims (ASan: stack overflow).
    Shape five;
    five.rank = 5;
    const std::string r5 = error_of([&] { (void)m.broadcast_to(five, "mask"); });
    EXPECT_EQ(r5, "mask: target rank must be in [0, 4] but got 5") << r5;
}

TEST(TensorView, BLHDBufferSeenAsBHLDWithoutCopy) {
    // What a projection GEMM produces: (B, L, H, D), contiguous.
    const std::int64_t B = 2, L = 5, H = 3, D = 4;
    Tensor blhd(DType::f32, Shape{B, L, H, D});
    for (std::int64_t n = 0; n < blhd.numel(); ++n) blhd.data_as<float>()[n] = static_cast<float>(n);
    const TensorView bhld = blhd.view().transpose(1, 2);
    EXPECT_EQ(bhld.data(), blhd.data());  // same memory: no copy
    EXPECT_EQ(bhld.shape(), (Shape{B, H, L, D}));
    EXPECT_EQ(bhld.stride(0), L * H * D);
    EXPECT_EQ(bhld.stride(1), D);
    EXPECT_EQ(bhld.stride(2), H * D);
    EXPECT_EQ(bhld.stride(3), 1);
    for (std::int64_t b = 0; b < B; ++b)
        for (std::int64_t h = 0; h < H; ++h)
            for (std::int64_t l = 0; l < L; ++l)
                for (std::int64_t d = 0; d < D; ++d)
                    ASSERT_EQ(bhld.data_as<float>()[bhld.offset(b, h, l, d)],
                              static_cast<float>(((b * L + l) * H + h) * D + d));
}

TEST(TensorView, LoadAsDoubleReadsEveryDtype) {
    const float f = 1.5f;
    const double g = -2.25;
    const std::uint16_t h = 0x3e00;  // 1.5 in float16
    const std::uint16_t bf = 0xc010;  // -2.25 in bfloat16
    const std::uint8_t t = 7;         // any non-zero byte is true
    const std::int32_t i = -123456;
    const std::int64_t l = 1LL << 40;
    EXPECT_EQ(TensorView(const_cast<float*>(&f), DType::f32, Shape{}).load_as_double(0), 1.5);
    EXPECT_EQ(TensorView(const_cast<double*>(&g), DType::f64, Shape{}).load_as_double(0), -2.25);
    EXPECT_EQ(TensorView(const_cast<std::uint16_t*>(&h), DType::f16, Shape{}).load_as_double(0), 1.5);
    EXPECT_EQ(TensorView(const_cast<std::uint16_t*>(&bf), DType::bf16, Shape{}).load_as_double(0), -2.25);
    EXPECT_EQ(TensorView(const_cast<std::uint8_t*>(&t), DType::boolean, Shape{}).load_as_double(0), 1.0);
    EXPECT_EQ(TensorView(const_cast<std::int32_t*>(&i), DType::i32, Shape{}).load_as_double(0), -123456.0);
    EXPECT_EQ(TensorView(const_cast<std::int64_t*>(&l), DType::i64, Shape{}).load_as_double(0), 1099511627776.0);
}

TEST(Tensor, OwningIs64ByteAlignedAndContiguous) {
    for (std::int64_t n : {0, 1, 3, 17, 1000}) {
        const Tensor t(DType::f32, Shape{n, 3});
        EXPECT_EQ(reinterpret_cast<std::uintptr_t>(t.data()) % 64, 0u) << n;
        EXPECT_TRUE(t.view().is_contiguous());
        EXPECT_EQ(t.nbytes(), static_cast<std::size_t>(n * 3 * 4));
    }
    const Tensor z(DType::i64, Shape{5, 7}, true);
    for (std::int64_t n = 0; n < z.numel(); ++n) EXPECT_EQ(z.data_as<std::int64_t>()[n], 0);
    Tensor a(DType::f64, Shape{4});
    void* p = a.data();
    Tensor b = std::move(a);  // move keeps the storage
    EXPECT_EQ(b.data(), p);
}

// A Tensor of 2 MiB or more starts on a 2 MiB boundary (core/allocate.hpp, allocate_streamed:
// its whole 2 MiB pages advised as huge pages), a smaller one on 64 bytes; either way every byte
// of it is the tensor's — written whole, both ends read back — just below, at and above 2 MiB and
// with a tail past the last whole page. fill_zero zeroes all of it.
TEST(Tensor, TwoMiBOrMoreStartsOnATwoMiBBoundary) {
    constexpr std::int64_t kHuge = std::int64_t{2} << 20;
    for (const std::int64_t bytes : {kHuge - 4, kHuge, kHuge + 4, 2 * kHuge - 4, 3 * kHuge + 4100}) {
        Tensor t(DType::f32, Shape{bytes / 4});
        EXPECT_EQ(reinterpret_cast<std::uintptr_t>(t.data()) % (bytes >= kHuge ? kHuge : 64), 0u) << bytes;
        std::memset(t.data(), 0x5a, static_cast<std::size_t>(bytes));
        float* f = t.data_as<float>();
        f[0] = 1.0f;
        f[bytes / 4 - 1] = 2.0f;
        EXPECT_EQ(f[0], 1.0f);
        EXPECT_EQ(f[bytes / 4 - 1], 2.0f);
        const Tensor z(DType::f32, Shape{bytes / 4}, true);
        std::int64_t nonzero = 0;
        for (std::int64_t n = 0; n < bytes / 4; ++n) nonzero += z.data_as<float>()[n] != 0.0f;
        EXPECT_EQ(nonzero, 0) << bytes;
    }
}

TEST(Tensor, ToDtypeCopiesAStridedViewInLogicalOrder) {
    Tensor src(DType::f64, Shape{3, 4});
    for (int n = 0; n < 12; ++n) src.data_as<double>()[n] = n + 0.1;
    const Tensor t = attn::to_dtype(src.view().transpose(0, 1), DType::f32);  // (4, 3)
    EXPECT_EQ(t.shape(), (Shape{4, 3}));
    for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 3; ++j) EXPECT_EQ(t.data_as<float>()[i * 3 + j], static_cast<float>(j * 4 + i + 0.1));
    const std::string e = error_of([] {
        const Tensor ints(DType::i32, Shape{2});
        (void)attn::to_dtype(ints, DType::f32);
    });
    EXPECT_NE(e.find("int32 -> float32"), std::string::npos) << e;
}

// The same dtype is a copy of the bits, strided or not: through double a signalling NaN
// (here float32 0xffbfffff, the payload fuzz_safetensors wrote) comes back quiet, and
// float16/bfloat16 payloads would be rounded.
TEST(Tensor, ToDtypeToTheSameDtypeKeepsEveryBit) {
    const std::uint32_t f32_bits[] = {0xffbfffffu, 0x7f800001u, 0x7fc01234u, 0x80000000u, 0x00000001u, 0x3f800000u};
    const std::uint16_t half_bits[] = {0x7c01u, 0xfd55u, 0x7f81u, 0x8000u, 0x0001u, 0x3c00u};
    Tensor f(DType::f32, Shape{2, 3});
    std::memcpy(f.data(), f32_bits, sizeof f32_bits);
    const Tensor ft = attn::to_dtype(f.view().transpose(0, 1), DType::f32);  // (3, 2), strided
    for (int i = 0; i < 3; ++i)
        for (int j = 0; j < 2; ++j) {
            std::uint32_t got;
            std::memcpy(&got, ft.data_as<float>() + i * 2 + j, 4);
            EXPECT_EQ(got, f32_bits[j * 3 + i]) << i << "," << j;
        }
    for (DType dt : {DType::f16, DType::bf16}) {
        Tensor h(dt, Shape{6});
        std::memcpy(h.data(), half_bits, sizeof half_bits);
        const Tensor ht = attn::to_dtype(h, dt);
        EXPECT_EQ(std::memcmp(ht.data(), half_bits, sizeof half_bits), 0) << attn::dtype_name(dt);
    }
}

}  // namespace
