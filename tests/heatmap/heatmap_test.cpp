// attn::viz heatmaps: the pooling arithmetic against hand-computed means, and the pictures
// decoded with a real PNG decoder (cairo's, which is libpng) — sizes, and the colour of every
// cell of known patterns against viridis' published endpoint colours #440154 (0) and
// #FDE725 (1), not against the code's own table.
#include <cairo.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "attn/error.hpp"
#include "attn/heatmap.hpp"
#include "viz/pool.hpp"

namespace attn {
namespace {

struct Rgb {
    int r, g, b;
};
constexpr Rgb kViridis0{0x44, 0x01, 0x54};  // viridis at 0, as published
constexpr Rgb kViridis1{0xFD, 0xE7, 0x25};  // viridis at 1

// A decoded PNG (cairo's reader), RGB per pixel.
class Decoded {
public:
    explicit Decoded(const std::string& png) : bytes_(png) {
        surface_ = cairo_image_surface_create_from_png_stream(&Decoded::read, this);
    }
    ~Decoded() { cairo_surface_destroy(surface_); }
    bool ok() const { return cairo_surface_status(surface_) == CAIRO_STATUS_SUCCESS; }
    int width() const { return cairo_image_surface_get_width(surface_); }
    int height() const { return cairo_image_surface_get_height(surface_); }
    Rgb at(int x, int y) const {
        cairo_surface_flush(surface_);
        const unsigned char* row = cairo_image_surface_get_data(surface_) + y * cairo_image_surface_get_stride(surface_);
        std::uint32_t px;
        std::memcpy(&px, row + 4 * x, 4);  // native-endian 0xAARRGGBB (opaque image)
        return {static_cast<int>((px >> 16) & 0xff), static_cast<int>((px >> 8) & 0xff), static_cast<int>(px & 0xff)};
    }

private:
    static cairo_status_t read(void* closure, unsigned char* data, unsigned int length) {
        auto* self = static_cast<Decoded*>(closure);
        if (self->pos_ + length > self->bytes_.size()) return CAIRO_STATUS_READ_ERROR;
        std::memcpy(data, self->bytes_.data() + self->pos_, length);
        self->pos_ += length;
        return CAIRO_STATUS_SUCCESS;
    }
    std::string bytes_;
    std::size_t pos_ = 0;
    cairo_surface_t* surface_ = nullptr;
};

bool near(Rgb a, Rgb b, int tol = 1) {
    return std::abs(a.r - b.r) <= tol && std::abs(a.g - b.g) <= tol && std::abs(a.b - b.b) <= tol;
}
bool grey(Rgb a) { return a.r == a.g && a.g == a.b && a.r > 100 && a.r < 240; }
std::string str(Rgb a) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "#%02X%02X%02X", a.r, a.g, a.b);
    return buf;
}

// Every pixel of cell (r, c) of panel p satisfies `pred`.
template <class Pred>
void expect_cell(const Decoded& img, const HeatmapPanelGeometry& g, int r, int c, Pred pred, const std::string& what) {
    for (int y = g.y + r * g.cell_h; y < g.y + (r + 1) * g.cell_h; ++y) {
        for (int x = g.x + c * g.cell_w; x < g.x + (c + 1) * g.cell_w; ++x) {
            const Rgb px = img.at(x, y);
            if (!pred(px)) {
                ADD_FAILURE() << "cell (" << r << ", " << c << ") pixel (" << x << ", " << y << ") is " << str(px) << ", expected " << what;
                return;
            }
        }
    }
}

Tensor matrix(std::int64_t rows, std::int64_t cols, double fill) {
    Tensor t(DType::f32, Shape{rows, cols});
    for (std::int64_t i = 0; i < rows * cols; ++i) t.data_as<float>()[i] = static_cast<float>(fill);
    return t;
}

TEST(HeatmapPool, BlockSize) {
    EXPECT_EQ(viz::block_for(5, 256), 1);
    EXPECT_EQ(viz::block_for(256, 256), 1);
    EXPECT_EQ(viz::block_for(257, 256), 2);
    EXPECT_EQ(viz::block_for(2048, 256), 8);
    EXPECT_EQ(viz::block_for(1000, 256), 4);
}

TEST(HeatmapPool, MeansOfBlocksIncludingPartialEdges) {
    // 3×5 weights, k = 2 → 2×3 cells; the last row and column blocks are partial.
    const float w[15] = {1, 2, 3, 4, 5,  //
                         6, 7, 8, 9, 10,  //
                         11, 12, 13, 14, 15};
    Tensor t(DType::f32, Shape{1, 3, 5});
    std::memcpy(t.data(), w, sizeof w);
    const viz::Pooled p = viz::mean_pool(t, 2, 2, "w");
    ASSERT_EQ(p.rows, 2);
    ASSERT_EQ(p.cols, 3);
    const double want[2][3] = {{(1 + 2 + 6 + 7) / 4.0, (3 + 4 + 8 + 9) / 4.0, (5 + 10) / 2.0},
                               {(11 + 12) / 2.0, (13 + 14) / 2.0, 15.0}};
    for (int r = 0; r < 2; ++r)
        for (int c = 0; c < 3; ++c) EXPECT_DOUBLE_EQ(p.at(0, r, c), want[r][c]) << r << "," << c;
    EXPECT_DOUBLE_EQ(p.max, 15.0);
    EXPECT_FALSE(p.any_masked);
}

// Finite weights near DBL_MAX: each block's mean is finite (their double sum overflowed to inf,
// and a picture of them crashed on the infinite scale; an exploratory test found it).
TEST(HeatmapPool, MeansOfHugeFiniteWeightsStayFinite) {
    Tensor t(DType::f64, Shape{1, 6, 6});
    for (std::int64_t i = 0; i < t.numel(); ++i) t.data_as<double>()[i] = 4e307;
    const viz::Pooled p = viz::mean_pool(t, 3, 3, "w");
    for (int r = 0; r < 2; ++r)
        for (int c = 0; c < 2; ++c) EXPECT_DOUBLE_EQ(p.at(0, r, c), 4e307) << r << "," << c;
    EXPECT_DOUBLE_EQ(p.max, 4e307);
    Tensor big(DType::f64, Shape{600, 600});  // past max_cells: drawn as block means
    for (std::int64_t i = 0; i < big.numel(); ++i) big.data_as<double>()[i] = 4e307;
    EXPECT_NO_THROW(render_heatmap(big, {}, ImageFormat::png));
}

TEST(HeatmapPool, MaskedSurvivesOnlyWhenTheWholeBlockIsZero) {
    Tensor t(DType::f64, Shape{1, 4, 4}, true);
    t.data_as<double>()[0 * 4 + 2] = 1e-30;  // one tiny weight in the top-right block
    const viz::Pooled p = viz::mean_pool(t, 2, 2, "w");
    EXPECT_EQ(p.at(0, 0, 0), 0.0);
    EXPECT_GT(p.at(0, 0, 1), 0.0);
    EXPECT_TRUE(p.any_masked);
}

TEST(HeatmapPool, RejectsNegativeAndNonFiniteWeights) {
    for (double bad : {-0.25, std::nan(""), static_cast<double>(INFINITY)}) {
        Tensor t(DType::f64, Shape{2, 3, 3}, true);
        t.data_as<double>()[9 + 3 * 2 + 1] = bad;
        try {
            viz::mean_pool(t, 1, 1, "heatmap: weights");
            ADD_FAILURE() << "no error for " << bad;
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find("element (1, 2, 1)"), std::string::npos) << e.what();
        }
    }
}

// Identity plus a tiny epsilon elsewhere: diagonal cells are the top colour, the others the
// bottom colour (eps / max ≈ 0), none masked.
TEST(HeatmapPng, IdentityPatternHasViridisEndpointColours) {
    const int L = 7;
    Tensor w = matrix(L, L, 1e-6);
    for (int i = 0; i < L; ++i) w.data_as<float>()[i * L + i] = 1.0f;
    HeatmapOptions o;
    o.key_tokens = {"一只", "蓝色", "怪兽", "走进", "森林", "a", "b"};
    const HeatmapImage img = render_heatmap(w, o, ImageFormat::png);
    const Decoded png(img.bytes);
    ASSERT_TRUE(png.ok());
    EXPECT_EQ(png.width(), img.width);
    EXPECT_EQ(png.height(), img.height);
    EXPECT_GT(img.width, 7 * 20);
    ASSERT_EQ(img.panels.size(), 1u);
    const HeatmapPanelGeometry& g = img.panels[0];
    EXPECT_EQ(g.rows, L);
    EXPECT_EQ(g.cols, L);
    EXPECT_EQ(img.block_rows, 1);
    EXPECT_EQ(img.block_cols, 1);
    for (int r = 0; r < L; ++r) {
        for (int c = 0; c < L; ++c) {
            // The top-left 3×3 pixels of a cell: clear of the value printed at its centre.
            const Rgb px = png.at(g.x + c * g.cell_w + 1, g.y + r * g.cell_h + 1);
            const Rgb px2 = png.at(g.x + c * g.cell_w + 3, g.y + r * g.cell_h + 3);
            const Rgb want = r == c ? kViridis1 : kViridis0;
            EXPECT_TRUE(near(px, want) && near(px2, want)) << "cell (" << r << ", " << c << ") is " << str(px) << ", expected " << str(want);
        }
    }
    // Just outside the cells: not a cell colour (frame or background).
    EXPECT_FALSE(near(png.at(g.x - 3, g.y + 2), kViridis0, 20));
}

// One hot column: every query puts all its weight on key 2; the other weights are exactly 0,
// so they are masked: hatched grey, never a viridis colour.
TEST(HeatmapPng, OneHotColumnIsTopColourAndTheRestMaskedGrey) {
    const int Lq = 4, Lk = 6, hot = 2;
    Tensor w = matrix(Lq, Lk, 0.0);
    for (int i = 0; i < Lq; ++i) w.data_as<float>()[i * Lk + hot] = 1.0f;
    HeatmapOptions o;
    o.annotate = false;  // whole cells are then one colour (or hatch) edge to edge
    const HeatmapImage img = render_heatmap(w, o, ImageFormat::png);
    const Decoded png(img.bytes);
    ASSERT_TRUE(png.ok());
    const HeatmapPanelGeometry& g = img.panels[0];
    ASSERT_EQ(g.rows, Lq);
    ASSERT_EQ(g.cols, Lk);
    std::set<int> greys;
    for (int r = 0; r < Lq; ++r) {
        for (int c = 0; c < Lk; ++c) {
            if (c == hot) {
                expect_cell(png, g, r, c, [](Rgb p) { return near(p, kViridis1); }, "#FDE725");
            } else {
                expect_cell(png, g, r, c, [](Rgb p) { return grey(p); }, "a neutral grey");
                for (int d = 0; d < g.cell_w; ++d) greys.insert(png.at(g.x + c * g.cell_w + d, g.y + r * g.cell_h + g.cell_h / 2).r);
            }
        }
    }
    EXPECT_GE(greys.size(), 2u) << "masked cells should be hatched (two greys)";
}

TEST(HeatmapPng, VmaxSetsTheTopColour) {
    Tensor w = matrix(3, 3, 0.5);
    HeatmapOptions o;
    o.vmax = 0.5;
    HeatmapImage img = render_heatmap(w, o, ImageFormat::png);
    Decoded a(img.bytes);
    EXPECT_TRUE(near(a.at(img.panels[0].x + 1, img.panels[0].y + 1), kViridis1));
    o.vmax = 1e9;  // 0.5 is then ≈ the bottom of the scale
    img = render_heatmap(w, o, ImageFormat::png);
    Decoded b(img.bytes);
    EXPECT_TRUE(near(b.at(img.panels[0].x + 1, img.panels[0].y + 1), kViridis0));
}

// Strided input (a transposed view): the picture is of the view, not of the buffer.
TEST(HeatmapPng, ReadsStridedViews) {
    Tensor w = matrix(3, 5, 1e-6);
    w.data_as<float>()[0 * 5 + 4] = 1.0f;  // (0, 4) in the buffer → (4, 0) in the transpose
    const HeatmapImage img = render_heatmap(w.view().transpose(0, 1), HeatmapOptions{}, ImageFormat::png);
    const Decoded png(img.bytes);
    const auto& g = img.panels[0];
    ASSERT_EQ(g.rows, 5);
    ASSERT_EQ(g.cols, 3);
    EXPECT_TRUE(near(png.at(g.x + 0 * g.cell_w + 1, g.y + 4 * g.cell_h + 1), kViridis1));
    EXPECT_TRUE(near(png.at(g.x + 2 * g.cell_w + 1, g.y + 0 * g.cell_h + 1), kViridis0));
}

// Several panels: a grid sharing one scale; panel p has its hot key at column p.
TEST(HeatmapPng, SmallMultiplesOnePanelPerHead) {
    const int P = 5, L = 6;
    Tensor w(DType::f64, Shape{P, L, L});
    for (int p = 0; p < P; ++p)
        for (int i = 0; i < L; ++i)
            for (int j = 0; j < L; ++j) w.data_as<double>()[(p * L + i) * L + j] = j == p ? 0.5 : 1e-9;
    HeatmapOptions o;
    o.annotate = false;
    const HeatmapImage img = render_heatmap(w, o, ImageFormat::png);
    const Decoded png(img.bytes);
    ASSERT_TRUE(png.ok());
    ASSERT_EQ(img.panels.size(), static_cast<std::size_t>(P));
    std::set<std::pair<int, int>> origins;
    for (int p = 0; p < P; ++p) {
        const auto& g = img.panels[static_cast<std::size_t>(p)];
        origins.insert({g.x, g.y});
        for (int c = 0; c < L; ++c) {
            const Rgb want = c == p ? kViridis1 : kViridis0;  // shared scale: 0.5 is the top
            expect_cell(png, g, 3, c, [&](Rgb px) { return near(px, want); }, str(want));
        }
    }
    EXPECT_EQ(origins.size(), static_cast<std::size_t>(P)) << "panels overlap";
}

// L = 1000: mean of 4×4 blocks, 250 cells a side. Blocks built so that mean-pooling (not
// max-pooling) is visible: one block holds a single 0.8 among zeros (mean 0.05), another is
// 0.05 everywhere — the same colour; a block of 0.8s is the top colour.
TEST(HeatmapPng, LargeMatricesAreMeanPooled) {
    const int L = 1000;
    Tensor w(DType::f32, Shape{L, L}, true);
    float* d = w.data_as<float>();
    d[0 * L + 0] = 0.8f;  // block (0, 0): one 0.8 → mean 0.05
    for (int i = 4; i < 8; ++i)
        for (int j = 0; j < 4; ++j) d[i * L + j] = 0.05f;  // block (1, 0): mean 0.05
    for (int i = 8; i < 12; ++i)
        for (int j = 8; j < 12; ++j) d[i * L + j] = 0.8f;  // block (2, 2): mean 0.8 = max
    HeatmapOptions o;
    const HeatmapImage img = render_heatmap(w, o, ImageFormat::png);
    EXPECT_EQ(img.block_rows, 4);
    EXPECT_EQ(img.block_cols, 4);
    const auto& g = img.panels[0];
    EXPECT_EQ(g.rows, 250);
    EXPECT_EQ(g.cols, 250);
    const Decoded png(img.bytes);
    ASSERT_TRUE(png.ok());
    EXPECT_LE(png.width(), 1400);
    const Rgb a = png.at(g.x + 0 * g.cell_w, g.y + 0 * g.cell_h), b = png.at(g.x + 0 * g.cell_w, g.y + 1 * g.cell_h);
    EXPECT_TRUE(near(a, b, 0)) << str(a) << " vs " << str(b);
    EXPECT_FALSE(grey(a));
    EXPECT_TRUE(near(png.at(g.x + 2 * g.cell_w, g.y + 2 * g.cell_h), kViridis1));
    EXPECT_TRUE(grey(png.at(g.x + 100 * g.cell_w, g.y + 3 * g.cell_h)));  // an all-zero block
}

TEST(HeatmapSvg, IsAnSvgDocumentInPixels) {
    Tensor w = matrix(4, 4, 0.25);
    HeatmapOptions o;
    o.key_tokens = {"一只", "蓝色", "<&>", "\"q\""};  // markup characters must come out escaped (as glyphs)
    const HeatmapImage img = render_heatmap(w, o, ImageFormat::svg);
    EXPECT_EQ(img.bytes.rfind("<?xml", 0), 0u);
    EXPECT_NE(img.bytes.find("<svg"), std::string::npos);
    EXPECT_NE(img.bytes.find("width=\"" + std::to_string(img.width) + "px\""), std::string::npos);
    EXPECT_NE(img.bytes.find("</svg>"), std::string::npos);
}

void expect_error(const TensorView& w, const HeatmapOptions& o, const std::string& needle) {
    try {
        render_heatmap(w, o, ImageFormat::png);
        ADD_FAILURE() << "expected an error containing '" << needle << "'";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
}

TEST(HeatmapErrors, NameTheArgument) {
    Tensor w = matrix(3, 4, 0.25);
    HeatmapOptions o;
    expect_error(Tensor(DType::f32, Shape{12}), o, "(Lq, Lk) or (P, Lq, Lk) but have shape (12,)");
    expect_error(Tensor(DType::f32, Shape{1, 1, 3, 4}), o, "(1, 1, 3, 4)");
    expect_error(Tensor(DType::f32, Shape{0, 4}), o, "must not be empty");
    expect_error(Tensor(DType::i32, Shape{3, 4}), o, "floating type but hold int32");
    o.key_tokens = {"a", "b", "c"};
    expect_error(w, o, "key_tokens has 3 labels but the weights have Lk (columns) = 4");
    o = {};
    o.query_tokens = {"a", "b"};
    expect_error(w, o, "query_tokens has 2 labels but the weights have Lq (rows) = 3");
    o = {};
    o.key_tokens = {"a", "b", "\xff\xfe", "d"};
    expect_error(w, o, "key_tokens[2] is not valid UTF-8");
    o = {};
    o.vmax = 0.0;
    expect_error(w, o, "vmax must be a finite number > 0");
    o = {};
    o.panel_titles = {"x", "y"};
    expect_error(w, o, "panel_titles has 2 labels but the weights have P (panels) = 1");
    o = {};
    expect_error(Tensor(DType::f32, Shape{300, 2, 2}, true), o, "at most 256 panels");
    // Unbounded, max_cells made PNG fail in cairo ("invalid value") and SVG millions of px wide.
    o.max_cells = 1;
    expect_error(w, o, "heatmap: max_cells must be from 2 to 4096 but is 1");
    o.max_cells = kHeatmapMaxCells + 1;
    expect_error(w, o, "heatmap: max_cells must be from 2 to 4096 but is 4097");
}

TEST(HeatmapFile, WritesAtomicallyAndOnlyOnSuccess) {
    char dir_template[] = "/tmp/attn-heatmap-test-XXXXXX";
    ASSERT_NE(::mkdtemp(dir_template), nullptr);
    const std::string dir = dir_template;
    Tensor w = matrix(3, 3, 0.3);
    const HeatmapImage img = write_heatmap(dir + "/a.png", w, HeatmapOptions{});
    std::ifstream in(dir + "/a.png", std::ios::binary);
    const std::string on_disk((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_EQ(on_disk, img.bytes);
    EXPECT_EQ(on_disk.substr(1, 3), "PNG");

    EXPECT_THROW(write_heatmap(dir + "/b.jpg", w, HeatmapOptions{}), Error);
    EXPECT_THROW(write_heatmap(dir + "/missing/c.png", w, HeatmapOptions{}), Error);
    HeatmapOptions bad;
    bad.key_tokens = {"only one"};
    EXPECT_THROW(write_heatmap(dir + "/d.svg", w, bad), Error);
    for (const char* name : {"b.jpg", "d.svg"}) EXPECT_NE(::access((dir + "/" + name).c_str(), F_OK), 0) << name;
    // Nothing else (no temporary) was left behind: only a.png.
    EXPECT_EQ(std::system(("test \"$(ls -A " + dir + ")\" = a.png").c_str()), 0);
    (void)std::system(("rm -rf " + dir).c_str());
}

}  // namespace
}  // namespace attn
