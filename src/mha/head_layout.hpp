// Where the rows and heads of an MHA layer's buffers sit — written once for the forward,
// the backward and the incremental path. Inputs are (L, B, F), (B, L, F) with batch_first,
// or unbatched (L, F); a projection writes its rows in the input's row order as (rows, ld)
// buffers (heads are column blocks), or head-major — each head a (rows, d) matrix of its own,
// rows batch-major whatever the input's order: the inference forward's Q, K and V —, and the
// heads are stride views of them (docs/conventions.md: the head split is a stride view, never
// a copy).
#pragma once

#include <cstdint>

#include "attn/tensor.hpp"
#include "linear.hpp"

namespace attn::detail {

// Row of (b, l) in a (L, B, F) / (B, L, F) / (L, F) input: row = b·rb + l·rl.
struct Rows {
    std::int64_t rb = 0, rl = 0;
};

inline Rows rows_of(bool batched, bool batch_first, std::int64_t B, std::int64_t L) {
    if (!batched) return {0, 1};
    return batch_first ? Rows{L, 1} : Rows{1, B};
}

// A (B, heads, L, d) view of columns [col, col + heads·d) of a (rows, ld) buffer of dtype dt.
inline TensorView heads_view(void* buf, DType dt, std::int64_t ld, std::int64_t col, Rows r, std::int64_t B,
                             std::int64_t heads, std::int64_t L, std::int64_t d) {
    return TensorView(static_cast<char*>(buf) + col * static_cast<std::int64_t>(dtype_size(dt)), dt, Shape{B, heads, L, d},
                      Strides{r.rb * ld, d, r.rl * ld, 1});
}
inline TensorView heads_view(float* buf, std::int64_t ld, std::int64_t col, Rows r, std::int64_t B,
                             std::int64_t heads, std::int64_t L, std::int64_t d) {
    return heads_view(buf, DType::f32, ld, col, r, B, heads, L, d);
}

// Head-major: a projection's GEMM stores head k's d columns as a (rows, d) matrix at
// buf + k·rows·d (linear's ColumnBlocks{d, rows·d}), its rows batch-major — (b, l) at b·L + l —
// so a head's rows of one batch item are contiguous for every input layout: a seq-first input's
// rows (l·B + b) are read batch by batch (head_major_read), which permutes the GEMM's rows, not
// its arithmetic. A (B, heads, L, d) view of heads [first, first + heads) of such a buffer:
inline ColumnBlocks head_major_blocks(std::int64_t rows, std::int64_t d) { return ColumnBlocks{d, rows * d}; }
inline TensorView head_major_view(float* buf, std::int64_t rows, std::int64_t first, std::int64_t B, std::int64_t heads,
                                  std::int64_t L, std::int64_t d) {
    return TensorView(buf + first * rows * d, DType::f32, Shape{B, heads, L, d}, Strides{L * d, rows * d, d, 1});
}

// How a head-major projection reads an input of row stride ld whose (b, l) row is b·rb + l·rl
// (Rows): the GEMM's row b·L + l is the input's, so batch-major rows (batch_first, unbatched,
// B = 1) are read as they lie and seq-first ones as B groups of L rows, rl·ld apart.
struct InputRead {
    std::int64_t ldx = 0;
    RowGroups groups;
};
inline InputRead head_major_read(Rows r, std::int64_t L, std::int64_t ld) {
    if (r.rl == 1) return {ld, {}};
    return {r.rl * ld, RowGroups{L, r.rb * ld}};
}

}  // namespace attn::detail
