// Text for the heatmap through pango + fontconfig, so any script renders with the fonts
// the system has (Noto CJK for Chinese/Japanese/Korean tokens, DejaVu for the rest), with
// per-character fallback — which cairo's own "toy" text API does not do.
//
// Metrics hinting is off, so text measured on one surface (the layout pass) has exactly the
// same size when drawn on another (PNG or SVG).
#pragma once

#include <cairo.h>
#include <pango/pangocairo.h>

#include <string>

namespace attn::viz {

struct TextStyle {
    double px = 13.0;       // font size in pixels
    bool bold = false;
    int max_width = -1;     // > 0: ellipsize ("…") beyond this many pixels
};

struct TextSize {
    int width = 0, height = 0;  // logical extents in pixels, rounded up
};

enum class HAlign { left, center, right };
enum class VAlign { top, middle, bottom };

class TextEngine {
public:
    TextEngine();
    ~TextEngine();
    TextEngine(const TextEngine&) = delete;
    TextEngine& operator=(const TextEngine&) = delete;

    TextSize measure(const std::string& text, const TextStyle& style);

    // Draws `text` so that its box is aligned to (x, y) as asked. angle_deg rotates the box
    // counter-clockwise about (x, y) (90 = reading upwards).
    void draw(cairo_t* cr, const std::string& text, const TextStyle& style, double x, double y, HAlign h, VAlign v,
              double r, double g, double b, double angle_deg = 0.0);

private:
    PangoLayout* layout_for(const std::string& text, const TextStyle& style);

    PangoContext* context_ = nullptr;
    PangoLayout* layout_ = nullptr;
    PangoFontDescription* font_ = nullptr;
};

// The label shown for a token: control characters become visible escapes ("\n" for a
// newline token), so a tokenizer's whitespace tokens stay one line and readable.
std::string printable_token(const std::string& token);

// True when `s` is valid UTF-8 (pango needs it).
bool is_valid_utf8(const std::string& s);

}  // namespace attn::viz
