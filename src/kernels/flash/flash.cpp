// Flash kernel front: what it supports, its tile sizes, and the ISA switch.
#include "flash.hpp"

#include <cstdlib>

#include "attn/error.hpp"
#include "attn/threads.hpp"

namespace attn::detail {

// 64 queries × 64 keys for every head dim: Qᵀ, Sᵀ and Oᵀ of a task are 16 KiB each at
// D = 64 (L1/L2), and the lab's sweep (dev/flash_lab.cpp header, docs/kernels.md) found
// the other sizes equal within the noise or slower (Nb = 32 with Mb = 32: −35 % at D = 64),
// at D = 128 and D = 64 alike; D = 256 measured at the same efficiency with 64 × 64.
FlashTiles flash_default_tiles(std::int64_t Dk, std::int64_t Dv) {
    (void)Dk;
    (void)Dv;
    return FlashTiles{64, 64};
}

std::string flash_decline_reason(const SdpaProblem& p) {
    auto not_f32 = [](const TensorView& t, const char* name) -> std::string {
        if (t.dtype() == DType::f32) return {};
        return std::string(name) + " is " + std::string(dtype_name(t.dtype())) +
               ": the flash kernel reads float32 Q, K, V";
    };
    for (const auto& [t, name] : {std::pair{&p.q, "Q"}, std::pair{&p.k, "K"}, std::pair{&p.v, "V"}}) {
        std::string r = not_f32(*t, name);
        if (!r.empty()) return r;
    }
    if (p.out.dtype() != DType::f32 && p.out.dtype() != DType::f64)
        return "out is " + std::string(dtype_name(p.out.dtype())) + ": the flash kernel writes float32 or float64";
    return {};
}

void flash_forward(const SdpaProblem& p, const KernelSet& kernels, int threads, const FlashTiles* tiles) {
    const FlashTiles t = tiles != nullptr ? *tiles : flash_default_tiles(p.Dk, p.Dv);
    // Only the lab and tests pass tiles; the driver needs whole 16-query panels.
    if (t.Mb < 16 || t.Mb % 16 != 0 || t.Mb > 4096 || t.Nb < 1 || t.Nb > 4096) {
        throw Error("flash tiles: Mb must be a multiple of 16 in [16, 4096] and Nb in [1, 4096] but got Mb=" +
                    std::to_string(t.Mb) + " Nb=" + std::to_string(t.Nb));
    }
    if (threads <= 0) threads = num_threads();  // the one thread setting (attn/threads.hpp)
    const Dropout drop = p.dropout();  // once per call; inactive when p = 0
    kernels.flash_forward(p, t, drop, threads);
}

}  // namespace attn::detail
