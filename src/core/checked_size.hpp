// Sizes computed from user input — shapes, capacities, element and byte counts — go through
// these and nowhere else, so that an impossible size is an attn::Error that names the
// argument and the count, never a wrapped number that a later allocation or write trusts.
//
// The limit is INT64_MAX for element counts and for byte counts: offsets are int64
// (ptrdiff_t) arithmetic in every kernel, so a size beyond it cannot be addressed.
// Zero-sized arrays follow numpy's rule: the product of the NON-ZERO dimensions must fit
// too, because the contiguous strides of (0, 10¹², 10¹⁴) are products of those dimensions
// (numpy refuses such a shape with "array is too big" for the same reason).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include "attn/tensor.hpp"

namespace attn::detail {

// a·b and a+b for sizes >= 0; nullopt when the result exceeds INT64_MAX.
std::optional<std::int64_t> size_mul(std::int64_t a, std::int64_t b);
std::optional<std::int64_t> size_add(std::int64_t a, std::int64_t b);

// The same, throwing "<op>: <what>: a × b (or a + b) exceeds 9223372036854775807".
std::int64_t checked_mul(std::string_view op, std::string_view what, std::int64_t a, std::int64_t b);
std::int64_t checked_add(std::string_view op, std::string_view what, std::int64_t a, std::int64_t b);

// Bytes of a C-contiguous array of `shape` with `elem_size`-byte elements (0 when a dim is 0),
// or nullopt when the product of its non-zero dims × elem_size exceeds INT64_MAX.
std::optional<std::int64_t> shape_bytes(const Shape& shape, std::size_t elem_size);

// The same, throwing "<op>: <what> of shape (…) with <n>-byte elements needs more bytes than
// a 64-bit size can count (d0 × d1 × … × n > 9223372036854775807)".
std::int64_t checked_bytes(std::string_view op, std::string_view what, const Shape& shape, std::size_t elem_size);

// Elements of `shape` (0 when a dim is 0); throws "<op>: <what> (…) has more elements than a
// 64-bit count can hold (d0 × d1 × … > 9223372036854775807)".
std::int64_t checked_numel(std::string_view op, std::string_view what, const Shape& shape);

}  // namespace attn::detail
