// The heatmap: check the arguments, pool the weights, lay the picture out (measuring text
// on a scratch surface), then draw it once on a PNG or SVG cairo surface. One drawing code
// for both formats, so they show the same thing.
//
// Layout (pixels):
//   margin
//   title / subtitle / "rows: queries … columns: keys …"
//   grid of panels                                   colour bar + ticks
//     [caption]                                      legend: hatched grey = exactly 0
//     [key labels, horizontal or rotated 90°]
//     [query labels] [cells]
//   notes (down-sampling, colour scale)
//   margin
#include "attn/heatmap.hpp"

#include <cairo-svg.h>
#include <cairo.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "attn/error.hpp"
#include "core/check.hpp"
#include "io/atomic_file.hpp"
#include "pool.hpp"
#include "text.hpp"
#include "viridis.hpp"

namespace attn {
namespace {

using viz::HAlign;
using viz::TextEngine;
using viz::TextStyle;
using viz::VAlign;

constexpr int kMargin = 16;
constexpr double kMaskedGrey = 208.0 / 255.0;  // fill of cells whose weight is exactly 0
constexpr double kHatchGrey = 150.0 / 255.0;   // their diagonal hatch
constexpr double kInk = 0.13;                  // text
constexpr double kMutedInk = 0.38;             // notes, ticks

std::string fmt(const char* format, double v) {
    char buf[64];
    std::snprintf(buf, sizeof buf, format, v);
    return buf;
}

std::string shape_str(std::int64_t a, std::int64_t b) {
    return std::to_string(a) + "\xc3\x97" + std::to_string(b);  // a×b
}

// The "nice" number ≥ x from 1, 2, 5 × 10^n (for label steps and colour bar ticks).
double nice_ceil(double x) {
    const double p = std::pow(10.0, std::floor(std::log10(x)));
    for (double m : {1.0, 2.0, 5.0, 10.0})
        if (m * p >= x * (1 - 1e-12)) return m * p;
    return 10.0 * p;
}

// ------------------------------------------------------------------------------------------
// Arguments

struct Problem {
    TensorView w;  // (P, Lq, Lk)
    std::int64_t P = 0, Lq = 0, Lk = 0;
    std::vector<std::string> rows_tokens, cols_tokens, captions;
};

void check_tokens(const std::vector<std::string>& tokens, std::int64_t want, const char* what, const char* axis) {
    if (tokens.empty()) return;
    if (static_cast<std::int64_t>(tokens.size()) != want) {
        throw Error(std::string("heatmap: ") + what + " has " + std::to_string(tokens.size()) + " labels but the weights have " +
                    axis + " = " + std::to_string(want));
    }
    for (std::size_t i = 0; i < tokens.size(); ++i) {
        if (!viz::is_valid_utf8(tokens[i])) {
            throw Error(std::string("heatmap: ") + what + "[" + std::to_string(i) + "] is not valid UTF-8");
        }
    }
}

// weights: (Lq, Lk) or (P, Lq, Lk) → a checked Problem with labels resolved.
Problem check(const TensorView& weights, const HeatmapOptions& o) {
    if (weights.empty()) throw Error("heatmap: weights: no tensor given");
    if (!is_floating(weights.dtype())) {
        throw Error("heatmap: weights must hold a floating type but hold " + std::string(dtype_name(weights.dtype())),
                    ErrorKind::type);
    }
    Problem p;
    if (weights.rank() == 2) {
        p.w = TensorView(weights.data(), weights.dtype(), Shape{1, weights.dim(0), weights.dim(1)},
                         Strides{0, weights.stride(0), weights.stride(1), 0});
    } else if (weights.rank() == 3) {
        p.w = weights;
    } else {
        throw Error("heatmap: weights must have shape (Lq, Lk) or (P, Lq, Lk) but have shape " + weights.shape().str());
    }
    p.P = p.w.dim(0), p.Lq = p.w.dim(1), p.Lk = p.w.dim(2);
    if (p.P < 1 || p.Lq < 1 || p.Lk < 1) {
        throw Error("heatmap: weights must not be empty but have shape " + weights.shape().str());
    }
    if (p.P > kHeatmapMaxPanels) {
        throw Error("heatmap: at most " + std::to_string(kHeatmapMaxPanels) + " panels fit in one picture but the weights have " +
                    std::to_string(p.P));
    }
    check_tokens(o.key_tokens, p.Lk, "key_tokens", "Lk (columns)");
    check_tokens(o.query_tokens, p.Lq, "query_tokens", "Lq (rows)");
    check_tokens(o.panel_titles, p.P, "panel_titles", "P (panels)");
    if (!viz::is_valid_utf8(o.title)) throw Error("heatmap: title is not valid UTF-8");
    if (!viz::is_valid_utf8(o.subtitle)) throw Error("heatmap: subtitle is not valid UTF-8");
    if (o.vmax && !(std::isfinite(*o.vmax) && *o.vmax > 0.0)) {
        throw Error("heatmap: vmax must be a finite number > 0 but is " + fmt("%g", *o.vmax));
    }
    // kHeatmapMaxCells says why the bound.
    if (o.max_cells < 2 || o.max_cells > kHeatmapMaxCells) {
        throw Error("heatmap: max_cells must be from 2 to " + std::to_string(kHeatmapMaxCells) + " but is " +
                    std::to_string(o.max_cells));
    }

    p.cols_tokens = o.key_tokens;
    p.rows_tokens = !o.query_tokens.empty() ? o.query_tokens : (p.Lq == p.Lk ? o.key_tokens : std::vector<std::string>{});
    for (auto& t : p.cols_tokens) t = viz::printable_token(t);
    for (auto& t : p.rows_tokens) t = viz::printable_token(t);
    if (!o.panel_titles.empty()) {
        p.captions = o.panel_titles;
    } else if (p.P > 1) {
        for (std::int64_t i = 0; i < p.P; ++i) p.captions.push_back("head " + std::to_string(i));
    }
    return p;
}

// ------------------------------------------------------------------------------------------
// Layout

struct Label {
    std::int64_t cell;  // display cell it names
    std::string text;
};

struct Axis {
    std::vector<Label> labels;
    int step = 1;       // every step-th cell is labelled
    int extent = 0;     // widest label (pixels)
};

// Labels for one axis of n display cells (block k): tokens when each cell is one token and
// there is room for every label; "index token" when only every step-th fits; start indices
// when cells are blocks.
Axis make_axis(TextEngine& te, const TextStyle& style, std::int64_t n, std::int64_t k, int cell, int line,
               const std::vector<std::string>& tokens) {
    Axis a;
    a.step = cell >= line ? 1 : static_cast<int>(nice_ceil(static_cast<double>(line) / cell));
    for (std::int64_t c = 0; c < n; c += a.step) {
        std::string text;
        if (k == 1 && !tokens.empty()) {
            text = a.step == 1 ? tokens[static_cast<std::size_t>(c)] : std::to_string(c) + " " + tokens[static_cast<std::size_t>(c)];
        } else {
            text = std::to_string(c * k);
        }
        a.extent = std::max(a.extent, te.measure(text, style).width);
        a.labels.push_back({c, std::move(text)});
    }
    return a;
}

struct Layout {
    int width = 0, height = 0;
    int grid_cols = 1, grid_rows = 1;
    int cell_w = 0, cell_h = 0;  // a cell's width and height (equal unless one side is short)
    std::int64_t R = 0, C = 0;   // display cells per panel
    TextStyle title{17.0, true, -1}, subtitle{13.0, false, -1}, label{13.0, false, -1}, caption{13.0, true, -1},
        small{12.0, false, -1}, value{11.0, false, -1};
    Axis rows, cols;
    bool cols_rotated = false;
    int line = 0;            // height of one label line
    int row_label_w = 0, col_label_h = 0, caption_h = 0;
    int panel_w = 0, panel_h = 0, panel_gap = 24;
    int header_y = kMargin, grid_x = kMargin, grid_y = 0;
    struct HeaderLine {
        std::string text;
        bool is_title;
        int height;
    };
    std::vector<HeaderLine> header;  // title, subtitle, axis line (empty ones skipped)
    int bar_x = 0, bar_y = 0, bar_w = 18, bar_h = 0;
    std::vector<std::pair<double, std::string>> ticks;
    int legend_y = 0;
    std::vector<std::string> notes;
    int notes_y = 0;
    bool annotate = false;
};

constexpr int kLabelGap = 6;  // between labels and cells

Layout lay_out(TextEngine& te, const Problem& p, const viz::Pooled& d, double vmax, const HeatmapOptions& o) {
    Layout L;
    L.R = d.rows, L.C = d.cols;
    if (p.P > 1) {
        L.grid_cols = static_cast<int>(std::ceil(std::sqrt(static_cast<double>(p.P))));
        L.grid_rows = static_cast<int>((p.P + L.grid_cols - 1) / L.grid_cols);
    }
    const std::int64_t side = std::max(L.R, L.C);
    // Square cells sized by the longer side; a short side (a decoding step's single query,
    // say) gets taller cells so that it stays at least ~120 px across rather than a thin line.
    const int target = p.P == 1 ? 640 : std::max(140, 900 / L.grid_cols), biggest = p.P == 1 ? 56 : 40;
    const int cell = static_cast<int>(std::clamp<std::int64_t>(target / side, 2, biggest));
    L.cell_w = std::max(cell, static_cast<int>(std::min<std::int64_t>(biggest, 120 / L.C)));
    L.cell_h = std::max(cell, static_cast<int>(std::min<std::int64_t>(biggest, 120 / L.R)));
    if (std::min(L.cell_w, L.cell_h) < 18) L.label.px = 11.0;
    L.label.max_width = p.P == 1 ? 150 : 100;
    L.line = te.measure("Ag一", L.label).height;
    // A label fits its cell when the font (not the CJK line height) fits, with 2 px to spare.
    const int pitch = static_cast<int>(std::ceil(L.label.px)) + 2;
    L.rows = make_axis(te, L.label, L.R, d.block_rows, L.cell_h, pitch, p.rows_tokens);
    L.cols = make_axis(te, L.label, L.C, d.block_cols, L.cell_w, pitch, p.cols_tokens);
    L.row_label_w = L.rows.extent;
    L.cols_rotated = !(L.cols.step == 1 && L.cols.extent <= L.cell_w - 4);
    L.col_label_h = L.cols_rotated ? L.cols.extent : L.line;
    L.caption_h = p.captions.empty() ? 0 : te.measure("Ag", L.caption).height + 4;
    L.panel_w = L.row_label_w + kLabelGap + static_cast<int>(L.C) * L.cell_w;
    L.panel_h = L.caption_h + L.col_label_h + kLabelGap + static_cast<int>(L.R) * L.cell_h;
    L.annotate = o.annotate && std::min(L.cell_w, L.cell_h) >= 36;

    // Header lines, shortened with "…" past 1600 px as long tokens are (a title of a few
    // thousand characters made a picture wider than cairo's 32767 px limit).
    L.title.max_width = L.subtitle.max_width = 1600;
    const std::string axes = "rows: queries (Lq = " + std::to_string(p.Lq) + ")   columns: keys (Lk = " + std::to_string(p.Lk) + ")";
    // Control bytes of the title and subtitle are shown escaped, as tokens' are.
    const std::string title = viz::printable_token(o.title), subtitle = viz::printable_token(o.subtitle);
    for (const auto& [text, is_title] : {std::pair{title, true}, std::pair{subtitle, false}, std::pair{axes, false}}) {
        if (!text.empty()) L.header.push_back({text, is_title, te.measure(text, is_title ? L.title : L.subtitle).height});
    }
    int header_total = 0, header_w = 0;
    for (const auto& h : L.header) {
        header_total += h.height;
        header_w = std::max(header_w, te.measure(h.text, h.is_title ? L.title : L.subtitle).width);
    }
    L.grid_y = L.header_y + header_total + 12;
    const int grid_w = L.grid_cols * L.panel_w + (L.grid_cols - 1) * L.panel_gap;
    const int grid_h = L.grid_rows * L.panel_h + (L.grid_rows - 1) * L.panel_gap;

    // Colour bar beside the first panel's cells, with ticks at nice steps of the scale.
    L.bar_x = L.grid_x + grid_w + 28;
    L.bar_y = L.grid_y + L.caption_h + L.col_label_h + kLabelGap;
    L.bar_h = std::clamp(grid_h - (L.bar_y - L.grid_y), 160, 320);
    // The tick count comes from vmax / step (about 5), never from comparing i·step with vmax:
    // vmax / 5 underflows to a step of 0 for denormal weights, and vmax·(1 + 1e-9) overflows
    // to +inf for weights near DBL_MAX — either made that loop run for ever. A step that is not
    // a positive normal number leaves the ticks 0 and vmax.
    const double step = nice_ceil(vmax / 5.0);
    const bool step_ok = std::isnormal(step) && step > 0.0;
    const int decimals = step_ok ? std::max(0, static_cast<int>(-std::floor(std::log10(step) + 1e-9))) : 0;
    const std::string tick_format = !step_ok || step < 1e-4 || step >= 1e5 ? "%.3g" : "%." + std::to_string(decimals) + "f";
    const int tick_count = step_ok ? static_cast<int>(std::floor(vmax / step * (1 + 1e-9))) + 1 : 1;  // 0, step, …
    int tick_w = 0;
    for (int i = 0; i < tick_count; ++i) {
        const std::string t = fmt(tick_format.c_str(), i * step);
        tick_w = std::max(tick_w, te.measure(t, L.small).width);
        L.ticks.emplace_back(i * step, t);
    }
    // The top of the scale gets its own label when the last nice tick is well below it.
    if (L.bar_h * (1.0 - L.ticks.back().first / vmax) > 14.0) {
        const std::string t = fmt("%.3g", vmax);
        tick_w = std::max(tick_w, te.measure(t, L.small).width);
        L.ticks.emplace_back(vmax, t);
    }
    L.legend_y = L.bar_y + L.bar_h + 22;
    const int legend_w = 16 + 6 + std::max(te.measure("exactly 0", L.small).width, te.measure("(masked)", L.small).width);
    const int right_w = 28 + std::max(L.bar_w + 6 + tick_w, legend_w);
    const int right_h = (L.legend_y + 2 * te.measure("Ag", L.small).height + 4) - L.grid_y;

    // Notes under everything: what the colours and cells mean, honestly.
    if (d.block_rows > 1 || d.block_cols > 1) {
        const std::string k = shape_str(d.block_rows, d.block_cols);
        L.notes.push_back("down-sampled " + k + " blocks (mean): each cell is the mean of a " + k + " block of weights; " +
                          shape_str(p.Lq, p.Lk) + " drawn as " + shape_str(d.rows, d.cols) + " cells");
        // An axis of blocks is labelled by start index: say so when tokens were given for it.
        const bool rows_dropped = d.block_rows > 1 && !p.rows_tokens.empty();
        const bool cols_dropped = d.block_cols > 1 && !p.cols_tokens.empty();
        if (rows_dropped || cols_dropped) {
            L.notes.push_back(std::string(rows_dropped && cols_dropped ? "query and key" : rows_dropped ? "query" : "key") +
                              " tokens not drawn: a cell spans several tokens, so that axis shows start indices");
        }
    }
    L.notes.push_back("colour: viridis from 0 to " + fmt("%.4g", vmax) +
                      (o.vmax ? " (set by the caller; larger values get the top colour)" : " (the largest value drawn)") +
                      ";  hatched grey: weight exactly 0 (masked, or underflowed)");
    int notes_w = 0, notes_h = 0;
    for (const auto& n : L.notes) {
        const auto s = te.measure(n, L.small);
        notes_w = std::max(notes_w, s.width);
        notes_h += s.height + 2;
    }
    L.notes_y = L.grid_y + std::max(grid_h, right_h) + 14;
    L.width = std::max({kMargin + grid_w + right_w + kMargin, kMargin + header_w + kMargin, kMargin + notes_w + kMargin});
    L.height = L.notes_y + notes_h + kMargin;
    return L;
}

// ------------------------------------------------------------------------------------------
// Drawing

void set_rgb8(cairo_t* cr, viz::Rgb8 c) { cairo_set_source_rgb(cr, c.r / 255.0, c.g / 255.0, c.b / 255.0); }

// Diagonal hatch lines over the current clip region, in picture coordinates so that
// neighbouring masked cells share one continuous pattern.
void hatch(cairo_t* cr, double x0, double y0, double w, double h) {
    cairo_set_source_rgb(cr, kHatchGrey, kHatchGrey, kHatchGrey);
    cairo_set_line_width(cr, 1.2);
    const double spacing = 6.0;
    for (double s = std::floor((x0 + y0) / spacing) * spacing; s <= x0 + w + y0 + h; s += spacing) {
        cairo_move_to(cr, s - y0 - h, y0 + h);  // the line x + y = s, clipped below
        cairo_line_to(cr, s - y0, y0);
    }
    cairo_stroke(cr);
}

void draw_panel(cairo_t* cr, TextEngine& te, const Layout& L, const viz::Pooled& d, double vmax, std::int64_t panel,
                const std::string& caption, int px, int py, HeatmapPanelGeometry& geo) {
    const int mx = px + L.row_label_w + kLabelGap;
    const int my = py + L.caption_h + L.col_label_h + kLabelGap;
    const int cw = L.cell_w, ch = L.cell_h;
    const int mw = static_cast<int>(L.C) * cw, mh = static_cast<int>(L.R) * ch;
    geo = {mx, my, cw, ch, static_cast<int>(L.R), static_cast<int>(L.C)};

    if (!caption.empty()) te.draw(cr, caption, L.caption, mx + mw / 2.0, py, HAlign::center, VAlign::top, kInk, kInk, kInk);

    // Cells: integer-aligned rectangles, so each is one exact colour in the PNG. A run of
    // same-coloured cells in a row is one rectangle (keeps SVGs of masked triangles small).
    auto colour_of = [&](std::int64_t r, std::int64_t c) -> int {  // 0xRRGGBB, or -1 = masked
        const double v = d.at(panel, r, c);
        if (v == 0.0) return -1;
        const viz::Rgb8 k = viz::viridis8(v / vmax);
        return (k.r << 16) | (k.g << 8) | k.b;
    };
    cairo_set_antialias(cr, CAIRO_ANTIALIAS_NONE);
    bool masked = false;
    for (std::int64_t r = 0; r < L.R; ++r) {
        for (std::int64_t c = 0; c < L.C;) {
            const int colour = colour_of(r, c);
            std::int64_t end = c + 1;
            while (end < L.C && colour_of(r, end) == colour) ++end;
            if (colour < 0) {
                cairo_set_source_rgb(cr, kMaskedGrey, kMaskedGrey, kMaskedGrey);
                masked = true;
            } else {
                cairo_set_source_rgb(cr, (colour >> 16) / 255.0, ((colour >> 8) & 0xff) / 255.0, (colour & 0xff) / 255.0);
            }
            cairo_rectangle(cr, mx + static_cast<double>(c) * cw, my + static_cast<double>(r) * ch,
                            static_cast<double>(end - c) * cw, ch);
            cairo_fill(cr);
            c = end;
        }
    }
    cairo_set_antialias(cr, CAIRO_ANTIALIAS_DEFAULT);
    if (masked) {  // hatch over the masked runs
        cairo_save(cr);
        for (std::int64_t r = 0; r < L.R; ++r) {
            for (std::int64_t c = 0; c < L.C;) {
                std::int64_t end = c + 1;
                if (d.at(panel, r, c) != 0.0) {
                    c = end;
                    continue;
                }
                while (end < L.C && d.at(panel, r, end) == 0.0) ++end;
                cairo_rectangle(cr, mx + static_cast<double>(c) * cw, my + static_cast<double>(r) * ch,
                                static_cast<double>(end - c) * cw, ch);
                c = end;
            }
        }
        cairo_clip(cr);
        hatch(cr, mx, my, mw, mh);
        cairo_restore(cr);
    }
    if (L.annotate) {
        for (std::int64_t r = 0; r < L.R; ++r) {
            for (std::int64_t c = 0; c < L.C; ++c) {
                const double v = d.at(panel, r, c);
                if (v == 0.0) continue;
                const double ink = v / vmax < 0.6 ? 1.0 : 0.0;  // white on dark viridis, black on light
                // Two decimals for weights; large values (dropout's 1/(1−p) scaling, or any
                // non-negative matrix) and a scale whose top is below 0.1 (two decimals read
                // "0.00" on its brightest cells) in three significant digits.
                te.draw(cr, fmt(v < 10.0 && vmax >= 0.1 ? "%.2f" : "%.3g", v), L.value, mx + (c + 0.5) * cw, my + (r + 0.5) * ch, HAlign::center,
                        VAlign::middle, ink, ink, ink);
            }
        }
    }
    // Frame just outside the cells.
    cairo_set_source_rgb(cr, 0.45, 0.45, 0.45);
    cairo_set_line_width(cr, 1.0);
    cairo_rectangle(cr, mx - 0.5, my - 0.5, mw + 1.0, mh + 1.0);
    cairo_stroke(cr);

    // Query labels (rows), right-aligned against the cells; a tick when labels are thinned.
    for (const auto& l : L.rows.labels) {
        const double y = my + (l.cell + 0.5) * ch;
        te.draw(cr, l.text, L.label, mx - kLabelGap, y, HAlign::right, VAlign::middle, kInk, kInk, kInk);
        if (L.rows.step > 1) {
            cairo_move_to(cr, mx - 4, y), cairo_line_to(cr, mx - 1, y);
        }
    }
    // Key labels (columns), horizontal when they fit, else reading upwards from the cells.
    for (const auto& l : L.cols.labels) {
        const double x = mx + (l.cell + 0.5) * cw;
        if (L.cols_rotated) {
            te.draw(cr, l.text, L.label, x, my - kLabelGap, HAlign::left, VAlign::middle, kInk, kInk, kInk, 90.0);
        } else {
            te.draw(cr, l.text, L.label, x, my - kLabelGap, HAlign::center, VAlign::bottom, kInk, kInk, kInk);
        }
        if (L.cols.step > 1) {
            cairo_move_to(cr, x, my - 4), cairo_line_to(cr, x, my - 1);
        }
    }
    cairo_set_source_rgb(cr, 0.45, 0.45, 0.45);
    cairo_stroke(cr);
}

void draw(cairo_t* cr, TextEngine& te, const Layout& L, const Problem& p, const viz::Pooled& d, double vmax,
          HeatmapImage& img) {
    cairo_set_source_rgb(cr, 1, 1, 1);
    cairo_paint(cr);

    int y = L.header_y;
    for (const auto& h : L.header) {
        const double ink = h.is_title ? kInk : kMutedInk;
        te.draw(cr, h.text, h.is_title ? L.title : L.subtitle, L.grid_x, y, HAlign::left, VAlign::top, ink, ink, ink);
        y += h.height;
    }

    img.panels.resize(static_cast<std::size_t>(p.P));
    for (std::int64_t i = 0; i < p.P; ++i) {
        const int gx = static_cast<int>(i % L.grid_cols), gy = static_cast<int>(i / L.grid_cols);
        draw_panel(cr, te, L, d, vmax, i, p.captions.empty() ? std::string() : p.captions[static_cast<std::size_t>(i)],
                   L.grid_x + gx * (L.panel_w + L.panel_gap), L.grid_y + gy * (L.panel_h + L.panel_gap),
                   img.panels[static_cast<std::size_t>(i)]);
    }

    // Colour bar: one exact colour per pixel row, top = vmax.
    cairo_set_antialias(cr, CAIRO_ANTIALIAS_NONE);
    for (int r = 0; r < L.bar_h; ++r) {
        set_rgb8(cr, viz::viridis8(1.0 - (r + 0.5) / L.bar_h));
        cairo_rectangle(cr, L.bar_x, L.bar_y + r, L.bar_w, 1);
        cairo_fill(cr);
    }
    cairo_set_antialias(cr, CAIRO_ANTIALIAS_DEFAULT);
    cairo_set_source_rgb(cr, 0.45, 0.45, 0.45);
    cairo_set_line_width(cr, 1.0);
    cairo_rectangle(cr, L.bar_x - 0.5, L.bar_y - 0.5, L.bar_w + 1.0, L.bar_h + 1.0);
    for (const auto& [v, text] : L.ticks) {
        const double ty = std::round(L.bar_y + L.bar_h * (1.0 - v / vmax)) + 0.5;
        cairo_move_to(cr, L.bar_x + L.bar_w, ty), cairo_line_to(cr, L.bar_x + L.bar_w + 4, ty);
    }
    cairo_stroke(cr);
    for (const auto& [v, text] : L.ticks) {
        const double ty = L.bar_y + L.bar_h * (1.0 - v / vmax);
        te.draw(cr, text, L.small, L.bar_x + L.bar_w + 6, ty, HAlign::left, VAlign::middle, kMutedInk, kMutedInk, kMutedInk);
    }
    te.draw(cr, "weight", L.small, L.bar_x, L.bar_y - 6, HAlign::left, VAlign::bottom, kMutedInk, kMutedInk, kMutedInk);

    // Legend: the masked swatch, drawn exactly as masked cells are.
    const int sx = L.bar_x, sy = L.legend_y, sw = 16;
    cairo_set_antialias(cr, CAIRO_ANTIALIAS_NONE);
    cairo_set_source_rgb(cr, kMaskedGrey, kMaskedGrey, kMaskedGrey);
    cairo_rectangle(cr, sx, sy, sw, sw);
    cairo_fill(cr);
    cairo_set_antialias(cr, CAIRO_ANTIALIAS_DEFAULT);
    cairo_save(cr);
    cairo_rectangle(cr, sx, sy, sw, sw);
    cairo_clip(cr);
    hatch(cr, sx, sy, sw, sw);
    cairo_restore(cr);
    cairo_set_source_rgb(cr, 0.45, 0.45, 0.45);
    cairo_rectangle(cr, sx - 0.5, sy - 0.5, sw + 1.0, sw + 1.0);
    cairo_stroke(cr);
    const int lh = te.measure("Ag", L.small).height;
    te.draw(cr, "exactly 0", L.small, sx + sw + 6, sy, HAlign::left, VAlign::top, kInk, kInk, kInk);
    te.draw(cr, "(masked)", L.small, sx + sw + 6, sy + lh, HAlign::left, VAlign::top, kMutedInk, kMutedInk, kMutedInk);

    y = L.notes_y;
    for (const auto& n : L.notes) {
        te.draw(cr, n, L.small, L.grid_x, y, HAlign::left, VAlign::top, kMutedInk, kMutedInk, kMutedInk);
        y += te.measure(n, L.small).height + 2;
    }
}

// cairo write callback: append to a std::string.
cairo_status_t append(void* closure, const unsigned char* data, unsigned int length) {
    static_cast<std::string*>(closure)->append(reinterpret_cast<const char*>(data), length);
    return CAIRO_STATUS_SUCCESS;
}

void check_cairo(cairo_status_t s, const char* what) {
    if (s != CAIRO_STATUS_SUCCESS) throw Error(std::string("heatmap: ") + what + " failed: " + cairo_status_to_string(s));
}

struct SurfaceDeleter {
    void operator()(cairo_surface_t* s) const { cairo_surface_destroy(s); }
};
struct ContextDeleter {
    void operator()(cairo_t* c) const { cairo_destroy(c); }
};

}  // namespace

bool heatmap_label_ok(const std::string& token) { return viz::is_valid_utf8(token); }

ImageFormat image_format_for_path(const std::string& path) {
    std::string ext = path.size() >= 4 ? path.substr(path.size() - 4) : "";
    for (char& c : ext) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (ext == ".png") return ImageFormat::png;
    if (ext == ".svg") return ImageFormat::svg;
    throw Error("heatmap: output file name must end in .png or .svg but is " + detail::quoted_path(path));
}

// weights: (Lq, Lk) or (P, Lq, Lk) → an encoded PNG or SVG in memory.
HeatmapImage render_heatmap(const TensorView& weights, const HeatmapOptions& options, ImageFormat format) {
    const Problem p = check(weights, options);
    const int grid_cols = p.P == 1 ? 1 : static_cast<int>(std::ceil(std::sqrt(static_cast<double>(p.P))));
    const std::int64_t cap = std::max<std::int64_t>(8, options.max_cells / grid_cols);
    const viz::Pooled d = viz::mean_pool(p.w, viz::block_for(p.Lq, cap), viz::block_for(p.Lk, cap),
                                         ("heatmap: " + options.name).c_str());
    const double vmax = options.vmax ? *options.vmax : (d.max > 0.0 ? d.max : 1.0);

    TextEngine te;
    const Layout L = lay_out(te, p, d, vmax, options);

    HeatmapImage img;
    img.format = format;
    img.width = L.width;
    img.height = L.height;
    img.block_rows = static_cast<int>(d.block_rows);
    img.block_cols = static_cast<int>(d.block_cols);
    img.vmax = vmax;
    std::unique_ptr<cairo_surface_t, SurfaceDeleter> surface;
    if (format == ImageFormat::png) {
        surface.reset(cairo_image_surface_create(CAIRO_FORMAT_RGB24, L.width, L.height));
    } else {
        surface.reset(cairo_svg_surface_create_for_stream(append, &img.bytes, L.width, L.height));
        // Sizes in px (not pt), so an SVG renderer draws it at the PNG's size.
        cairo_svg_surface_set_document_unit(surface.get(), CAIRO_SVG_UNIT_PX);
    }
    check_cairo(cairo_surface_status(surface.get()), "creating the cairo surface");
    {
        std::unique_ptr<cairo_t, ContextDeleter> cr(cairo_create(surface.get()));
        draw(cr.get(), te, L, p, d, vmax, img);
        check_cairo(cairo_status(cr.get()), "drawing");
    }
    if (format == ImageFormat::png) {
        check_cairo(cairo_surface_write_to_png_stream(surface.get(), append, &img.bytes), "PNG encoding");
    } else {
        cairo_surface_finish(surface.get());
        check_cairo(cairo_surface_status(surface.get()), "SVG writing");
    }
    return img;
}

HeatmapImage write_heatmap(const std::string& path, const TensorView& weights, const HeatmapOptions& options) {
    const ImageFormat format = image_format_for_path(path);
    HeatmapImage img = render_heatmap(weights, options, format);
    detail::AtomicFile file(path);
    file.write(img.bytes.data(), img.bytes.size());
    file.commit();
    return img;
}

}  // namespace attn
