// Heatmaps of attention weights, as PNG or SVG — the picture every attention tutorial draws:
// queries down (rows), keys across (columns), one colour per weight.
//
//                 keys →   一只  蓝色  怪兽 …        ┌──┐ 1.0
//   queries ↓   一只      ███  ░░░  ░░░            │  │
//               蓝色      ███  ███  ░░░            │  │ 0.5      ░ = weight exactly 0
//               怪兽      ███  ███  ███            └──┘ 0          (masked)
//
// Colours: viridis (perceptually uniform) from 0 to `vmax`, with a colour bar and its scale.
// A weight of exactly 0 is what a mask produces (softmax of −inf), so it is drawn hatched
// grey — never the colour of a small weight — and the legend says so. Large matrices are
// down-sampled honestly: each cell becomes the mean of a k×k block, and the picture says
// "down-sampled k×k blocks (mean)" (k per axis, so a 1×2048 row becomes 1×8 blocks). Several panels (heads) become a grid of small multiples
// sharing one colour scale.
//
// Drawn with cairo (PNG through its libpng encoder, SVG through its SVG surface) and pango
// with fontconfig for text, so token labels in any script — CJK included — render with the
// system's fonts (Noto CJK on Debian). Why cairo's SVG surface rather than our own SVG
// writer: one drawing code makes both formats, so they cannot drift apart; cairo writes text
// as glyph outlines, so the SVG shows the same CJK glyphs on a machine without CJK fonts;
// and escaping token text into XML is cairo's job, not ours. (Cost: SVG text is not
// selectable.) Library: attn::viz (CMake target attn_viz), kept out of the core `attn` so
// the core carries no graphics dependencies.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "attn/error.hpp"
#include "attn/tensor.hpp"

namespace attn {

enum class ImageFormat { png, svg };

// The most panels (P of (P, Lq, Lk) weights) one picture holds; more are an attn::Error.
inline constexpr int kHeatmapMaxPanels = 256;
// The most cells per side of a panel (HeatmapOptions::max_cells): at the smallest cell (2 px)
// 8192 px, well inside the 32767 px per side a cairo image can have (past ~16 000 cells PNG
// failed in cairo, and SVG grew millions of pixels wide).
inline constexpr int kHeatmapMaxCells = 4096;

struct HeatmapOptions {
    std::vector<std::string> key_tokens;    // column labels, Lk of them; empty: key indices
    std::vector<std::string> query_tokens;  // row labels, Lq of them; empty: key_tokens when
                                            // Lq == Lk (self-attention), else query indices
    std::vector<std::string> panel_titles;  // one per panel (small multiples); empty: "head p"
                                            // (a single panel gets no caption by default)
    std::string title;                      // bold first line; may be empty
    std::string subtitle;                   // second line (what was selected); may be empty
    std::optional<double> vmax;             // top of the colour scale (> 0); default: the
                                            // largest value drawn
    int max_cells = 256;                    // cells per side of one panel before down-sampling
                                            // (a grid of panels divides it by the columns);
                                            // 2 .. kHeatmapMaxCells
    bool annotate = true;                   // print each value in its cell when cells are big
    std::string name = "weights";           // what errors call the tensor (e.g. its file)
};

// Where things landed in the picture (pixels; SVG user units are pixels too).
struct HeatmapPanelGeometry {
    int x = 0, y = 0;            // top-left corner of the first cell
    int cell_w = 0, cell_h = 0;  // size of one cell (square unless one side of W is short)
    int rows = 0, cols = 0;      // cells drawn (after down-sampling)
};

struct HeatmapImage {
    std::string bytes;  // the whole encoded file
    ImageFormat format = ImageFormat::png;
    int width = 0, height = 0;
    int block_rows = 1, block_cols = 1;  // each cell is the mean of a block_rows×block_cols block
                                         // of weights (1×1 = not down-sampled)
    double vmax = 1.0;   // the value drawn as the top colour
    std::vector<HeatmapPanelGeometry> panels;
};

// weights: (Lq, Lk) — one panel — or (P, Lq, Lk) — P panels in a grid. Any floating dtype,
// any strides. Every value must be finite and ≥ 0. Throws attn::Error naming the argument.
HeatmapImage render_heatmap(const TensorView& weights, const HeatmapOptions& options, ImageFormat format);

// The format a file name asks for: "*.png" or "*.svg" (any case); anything else throws.
ImageFormat image_format_for_path(const std::string& path);

// Whether a token can be a label: valid UTF-8 without NUL bytes (render_heatmap refuses others,
// naming key_tokens[i] / query_tokens[i]; a caller reading them can name its own source).
bool heatmap_label_ok(const std::string& token);

// Renders to memory, then writes `path` atomically (temporary file + rename): on any error
// no file appears. The format follows the extension.
HeatmapImage write_heatmap(const std::string& path, const TensorView& weights, const HeatmapOptions& options);

}  // namespace attn
