// Which global rows each rank holds (contiguous or zigzag), and copying them in and out.
#include <string>

#include "attn/error.hpp"
#include "attn/ring.hpp"
#include "../core/check.hpp"
#include "../core/checked_size.hpp"
#include "../core/element_io.hpp"

namespace attn::dist {
namespace {

// Chunk c of n over L rows: [⌊c·L/n⌋, ⌊(c+1)·L/n⌋). Integer division spreads the remainder,
// so chunk lengths differ by at most one.
Segment chunk(std::int64_t L, std::int64_t n, std::int64_t c) {
    // ⌊c·L/n⌋ = c·⌊L/n⌋ + ⌊c·(L mod n)/n⌋: the first product stays below L; the second below
    // n², which needs 128 bits once n (2·P for zigzag, up to 2^32) passes 2^31.5.
    const auto at = [&](std::int64_t i) {
        return i * (L / n) + static_cast<std::int64_t>(static_cast<__int128>(i) * (L % n) / n);
    };
    const std::int64_t lo = at(c), hi = at(c + 1);
    return Segment{lo, hi - lo};
}

// Copy rows between a (B, H, *, D) float view and another, row by row (any strides/dtypes).
void copy_rows(const TensorView& src, std::int64_t src_row, const TensorView& dst, std::int64_t dst_row,
               std::int64_t rows) {
    const std::int64_t B = src.dim(0), H = src.dim(1), D = src.dim(3);
    for (std::int64_t b = 0; b < B; ++b)
        for (std::int64_t h = 0; h < H; ++h)
            for (std::int64_t i = 0; i < rows; ++i)
                for (std::int64_t d = 0; d < D; ++d) {
                    // 16-bit → 16-bit of the same dtype goes through double exactly.
                    attn::detail::store(dst, dst.offset(b, h, dst_row + i, d), src.load_as_double(src.offset(b, h, src_row + i, d)));
                }
}

void check_4d_float(const TensorView& t, const char* what) {
    if (t.rank() != 4 || !is_floating(t.dtype())) {
        throw Error(std::string(what) + ": expected a rank-4 floating tensor (B, H, L, D) but got " +
                    std::string(dtype_name(t.dtype())) + " " + t.shape().str(),
                    is_floating(t.dtype()) ? ErrorKind::value : ErrorKind::type);
    }
}

// Throws unless every segment lies inside [0, L); returns the rows they hold together.
std::int64_t check_segments(const std::vector<Segment>& segments, std::int64_t L, const char* what) {
    std::int64_t n = 0;
    for (const Segment& s : segments) {
        if (s.start < 0 || s.length < 0 || s.start > L || s.length > L - s.start) {  // no s.start + s.length: it can overflow
            throw Error(std::string(what) + ": segment (start " + std::to_string(s.start) + ", length " +
                        std::to_string(s.length) + ") does not fit a sequence of length " + std::to_string(L));
        }
        const auto sum = attn::detail::size_add(n, s.length);
        if (!sum) throw Error(std::string(what) + ": the segments hold more than 2^63 rows together");
        n = *sum;
    }
    return n;
}

}  // namespace

std::string_view layout_name(Layout layout) { return layout == Layout::zigzag ? "zigzag" : "contiguous"; }

Layout parse_layout(std::string_view name) {
    if (name == "zigzag") return Layout::zigzag;
    if (name == "contiguous") return Layout::contiguous;
    throw Error("layout: expected zigzag or contiguous but got " + attn::detail::quoted(name));
}

std::vector<Segment> rank_segments(std::int64_t L, int P, int rank, Layout layout) {
    if (L < 0) throw Error("rank_segments: length must be >= 0 but got " + std::to_string(L));
    if (P < 1 || rank < 0 || rank >= P) {
        throw Error("rank_segments: expected 0 <= rank < P with P >= 1 but got rank " + std::to_string(rank) +
                    " of P = " + std::to_string(P));
    }
    if (layout == Layout::contiguous) return {chunk(L, P, rank)};
    const std::int64_t n = 2 * static_cast<std::int64_t>(P);  // 2·P overflows int from P = 2^30
    return {chunk(L, n, rank), chunk(L, n, n - 1 - rank)};
}

std::int64_t rank_length(std::int64_t L, int P, int rank, Layout layout) {
    std::int64_t n = 0;
    for (const Segment& s : rank_segments(L, P, rank, layout)) n += s.length;
    return n;
}

// global: (B, H, L, D) → (B, H, Σ lengths, D) float32, or global's dtype when it is 16-bit
Tensor take_rows(const TensorView& global, const std::vector<Segment>& segments) {
    check_4d_float(global, "take_rows: global");
    const std::int64_t n = check_segments(segments, global.dim(2), "take_rows");
    const bool sixteen = global.dtype() == DType::f16 || global.dtype() == DType::bf16;
    Tensor local(sixteen ? global.dtype() : DType::f32, Shape{global.dim(0), global.dim(1), n, global.dim(3)});
    std::int64_t row = 0;
    for (const Segment& s : segments) {
        copy_rows(global, s.start, local, row, s.length);
        row += s.length;
    }
    return local;
}

// local: (B, H, Σ lengths, D) → rows of global (B, H, L, D)
void put_rows(const TensorView& local, const std::vector<Segment>& segments, const TensorView& global) {
    check_4d_float(local, "put_rows: local");
    check_4d_float(global, "put_rows: global");
    const std::int64_t n = check_segments(segments, global.dim(2), "put_rows");
    if (local.dim(0) != global.dim(0) || local.dim(1) != global.dim(1) || local.dim(3) != global.dim(3) ||
        local.dim(2) != n) {
        throw Error("put_rows: local " + local.shape().str() + " does not hold the " + std::to_string(n) +
                    " rows of the segments of global " + global.shape().str());
    }
    std::int64_t row = 0;
    for (const Segment& s : segments) {
        copy_rows(local, row, global, s.start, s.length);
        row += s.length;
    }
}

}  // namespace attn::dist
