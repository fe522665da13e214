#include "check.hpp"

#include <algorithm>
#include <array>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <limits>
#include <memory>
#include <new>
#include <numeric>
#include <string>
#include <vector>

#include "allocate.hpp"
#include "utf8.hpp"

namespace attn::detail {

bool is_empty(const TensorView& t) {
    for (int d = 0; d < t.rank(); ++d)
        if (t.dim(d) == 0) return true;
    return false;
}

namespace {

// |s|·n, or INT64_MAX when it does not fit (a reach that large only has to compare as large).
std::int64_t size_mul_or_max(std::int64_t s, std::int64_t n) {
    std::int64_t r = 0;
    return __builtin_mul_overflow(s, n, &r) ? std::numeric_limits<std::int64_t>::max() : r;
}

}  // namespace

std::string strides_text(const TensorView& t) {
    std::string s = "(";
    for (int d = 0; d < t.rank(); ++d) s += (d ? ", " : "") + std::to_string(t.stride(d));
    return s + (t.rank() == 1 ? ",)" : ")");
}

void require_rank(std::string_view op, const TensorView& t, std::string_view name, int rank, std::string_view layout,
                  NullData null_data) {
    if (null_data == NullData::allowed_if_empty) require_data(op, t, name);
    else if (t.data() == nullptr) fail(op, name, ": data pointer is null");
    if (t.rank() != rank) {
        fail(op, name, ": expected a rank-", rank, " tensor ", layout, " but got shape ", t.shape());
    }
}

void require_shape(std::string_view op, const TensorView& t, std::string_view name, const Shape& expected,
                   std::string_view layout) {
    if (!(t.shape() == expected)) fail(op, name, ": expected shape ", layout, " = ", expected, " but got ", t.shape());
}

void require_element_aligned(std::string_view op, const TensorView& t, std::string_view name) {
    const std::size_t size = dtype_size(t.dtype());
    if (reinterpret_cast<std::uintptr_t>(t.data()) % size != 0) {
        fail(op, name, ": data pointer ", t.data(), " is not a multiple of its ", size, "-byte ", dtype_name(t.dtype()),
             " elements (misaligned)");
    }
}

void require_f32_or_f64(std::string_view op, const TensorView& t, std::string_view name) {
    if (t.dtype() != DType::f32 && t.dtype() != DType::f64) {
        fail_type(op, name, ": dtype must be float32 or float64 but got ", dtype_name(t.dtype()));
    }
    require_element_aligned(op, t, name);
}

void require_floating(std::string_view op, const TensorView& t, std::string_view name) {
    if (!is_floating(t.dtype())) {
        fail_type(op, name, ": dtype must be float32, float64, float16 or bfloat16 but got ", dtype_name(t.dtype()));
    }
    require_element_aligned(op, t, name);
}

std::string missing_data(const TensorView& t) {
    if (t.data() != nullptr || is_empty(t)) return "";
    // "shape () has elements" alone puzzles: rank 0 is what a default view or Tensor has.
    return std::string("data pointer is null") +
           (t.rank() == 0 ? " (a default TensorView, or a Tensor that holds nothing)" : "") + " but its shape " +
           t.shape().str() + " has elements";
}

void require_data(std::string_view op, const TensorView& t, std::string_view name) {
    if (const std::string problem = missing_data(t); !problem.empty()) fail(op, name, ": ", problem);
}

void require_gradient_like(std::string_view op, const TensorView& t, std::string_view name, const Shape& expected,
                           std::string_view like) {
    if (t.data() == nullptr) fail(op, name, ": data pointer is null");
    require_floating(op, t, name);
    if (!(t.shape() == expected)) fail(op, name, ": expected the shape of ", like, " ", expected, " but got ", t.shape());
}

void require_distinct_elements(std::string_view op, const TensorView& t, std::string_view name) {
    if (is_empty(t)) return;  // no element to land anywhere
    for (int d = 0; d < t.rank(); ++d) {
        if (t.dim(d) > 1 && t.stride(d) == 0) {
            fail(op, name, ": dimension ", d, " has stride 0 but size ", t.dim(d),
                 "; an output cannot be a broadcast view");
        }
    }
    // Nonzero strides can overlap too ((2, 4, 3) with strides (1, 1, 1)). Sufficient for distinct
    // addresses: with the dims of size > 1 in increasing |stride|, each stride passes the reach of
    // the ones below it — every layout a program makes (contiguous, transposed, sliced): no
    // allocation, O(rank). Otherwise the elements span reach + 1 addresses: more elements than
    // that must collide (refused at once); fewer are marked in a bitmap of the span, one bit per
    // address, stopping at the first collision — O(elements), memory 1/32 of what a float32
    // output there covers — so an unusual but distinct interleaving is still accepted.
    std::array<int, kMaxRank> order{};
    int n = 0;
    for (int d = 0; d < t.rank(); ++d)
        if (t.dim(d) > 1) order[static_cast<std::size_t>(n++)] = d;
    // |stride|, INT64_MIN's as INT64_MAX (std::abs of it is undefined; either is past any memory).
    const auto abs_stride = [&](int d) {
        return t.stride(d) == std::numeric_limits<std::int64_t>::min() ? std::numeric_limits<std::int64_t>::max()
                                                                         : std::abs(t.stride(d));
    };
    // Insertion sort of at most kMaxRank dims (std::sort here drew a false -Warray-bounds from g++ 12).
    const auto stride_at = [&](int i) { return abs_stride(order[static_cast<std::size_t>(i)]); };
    for (int i = 1; i < n; ++i)
        for (int j = i; j > 0 && stride_at(j) < stride_at(j - 1); --j)
            std::swap(order[static_cast<std::size_t>(j)], order[static_cast<std::size_t>(j - 1)]);
    constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
    bool nested = true;
    std::int64_t reach = 0;  // Σ |stride|·(dim − 1) of the dims so far: the span of their offsets
    std::int64_t count = 1;  // their elements (saturating)
    for (int i = 0; i < n; ++i) {
        const int d = order[static_cast<std::size_t>(i)];
        const std::int64_t s = abs_stride(d);
        nested = nested && s > reach;
        const auto span = size_mul_or_max(s, t.dim(d) - 1);
        reach = span > kMax - reach ? kMax : reach + span;
        count = size_mul_or_max(count, t.dim(d));
    }
    // Every element is written, so every one is memory the caller holds: a byte span past 2^63
    // is not, and its byte offsets (element offset × size, in 64 bits) would wrap onto other
    // elements (a stride of 2^62 floats put row 1 on row 0's bytes).
    const auto size = static_cast<std::int64_t>(dtype_size(t.dtype()));
    if (reach > kMax / size - 1) {
        fail(op, name, ": strides ", strides_text(t), " for shape ", t.shape(), " span more than 2^63 bytes of ",
             dtype_name(t.dtype()), "; an output must be memory the caller holds");
    }
    if (nested) return;
    const auto overlap = [&] {
        fail(op, name, ": strides ", strides_text(t), " for shape ", t.shape(),
             " put two elements at one address; an output needs its own memory for every element");
    };
    if (count - 1 > reach) overlap();  // more elements than the reach + 1 addresses they span
    // The lowest offset: negative strides reach below the view's origin.
    std::int64_t base = 0;
    for (int d = 0; d < t.rank(); ++d)
        if (t.stride(d) < 0) base += t.stride(d) * (t.dim(d) - 1);
    // reach + 1 addresses lie between the output's lowest and highest element, memory the caller
    // holds: the bitmap is one bit per address of it. (An absurd view is OutOfMemory here.)
    const auto words = static_cast<std::size_t>(reach / 64 + 1);
    std::unique_ptr<std::uint64_t[]> seen(new (std::nothrow) std::uint64_t[words]());
    if (seen == nullptr) throw_out_of_memory(static_cast<std::int64_t>(words * 8), "the output overlap check's bitmap");
    std::array<std::int64_t, kMaxRank> idx{};
    for (std::int64_t e = 0; e < count; ++e) {
        std::int64_t off = -base;
        for (int d = 0; d < t.rank(); ++d) off += idx[static_cast<std::size_t>(d)] * t.stride(d);
        const std::uint64_t bit = std::uint64_t{1} << (off % 64);
        std::uint64_t& word = seen[static_cast<std::size_t>(off / 64)];
        if (word & bit) overlap();
        word |= bit;
        for (int d = t.rank() - 1; d >= 0; --d) {
            if (++idx[static_cast<std::size_t>(d)] < t.dim(d)) break;
            idx[static_cast<std::size_t>(d)] = 0;
        }
    }
}

void require_apart(std::string_view op, const std::vector<Named>& inputs, const std::vector<Named>& outputs) {
    for (auto o = outputs.begin(); o != outputs.end(); ++o) {
        if (o->t == nullptr) continue;
        for (const Named& i : inputs)
            if (i.t != nullptr) require_disjoint(op, *o->t, o->name, *i.t, i.name);
        for (auto p = outputs.begin(); p != o; ++p)
            if (p->t != nullptr && share_memory(*p->t, *o->t))
                fail(op, p->name, ": must not share memory with ", o->name, " (both are outputs: one would overwrite the other)");
    }
}

void require_gradient_outputs(std::string_view op, const std::vector<Named>& inputs,
                              const std::vector<Named>& gradients, const TensorView* dsinks,
                              const TensorView* sinks, std::int64_t Hq) {
    for (const Named& g : gradients) require_distinct_elements(op, *g.t, g.name);
    require_apart(op, inputs, gradients);
    if (dsinks == nullptr) return;
    if (sinks == nullptr) fail(op, "dsinks: given but options.sinks is not set (no sink to differentiate)");
    require_rank(op, *dsinks, "dsinks", 1, "(Hq,)");
    require_f32_or_f64(op, *dsinks, "dsinks");
    require_shape(op, *dsinks, "dsinks", Shape{Hq}, "(Hq,)");
    require_distinct_elements(op, *dsinks, "dsinks");
    std::vector<Named> others = inputs;
    others.insert(others.end(), gradients.begin(), gradients.end());
    others.push_back({sinks, "sinks"});
    require_apart(op, others, {{dsinks, "dsinks"}});
}

void require_query_fits_cache(std::string_view op, const TensorView& q, std::int64_t kv_heads, std::int64_t head_dim) {
    if (q.dim(3) != head_dim) fail(op, "Q: head dim ", q.dim(3), " does not match the cache's head_dim ", head_dim);
    if (q.dim(1) < 1) fail(op, "Q: heads must be >= 1 but got ", q.dim(1));  // 0 is a multiple of anything
    if (q.dim(1) % kv_heads != 0) {
        fail(op, "Q: heads ", q.dim(1), " must be a multiple of the cache's kv_heads ", kv_heads,
             " (grouped-query attention)");
    }
}

TensorView require_per_sequence(std::string_view op, const TensorView& t, std::string_view name, std::int64_t B,
                                std::string_view count) {
    if (t.data() == nullptr) fail(op, name, ": data pointer is null");
    if (t.dtype() != DType::i32 && t.dtype() != DType::i64) {
        fail_type(op, name, ": dtype must be int32 or int64 but got ", dtype_name(t.dtype()));
    }
    if (t.rank() != 1 || t.dim(0) != B) fail(op, name, ": expected shape (", count, ",) = (", B, ",) but got ", t.shape());
    return t;
}

namespace {

// Byte interval [lo, hi) a view can touch (strides may be negative or zero). In 128 bits: an
// input view's dims × strides need not fit 64 bits (huge strides of a view nobody reads
// whole), and a wrapped span could call two overlapping views disjoint.
struct Span {
    __int128 lo, hi;
};

Span span_of(const TensorView& t) {
    __int128 lo = 0, hi = 0;
    for (int d = 0; d < t.rank(); ++d) {
        const __int128 reach = static_cast<__int128>(t.dim(d) - 1) * t.stride(d);
        (reach < 0 ? lo : hi) += reach;
    }
    const auto base = static_cast<__int128>(reinterpret_cast<std::uintptr_t>(t.data()));
    const auto size = static_cast<__int128>(dtype_size(t.dtype()));
    return {base + lo * size, base + (hi + 1) * size};
}

}  // namespace

namespace {

// Two views whose rows interleave without sharing a byte (Q = buf[..., :D] and
// out = buf[..., D:] of one (B, H, L, 2D) buffer): when each view's last dim is unit-stride
// and every other dim's byte stride is a multiple of a period g, each view's bytes lie, modulo
// g, in one interval [address, address + row bytes); two such intervals that do not meet on
// the circle of length g mean no shared byte. (A sufficient test: false when unsure.)
bool rows_interleave_apart(const TensorView& a, const TensorView& b) {
    std::uint64_t g = 0;
    const auto row_bytes = [&g](const TensorView& t) -> std::int64_t {  // -1: not a row layout
        const int r = t.rank();
        if (r == 0 || (t.dim(r - 1) > 1 && t.stride(r - 1) != 1)) return -1;
        const auto es = static_cast<std::int64_t>(dtype_size(t.dtype()));
        for (int d = 0; d < r - 1; ++d)
            if (t.dim(d) > 1) {
                const auto s = static_cast<unsigned __int128>(t.stride(d) < 0 ? -static_cast<__int128>(t.stride(d)) : t.stride(d));
                if (s * static_cast<unsigned>(es) > UINT64_MAX) return -1;
                g = std::gcd(g, static_cast<std::uint64_t>(s * static_cast<unsigned>(es)));
            }
        if (t.dim(r - 1) > INT64_MAX / es) return -1;
        return t.dim(r - 1) * es;
    };
    const std::int64_t la = row_bytes(a), lb = row_bytes(b);
    if (la < 0 || lb < 0 || g == 0 || static_cast<std::uint64_t>(la) + static_cast<std::uint64_t>(lb) > g) return false;
    const std::uint64_t ra = reinterpret_cast<std::uintptr_t>(a.data()) % g, rb = reinterpret_cast<std::uintptr_t>(b.data()) % g;
    const std::uint64_t d = (rb + g - ra) % g;  // b's interval starts d bytes after a's, on the circle
    return d >= static_cast<std::uint64_t>(la) && d + static_cast<std::uint64_t>(lb) <= g;
}

}  // namespace

void require_dropout_p(std::string_view op, double p, std::string_view name) {
    if (!(p >= 0.0 && p < 1.0)) fail(op, name, ": must be in [0, 1) but got ", shortest(p));
}

void require_dropout(std::string_view op, double p, const std::optional<std::uint64_t>& seed, const DropoutNames& names) {
    require_dropout_p(op, p, names.p);
    if (p > 0.0 && !seed) {
        fail(op, names.seed, ": ", names.p, " = ", shortest(p), " needs a seed (", names.seed_value,
             "): the keep mask is a function of it, so a training loop passes a new seed each step "
             "and the backward the forward's (attn has no global generator)");
    }
}

bool share_memory(const TensorView& a, const TensorView& b) {
    if (is_empty(a) || is_empty(b)) return false;
    const Span x = span_of(a), y = span_of(b);
    return x.lo < y.hi && y.lo < x.hi && !rows_interleave_apart(a, b);
}

void require_disjoint(std::string_view op, const TensorView& out, std::string_view out_name, const TensorView& other,
                      std::string_view other_name) {
    if (share_memory(out, other)) {
        fail(op, out_name, ": must not share memory with ", other_name, " (the kernel writes ", out_name,
             " while it still reads ", other_name, ")");
    }
}

std::int64_t load_int(const TensorView& t, std::int64_t offset) {
    if (t.dtype() == DType::i32) return t.data_as<const std::int32_t>()[offset];
    return t.data_as<const std::int64_t>()[offset];
}

std::size_t utf8_sequence_length(std::string_view text, std::size_t i) {
    const auto byte = [&](std::size_t k) { return static_cast<unsigned char>(text[k]); };
    const unsigned char lead = byte(i);
    if (lead < 0x80) return 1;
    std::size_t n = 0;
    std::uint32_t code = 0, min_code = 0;
    if ((lead & 0xe0) == 0xc0) {
        n = 2, code = lead & 0x1f, min_code = 0x80;
    } else if ((lead & 0xf0) == 0xe0) {
        n = 3, code = lead & 0x0f, min_code = 0x800;
    } else if ((lead & 0xf8) == 0xf0) {
        n = 4, code = lead & 0x07, min_code = 0x10000;
    } else {
        return 0;
    }
    if (i + n > text.size()) return 0;
    for (std::size_t k = 1; k < n; ++k) {
        if ((byte(i + k) & 0xc0) != 0x80) return 0;
        code = code << 6 | (byte(i + k) & 0x3f);
    }
    const bool surrogate = code >= 0xd800 && code <= 0xdfff;
    return code < min_code || code > 0x10ffff || surrogate ? 0 : n;
}

std::string quoted(std::string_view text, std::size_t max_bytes) {
    std::string out = "'";
    const auto escape = [&out](unsigned char c) {
        char esc[5];
        std::snprintf(esc, sizeof esc, "\\x%02x", c);
        out += esc;
    };
    std::size_t i = 0;
    while (i < text.size()) {
        const std::size_t n = utf8_sequence_length(text, i);
        // Cut before a character that would pass max_bytes, never inside one: a message cut
        // mid-character is not UTF-8, and Python shows such an error message as ''.
        if (i + std::max<std::size_t>(n, 1) > max_bytes) break;
        const auto c = static_cast<unsigned char>(text[i]);
        // Escaped: C0 controls and DEL, C1 controls U+0080..U+009F (0xC2 0x80..0x9F in UTF-8;
        // CSI acts on some terminals), and any byte that is not part of well-formed UTF-8 (a raw
        // 0x9B is CSI on others). Other characters are kept: a tensor may have a non-ASCII name.
        const bool c1 = n == 2 && c == 0xc2 && static_cast<unsigned char>(text[i + 1]) <= 0x9f;
        if (n == 0 || c1 || c < 0x20 || c == 0x7f) {
            for (std::size_t k = 0; k < std::max<std::size_t>(n, 1); ++k) escape(static_cast<unsigned char>(text[i + k]));
        } else if (c == '\'' || c == '\\') {  // the text's own quote or backslash: never the end of the quotes, never an escape
            out += '\\';
            out += static_cast<char>(c);
        } else {
            out.append(text.substr(i, n));
        }
        i += std::max<std::size_t>(n, 1);
    }
    return out + (i < text.size() ? "...'" : "'");
}

std::string names_held(const std::vector<std::string>& names) {
    if (names.empty()) return "it holds no tensors";
    std::string list;
    for (const std::string& n : names) {
        if (list.size() > 200) {
            list += ", …";
            break;
        }
        list += (list.empty() ? "" : ", ") + quoted(n);
    }
    return "it holds " + std::to_string(names.size()) + ": " + list;
}

std::string quoted_path(std::string_view path) { return quoted(path, std::string_view::npos); }

std::string shortest(double value) {
    char text[32];
    const auto end = std::to_chars(text, text + sizeof text, value).ptr;
    return std::string(text, end);
}

}  // namespace attn::detail
