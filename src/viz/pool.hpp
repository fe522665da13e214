// The numbers a heatmap draws: weights checked, then mean-pooled in k×k blocks when the
// matrix is too large to draw one cell per weight. Kept apart from the drawing so tests can
// check the arithmetic directly.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "attn/tensor.hpp"

namespace attn::viz {

struct Pooled {
    std::int64_t panels = 0, rows = 0, cols = 0;  // after pooling
    std::int64_t block_rows = 1, block_cols = 1;  // cells are means of block_rows×block_cols blocks
    std::vector<double> values;                   // (panels, rows, cols), C order
    double max = 0.0;                             // largest value (0 when all are masked)
    bool any_masked = false;                      // some cell is exactly 0

    double at(std::int64_t p, std::int64_t r, std::int64_t c) const {
        return values[static_cast<std::size_t>((p * rows + r) * cols + c)];
    }
};

// Smallest k with ceil(n / k) <= cap, i.e. k = ceil(n / cap): the block along one axis.
std::int64_t block_for(std::int64_t n, std::int64_t cap);

// weights: (P, Lq, Lk), any floating dtype and strides → (P, ceil(Lq/kr), ceil(Lk/kc)).
// Each output cell is the mean of the weights its block covers (edge blocks cover fewer
// weights and average only those), accumulated in double. A cell is exactly 0 only when every
// weight in its block is exactly 0, so "masked" survives pooling. Throws attn::Error for a
// negative or non-finite weight, naming its index (`what` names the tensor).
Pooled mean_pool(const TensorView& weights, std::int64_t kr, std::int64_t kc, const char* what);

// The rule for a weight that is drawn (or averaged into a drawn cell): finite and >= 0. Throws
// attn::Error "<what>: attention weights must be finite and >= 0, but element (<index>) is <w>".
void require_drawable_weight(double w, const std::string& what, std::initializer_list<std::int64_t> index);

}  // namespace attn::viz
