// attn/npy.hpp: round trips for every dtype and rank, strided views, format versions 1/2/3,
// every malformed-file case (a clear attn::Error naming the file, never a crash or an
// allocation sized by an unchecked header), and atomic writes (nothing left behind on failure).
#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <csignal>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "attn/error.hpp"
#include "attn/npy.hpp"
#include "io/atomic_file.hpp"

namespace {

namespace fs = std::filesystem;
using attn::DType;
using attn::Shape;
using attn::Tensor;
using attn::TensorView;

// A fresh directory per test, removed afterwards.
class Npy : public ::testing::Test {
protected:
    void SetUp() override {
        const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
        dir_ = fs::temp_directory_path() /
               ("attn_npy_" + std::to_string(::getpid()) + "_" + info->name());
        fs::remove_all(dir_);
        fs::create_directories(dir_);
    }
    void TearDown() override { fs::remove_all(dir_); }

    std::string path(const std::string& name) const { return (dir_ / name).string(); }
    std::vector<std::string> listing() const {
        std::vector<std::string> names;
        for (const auto& e : fs::directory_iterator(dir_)) names.push_back(e.path().filename().string());
        std::sort(names.begin(), names.end());
        return names;
    }
    // Whether this directory's file system has fallocate (AtomicFile::reserve relies on it).
    bool fallocate_works() const {
        const std::string probe = path(".probe");
        const int fd = ::open(probe.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
        const bool ok = fd >= 0 && ::fallocate(fd, 0, 0, 4096) == 0;
        if (fd >= 0) ::close(fd);
        ::unlink(probe.c_str());
        return ok;
    }
    void write_bytes(const std::string& name, const std::string& bytes) const {
        std::ofstream f(path(name), std::ios::binary);
        f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    }
    // The message of the attn::Error that read_npy throws on `name` (fails the test otherwise).
    std::string read_error(const std::string& name) const {
        try {
            (void)attn::read_npy(path(name));
        } catch (const attn::Error& e) {
            const std::string msg = e.what();
            EXPECT_EQ(msg.rfind("'" + path(name) + "': ", 0), 0u) << "the message must start with the file name, quoted: " << msg;
            return msg;
        } catch (const std::exception& e) {
            ADD_FAILURE() << "expected attn::Error, got another exception: " << e.what();
            return {};
        }
        ADD_FAILURE() << "expected attn::Error reading " << name;
        return {};
    }

    fs::path dir_;
};

// A .npy file by hand: magic, version, little-endian header length (2 bytes for 1.x, 4 for
// 2.x/3.x), the header text padded with spaces and ending in '\n', then `data`.
std::string npy_bytes(const std::string& dict, const std::string& data, int major = 1) {
    const std::size_t prelude = major == 1 ? 10 : 12;
    std::string header = dict;
    const std::size_t total = prelude + header.size() + 1;
    header.append((64 - total % 64) % 64, ' ');
    header += '\n';
    std::string out = "\x93NUMPY";
    out += static_cast<char>(major);
    out += '\0';
    const std::uint32_t len = static_cast<std::uint32_t>(header.size());
    for (std::size_t i = 0; i < (major == 1 ? 2u : 4u); ++i) out += static_cast<char>((len >> (8 * i)) & 0xff);
    return out + header + data;
}

std::string dict_of(const std::string& descr, const std::string& shape, const std::string& fortran = "False") {
    return "{'descr': '" + descr + "', 'fortran_order': " + fortran + ", 'shape': " + shape + ", }";
}

std::string float_bytes(std::initializer_list<float> v) {
    std::string s(v.size() * 4, '\0');
    std::memcpy(s.data(), std::data(v), s.size());
    return s;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// ---- round trips -----------------------------------------------------------------------------

TEST_F(Npy, RoundTripEveryDtypeAndRank) {
    const std::vector<Shape> shapes{Shape{}, Shape{7}, Shape{3, 5}, Shape{2, 3, 4}, Shape{2, 1, 3, 5}, Shape{0, 3}};
    std::mt19937 gen(1);
    for (DType t : {DType::f32, DType::f64, DType::f16, DType::boolean, DType::i32, DType::i64}) {
        for (const Shape& s : shapes) {
            Tensor a(t, s);
            auto* bytes = static_cast<unsigned char*>(a.data());
            for (std::size_t i = 0; i < a.nbytes(); ++i) bytes[i] = static_cast<unsigned char>(gen());
            if (t == DType::boolean)  // a bool byte is 0 or 1
                for (std::size_t i = 0; i < a.nbytes(); ++i) bytes[i] &= 1;
            const std::string p = path("a.npy");
            attn::write_npy(p, a);
            const Tensor b = attn::read_npy(p);
            const std::string what = std::string(attn::dtype_name(t)) + " " + s.str();
            EXPECT_EQ(b.dtype(), t) << what;
            EXPECT_EQ(b.shape(), s) << what;
            ASSERT_EQ(b.nbytes(), a.nbytes()) << what;
            EXPECT_EQ(std::memcmp(a.data(), b.data(), a.nbytes()), 0) << what;
            EXPECT_EQ(reinterpret_cast<std::uintptr_t>(b.data()) % 64, 0u);
        }
    }
    EXPECT_EQ(listing(), std::vector<std::string>{"a.npy"});  // no temporary files left
}

TEST_F(Npy, WritesTheHeaderNumpyWrites) {
    const Tensor a(DType::f32, Shape{2, 3}, true);
    attn::write_npy(path("h.npy"), a);
    std::ifstream f(path("h.npy"), std::ios::binary);
    const std::string all((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    ASSERT_GE(all.size(), 10u);
    EXPECT_EQ(all.substr(0, 8), std::string("\x93NUMPY\x01\x00", 8));
    const std::size_t hl = static_cast<unsigned char>(all[8]) | (static_cast<unsigned char>(all[9]) << 8);
    EXPECT_EQ((10 + hl) % 64, 0u);  // data starts 64-byte aligned
    EXPECT_EQ(all.size(), 10 + hl + 24);
    const std::string header = all.substr(10, hl);
    EXPECT_EQ(header.rfind("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", 0), 0u) << header;
    EXPECT_EQ(header.back(), '\n');

    attn::write_npy(path("r1.npy"), Tensor(DType::i64, Shape{4}));
    attn::write_npy(path("r0.npy"), Tensor(DType::boolean, Shape{}));
    std::ifstream f1(path("r1.npy"), std::ios::binary), f0(path("r0.npy"), std::ios::binary);
    const std::string s1((std::istreambuf_iterator<char>(f1)), std::istreambuf_iterator<char>());
    const std::string s0((std::istreambuf_iterator<char>(f0)), std::istreambuf_iterator<char>());
    EXPECT_TRUE(contains(s1, "{'descr': '<i8', 'fortran_order': False, 'shape': (4,), }")) << s1;
    EXPECT_TRUE(contains(s0, "{'descr': '|b1', 'fortran_order': False, 'shape': (), }")) << s0;
}

TEST_F(Npy, StridedViewsAreWrittenInCOrder) {
    Tensor base(DType::f64, Shape{3, 4, 5});
    for (std::int64_t n = 0; n < base.numel(); ++n) base.data_as<double>()[n] = static_cast<double>(n);
    const TensorView t = base.view().transpose(0, 2).slice(1, 1, 2);  // (5, 2, 3): [a][b][c] = base[c][b+1][a]
    attn::write_npy(path("t.npy"), t);
    const Tensor r = attn::read_npy(path("t.npy"));
    ASSERT_EQ(r.shape(), (Shape{5, 2, 3}));
    std::int64_t n = 0;
    for (std::int64_t a = 0; a < 5; ++a)
        for (std::int64_t b = 0; b < 2; ++b)
            for (std::int64_t c = 0; c < 3; ++c, ++n)
                EXPECT_EQ(r.data_as<double>()[n], static_cast<double>(c * 20 + (b + 1) * 5 + a));

    std::uint8_t one = 1;  // a broadcast view (stride 0) is written expanded
    const TensorView bc = TensorView(&one, DType::boolean, Shape{1}).broadcast_to(Shape{2, 3}, "x");
    attn::write_npy(path("b.npy"), bc);
    const Tensor rb = attn::read_npy(path("b.npy"));
    ASSERT_EQ(rb.shape(), (Shape{2, 3}));
    for (int i = 0; i < 6; ++i) EXPECT_EQ(rb.data_as<std::uint8_t>()[i], 1);
}

TEST_F(Npy, ReadsVersions2And3AndAnyKeyOrder) {
    const std::string data = float_bytes({1, 2, 3, 4, 5, 6});
    write_bytes("v2.npy", npy_bytes(dict_of("<f4", "(2, 3)"), data, 2));
    write_bytes("v3.npy", npy_bytes(dict_of("<f4", "(3, 2)"), data, 3));
    write_bytes("order.npy", npy_bytes("{\"shape\": (6,), \"fortran_order\": False, \"descr\": \"<f4\"}", data));
    write_bytes("py2.npy", npy_bytes(dict_of("<f4", "(2L, 3L)"), data));
    for (const char* name : {"v2.npy", "v3.npy", "order.npy", "py2.npy"}) {
        const Tensor t = attn::read_npy(path(name));
        EXPECT_EQ(t.numel(), 6) << name;
        for (int i = 0; i < 6; ++i) EXPECT_EQ(t.data_as<float>()[i], static_cast<float>(i + 1)) << name;
    }
    EXPECT_EQ(attn::read_npy(path("v2.npy")).shape(), (Shape{2, 3}));
}

TEST_F(Npy, BoolBytesOtherThanOneReadAsTrue) {
    write_bytes("b.npy", npy_bytes(dict_of("|b1", "(4,)"), std::string("\x00\x01\x02\xff", 4)));
    const Tensor t = attn::read_npy(path("b.npy"));
    const std::uint8_t want[4] = {0, 1, 1, 1};
    for (int i = 0; i < 4; ++i) EXPECT_EQ(t.data_as<std::uint8_t>()[i], want[i]);
}

// ---- malformed files -------------------------------------------------------------------------

TEST_F(Npy, NonexistentFile) {
    const std::string msg = read_error("missing.npy");
    EXPECT_TRUE(contains(msg, "cannot open for reading (No such file or directory)")) << msg;
}

TEST_F(Npy, DirectoryInsteadOfFile) {
    fs::create_directory(path("d.npy"));
    const std::string msg = read_error("d.npy");
    EXPECT_TRUE(contains(msg, "directory")) << msg;
}

TEST_F(Npy, BadMagic) {
    std::string bytes = npy_bytes(dict_of("<f4", "(1,)"), float_bytes({1}));
    bytes[1] = 'M';
    write_bytes("magic.npy", bytes);
    EXPECT_TRUE(contains(read_error("magic.npy"), "not a .npy file (bad magic bytes)"));
    write_bytes("text.npy", "hello, this is a text file\n");
    EXPECT_TRUE(contains(read_error("text.npy"), "not a .npy file (bad magic bytes)"));
}

TEST_F(Npy, TruncatedPreamble) {
    write_bytes("empty.npy", "");
    EXPECT_TRUE(contains(read_error("empty.npy"), "not a .npy file (only 0 bytes)"));
    write_bytes("short.npy", std::string("\x93NUMPY\x01", 7));
    EXPECT_TRUE(contains(read_error("short.npy"), "not a .npy file (only 7 bytes)"));
    write_bytes("v2short.npy", std::string("\x93NUMPY\x02\x00\x10\x00", 10));  // 2.0 needs 12 bytes
    EXPECT_TRUE(contains(read_error("v2short.npy"), "truncated .npy preamble"));
}

TEST_F(Npy, UnsupportedVersion) {
    std::string bytes = npy_bytes(dict_of("<f4", "(1,)"), float_bytes({1}));
    bytes[6] = 4;
    write_bytes("v4.npy", bytes);
    const std::string msg = read_error("v4.npy");
    EXPECT_TRUE(contains(msg, "unsupported .npy format version 4.0 (attn reads 1.0, 2.0 and 3.0)")) << msg;
}

TEST_F(Npy, HeaderLengthPastEndOfFile) {
    std::string bytes = npy_bytes(dict_of("<f4", "(1,)"), float_bytes({1}));
    bytes[8] = '\xff';
    bytes[9] = '\x7f';  // 32767-byte header in a ~70-byte file
    write_bytes("hl.npy", bytes);
    const std::string msg = read_error("hl.npy");
    EXPECT_TRUE(contains(msg, "header length 32767 runs past the end of the file (" + std::to_string(bytes.size()) + " bytes)"))
        << msg;
    // A 2.0 header length of 4 GiB − 1: must be rejected before a 4 GiB string is allocated.
    std::string v2 = npy_bytes(dict_of("<f4", "(1,)"), float_bytes({1}), 2);
    v2[8] = v2[9] = v2[10] = v2[11] = '\xff';
    write_bytes("hl2.npy", v2);
    EXPECT_TRUE(contains(read_error("hl2.npy"), "header length 4294967295 runs past the end of the file"));
}

TEST_F(Npy, MalformedDict) {
    const std::string data = float_bytes({1, 2});
    struct Bad {
        const char* dict;
        const char* expect;
    };
    const Bad cases[] = {
        {"", "malformed .npy header: expected '{'"},
        {"'descr': '<f4', 'fortran_order': False, 'shape': (2,)}", "malformed .npy header: expected '{'"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2,), ", "malformed .npy header: expected a quoted string"},
        {"{'descr': '<f4, 'fortran_order': False, 'shape': (2,)}", "malformed .npy header"},
        {"{'descr' '<f4', 'fortran_order': False, 'shape': (2,)}", "malformed .npy header: expected ':'"},
        {"{'descr': <f4, 'fortran_order': False, 'shape': (2,)}", "malformed .npy header: expected a quoted string"},
        {"{'descr': '<f4', 'fortran_order': false, 'shape': (2,)}", "expected True or False for 'fortran_order'"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': [2]}", "malformed .npy header: expected '('"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (-2,)}", "expected a non-negative integer in 'shape'"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2 1)}", "malformed .npy header: expected ')'"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2)}", "'shape' must be a tuple, and (2) is an integer"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2,,)}", "expected a non-negative integer in 'shape'"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2,)", "malformed .npy header: expected '}'"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,)}", "a dimension in 'shape' is too large"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'extra': 1}", "unexpected key 'extra' in the header"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'shape': (1,)}", "the key 'shape' appears twice in the header"},
        {"{'descr': '<f8', 'descr': '<f4', 'fortran_order': False, 'shape': (2,)}", "the key 'descr' appears twice in the header"},
        {"{'descr': '<f4', 'fortran_order': False, 'fortran_order': False, 'shape': (2,)}",
         "the key 'fortran_order' appears twice in the header"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2,)} trailing", "malformed .npy header"},
    };
    int n = 0;
    for (const Bad& c : cases) {
        const std::string name = "bad" + std::to_string(n++) + ".npy";
        write_bytes(name, npy_bytes(c.dict, data));
        const std::string msg = read_error(name);
        EXPECT_TRUE(contains(msg, c.expect)) << "dict: " << c.dict << "\nmessage: " << msg;
    }
}

TEST_F(Npy, MissingKeys) {
    const std::string data = float_bytes({1, 2});
    for (const char* dict : {"{'fortran_order': False, 'shape': (2,)}", "{'descr': '<f4', 'shape': (2,)}",
                             "{'descr': '<f4', 'fortran_order': False}", "{}"}) {
        write_bytes("m.npy", npy_bytes(dict, data));
        const std::string msg = read_error("m.npy");
        EXPECT_TRUE(contains(msg, "the header must have the keys 'descr', 'fortran_order' and 'shape'")) << dict << ": " << msg;
    }
}

// np.save of a transposed (Fortran-contiguous) array writes fortran_order True: the data is
// column-major. It is read into attn's row-major layout (it was refused).
TEST_F(Npy, FortranOrderIsReadIntoCOrder) {
    // (2, 3) column-major: a00 a10 a01 a11 a02 a12.
    write_bytes("f.npy", npy_bytes(dict_of("<f4", "(2, 3)", "True"), float_bytes({1, 4, 2, 5, 3, 6})));
    const Tensor f = attn::read_npy(path("f.npy"));
    ASSERT_EQ(f.shape(), (Shape{2, 3}));
    for (int i = 0; i < 6; ++i) EXPECT_EQ(f.data_as<float>()[i], static_cast<float>(i + 1)) << i;
    // (2, 2, 2) int64 column-major: element (i, j, k) at i + 2j + 4k holds 100i + 10j + k.
    std::string bytes;
    for (std::int64_t k = 0; k < 2; ++k)
        for (std::int64_t j = 0; j < 2; ++j)
            for (std::int64_t i = 0; i < 2; ++i) {
                const std::int64_t v = 100 * i + 10 * j + k;
                bytes.append(reinterpret_cast<const char*>(&v), sizeof v);
            }
    write_bytes("g.npy", npy_bytes(dict_of("<i8", "(2, 2, 2)", "True"), bytes));
    const Tensor g = attn::read_npy(path("g.npy"));
    ASSERT_EQ(g.shape(), (Shape{2, 2, 2}));
    for (std::int64_t i = 0; i < 2; ++i)
        for (std::int64_t j = 0; j < 2; ++j)
            for (std::int64_t k = 0; k < 2; ++k) EXPECT_EQ(g.data_as<std::int64_t>()[4 * i + 2 * j + k], 100 * i + 10 * j + k);
    // The size check still comes first.
    write_bytes("h.npy", npy_bytes(dict_of("<f4", "(2, 3)", "True"), float_bytes({1, 2})));
    EXPECT_TRUE(contains(read_error("h.npy"), "needs 24 bytes of data but the file holds 8")) << read_error("h.npy");
}

// A Fortran-order array with no element but huge other dims reads as that empty shape at once: the
// reorder walked every index of the dims before the zero one (5·10^17 for (5, 10^17, 0): it
// did not end in 20 s — fuzz_npy's timeout, kept as fuzz/corpus/fuzz_npy/regress-fortran-zero-huge-shape.npy).
TEST_F(Npy, FortranOrderWithNoElementAndHugeDims) {
    write_bytes("z.npy", npy_bytes(dict_of("<f4", "(5, 100000000000000000, 0)", "True"), ""));
    const Tensor z = attn::read_npy(path("z.npy"));
    EXPECT_EQ(z.shape(), (Shape{5, 100000000000000000, 0}));
    EXPECT_EQ(z.numel(), 0);
}

TEST_F(Npy, UnsupportedDtypes) {
    for (const char* d : {">f4", "<u2", "<c8", "<f16", "|u1", "<U3", "|O", "<M8[ns]"}) {
        write_bytes("d.npy", npy_bytes(dict_of(d, "(2,)"), std::string(64, '\0')));
        const std::string msg = read_error("d.npy");
        EXPECT_TRUE(contains(msg, std::string("unsupported dtype '") + d + "'")) << msg;
        EXPECT_TRUE(contains(msg, "little-endian float32, float64, float16, bool, int32 and int64")) << msg;
    }
}

// A structured dtype's descr is a list of fields, as np.save writes it: refused for its dtype. It
// was "malformed .npy header: expected a quoted string at byte 10", as if the file were broken.
TEST_F(Npy, StructuredDtypeIsAnUnsupportedDtype) {
    for (const char* d : {"[('a', '<f4'), ('b', '<i4')]", "[('a', '<f4', (2,)), ('b', [('c', '|u1')])]"}) {
        write_bytes("s.npy", npy_bytes(std::string("{'descr': ") + d + ", 'fortran_order': False, 'shape': (2,), }",
                                       std::string(64, '\0')));
        const std::string msg = read_error("s.npy");
        std::string shown;  // the descr quoted: its own quotes escaped (docs/errors.md, "Quoting")
        for (const char* c = d; *c != '\0'; ++c) shown += *c == '\'' ? std::string("\\'") : std::string(1, *c);
        EXPECT_TRUE(contains(msg, "unsupported dtype '" + shown + "' (a structured dtype, with named fields; " +
                                      "attn reads little-endian float32")) << msg;
    }
    write_bytes("u.npy", npy_bytes("{'descr': [('a', '<f4'), 'fortran_order': False, 'shape': (2,), }", std::string(64, '\0')));
    EXPECT_TRUE(contains(read_error("u.npy"), "malformed .npy header")) << read_error("u.npy");
}

// Header text in a message is quoted with its control bytes escaped: an escape sequence, a
// newline or a NUL in 'descr' printed the message over two lines, coloured the terminal or cut
// it at the NUL (an exploratory test found it).
TEST_F(Npy, HeaderTextInMessagesIsEscaped) {
    const std::string descr = std::string("\x1b[31mRED\nsecond") + '\0' + "tail";
    const std::string dict = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': (2,), }";
    write_bytes("e.npy", npy_bytes(dict, std::string(64, '\0')));
    const std::string msg = read_error("e.npy");
    EXPECT_TRUE(contains(msg, "unsupported dtype '\\x1b[31mRED\\x0asecond\\x00tail' (attn reads")) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\x1b'), std::string::npos) << msg;
    const std::string keyed = "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'a\rb': 1}";
    write_bytes("k.npy", npy_bytes(keyed, float_bytes({1, 2})));
    EXPECT_TRUE(contains(read_error("k.npy"), "unexpected key 'a\\x0db' in the header")) << read_error("k.npy");
    // Bytes that are not well-formed UTF-8 are escaped (a raw 0x9B is CSI on some terminals; an
    // overlong '/' and a lone continuation byte), well-formed non-ASCII text is kept.
    const std::string raw = "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'a\x9b[31m\xc0\xaf\xc3\xa9\xa9': 1}";
    write_bytes("raw.npy", npy_bytes(raw, float_bytes({1, 2})));
    EXPECT_TRUE(contains(read_error("raw.npy"), "unexpected key 'a\\x9b[31m\\xc0\\xaf\xc3\xa9\\xa9' in the header"))
        << read_error("raw.npy");
}

TEST_F(Npy, RankAboveFour) {
    write_bytes("r5.npy", npy_bytes(dict_of("<f4", "(1, 1, 1, 1, 2)"), float_bytes({1, 2})));
    EXPECT_TRUE(contains(read_error("r5.npy"), "rank 5 is more than attn's maximum of 4"));
}

TEST_F(Npy, ShapeClaimsMoreBytesThanTheFileHolds) {
    write_bytes("short.npy", npy_bytes(dict_of("<f4", "(2, 3)"), float_bytes({1, 2, 3, 4, 5})));
    std::string msg = read_error("short.npy");
    EXPECT_TRUE(contains(msg, "shape (2, 3) of float32 needs 24 bytes of data but the file holds 20")) << msg;

    // 2^40 float64 elements (8 TiB): an attn::Error about the file, not an allocation attempt.
    write_bytes("huge.npy", npy_bytes(dict_of("<f8", "(1048576, 1048576)"), float_bytes({1, 2})));
    msg = read_error("huge.npy");
    EXPECT_TRUE(contains(msg, "needs 8796093022208 bytes of data but the file holds 8")) << msg;

    // A byte count that overflows 64 bits (and an element count that overflows int64).
    write_bytes("ovf.npy", npy_bytes(dict_of("<f4", "(4294967296, 4294967296, 16)"), float_bytes({1})));
    msg = read_error("ovf.npy");
    EXPECT_TRUE(contains(msg, "shape (4294967296, 4294967296, 16) with 4-byte elements needs more bytes than a 64-bit "
                              "size can count (4294967296 × 4294967296 × 16 × 4 > 9223372036854775807)")) << msg;
    write_bytes("ovf2.npy", npy_bytes(dict_of("<i8", "(9223372036854775807, 3)"), ""));
    EXPECT_TRUE(contains(read_error("ovf2.npy"), "more bytes than a 64-bit size can count"));
}

TEST_F(Npy, TrailingBytes) {
    write_bytes("t.npy", npy_bytes(dict_of("<f4", "(2,)"), float_bytes({1, 2, 3})));
    const std::string msg = read_error("t.npy");
    EXPECT_TRUE(contains(msg, "shape (2,) of float32 needs 8 bytes of data but the file holds 12")) << msg;
}

// ---- atomic writes ---------------------------------------------------------------------------

TEST_F(Npy, OutputIntoANonexistentDirectoryLeavesNothing) {
    const Tensor a(DType::f32, Shape{3}, true);
    const std::string p = path("no/such/dir/a.npy");
    try {
        attn::write_npy(p, a);
        ADD_FAILURE() << "expected attn::Error";
    } catch (const attn::Error& e) {
        EXPECT_EQ(std::string(e.what()).rfind("'" + p + "': cannot create output file (No such file or directory)", 0), 0u) << e.what();
    }
    EXPECT_TRUE(listing().empty());
}

TEST_F(Npy, ATensorWithoutDataIsAnErrorAndLeavesNothing) {
    const std::string p = path("none.npy");
    try {
        attn::write_npy(p, attn::TensorView());  // e.g. MhaOutput::weights without need_weights
        ADD_FAILURE() << "no error";
    } catch (const attn::Error& e) {
        EXPECT_NE(std::string(e.what()).find("write_npy: tensor: data pointer is null"), std::string::npos) << e.what();
    }
    EXPECT_TRUE(listing().empty());
}

TEST_F(Npy, UnwritableDtypeLeavesNothing) {
    const Tensor a(DType::bf16, Shape{3}, true);
    EXPECT_THROW(attn::write_npy(path("bf.npy"), a), attn::Error);
    EXPECT_TRUE(listing().empty());
}

TEST_F(Npy, OverwritesAtomicallyWithUsualPermissions) {
    write_bytes("o.npy", "old contents");
    Tensor a(DType::i32, Shape{2});
    a.data_as<std::int32_t>()[0] = 7;
    a.data_as<std::int32_t>()[1] = -7;
    attn::write_npy(path("o.npy"), a);
    const Tensor r = attn::read_npy(path("o.npy"));
    EXPECT_EQ(r.data_as<std::int32_t>()[1], -7);
    struct stat st {};
    ASSERT_EQ(::stat(path("o.npy").c_str(), &st), 0);
    const mode_t mask = ::umask(0);
    ::umask(mask);
    EXPECT_EQ(st.st_mode & 0777, 0666 & ~mask);
    EXPECT_EQ(listing(), std::vector<std::string>{"o.npy"});
}

TEST_F(Npy, WritingOverADirectoryFailsAndLeavesNoTemporary) {
    fs::create_directory(path("d.npy"));
    EXPECT_THROW(attn::write_npy(path("d.npy"), Tensor(DType::f32, Shape{2}, true)), attn::Error);
    EXPECT_EQ(listing(), std::vector<std::string>{"d.npy"});
    EXPECT_TRUE(fs::is_directory(path("d.npy")));
}

TEST_F(Npy, WritingOnAKernelPseudoFileSystemIsRefusedNamingIt) {
    // sysfs takes no file a program creates (root included: access() calls it writable); the
    // refusal names the file system, as /proc's always did, instead of a failed creation.
    const std::string target = "/sys/kernel/attn-unit-test.npy";
    if (!fs::is_directory("/sys/kernel")) GTEST_SKIP() << "skipped: /sys is not mounted here";
    try {
        attn::write_npy(target, Tensor(DType::f32, Shape{2}, true));
        FAIL() << "written on sysfs";
    } catch (const attn::Error& e) {
        EXPECT_NE(std::string(e.what()).find("'" + target + "' is on sysfs ('/sys/kernel/'), a kernel pseudo file system"),
                  std::string::npos)
            << e.what();
    }
    EXPECT_FALSE(fs::exists(target));
}

TEST_F(Npy, AReservedFileMustBeFilledExactly) {
    // fallocate sets the file's size: a writer that wrote less than it reserved would publish
    // zeros at the end. Refused, and nothing is left behind.
    if (!fallocate_works()) GTEST_SKIP() << "the temporary directory's file system has no fallocate";
    attn::detail::AtomicFile f(path("short.bin"));
    f.reserve(16);
    f.write("0123456789", 10);
    try {
        f.commit();
        ADD_FAILURE() << "no error";
    } catch (const attn::Error& e) {
        EXPECT_TRUE(contains(e.what(), "short.bin': internal error: 10 bytes written into a file reserved for 16")) << e.what();
    }
    EXPECT_TRUE(listing().empty());
}

TEST_F(Npy, AFailingWriteLeavesNoTemporaryFile) {
    // Limit this process's file size to 4 KiB (EFBIG instead of SIGXFSZ) and write 1 MiB.
    struct rlimit old {};
    ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
    void (*old_handler)(int) = std::signal(SIGXFSZ, SIG_IGN);
    struct rlimit lim = old;
    lim.rlim_cur = 4096;
    ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &lim), 0);
    const Tensor big(DType::f32, Shape{512, 512}, true);
    std::string msg;
    try {
        attn::write_npy(path("big.npy"), big);
    } catch (const attn::Error& e) {
        msg = e.what();
    }
    ::setrlimit(RLIMIT_FSIZE, &old);
    std::signal(SIGXFSZ, old_handler);
    // Refused before the first byte where the file system has fallocate: it is asked for the
    // whole size at once (AtomicFile::reserve; 128 header bytes + 1 MiB). Elsewhere a write fails.
    const std::string expected = fallocate_works() ? ": write failed: the file needs 1048704 bytes, more than the file system takes (File too large)"
                                                   : ": write failed";
    EXPECT_TRUE(contains(msg, "'" + path("big.npy") + "'" + expected)) << "message: " << msg;
    EXPECT_TRUE(listing().empty());

    // And a pre-existing file of that name survives a failed overwrite unchanged.
    write_bytes("big.npy", "keep me");
    ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &lim), 0);
    std::signal(SIGXFSZ, SIG_IGN);
    EXPECT_THROW(attn::write_npy(path("big.npy"), big), attn::Error);
    ::setrlimit(RLIMIT_FSIZE, &old);
    std::signal(SIGXFSZ, old_handler);
    EXPECT_EQ(listing(), std::vector<std::string>{"big.npy"});
    EXPECT_EQ(fs::file_size(path("big.npy")), 7u);
}

}  // namespace
