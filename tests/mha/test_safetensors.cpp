// safetensors reader/writer: round trips, the 16-bit dtypes, and every malformed-file case
// (on in-memory images and on files), each with the error it must give.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <filesystem>
#include <random>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "attn/error.hpp"
#include "attn/half.hpp"
#include "attn/safetensors.hpp"

namespace {

using attn::DType;
using attn::Shape;
using attn::Tensor;

std::string image(const std::string& header, const std::string& data) {
    std::string out(8, '\0');
    const std::uint64_t n = header.size();
    for (int i = 0; i < 8; ++i) out[static_cast<std::size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
    return out + header + data;
}

std::string floats(std::initializer_list<float> v) {
    std::string s(v.size() * 4, '\0');
    std::memcpy(s.data(), v.begin(), s.size());
    return s;
}

// Expects parse_safetensors to throw attn::Error containing `expect`.
void expect_error(const std::string& img, const std::string& expect) {
    try {
        attn::parse_safetensors(img.data(), img.size(), "w.safetensors");
        FAIL() << "no error; expected: " << expect;
    } catch (const attn::Error& e) {
        const std::string msg = e.what();
        EXPECT_NE(msg.find("w.safetensors"), std::string::npos) << msg;
        EXPECT_NE(msg.find(expect), std::string::npos) << "message: " << msg << "\nexpected to contain: " << expect;
    }
}

const std::string kTwo =
    R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, "b": {"dtype": "F32", "shape": [1, 1], "data_offsets": [8, 12]}})";

TEST(Safetensors, ParsesValidImage) {
    const auto f = attn::parse_safetensors(image(kTwo, floats({1.5f, -2.0f, 3.0f})).data(), 20 + kTwo.size(), "w");
    ASSERT_EQ(f.tensors.size(), 2u);
    const Tensor* a = f.find("a");
    const Tensor* b = f.find("b");
    ASSERT_NE(a, nullptr);
    ASSERT_NE(b, nullptr);
    EXPECT_EQ(a->shape(), (Shape{2}));
    EXPECT_EQ(b->shape(), (Shape{1, 1}));
    EXPECT_EQ(a->data_as<float>()[0], 1.5f);
    EXPECT_EQ(a->data_as<float>()[1], -2.0f);
    EXPECT_EQ(b->data_as<float>()[0], 3.0f);
    EXPECT_EQ(f.find("c"), nullptr);
}

// A checkpoint holds more than floats (int64 position ids, bool masks, uint8 buffers): F64,
// I64, I32 and BOOL are read in their dtype and written back as they are; a dtype attn has no
// type for (U8) is refused only when that tensor is read, so the others read by name (one such
// tensor made every tensor of the file unreadable; a review found it).
TEST(Safetensors, IntegerBoolAndFloat64TensorsAndUnreadableOnes) {
    const double f64[2] = {0.1, -2.5};
    const std::int64_t i64[2] = {-(std::int64_t{1} << 40), 7};
    const std::int32_t i32[1] = {-3};
    const unsigned char b[3] = {1, 0, 1}, u8[2] = {200, 3};
    const std::string hdr = R"({"d": {"dtype": "F64", "shape": [2], "data_offsets": [0, 16]},)"
                            R"( "i": {"dtype": "I64", "shape": [2, 1], "data_offsets": [16, 32]},)"
                            R"( "j": {"dtype": "I32", "shape": [], "data_offsets": [32, 36]},)"
                            R"( "m": {"dtype": "BOOL", "shape": [3], "data_offsets": [36, 39]},)"
                            R"( "u": {"dtype": "U8", "shape": [2], "data_offsets": [39, 41]}})";
    std::string data(reinterpret_cast<const char*>(f64), 16);
    data.append(reinterpret_cast<const char*>(i64), 16).append(reinterpret_cast<const char*>(i32), 4);
    data.append(reinterpret_cast<const char*>(b), 3).append(reinterpret_cast<const char*>(u8), 2);
    const std::string img = image(hdr, data);
    const auto dir = std::filesystem::temp_directory_path() / ("attn_st_i_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    const std::string path = (dir / "c.safetensors").string();
    std::ofstream(path, std::ios::binary).write(img.data(), static_cast<std::streamsize>(img.size()));
    const Tensor d = attn::read_safetensors_tensor(path, "d"), i = attn::read_safetensors_tensor(path, "i");
    const Tensor j = attn::read_safetensors_tensor(path, "j"), m = attn::read_safetensors_tensor(path, "m");
    EXPECT_EQ(d.dtype(), DType::f64);
    EXPECT_EQ(d.data_as<double>()[0], 0.1);
    EXPECT_EQ(i.dtype(), DType::i64);
    EXPECT_EQ(i.shape(), (Shape{2, 1}));
    EXPECT_EQ(i.data_as<std::int64_t>()[0], -(std::int64_t{1} << 40));
    EXPECT_EQ(j.dtype(), DType::i32);
    EXPECT_EQ(j.data_as<std::int32_t>()[0], -3);
    EXPECT_EQ(m.dtype(), DType::boolean);
    EXPECT_EQ(std::memcmp(m.data(), b, 3), 0);
    // By prefix: only those tensors are read (the U8 one outside it is no error), every name is held.
    std::vector<std::string> held;
    const attn::SafetensorsFile only_i = attn::read_safetensors_prefix(path, "i", &held);
    ASSERT_EQ(only_i.tensors.size(), 1u);
    EXPECT_EQ(only_i.tensors[0].first, "i");
    EXPECT_EQ(only_i.tensors[0].second.data_as<std::int64_t>()[1], 7);
    EXPECT_EQ(held, (std::vector<std::string>{"d", "i", "j", "m", "u"}));
    // The names alone (what FILE.safetensors:NAME may say): the U8 tensor is no error, none is read.
    EXPECT_EQ(attn::safetensors_names(path), held);
    for (const auto& read : {std::function<void()>([&] { attn::read_safetensors_tensor(path, "u"); }),
                             std::function<void()>([&] { attn::read_safetensors_prefix(path, "u"); }),
                             std::function<void()>([&] { attn::read_safetensors(path); })}) {
        try {
            read();
            ADD_FAILURE() << "U8 read";
        } catch (const attn::Error& e) {
            EXPECT_NE(std::string(e.what()).find("tensor 'u': dtype U8 is not supported (F32, F16, BF16, F64, I64, I32 or BOOL)"),
                      std::string::npos) << e.what();
        }
    }
    // Written back: I64, I32 and BOOL as they are, F64 as F32.
    const std::string out = (dir / "w.safetensors").string();
    attn::write_safetensors(out, {{"d", d.view()}, {"i", i.view()}, {"j", j.view()}, {"m", m.view()}});
    const attn::SafetensorsFile back = attn::read_safetensors(out);
    EXPECT_EQ(back.find("d")->dtype(), DType::f32);
    for (const char* n : {"i", "j", "m"}) {
        const Tensor one = attn::read_safetensors_tensor(path, n);
        ASSERT_EQ(back.find(n)->dtype(), one.dtype()) << n;
        EXPECT_EQ(std::memcmp(back.find(n)->data(), one.data(), one.nbytes()), 0) << n;
    }
    std::filesystem::remove_all(dir);
}

TEST(Safetensors, ReadsF16AndBF16) {
    const std::uint16_t h[2] = {attn::float_to_f16(0.5f), attn::float_to_f16(-3.25f)};
    const std::uint16_t bf[1] = {attn::float_to_bf16(1.0f / 3.0f)};
    const std::string hdr =
        R"({"__metadata__": {"format": "pt"}, "h": {"dtype": "F16", "shape": [2], "data_offsets": [0, 4]}, "bf": {"dtype": "BF16", "shape": [], "data_offsets": [4, 6]}})";
    std::string data(6, '\0');
    std::memcpy(data.data(), h, 4);
    std::memcpy(data.data() + 4, bf, 2);
    const std::string img = image(hdr, data);
    const auto f = attn::parse_safetensors(img.data(), img.size(), "w");
    EXPECT_EQ(f.metadata.at("format"), "pt");
    const Tensor h32 = attn::to_dtype(*f.find("h"), DType::f32);
    EXPECT_EQ(f.find("h")->dtype(), DType::f16);
    EXPECT_EQ(h32.data_as<float>()[0], 0.5f);
    EXPECT_EQ(h32.data_as<float>()[1], -3.25f);
    EXPECT_EQ(f.find("bf")->dtype(), DType::bf16);
    EXPECT_EQ(f.find("bf")->shape().rank, 0);
    EXPECT_NEAR(attn::to_dtype(*f.find("bf"), DType::f32).data_as<float>()[0], 1.0f / 3.0f, 2e-3);
}

TEST(Safetensors, ZeroSizedTensorsAndEmptyFile) {
    const std::string hdr =
        R"({"z": {"dtype": "F32", "shape": [0, 3], "data_offsets": [0, 0]}, "a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})";
    const std::string img = image(hdr, floats({7.0f}));
    const auto f = attn::parse_safetensors(img.data(), img.size(), "w");
    EXPECT_EQ(f.find("z")->numel(), 0);
    EXPECT_EQ(f.find("a")->data_as<float>()[0], 7.0f);
    const std::string empty = image("{}", "");
    EXPECT_TRUE(attn::parse_safetensors(empty.data(), empty.size(), "w").tensors.empty());
}

TEST(Safetensors, WriteReadRoundTripStridedAndHalf) {
    const auto dir = std::filesystem::temp_directory_path() / ("attn_st_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    const std::string path = (dir / "rt.safetensors").string();
    Tensor a(DType::f32, Shape{3, 4});
    for (int i = 0; i < 12; ++i) a.data_as<float>()[i] = static_cast<float>(i) * 0.25f - 1.0f;
    Tensor h(DType::f16, Shape{2});
    h.data_as<std::uint16_t>()[0] = attn::float_to_f16(2.5f);
    h.data_as<std::uint16_t>()[1] = attn::float_to_f16(-0.125f);
    attn::write_safetensors(path, {{"a_t", a.view().transpose(0, 1)}, {"h", h.view()}}, {{"who", "test"}});
    const auto f = attn::read_safetensors(path);
    ASSERT_NE(f.find("a_t"), nullptr);
    EXPECT_EQ(f.find("a_t")->shape(), (Shape{4, 3}));
    EXPECT_EQ(f.find("a_t")->dtype(), DType::f32);
    for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 3; ++j) EXPECT_EQ(f.find("a_t")->data_as<float>()[i * 3 + j], a.data_as<float>()[j * 4 + i]);
    EXPECT_EQ(f.find("h")->data_as<float>()[0], 2.5f);
    EXPECT_EQ(f.find("h")->data_as<float>()[1], -0.125f);
    EXPECT_EQ(f.metadata.at("who"), "test");
    // The data section starts 8-byte aligned.
    std::ifstream in(path, std::ios::binary);
    std::uint64_t n = 0;
    in.read(reinterpret_cast<char*>(&n), 8);
    EXPECT_EQ(n % 8, 0u);

    EXPECT_THROW(attn::write_safetensors(path, {{"x", a.view()}, {"x", a.view()}}), attn::Error);
    EXPECT_THROW(attn::write_safetensors(path, {{"__metadata__", a.view()}}), attn::Error);
    std::filesystem::remove_all(dir);
}

// One tensor by name (the CLI's FILE.safetensors:NAME): only its data is read, the header is
// still checked whole, and a missing name lists the names the file holds.
TEST(Safetensors, ReadsOneTensorByName) {
    const auto dir = std::filesystem::temp_directory_path() / ("attn_st_one_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    const std::string path = (dir / "two.safetensors").string();
    const std::string img = image(kTwo, floats({1, 2, 3}));
    std::ofstream(path, std::ios::binary).write(img.data(), static_cast<std::streamsize>(img.size()));
    const attn::SafetensorsFile all = attn::read_safetensors(path);
    for (const auto& [name, t] : all.tensors) {
        const Tensor one = attn::read_safetensors_tensor(path, name);
        ASSERT_EQ(one.shape(), t.shape());
        ASSERT_EQ(one.dtype(), t.dtype());
        EXPECT_EQ(std::memcmp(one.data(), t.data(), t.nbytes()), 0) << name;
    }
    try {
        attn::read_safetensors_tensor(path, "nope");
        FAIL() << "no error";
    } catch (const attn::Error& e) {
        const std::string m = e.what();
        EXPECT_NE(m.find("'" + path + "': has no tensor named 'nope' (it holds 2: "), std::string::npos) << m;
    }
    // A damaged header is refused even though the named tensor's own entry is fine.
    const std::string bad = image(kTwo, floats({1, 2, 3, 4}));  // a hole at the end of the data
    std::ofstream(path, std::ios::binary | std::ios::trunc).write(bad.data(), static_cast<std::streamsize>(bad.size()));
    EXPECT_THROW(attn::read_safetensors_tensor(path, all.tensors.front().first), attn::Error);
    std::filesystem::remove_all(dir);
}

TEST(Safetensors, FileErrors) {
    EXPECT_THROW(attn::read_safetensors("/nonexistent/dir/w.safetensors"), attn::Error);
    EXPECT_THROW(attn::read_safetensors("/tmp"), attn::Error);
    // A truncated file: the header promises data the file does not hold.
    const auto dir = std::filesystem::temp_directory_path() / ("attn_st_t_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    const std::string path = (dir / "t.safetensors").string();
    const std::string img = image(kTwo, floats({1, 2, 3}));
    std::ofstream(path, std::ios::binary).write(img.data(), static_cast<std::streamsize>(img.size() - 3));
    try {
        attn::read_safetensors(path);
        FAIL() << "no error";
    } catch (const attn::Error& e) {
        EXPECT_NE(std::string(e.what()).find("past the end of the data section"), std::string::npos) << e.what();
    }
    std::filesystem::remove_all(dir);
}

struct Bad {
    const char* name;
    std::string img;
    const char* expect;
};

std::vector<Bad> malformed() {
    const std::string d12 = floats({1, 2, 3});
    auto one = [&](const std::string& entry, const std::string& data) {
        return image(R"({"a": )" + entry + "}", data);
    };
    std::string huge_len = image(kTwo, d12);
    for (int i = 0; i < 8; ++i) huge_len[static_cast<std::size_t>(i)] = static_cast<char>(0xff);
    std::string past = image(kTwo, d12);
    past[0] = static_cast<char>(past[0] + 13);  // header longer than the rest of the file
    return {
        {"empty", "", "too short"},
        {"seven-bytes", std::string(7, '\0'), "too short"},
        {"length-past-eof", past, "runs past the end of the file"},
        {"length-2^64-1", huge_len, "runs past the end of the file"},
        {"bad-json", image(R"({"a": {"dtype": "F32",)", ""), "not valid JSON"},
        {"trailing-garbage", image(kTwo + "x", d12), "not valid JSON"},
        {"nul-in-header", image(kTwo + std::string(3, '\0'), d12), "NUL byte"},
        {"not-object", image("[1]", ""), "must be a JSON object"},
        {"duplicate", image(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, "a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})",
                            floats({1, 2})), "'a' more than once"},
        // A field twice in one entry: nlohmann kept the last silently. (The same field in two
        // entries is fine: kTwo, ParsesValidImage.)
        {"duplicate-field", one(R"({"dtype": "I32", "dtype": "F32", "shape": [1], "data_offsets": [0, 4]})", floats({1})),
         "'dtype' more than once"},
        {"entry-not-object", one("3", ""), "must be a JSON object"},
        {"missing-dtype", one(R"({"shape": [1], "data_offsets": [0, 4]})", floats({1})), "missing field 'dtype'"},
        {"missing-shape", one(R"({"dtype": "F32", "data_offsets": [0, 4]})", floats({1})), "missing field 'shape'"},
        {"missing-offsets", one(R"({"dtype": "F32", "shape": [1]})", floats({1})), "missing field 'data_offsets'"},
        {"extra-field", one(R"({"dtype": "F32", "shape": [1], "data_offsets": [0, 4], "x": 1})", floats({1})), "unexpected field 'x'"},
        {"unknown-dtype", one(R"({"dtype": "F31", "shape": [1], "data_offsets": [0, 4]})", floats({1})), "unknown dtype 'F31'"},
        {"unsupported-dtype", one(R"({"dtype": "U8", "shape": [4], "data_offsets": [0, 4]})", floats({1})), "U8 is not supported"},
        {"dtype-number", one(R"({"dtype": 1, "shape": [1], "data_offsets": [0, 4]})", floats({1})), "dtype must be a string"},
        {"shape-not-array", one(R"({"dtype": "F32", "shape": 1, "data_offsets": [0, 4]})", floats({1})), "shape must be an array"},
        {"shape-negative", one(R"({"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]})", floats({1})), "must be >= 0"},
        {"shape-fraction", one(R"({"dtype": "F32", "shape": [1.5], "data_offsets": [0, 4]})", floats({1})), "non-negative integer"},
        {"shape-rank-5", one(R"({"dtype": "F32", "shape": [1, 1, 1, 1, 1], "data_offsets": [0, 4]})", floats({1})), "rank 5"},
        {"shape-too-big", one(R"({"dtype": "F32", "shape": [4611686018427387904, 4611686018427387904], "data_offsets": [0, 4]})", floats({1})),
         "more bytes than"},
        {"shape-dim-2^64-1", one(R"({"dtype": "F32", "shape": [18446744073709551615], "data_offsets": [0, 4]})", floats({1})), "too large"},
        {"bytes-mismatch", one(R"({"dtype": "F32", "shape": [2], "data_offsets": [0, 4]})", floats({1})), "needs 8 bytes"},
        {"offsets-one", one(R"({"dtype": "F32", "shape": [1], "data_offsets": [4]})", floats({1})), "[begin, end]"},
        {"offsets-reversed", one(R"({"dtype": "F32", "shape": [0], "data_offsets": [4, 0]})", floats({1})), "end before they begin"},
        {"offsets-past-data", one(R"({"dtype": "F32", "shape": [2], "data_offsets": [0, 8]})", floats({1})), "past the end of the data"},
        {"offsets-huge", one(R"({"dtype": "F32", "shape": [1], "data_offsets": [18446744073709551612, 18446744073709551615]})", floats({1})),
         "past the end of the data"},
        {"overlap", image(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})",
                          floats({1, 2})), "overlap"},
        {"hole-between", image(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, "b": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]}})",
                               d12), "belong to no tensor"},
        {"hole-at-start", one(R"({"dtype": "F32", "shape": [1], "data_offsets": [4, 8]})", floats({1, 2})), "belong to no tensor"},
        {"trailing-bytes", one(R"({"dtype": "F32", "shape": [1], "data_offsets": [0, 4]})", floats({1, 2})), "at the end of the data section"},
        {"metadata-not-object", image(R"({"__metadata__": 3})", ""), "__metadata__ must be an object"},
        {"metadata-value-number", image(R"({"__metadata__": {"k": 3}})", ""), "__metadata__['k'] must be a string"},
        {"empty-name", image(R"({"": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})", floats({1})), "empty name"},
    };
}

TEST(Safetensors, MalformedImagesGiveClearErrors) {
    for (const Bad& b : malformed()) {
        SCOPED_TRACE(b.name);
        expect_error(b.img, b.expect);
    }
}

// Names and dtypes from the file are quoted with control bytes escaped (JSON's \u001b and \n
// decode to raw bytes that would break the one-line message or colour a terminal).
TEST(Safetensors, FileTextInMessagesIsEscaped) {
    expect_error(image(R"({"a\u001b[31m": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}})", floats({1})),
                 "tensor 'a\\x1b[31m'");
    expect_error(image(R"({"a": {"dtype": "F\n32", "shape": [1], "data_offsets": [0, 4]}})", floats({1})),
                 "unknown dtype 'F\\x0a32'");
    // A C1 control (CSI, U+009B, in UTF-8) is escaped too; other non-ASCII text is kept.
    expect_error(image(R"({"\u00e9\u009b[31m": {"dtype": "Q9", "shape": [1], "data_offsets": [0, 4]}})", floats({1})),
                 "tensor '\xc3\xa9\\xc2\\x9b[31m'");
    // The cut falls between characters: a name of 'a' and 100 'é' (2 bytes each) keeps 'a' and 39 of
    // them (79 bytes); cutting at byte 80 split the 40th, and Python showed the message as ''.
    std::string e_acute_39;
    for (int i = 0; i < 39; ++i) e_acute_39 += "\xc3\xa9";
    std::string name_json = "a";
    for (int i = 0; i < 100; ++i) name_json += "\\u00e9";
    expect_error(image("{\"" + name_json + R"(": {"dtype": "Q9", "shape": [1], "data_offsets": [0, 4]}})", floats({1})),
                 "tensor 'a" + e_acute_39 + "...'");
    // File text of any length is cut: a 100 000-character shape string made a 100 KB message.
    const std::string long_shape = R"({"a": {"dtype": "F32", "shape": ")" + std::string(100000, 'x') + R"(", "data_offsets": [0, 4]}})";
    try {
        attn::parse_safetensors(image(long_shape, floats({1})).data(), 8 + long_shape.size() + 4, "w.safetensors");
        ADD_FAILURE() << "no error";
    } catch (const attn::Error& e) {
        EXPECT_LT(std::string(e.what()).size(), 300u) << std::string(e.what()).substr(0, 300);
        EXPECT_NE(std::string(e.what()).find("shape must be an array but got '\"xxx"), std::string::npos);
    }
}

TEST(Safetensors, HeaderOverTheLimitIsRefusedUnparsed) {
    // A header of 100 MiB + 8 bytes that the file really holds (in memory only).
    const std::uint64_t big = attn::kSafetensorsMaxHeader + 8;
    std::string img(8, '\0');
    for (int i = 0; i < 8; ++i) img[static_cast<std::size_t>(i)] = static_cast<char>((big >> (8 * i)) & 0xff);
    img += std::string(big, ' ');
    expect_error(img, "exceeds the limit");
}

// The same images as files (read through fseeko/fread rather than memory).
TEST(Safetensors, MalformedFilesGiveClearErrors) {
    const auto dir = std::filesystem::temp_directory_path() / ("attn_st_m_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    const std::string path = (dir / "w.safetensors").string();
    for (const Bad& b : malformed()) {
        SCOPED_TRACE(b.name);
        std::ofstream(path, std::ios::binary | std::ios::trunc).write(b.img.data(), static_cast<std::streamsize>(b.img.size()));
        try {
            attn::read_safetensors(path);
            ADD_FAILURE() << "no error";
        } catch (const attn::Error& e) {
            EXPECT_NE(std::string(e.what()).find(b.expect), std::string::npos) << e.what();
        }
    }
    std::filesystem::remove_all(dir);
}

// Random damage to a valid file — flipped bytes, truncation, a rewritten length — must give
// a parsed file or an attn::Error, never a crash or a read past the image (run under
// -DATTN_SANITIZE=ON to check the latter).
TEST(Safetensors, RandomDamageNeverCrashes) {
    const std::string good = image(kTwo + "   ", floats({1, 2, 3}));
    std::mt19937 rng(42);
    int parsed = 0, refused = 0;
    for (int iter = 0; iter < 3000; ++iter) {
        std::string img = good;
        const int kind = iter % 3;
        if (kind == 0) {
            const int flips = 1 + static_cast<int>(rng() % 4);
            for (int f = 0; f < flips; ++f) img[rng() % img.size()] = static_cast<char>(rng() & 0xff);
        } else if (kind == 1) {
            img.resize(rng() % img.size());
        } else {
            const std::uint64_t n = rng() % (img.size() + 16);
            for (int i = 0; i < 8; ++i) img[static_cast<std::size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
        }
        // A copy of exactly the damaged size, so a sanitizer sees any over-read.
        std::vector<char> exact(img.begin(), img.end());
        try {
            attn::parse_safetensors(exact.data(), exact.size(), "w");
            ++parsed;
        } catch (const attn::Error&) {
            ++refused;
        }
    }
    EXPECT_EQ(parsed + refused, 3000);
    EXPECT_GT(refused, 2000);
}

// torch.save files are named as such; a real header whose length begins with the same bytes as a
// pickle (640 = 0x80 0x02 …) is read (the first version of the check refused it).
TEST(Safetensors, TorchSaveFilesAreNamedAndLength640IsNot) {
    std::string header = R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})";
    header.append(640 - header.size(), ' ');
    const std::string img = image(header, floats({2.5f}));
    ASSERT_EQ(static_cast<unsigned char>(img[0]), 0x80);
    ASSERT_EQ(static_cast<unsigned char>(img[1]), 0x02);
    const auto f = attn::parse_safetensors(img.data(), img.size(), "w.safetensors");
    ASSERT_EQ(f.tensors.size(), 1u);
    EXPECT_EQ(f.tensors[0].second.data_as<float>()[0], 2.5f);
    const char pickle[] = "\x80\x02}q\x00(X\x0e\x00\x00\x00in_proj_weightq";  // torch.save(..., zipfile False)
    const char zip[] = "PK\x03\x04\x00\x00\x08\x08\x00\x00\x00\x00";
    expect_error(std::string(pickle, sizeof pickle - 1), "is a pickle (torch.save writes these)");
    expect_error(std::string(zip, sizeof zip - 1), "is a zip archive (torch.save writes these)");
}

// The header is read as a stream of JSON events (no document, whose destructor can terminate on
// out of memory: unit_alloc_failures), and no deeper than the format nests: an array or object in
// a shape or data_offsets element, or in a dtype's or a metadata value's, is refused by its place.
// (The document's dump() of a dtype 100 000 arrays deep, for the message, overflowed the stack.)
TEST(Safetensors, NestingDeeperThanTheFormatIsRefusedByPlace) {
    expect_error(image(R"({"a": {"dtype": "F32", "shape": [[1]], "data_offsets": [0, 4]}})", floats({1})),
                 "header nests deeper than the format: ['a']['shape'][0] is an array (the format has an object of tensors, "
                 "each an object whose shape and data_offsets are arrays of integers)");
    expect_error(image(R"({"__metadata__": {"k": {"x": {}}}})", ""), "['__metadata__']['k']['x'] is an object");
    const std::string deep = R"({"a": {"dtype": )" + std::string(100000, '[') + std::string(100000, ']') +
                             R"(, "shape": [1], "data_offsets": [0, 4]}})";
    expect_error(image(deep, floats({1})), "['a']['dtype'][0] is an array");
    // As deep as the format, a value of the wrong type is shown as before.
    expect_error(image(R"({"a": {"dtype": {"b": 1, "a": "x"}, "shape": [1], "data_offsets": [0, 4]}})", floats({1})),
                 R"(dtype must be a string but got '{"a":"x","b":1}')");
    expect_error(image(R"({"__metadata__": [1.50, {"b": null, "a": -0}]})", ""),
                 R"(__metadata__ must be an object of strings but got '[1.5,{"a":0,"b":null}]')");
}

// A key given twice is refused wherever it is, the empty key too: the reader took an empty name
// as "no duplicate yet", so {"__metadata__": {"": "a", "": "b"}} read as {"": "b"}.
TEST(Safetensors, EmptyKeyTwiceIsADuplicate) {
    expect_error(image(R"({"__metadata__": {"": "a", "": "b"}})", ""), "header names '' more than once");
    expect_error(image(R"({"a": {"": 1, "": 2, "dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})", floats({1})),
                 "header names '' more than once");
}

// A header is JSON text, which is UTF-8: a name or metadata that is not is an attn::Error before
// anything is written (it was nlohmann's type_error 316, from the middle of the writer).
TEST(Safetensors, WritingTextThatIsNotUtf8IsAnError) {
    const auto dir = std::filesystem::temp_directory_path() / ("attn_st_u_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    const std::string path = (dir / "u.safetensors").string();
    const Tensor a(DType::f32, Shape{1});
    const auto expect = [&](const std::string& name, const std::map<std::string, std::string>& metadata, const std::string& message) {
        try {
            attn::write_safetensors(path, {{name, a.view()}}, metadata);
            ADD_FAILURE() << "no error; expected: " << message;
        } catch (const attn::Error& e) {
            EXPECT_EQ(std::string(e.what()), "'" + path + "': " + message + " is not valid UTF-8 (a safetensors header is JSON text)");
        }
        EXPECT_FALSE(std::filesystem::exists(path));
    };
    expect("a\xff", {}, "tensor name 'a\\xff'");
    expect("a", {{"\xc3", "v"}}, "metadata key '\\xc3'");
    expect("a", {{"k", "\xed\xa0\x80"}}, "the value of metadata key 'k'");  // a UTF-16 surrogate
    std::filesystem::remove_all(dir);
}

// A header of 100 000 tensors reads, every entry in place. Not timed (speed is the benchmark's,
// not a unit test's): the DOM reader this replaced took a minute here (nlohmann's callback parser
// rescanned the header object after each entry; 200 000 tensors, a 17 MB header, 14 minutes), the
// SAX reader 0.4 s — measured, and written in CHANGELOG.md.
TEST(Safetensors, ManyTensorsRead) {
    std::string header = "{";
    for (int i = 0; i < 100000; ++i) {
        header += (i == 0 ? "\"t" : ", \"t") + std::to_string(i) + R"(": {"dtype": "F32", "shape": [)" +
                  std::to_string(i % 3) + R"(, 0], "data_offsets": [0, 0]})";
    }
    header += "}";
    const std::string img = image(header, "");
    const auto f = attn::parse_safetensors(img.data(), img.size(), "w");
    ASSERT_EQ(f.tensors.size(), 100000u);
    for (int i : {0, 1, 2, 49999, 99999}) {
        const attn::Tensor* t = f.find("t" + std::to_string(i));
        ASSERT_NE(t, nullptr) << "t" << i;
        EXPECT_EQ(t->view().rank(), 2) << "t" << i;
        EXPECT_EQ(t->view().dim(0), i % 3) << "t" << i;
    }
}

}  // namespace
