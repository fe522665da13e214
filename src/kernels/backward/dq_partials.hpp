// dQ with several chunks per (b, KV head): the chunks' partials (DqPartials) and their sum in
// chunk order (sum_dq_row).
// A part of the backward driver: only flash_backward.cpp includes it, and like the rest of the
// driver it has internal linkage (anonymous namespace).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "../../core/allocate.hpp"
#include "../../core/element_io.hpp"
#include "backward_plan.hpp"

#ifndef ATTN_BACKWARD_DRIVER
#error "include dq_partials.hpp from flash_backward.cpp only"
#endif

namespace attn::detail {
namespace {

// The dQ partials of a several-chunk call (B·Hkv < 8 on up to 2 CPUs), on the calling thread
// and kept for its next call as the tasks' buffers are, unless larger than 32 MiB: allocated per
// call they put page faults on every call (~8 % of a call's samples: kernels-lab.md#bwd-1). On
// 64-byte lines (the tiles' zmm loads and stores of dQ rows; a 16-byte-aligned `new float[]`
// split them) and, from 2 MiB, on advised huge pages (allocate_streamed). Contents undefined:
// the call zeroes them.
class DqPartials {
public:
    explicit DqPartials(std::size_t floats) {
        if (floats == 0) return;
        if (kept_.floats < floats) {
            kept_.release();
            kept_.p = static_cast<float*>(allocate_streamed(static_cast<std::int64_t>(sizeof(float) * floats),
                                                            "the flash backward's dQ partials (one per chunk of key blocks)"));
            kept_.floats = floats;
        }
        data_ = kept_.p;
    }
    ~DqPartials() {
        if (kept_.floats > kKeepFloats) kept_.release();
    }
    DqPartials(const DqPartials&) = delete;
    DqPartials& operator=(const DqPartials&) = delete;
    float* data() const { return data_; }

private:
    static constexpr std::size_t kKeepFloats = (std::size_t{32} << 20) / sizeof(float);
    struct Buffer {
        float* p = nullptr;
        std::size_t floats = 0;
        void release() {
            std::free(p);
            p = nullptr;
            floats = 0;
        }
        ~Buffer() { std::free(p); }
    };
    static thread_local Buffer kept_;
    float* data_ = nullptr;
};
thread_local DqPartials::Buffer DqPartials::kept_;

// dQ row r (b·Hq·Lq + h·Lq + i) = Σ over the chunks' partials, in chunk order.
void sum_dq_row(const Plan& c, const float* dq_ws, std::int64_t r) {
    const std::int64_t b = r / (c.Hq * c.Lq), h = r / c.Lq % c.Hq, i = r % c.Lq;
    for (std::int64_t d = 0; d < c.Dk; ++d) {
        float acc = dq_ws[static_cast<std::size_t>(r * c.Dkp + d)];
        for (std::int64_t k = 1; k < c.nchunks; ++k)
            acc += dq_ws[static_cast<std::size_t>(k) * c.dq_part + static_cast<std::size_t>(r * c.Dkp + d)];
        store(c.bp.dq, c.bp.dq.offset(b, h, i, d), acc * c.split.grads);
    }
}

}  // namespace
}  // namespace attn::detail
