// Uses the installed attn: one causal attention whose answer is known by hand.
//   q = [1, 1], k = [0, ln 3], v = [4, 8], Dk = Dv = 1, scale 1/sqrt(1) = 1, causal top-left:
//   query 0 sees key 0 only → 4;  query 1 weights e^0 : e^(ln 3) = 1/4 : 3/4 → 1 + 6 = 7.
#include <attn/error.hpp>
#include <attn/sdpa.hpp>
#include <attn/version.hpp>

#include <cmath>
#include <cstdio>

int main() {
    float q[2] = {1.0f, 1.0f};
    float k[2] = {0.0f, static_cast<float>(std::log(3.0))};
    float v[2] = {4.0f, 8.0f};
    float out[2] = {NAN, NAN};
    const attn::Shape s{1, 1, 2, 1};
    attn::SdpaOptions opt;
    opt.causal = attn::Causal::top_left;
    attn::sdpa(attn::TensorView(q, attn::DType::f32, s), attn::TensorView(k, attn::DType::f32, s),
               attn::TensorView(v, attn::DType::f32, s), opt, attn::TensorView(out, attn::DType::f32, s));
    if (std::fabs(out[0] - 4.0f) > 1e-6f || std::fabs(out[1] - 7.0f) > 1e-5f) {
        std::printf("consumer: wrong result %g %g (expected 4 7)\n", out[0], out[1]);
        return 1;
    }
    try {  // errors cross the library boundary as attn::Error
        attn::sdpa(attn::TensorView(q, attn::DType::f32, attn::Shape{2}), attn::TensorView(k, attn::DType::f32, s),
                   attn::TensorView(v, attn::DType::f32, s), opt, attn::TensorView(out, attn::DType::f32, s));
        std::printf("consumer: expected attn::Error\n");
        return 1;
    } catch (const attn::Error&) {
    }
    std::printf("consumer: attn %s ok\n", attn::kVersion);
    return 0;
}
