#include "text.hpp"

#include <cmath>
#include <cstdio>

#include "attn/error.hpp"

namespace attn::viz {

namespace {
// First family that has a glyph wins, per character: Noto Sans CJK SC covers CJK and Latin;
// DejaVu Sans and the generic sans-serif catch everything else fontconfig knows.
constexpr const char* kFamilies = "Noto Sans CJK SC,DejaVu Sans,sans-serif";
}  // namespace

TextEngine::TextEngine() {
    PangoFontMap* map = pango_cairo_font_map_get_default();  // owned by pango
    context_ = pango_font_map_create_context(map);
    if (context_ == nullptr) throw Error("heatmap: pango could not create a text context");
    cairo_font_options_t* options = cairo_font_options_create();
    cairo_font_options_set_hint_metrics(options, CAIRO_HINT_METRICS_OFF);
    cairo_font_options_set_hint_style(options, CAIRO_HINT_STYLE_SLIGHT);
    cairo_font_options_set_antialias(options, CAIRO_ANTIALIAS_GRAY);
    pango_cairo_context_set_font_options(context_, options);
    cairo_font_options_destroy(options);
    layout_ = pango_layout_new(context_);
    font_ = pango_font_description_from_string(kFamilies);
    pango_layout_set_single_paragraph_mode(layout_, TRUE);
}

TextEngine::~TextEngine() {
    if (font_ != nullptr) pango_font_description_free(font_);
    if (layout_ != nullptr) g_object_unref(layout_);
    if (context_ != nullptr) g_object_unref(context_);
}

PangoLayout* TextEngine::layout_for(const std::string& text, const TextStyle& style) {
    pango_font_description_set_absolute_size(font_, style.px * PANGO_SCALE);
    pango_font_description_set_weight(font_, style.bold ? PANGO_WEIGHT_BOLD : PANGO_WEIGHT_NORMAL);
    pango_layout_set_font_description(layout_, font_);
    if (style.max_width > 0) {
        pango_layout_set_width(layout_, style.max_width * PANGO_SCALE);
        pango_layout_set_ellipsize(layout_, PANGO_ELLIPSIZE_END);
    } else {
        pango_layout_set_width(layout_, -1);
        pango_layout_set_ellipsize(layout_, PANGO_ELLIPSIZE_NONE);
    }
    // Pango measures in int units of 1/1024 px: a text wider than ~2·10^6 px (a 700 000
    // character token) overflowed them and was drawn across the cells instead of ellipsized.
    // No label of a picture needs more than kMaxTextBytes; a longer one is cut at a character
    // boundary and ends in "…".
    constexpr std::size_t kMaxTextBytes = 4096;
    if (text.size() > kMaxTextBytes) {
        const char* cut = g_utf8_find_prev_char(text.c_str(), text.c_str() + kMaxTextBytes + 1);
        std::string shortened(text.c_str(), cut != nullptr ? cut : text.c_str() + kMaxTextBytes);
        shortened += "\xe2\x80\xa6";  // …
        pango_layout_set_text(layout_, shortened.c_str(), static_cast<int>(shortened.size()));
    } else {
        pango_layout_set_text(layout_, text.c_str(), static_cast<int>(text.size()));
    }
    return layout_;
}

TextSize TextEngine::measure(const std::string& text, const TextStyle& style) {
    PangoRectangle logical;
    pango_layout_get_pixel_extents(layout_for(text, style), nullptr, &logical);
    return {logical.width, logical.height};
}

void TextEngine::draw(cairo_t* cr, const std::string& text, const TextStyle& style, double x, double y, HAlign h,
                      VAlign v, double r, double g, double b, double angle_deg) {
    PangoLayout* layout = layout_for(text, style);
    PangoRectangle logical;
    pango_layout_get_pixel_extents(layout, nullptr, &logical);
    const double dx = h == HAlign::left ? 0.0 : h == HAlign::center ? -logical.width / 2.0 : -logical.width;
    const double dy = v == VAlign::top ? 0.0 : v == VAlign::middle ? -logical.height / 2.0 : -logical.height;
    cairo_save(cr);
    cairo_translate(cr, x, y);
    if (angle_deg != 0.0) cairo_rotate(cr, -angle_deg * M_PI / 180.0);
    cairo_move_to(cr, dx - logical.x, dy - logical.y);
    cairo_set_source_rgb(cr, r, g, b);
    pango_cairo_update_layout(cr, layout);
    pango_cairo_show_layout(cr, layout);
    cairo_restore(cr);
}

std::string printable_token(const std::string& token) {
    std::string out;
    for (unsigned char c : token) {
        if (c == '\n') out += "\\n";
        else if (c == '\t') out += "\\t";
        else if (c == '\r') out += "\\r";
        else if (c < 0x20 || c == 0x7f) {
            char buf[8];
            std::snprintf(buf, sizeof buf, "\\x%02x", c);
            out += buf;
        } else out += static_cast<char>(c);
    }
    return out;
}

bool is_valid_utf8(const std::string& s) {
    return g_utf8_validate(s.data(), static_cast<gssize>(s.size()), nullptr) != 0;
}

}  // namespace attn::viz
