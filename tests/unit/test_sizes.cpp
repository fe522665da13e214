// Sizes from user input (issue 19, class 1): every product of shapes, element sizes and byte
// counts goes through src/core/checked_size.hpp. An impossible size is an attn::Error that
// names what and the factors; a possible one the system refuses is attn::OutOfMemory naming
// the buffer and the bytes. Nothing overflows on the way (this binary also runs under
// ASan + UBSan: tests/kernels/asan_kernel_tests.sh).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "attn/error.hpp"
#include "attn/npy.hpp"
#include "attn/safetensors.hpp"
#include "attn/tensor.hpp"
#include "core/allocate.hpp"
#include "core/checked_size.hpp"

// Under ASan, an allocation above its limit aborts unless it may return null; these tests
// exercise exactly that path (a harmless unused symbol in a normal build).
extern "C" const char* __asan_default_options() { return "allocator_may_return_null=1"; }

namespace {

using attn::DType;
using attn::Shape;
using attn::Tensor;
constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();

template <class E = attn::Error, class F>
std::string error_of(F&& f) {
    try {
        f();
    } catch (const E& e) {
        return e.what();
    }
    ADD_FAILURE() << "expected an exception";
    return {};
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

Shape shape_of(const std::vector<std::int64_t>& dims) {  // dims set directly, as readers do
    Shape s;
    s.rank = static_cast<int>(dims.size());
    for (std::size_t i = 0; i < dims.size(); ++i) s.dims[i] = dims[i];
    return s;
}

// The oracle: exact arithmetic in 128 bits, saturated — independent of the helper under test.
std::optional<std::int64_t> bytes_oracle(const std::vector<std::int64_t>& dims, std::int64_t elem) {
    unsigned __int128 p = static_cast<unsigned __int128>(elem);
    bool empty = false;
    for (std::int64_t d : dims) {
        if (d == 0) {
            empty = true;
            continue;
        }
        p *= static_cast<unsigned __int128>(d);
        if (p > static_cast<unsigned __int128>(kMax)) return std::nullopt;
    }
    return empty ? 0 : static_cast<std::int64_t>(p);
}

TEST(CheckedSize, MulAndAddAtTheLimit) {
    using attn::detail::size_add;
    using attn::detail::size_mul;
    EXPECT_EQ(size_mul(kMax, 1), kMax);
    EXPECT_EQ(size_mul(std::int64_t{1} << 31, std::int64_t{1} << 31), std::int64_t{1} << 62);
    EXPECT_EQ(size_mul(std::int64_t{1} << 62, 2), std::nullopt);
    EXPECT_EQ(size_mul(3037000500, 3037000500), std::nullopt);  // just above sqrt(2^63)
    EXPECT_EQ(size_mul(0, kMax), 0);
    EXPECT_EQ(size_mul(-1, 2), std::nullopt);
    EXPECT_EQ(size_add(kMax - 1, 1), kMax);
    EXPECT_EQ(size_add(kMax, 1), std::nullopt);
    EXPECT_EQ(size_add(-5, 3), std::nullopt);
    const std::string m = error_of([] { (void)attn::detail::checked_mul("KVCache", "capacity", kMax, 2); });
    EXPECT_EQ(m, "KVCache: capacity: 9223372036854775807 × 2 exceeds 9223372036854775807");
    const std::string a = error_of([] { (void)attn::detail::checked_add("KVCache", "append: length", kMax, 7); });
    EXPECT_EQ(a, "KVCache: append: length: 9223372036854775807 + 7 exceeds 9223372036854775807");
}

// Random shapes built from dims near the limits, against the 128-bit oracle.
TEST(CheckedSize, ShapeBytesMatchesExactArithmetic) {
    const std::vector<std::int64_t> pool = {0, 1, 2, 3, 7, 1000, 1 << 20, std::int64_t{1} << 31, std::int64_t{1} << 32,
                                            1000000000000, 100000000000000, std::int64_t{1} << 62, kMax / 3, kMax};
    std::mt19937 rng(19);
    int overflowing = 0, empty_overflowing = 0;
    for (int trial = 0; trial < 4000; ++trial) {
        std::vector<std::int64_t> dims(rng() % 5);
        for (auto& d : dims) d = pool[rng() % pool.size()];
        const std::int64_t elem = std::vector<std::int64_t>{1, 2, 4, 8}[rng() % 4];
        const auto want = bytes_oracle(dims, elem);
        const auto got = attn::detail::shape_bytes(shape_of(dims), static_cast<std::size_t>(elem));
        ASSERT_EQ(got, want) << shape_of(dims).str() << " × " << elem;
        if (!want) {
            ++overflowing;
            bool zero = false;
            for (auto d : dims) zero |= d == 0;
            empty_overflowing += zero;
            const std::string msg =
                error_of([&] { (void)attn::detail::checked_bytes("op", "x", shape_of(dims), static_cast<std::size_t>(elem)); });
            ASSERT_TRUE(contains(msg, "op: x of shape " + shape_of(dims).str())) << msg;
            ASSERT_TRUE(contains(msg, "more bytes than a 64-bit size can count")) << msg;
        }
    }
    EXPECT_GT(overflowing, 100);  // the pool does reach both cases
    EXPECT_GT(empty_overflowing, 10);
}

// Zero-size shapes whose other dims overflow, and plain overflowing shapes: numel and the
// contiguous strides refuse them (UBSan would flag the multiplication otherwise).
TEST(CheckedSize, ShapesWhoseElementCountOverflowsAreRefused) {
    const std::vector<std::vector<std::int64_t>> bad = {{0, 1000000000000, 100000000000000},
                                                        {1000000000000, 100000000000000, 0},
                                                        {std::int64_t{1} << 32, std::int64_t{1} << 32},
                                                        {3, std::int64_t{1} << 62},
                                                        {kMax, 2, 0, 1}};
    for (const auto& dims : bad) {
        const Shape s = shape_of(dims);
        const std::string n = error_of([&] { (void)s.numel(); });
        EXPECT_TRUE(contains(n, "shape: shape " + s.str() + " has more elements than a 64-bit count can hold")) << n;
        const std::string st = error_of([&] { (void)attn::contiguous_strides(s); });
        EXPECT_FALSE(st.empty());
        const std::string t = error_of([&] { Tensor x(DType::f32, s); });
        EXPECT_TRUE(contains(t, "more bytes than a 64-bit size can count")) << t;
        // The factors named are the ones that overflow: a zero-size shape's other dims (it said
        // "0 × 1000000000000 × … > 9223372036854775807", which is false).
        const bool empty = std::find(dims.begin(), dims.end(), 0) != dims.end();
        EXPECT_EQ(contains(t, "(the dims other than 0: "), empty) << t;
        EXPECT_FALSE(contains(t, "(0 × ")) << t;
        // A contiguous view computes the strides: it refuses the shape too.
        EXPECT_FALSE(error_of([&] { (void)attn::TensorView(nullptr, DType::f32, s); }).empty());
    }
    // At the limit and empty-but-countable shapes are fine.
    EXPECT_EQ(shape_of({std::int64_t{1} << 31, std::int64_t{1} << 31}).numel(), std::int64_t{1} << 62);
    EXPECT_EQ(attn::contiguous_strides(shape_of({std::int64_t{1} << 31, std::int64_t{1} << 31}))[0], std::int64_t{1} << 31);
    EXPECT_EQ(shape_of({std::int64_t{1} << 62, 1, 0}).numel(), 0);
    EXPECT_EQ(shape_of({kMax}).numel(), kMax);
    const Tensor e(DType::f32, shape_of({0, 1000000, 1000}));  // empty, countable: allocates
    EXPECT_EQ(e.numel(), 0);
    EXPECT_EQ(e.nbytes(), 0u);
    EXPECT_NE(e.data(), nullptr);
}

TEST(CheckedSize, TensorBytesOverflowIsAnErrorNotAnAllocation) {
    // Element counts that fit but byte counts that do not.
    for (const auto& [dt, dims] : std::vector<std::pair<DType, std::vector<std::int64_t>>>{
             {DType::f32, {std::int64_t{1} << 62}},
             {DType::f64, {std::int64_t{1} << 61}},
             {DType::f16, {2, std::int64_t{1} << 61}},
             {DType::i64, {kMax / 4, 2}}}) {
        const std::string m = error_of([dt = dt, &dims = dims] { Tensor t(dt, shape_of(dims), false, "q"); });
        EXPECT_TRUE(contains(m, "Tensor: q (" + std::string(attn::dtype_name(dt)) + ") of shape " + shape_of(dims).str()))
            << m;
        EXPECT_TRUE(contains(m, "more bytes than a 64-bit size can count")) << m;
    }
}

TEST(CheckedSize, RefusedAllocationNamesTheTensorAndTheBytes) {
    // 2^52 bytes (4 PiB): countable, but no machine gives it.
    const std::string m = error_of<attn::OutOfMemory>(
        [] { Tensor t(DType::f32, Shape{std::int64_t{1} << 40, 1024}, false, "the weights"); });
    EXPECT_TRUE(contains(m, "out of memory: cannot allocate 4503599627370496 bytes (4.0 PiB) for the weights (float32) "
                            "of shape (1099511627776, 1024)"))
        << m;
    // It is a std::bad_alloc, so code that handles running out of memory still does.
    EXPECT_THROW((Tensor(DType::f64, Shape{std::int64_t{1} << 50})), std::bad_alloc);
}

// A buffer of 2 MiB or more is padded to whole 2 MiB pages for aligned_alloc (allocate_streamed,
// which every Tensor and KV cache takes): at the top of the int64 range that rounding must not wrap
// to a small size that the system would give — refused, as OutOfMemory naming the buffer.
TEST(CheckedSize, StreamedAllocationAtTheTopOfTheRangeIsRefused) {
    constexpr std::int64_t kHuge = std::int64_t{2} << 20;
    for (const std::int64_t bytes : {kMax, kMax - kHuge + 2, kMax / kHuge * kHuge, std::int64_t{1} << 62}) {
        const std::string m = error_of<attn::OutOfMemory>([bytes] { attn::detail::allocate_streamed(bytes, "the cache"); });
        EXPECT_TRUE(contains(m, "cannot allocate " + std::to_string(bytes) + " bytes")) << m;
        EXPECT_TRUE(contains(m, "for the cache")) << m;
    }
}

// ---- file headers ----------------------------------------------------------------------------

std::string temp_path(const std::string& name) {
    return (std::filesystem::temp_directory_path() / ("attn_sizes_" + std::to_string(::getpid()) + "_" + name)).string();
}

// A version-1.0 .npy file: magic, header length, the dict padded to 64 bytes, then `data`.
void write_npy_file(const std::string& path, const std::string& descr, const std::string& shape, const std::string& data) {
    std::string dict = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + shape + ", }";
    dict.append((64 - (10 + dict.size() + 1) % 64) % 64, ' ');
    dict += '\n';
    std::string bytes = "\x93NUMPY\x01";
    bytes += '\0';
    bytes += static_cast<char>(dict.size() & 0xff);
    bytes += static_cast<char>(dict.size() >> 8);
    std::ofstream(path, std::ios::binary) << bytes << dict << data;
}

TEST(CheckedSize, NpyHeadersWithOverflowingShapes) {
    const std::string path = temp_path("h.npy");
    const std::vector<std::pair<std::string, std::string>> cases = {
        {"<f4", "(0, 1000000000000, 100000000000000)"},  // empty, but its strides overflow
        {"<f4", "(1000000000000, 100000000000000, 0)"},
        {"<f8", "(0, 9223372036854775807, 2)"},
        {"<f4", "(4611686018427387904, 2)"},               // elements fit, bytes do not
        {"<f8", "(9223372036854775807,)"},
        {"|b1", "(4294967296, 4294967296)"},               // 1-byte elements, 2^64 of them
        {"<i4", "(3037000500, 3037000500, 1, 1)"}};
    for (const auto& [descr, shape] : cases) {
        write_npy_file(path, descr, shape, std::string(8, '\0'));
        const std::string m = error_of([&] { (void)attn::read_npy(path); });
        EXPECT_TRUE(contains(m, "'" + path + "': the array of shape ")) << m;
        EXPECT_TRUE(contains(m, "more bytes than a 64-bit size can count")) << descr << " " << shape << ": " << m;
    }
    // An empty array whose dims are countable reads fine.
    write_npy_file(path, "<f4", "(0, 1000000, 1000)", "");
    const Tensor t = attn::read_npy(path);
    EXPECT_EQ(t.shape(), (Shape{0, 1000000, 1000}));
    std::remove(path.c_str());
}

// An in-memory safetensors file with one tensor 'a' of `shape` (a JSON array) and `data`.
std::string safetensors_bytes(const std::string& shape, std::uint64_t end, const std::string& data) {
    std::string header = R"({"a": {"dtype": "F32", "shape": )" + shape + R"(, "data_offsets": [0, )" + std::to_string(end) + "]}}";
    std::string out;
    for (int i = 0; i < 8; ++i) out += static_cast<char>((header.size() >> (8 * i)) & 0xff);
    return out + header + data;
}

TEST(CheckedSize, SafetensorsHeadersWithOverflowingShapes) {
    for (const std::string& shape :
         {std::string("[0, 1000000000000, 100000000000000]"), std::string("[1000000000000, 100000000000000, 0]"),
          std::string("[4611686018427387904, 2]"), std::string("[2305843009213693952, 1, 1, 1]"),
          std::string("[9223372036854775807, 9223372036854775807]")}) {
        const std::string bytes = safetensors_bytes(shape, 0, "");
        const std::string m = error_of([&] { (void)attn::parse_safetensors(bytes.data(), bytes.size(), "mem"); });
        EXPECT_TRUE(contains(m, "mem: tensor 'a': data of shape (")) << shape << ": " << m;
        EXPECT_TRUE(contains(m, "more bytes than a 64-bit size can count")) << shape << ": " << m;
    }
    const std::string ok = safetensors_bytes("[0, 1000000, 1000]", 0, "");
    const attn::SafetensorsFile f = attn::parse_safetensors(ok.data(), ok.size(), "mem");
    ASSERT_NE(f.find("a"), nullptr);
    EXPECT_EQ(f.find("a")->shape(), (Shape{0, 1000000, 1000}));
}

}  // namespace
