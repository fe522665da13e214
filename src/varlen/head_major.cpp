// Head-major K/V copies for sdpa_varlen (head_major.hpp explains why).
#include "head_major.hpp"

#include <omp.h>

#include <algorithm>
#include <cstring>

#include "attn/threads.hpp"

namespace attn::detail {
namespace {

// A key tile is reused by every query block that sees it: with fewer than this many queries
// (and keys) the copy costs about as much as it saves.
constexpr std::int64_t kMinRows = 256;

bool strided_f32(const TensorView& t) {
    return t.dtype() == DType::f32 && t.stride(3) == 1 && t.stride(2) != t.dim(3);
}

}  // namespace

bool head_major_pays(const SdpaProblem& p) {
    return p.paged == nullptr && p.B == 1 && p.Lq >= kMinRows && p.Lk >= kMinRows && strided_f32(p.k) &&
           strided_f32(p.v);
}

void HeadMajorScratch::reserve(const SdpaProblem& p) {
    // No overflow: these elements already exist in the packed K and V.
    need = std::max(need, p.Hkv * p.Lk * (p.Dk + p.Dv));
}

SdpaProblem head_major_kv(const SdpaProblem& p, HeadMajorScratch& scratch) {
    const std::int64_t H = p.Hkv, L = p.Lk;
    // No overflow: nk + nv elements already exist in the packed K and V.
    const std::int64_t nk = H * L * p.Dk, nv = H * L * p.Dv, need = nk + nv;
    scratch.reserve(p);
    if (scratch.buf.data() == nullptr || scratch.buf.numel() < need) {
        scratch.buf = Tensor();  // free first: never two buffers at once
        scratch.buf = Tensor(DType::f32, Shape{scratch.need}, false, "sdpa_varlen head-major K/V");
    }
    float* kd = scratch.buf.data_as<float>();
    float* vd = kd + nk;
    const float* ks = p.k.data_as<const float>();
    const float* vs = p.v.data_as<const float>();
    const std::int64_t rows = H * L;
#pragma omp parallel for schedule(static) num_threads(num_threads()) if (rows >= 1024)
    for (std::int64_t r = 0; r < rows; ++r) {
        const std::int64_t h = r / L, j = r % L;
        std::memcpy(kd + r * p.Dk, ks + p.k.offset(0, h, j, 0), sizeof(float) * static_cast<std::size_t>(p.Dk));
        std::memcpy(vd + r * p.Dv, vs + p.v.offset(0, h, j, 0), sizeof(float) * static_cast<std::size_t>(p.Dv));
    }
    SdpaProblem hm = p;
    hm.k = TensorView(kd, DType::f32, Shape{1, H, L, p.Dk}, Strides{nk, L * p.Dk, p.Dk, 1});
    hm.v = TensorView(vd, DType::f32, Shape{1, H, L, p.Dv}, Strides{nv, L * p.Dv, p.Dv, 1});
    return hm;
}

}  // namespace attn::detail
