#include "checked_size.hpp"

#include <limits>
#include <sstream>
#include <string>

#include "check.hpp"

namespace attn::detail {
namespace {

constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();

// "d0 × d1 × … [× elem]" — the factors a user can compare with the arguments they gave. A
// zero-size shape is refused for the product of its nonzero dims (its strides would overflow):
// those are the factors then, since "0 × … > max" would be false.
std::string factors(const Shape& shape, std::size_t elem_size, bool with_elem) {  // (a valid rank)
    bool empty = false;
    for (int i = 0; i < shape.rank; ++i) empty = empty || shape[i] == 0;
    std::ostringstream s;
    bool first = true;
    for (int i = 0; i < shape.rank; ++i) {
        if (empty && shape[i] == 0) continue;
        s << (first ? "" : " × ") << shape[i];
        first = false;
    }
    if (with_elem) s << (first ? "" : " × ") << elem_size;
    return (empty ? "the dims other than 0: " : "") + s.str();
}

bool valid_rank(const Shape& shape) { return shape.rank >= 0 && shape.rank <= kMaxRank; }

// A negative dimension (or a rank outside 0..4: Shape::rank is a public field) is a different
// mistake from an overflowing count: say so.
void require_non_negative(std::string_view op, std::string_view what, const Shape& shape) {
    if (!valid_rank(shape)) fail(op, "rank must be in [0, ", kMaxRank, "] but got ", shape.rank);
    for (int i = 0; i < shape.rank; ++i) {
        if (shape[i] < 0) fail(op, what, " ", shape, ": dimension ", i, " must be >= 0 but got ", shape[i]);
    }
}

}  // namespace

std::optional<std::int64_t> size_mul(std::int64_t a, std::int64_t b) {
    std::int64_t r = 0;
    if (a < 0 || b < 0 || __builtin_mul_overflow(a, b, &r)) return std::nullopt;
    return r;
}

std::optional<std::int64_t> size_add(std::int64_t a, std::int64_t b) {
    std::int64_t r = 0;
    if (a < 0 || b < 0 || __builtin_add_overflow(a, b, &r)) return std::nullopt;
    return r;
}

std::int64_t checked_mul(std::string_view op, std::string_view what, std::int64_t a, std::int64_t b) {
    if (const auto r = size_mul(a, b)) return *r;
    fail(op, what, ": ", a, " × ", b, " exceeds ", kMax);
}

std::int64_t checked_add(std::string_view op, std::string_view what, std::int64_t a, std::int64_t b) {
    if (const auto r = size_add(a, b)) return *r;
    fail(op, what, ": ", a, " + ", b, " exceeds ", kMax);
}

std::optional<std::int64_t> shape_bytes(const Shape& shape, std::size_t elem_size) {
    if (elem_size > static_cast<std::size_t>(kMax) || !valid_rank(shape)) return std::nullopt;
    std::optional<std::int64_t> nonzero = static_cast<std::int64_t>(elem_size);
    bool empty = false;
    for (int i = 0; i < shape.rank && nonzero; ++i) {
        if (shape[i] == 0) {
            empty = true;
        } else {
            nonzero = size_mul(*nonzero, shape[i]);  // nullopt for a negative dim too
        }
    }
    if (!nonzero) return std::nullopt;
    return empty ? 0 : *nonzero;
}

std::int64_t checked_bytes(std::string_view op, std::string_view what, const Shape& shape, std::size_t elem_size) {
    if (const auto r = shape_bytes(shape, elem_size)) return *r;
    require_non_negative(op, what, shape);
    fail(op, what, " of shape ", shape, " with ", elem_size,
         "-byte elements needs more bytes than a 64-bit size can count (", factors(shape, elem_size, true), " > ", kMax,
         ")");
}

std::int64_t checked_numel(std::string_view op, std::string_view what, const Shape& shape) {
    if (const auto r = shape_bytes(shape, 1)) return *r;
    require_non_negative(op, what, shape);
    fail(op, what, " ", shape, " has more elements than a 64-bit count can hold (", factors(shape, 1, false), " > ",
         kMax, ")");
}

}  // namespace attn::detail
