// The viridis colour map (table and source in viridis.cpp).
#pragma once

#include <cstdint>

namespace attn::viz {

extern const float (&kViridis)[256][3];  // sRGB in [0, 1], index 0 = lowest value

struct Rgb8 {
    std::uint8_t r, g, b;
};

// t in [0, 1] (clamped) → the nearest of the 256 entries, rounded to 8 bits per channel.
inline Rgb8 viridis8(double t) {
    if (!(t > 0.0)) t = 0.0;  // also maps NaN to 0; callers never pass NaN
    if (t > 1.0) t = 1.0;
    const int i = static_cast<int>(t * 255.0 + 0.5);
    auto q = [](float c) { return static_cast<std::uint8_t>(c * 255.0f + 0.5f); };
    return {q(kViridis[i][0]), q(kViridis[i][1]), q(kViridis[i][2])};
}

}  // namespace attn::viz
