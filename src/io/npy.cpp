#include "attn/npy.hpp"


#include <array>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string_view>
#include <vector>

#include "../core/check.hpp"
#include "../core/checked_size.hpp"
#include "attn/error.hpp"
#include "atomic_file.hpp"
#include "input_file.hpp"
#include "tensor_writers.hpp"

namespace attn {
namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr std::size_t kMagicLen = 6;

struct Header {
    std::string descr;
    bool fortran = false;
    bool has_descr = false, has_fortran = false, has_shape = false;
    std::vector<std::int64_t> shape;
};

// A strict parser for the Python dict literal numpy writes:
//   {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
class DictParser {
public:
    DictParser(std::string_view text, const std::string& file) : s_(text), file_(file) {}

    Header parse() {
        Header h;
        skip_ws();
        expect('{');
        for (;;) {
            skip_ws();
            if (peek() == '}') { ++i_; break; }
            const std::string key = parse_string();
            skip_ws();
            expect(':');
            skip_ws();
            // A key given twice is ambiguous (Python's dict keeps the last, a reader that stops at
            // the first would see another array): refused, as a file that is not numpy's.
            if ((key == "descr" && h.has_descr) || (key == "fortran_order" && h.has_fortran) ||
                (key == "shape" && h.has_shape))
                fail("the key " + detail::quoted(key) + " appears twice in the header");
            if (key == "descr") {
                h.descr = peek() == '[' ? parse_field_list() : parse_string();
                h.has_descr = true;
            } else if (key == "fortran_order") {
                h.fortran = parse_bool();
                h.has_fortran = true;
            } else if (key == "shape") {
                h.shape = parse_tuple();
                h.has_shape = true;
            } else {
                fail("unexpected key " + detail::quoted(key) + " in the header");
            }
            skip_ws();
            if (peek() == ',') { ++i_; continue; }
            skip_ws();
            expect('}');
            break;
        }
        // numpy pads the dict with spaces and a final '\n'; anything else after it is not a header.
        skip_ws();
        if (i_ != s_.size()) fail("unexpected text after the closing '}' at byte " + std::to_string(i_));
        if (!h.has_descr || !h.has_fortran || !h.has_shape) {
            fail("the header must have the keys 'descr', 'fortran_order' and 'shape'");
        }
        return h;
    }

private:
    [[noreturn]] void fail(const std::string& what) const { throw Error(file_ + ": malformed .npy header: " + what); }
    char peek() const { return i_ < s_.size() ? s_[i_] : '\0'; }
    void skip_ws() { while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n')) ++i_; }
    void expect(char c) {
        if (peek() != c) fail(std::string("expected '") + c + "' at byte " + std::to_string(i_));
        ++i_;
    }
    std::string parse_string() {
        const char q = peek();
        if (q != '\'' && q != '"') fail("expected a quoted string at byte " + std::to_string(i_));
        ++i_;
        const std::size_t end = s_.find(q, i_);
        if (end == std::string_view::npos) fail("unterminated string");
        std::string out(s_.substr(i_, end - i_));
        i_ = end + 1;
        return out;
    }
    // A structured dtype's descr is a list of fields, [('a', '<f4'), ('b', '<i4')]: its text, kept
    // whole, so that the file is refused for its dtype (dtype_from_descr) rather than as malformed.
    std::string parse_field_list() {
        const std::size_t begin = i_;
        int depth = 0;
        do {
            const char c = peek();
            if (c == '\'' || c == '"') {
                parse_string();
                continue;
            }
            if (c == '\0') fail("unterminated list in 'descr'");
            depth += c == '[' || c == '(' ? 1 : c == ']' || c == ')' ? -1 : 0;
            ++i_;
        } while (depth > 0);
        return std::string(s_.substr(begin, i_ - begin));
    }
    bool parse_bool() {
        if (s_.substr(i_, 4) == "True") { i_ += 4; return true; }
        if (s_.substr(i_, 5) == "False") { i_ += 5; return false; }
        fail("expected True or False for 'fortran_order'");
    }
    std::vector<std::int64_t> parse_tuple() {
        std::vector<std::int64_t> dims;
        expect('(');
        for (;;) {
            skip_ws();
            if (peek() == ')') { ++i_; break; }
            if (peek() < '0' || peek() > '9') fail("expected a non-negative integer in 'shape'");
            std::int64_t v = 0;
            while (peek() >= '0' && peek() <= '9') {
                const int digit = peek() - '0';
                if (v > (std::numeric_limits<std::int64_t>::max() - digit) / 10) fail("a dimension in 'shape' is too large");
                v = v * 10 + digit;
                ++i_;
            }
            while (peek() == 'L') ++i_;  // Python 2 longs
            dims.push_back(v);
            skip_ws();
            if (peek() == ',') { ++i_; continue; }
            skip_ws();
            expect(')');
            // Python reads "(4)" as the integer 4, and numpy refuses it; a 1-d shape is "(4,)".
            if (dims.size() == 1) fail("'shape' must be a tuple, and (" + std::to_string(v) + ") is an integer: a 1-d shape is (" + std::to_string(v) + ",)");
            break;
        }
        return dims;
    }

    std::string_view s_;
    std::size_t i_ = 0;
    const std::string& file_;
};

DType dtype_from_descr(const std::string& d, const std::string& file) {
    if (d == "<f4") return DType::f32;
    if (d == "<f8") return DType::f64;
    if (d == "<f2") return DType::f16;
    if (d == "|b1" || d == "<b1" || d == "b1") return DType::boolean;
    if (d == "<i4") return DType::i32;
    if (d == "<i8") return DType::i64;
    const bool structured = !d.empty() && d[0] == '[';
    throw Error(file + ": unsupported dtype " + detail::quoted(d) + (structured ? " (a structured dtype, with named fields; " : " (") +
                "attn reads little-endian float32, float64, float16, bool, int32 and int64)");
}

std::string descr_of(DType t) {
    if (!npy_holds(t)) throw Error("write_npy: dtype " + std::string(dtype_name(t)) + " has no .npy representation", ErrorKind::type);
    switch (t) {
        case DType::f32: return "<f4";
        case DType::f64: return "<f8";
        case DType::f16: return "<f2";
        case DType::boolean: return "|b1";
        case DType::i32: return "<i4";
        case DType::i64: return "<i8";
        case DType::bf16: break;  // !npy_holds
    }
    return {};
}

// numpy's fortran_order (np.save of a transposed or Fortran-contiguous array) stores element
// (i0, …, i_{n−1}) at Σ i_k·Π_{m<k} d_m; attn's tensors are row-major: one copy, byte for byte.
Tensor from_fortran_order(const Tensor& column_major, const std::string& name) {
    const Shape& shape = column_major.shape();
    Strides strides{};
    std::int64_t step = 1;
    for (int d = 0; d < shape.rank; ++d) {
        strides[static_cast<std::size_t>(d)] = step;
        step *= shape[d];
    }
    const TensorView in(column_major.data(), column_major.dtype(), shape, strides);
    Tensor out(column_major.dtype(), shape, false, name);
    // No element, nothing to copy — and the loops below would walk the other dims in full:
    // (5, 10^17, 0) has 5·10^17 empty rows (fuzz_npy's timeout).
    if (out.numel() == 0) return out;
    std::array<std::int64_t, kMaxRank> n{1, 1, 1, 1};
    for (int d = 0; d < shape.rank; ++d) n[static_cast<std::size_t>(d)] = shape[d];
    const std::size_t item = dtype_size(in.dtype());
    const auto* from = static_cast<const char*>(in.data());
    auto* to = static_cast<char*>(out.data());
    for (std::int64_t a = 0; a < n[0]; ++a)
        for (std::int64_t b = 0; b < n[1]; ++b)
            for (std::int64_t c = 0; c < n[2]; ++c)
                for (std::int64_t d = 0; d < n[3]; ++d, to += item)
                    std::memcpy(to, from + in.offset(a, b, c, d) * static_cast<std::int64_t>(item), item);
    return out;
}

}  // namespace

Tensor read_npy(const std::string& path) {
    // Only regular files are .npy files: the open refuses FIFOs, devices and directories
    // (a FIFO would block, /dev/zero never ends, and neither has a size to check against).
    const detail::InputFile f(path);
    const std::string name = detail::quoted_path(path);  // every message names the file so
    const auto file_size = static_cast<std::int64_t>(f.size());
    if (file_size < 10) throw Error(name + ": not a .npy file (only " + std::to_string(file_size) + " bytes)");

    char pre[12] = {};
    f.read_at(0, pre, 10);
    if (std::memcmp(pre, kMagic, kMagicLen) != 0) throw Error(name + ": not a .npy file (bad magic bytes)");
    const int major = static_cast<unsigned char>(pre[6]);
    std::uint64_t header_len = 0;
    std::int64_t prelude = 0;
    if (major == 1) {
        header_len = static_cast<unsigned char>(pre[8]) | (static_cast<std::uint64_t>(static_cast<unsigned char>(pre[9])) << 8);
        prelude = 10;
    } else if (major == 2 || major == 3) {
        if (file_size < 12) throw Error(name + ": truncated .npy preamble");
        f.read_at(10, pre + 10, 2);
        for (int i = 0; i < 4; ++i) header_len |= static_cast<std::uint64_t>(static_cast<unsigned char>(pre[8 + i])) << (8 * i);
        prelude = 12;
    } else {
        throw Error(name + ": unsupported .npy format version " + std::to_string(major) + "." +
                    std::to_string(static_cast<unsigned char>(pre[7])) + " (attn reads 1.0, 2.0 and 3.0)");
    }
    if (header_len > static_cast<std::uint64_t>(file_size - prelude)) {
        throw Error(name + ": header length " + std::to_string(header_len) + " runs past the end of the file (" +
                    std::to_string(file_size) + " bytes)");
    }
    std::string text(header_len, '\0');
    f.read_at(static_cast<std::uint64_t>(prelude), text.data(), header_len);
    const Header h = DictParser(text, name).parse();

    const DType dtype = dtype_from_descr(h.descr, name);
    if (h.shape.size() > static_cast<std::size_t>(kMaxRank)) {
        throw Error(name + ": rank " + std::to_string(h.shape.size()) + " is more than attn's maximum of 4");
    }
    // Count the bytes the shape claims (checked: a zero-size shape like (0, 10^12, 10^14) is
    // refused too, its strides would overflow), then compare with the file.
    const std::uint64_t available = static_cast<std::uint64_t>(file_size - prelude) - header_len;
    Shape shape;
    shape.rank = static_cast<int>(h.shape.size());
    for (std::size_t i = 0; i < h.shape.size(); ++i) shape.dims[i] = h.shape[i];
    const auto need = static_cast<std::uint64_t>(detail::checked_bytes(name, "the array", shape, dtype_size(dtype)));
    if (need != available) {
        throw Error(name + ": shape " + shape.str() + " of " + std::string(dtype_name(dtype)) + " needs " +
                    std::to_string(need) + " bytes of data but the file holds " + std::to_string(available));
    }
    Tensor t(dtype, shape, false, name);
    f.read_at(static_cast<std::uint64_t>(prelude) + header_len, t.data(), need);
    if (dtype == DType::boolean) {  // numpy accepts any non-zero byte as True
        auto* p = static_cast<unsigned char*>(t.data());
        for (std::uint64_t i = 0; i < need; ++i) p[i] = p[i] != 0;
    }
    if (h.fortran && shape.rank > 1) return from_fortran_order(t, name);
    return t;
}

namespace detail {

void write_npy_into(AtomicFile& out, const TensorView& t) {
    require_data("write_npy", t, "tensor");
    const std::string descr = descr_of(t.dtype());
    std::string dict = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': (";
    for (int i = 0; i < t.rank(); ++i) dict += std::to_string(t.dim(i)) + (t.rank() == 1 || i + 1 < t.rank() ? "," : "") + (i + 1 < t.rank() ? " " : "");
    dict += "), }";
    // Pad with spaces so that magic + lengths + header is a multiple of 64, ending in '\n'.
    const bool v1 = dict.size() + 1 + 10 < 65536;
    const std::size_t prelude = v1 ? 10 : 12;
    std::size_t total = prelude + dict.size() + 1;
    dict.append((64 - total % 64) % 64, ' ');
    dict += '\n';

    std::string head(kMagic, kMagicLen);
    head += static_cast<char>(v1 ? 1 : 2);
    head += '\0';
    const std::uint32_t hl = static_cast<std::uint32_t>(dict.size());
    for (std::size_t i = 0; i < (v1 ? 2u : 4u); ++i) head += static_cast<char>((hl >> (8 * i)) & 0xffu);
    head += dict;

    // A view's elements are checked against its memory, not its file size: a broadcast view
    // (stride 0) can stand for more bytes than a file can hold.
    const std::int64_t data_bytes = checked_mul(detail::quoted_path(out.path()), "the data", t.numel(), static_cast<std::int64_t>(dtype_size(t.dtype())));
    out.reserve(checked_add(detail::quoted_path(out.path()), "the file", static_cast<std::int64_t>(head.size()), data_bytes));
    out.write(head.data(), head.size());
    write_elements_into(out, t);
}

void write_elements_into(AtomicFile& out, const TensorView& t) {
    // Contiguous data goes out in one piece; a strided view element by element.
    const std::size_t es = dtype_size(t.dtype());
    if (t.is_contiguous()) {
        out.write(t.data(), static_cast<std::size_t>(t.numel()) * es);
    } else {
        std::array<std::int64_t, kMaxRank> n{1, 1, 1, 1};
        for (int i = 0; i < t.rank(); ++i) n[static_cast<std::size_t>(i)] = t.dim(i);
        const auto* base = static_cast<const char*>(t.data());
        for (std::int64_t a = 0; a < n[0]; ++a)
            for (std::int64_t b = 0; b < n[1]; ++b)
                for (std::int64_t c = 0; c < n[2]; ++c)
                    for (std::int64_t d = 0; d < n[3]; ++d)
                        out.write(base + t.offset(a, b, c, d) * static_cast<std::int64_t>(es), es);
    }
}

}  // namespace detail

void write_npy(const std::string& path, const TensorView& t) {
    detail::require_data("write_npy", t, "tensor");  // before the staging file exists
    detail::AtomicFile out(path);
    detail::write_npy_into(out, t);
    out.commit();
}

}  // namespace attn
