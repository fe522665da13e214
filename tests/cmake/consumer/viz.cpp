// Uses the installed attn::viz: a 2×3 weights matrix drawn to memory as a PNG.
#include <attn/heatmap.hpp>

#include <cstdio>
#include <cstring>

int main() {
    float w[6] = {1.0f, 0.0f, 0.0f, 0.25f, 0.75f, 0.0f};
    attn::HeatmapOptions opt;
    opt.key_tokens = {"a", "b", "c"};
    const attn::HeatmapImage img =
        attn::render_heatmap(attn::TensorView(w, attn::DType::f32, attn::Shape{2, 3}), opt, attn::ImageFormat::png);
    if (img.bytes.size() < 8 || std::memcmp(img.bytes.data(), "\x89PNG", 4) != 0 || img.width <= 0) {
        std::printf("consumer_viz: not a PNG\n");
        return 1;
    }
    std::printf("consumer_viz: png %dx%d ok\n", img.width, img.height);
    return 0;
}
