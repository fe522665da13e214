// Uses the installed attn::dist: ring attention on one rank equals attn::sdpa.
#include <attn/ring.hpp>
#include <attn/sdpa.hpp>

#include <cmath>
#include <cstdio>

int main(int argc, char** argv) {
    MPI_Init(&argc, &argv);
    const std::int64_t L = 8, D = 4;
    attn::Tensor q(attn::DType::f32, {1, 1, L, D}), out(attn::DType::f32, {1, 1, L, D}), ref(attn::DType::f32, {1, 1, L, D});
    for (std::int64_t i = 0; i < L * D; ++i) q.data_as<float>()[i] = std::sin(0.3f * static_cast<float>(i));
    attn::dist::RingOptions ro;
    ro.causal = attn::Causal::top_left;
    attn::dist::ring_attention(MPI_COMM_WORLD, q, q, q, ro, out);
    attn::SdpaOptions so;
    so.causal = attn::Causal::top_left;
    attn::sdpa(q, q, q, so, ref);
    float worst = 0;
    for (std::int64_t i = 0; i < L * D; ++i) {
        worst = std::fmax(worst, std::fabs(out.data_as<float>()[i] - ref.data_as<float>()[i]));
    }
    MPI_Finalize();
    if (!(worst <= 1e-6f)) {
        std::printf("consumer_ring: differs from sdpa by %g\n", worst);
        return 1;
    }
    std::printf("consumer_ring: ok\n");
    return 0;
}
