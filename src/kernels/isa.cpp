// The kernel table: one row per ISA. The only place that names ISA-specific entry points.
#include "isa.hpp"

#include <atomic>

namespace attn::detail {
namespace {

const KernelSet kRows[] = {
    {Isa::portable, kFlashPanelPortable, flash_forward_portable, backward_tile_portable, dropout_row_portable,
     decode_portable, exp2_portable, narrow16_portable, gemm_portable, gemm_pack_b_portable, nullptr, nullptr, nullptr, nullptr, nullptr},
    {Isa::avx2, kFlashPanelAvx2, flash_forward_avx2, backward_tile_avx2, dropout_row_avx2, decode_avx2, exp2_avx2,
     narrow16_avx2, gemm_avx2, gemm_pack_b_avx2, nullptr, nullptr, nullptr, nullptr, nullptr},
    // Dropout stays the AVX2 Philox: it is a few percent of a dropout call and every
    // AVX-512 CPU attn accepts has AVX2 (CpuFeatures::has_avx512).
    // flash_forward_bf16: isa.hpp says why bf16 compute is a member of this row, not a row.
    {Isa::avx512, kFlashPanelAvx512, flash_forward_avx512, backward_tile_avx512, dropout_row_avx2, decode_avx512,
     exp2_avx512, narrow16_avx512, gemm_avx512, gemm_pack_b_avx512, flash_forward_avx512_bf16, backward_tile_avx512_bf16,
     gemm_avx512_bf16, gemm_pack_b_avx512_bf16, backward_tile_amx_bf16, gemm_amx_bf16, flash_forward_avx512_amx_bf16},
};

std::atomic<const KernelSet*> g_override{nullptr};  // ScopedKernelSet

}  // namespace

const KernelSet* kernel_set_for(Isa isa) {
    if (!cpu_supports(isa)) return nullptr;
    for (const KernelSet& k : kRows)
        if (k.isa == isa) return &k;
    return nullptr;
}

const KernelSet& kernel_set(std::string* why) {
    if (const KernelSet* k = g_override.load(std::memory_order_acquire)) {
        if (why != nullptr) *why = "set by a test";
        return *k;
    }
    static std::string reason;
    static const KernelSet& chosen = *kernel_set_for(select_isa(&reason));
    if (why != nullptr) *why = reason;
    return chosen;
}

ScopedKernelSet::ScopedKernelSet(const KernelSet& k) : saved_(g_override.exchange(&k)) {}
ScopedKernelSet::~ScopedKernelSet() { g_override.store(saved_); }

std::vector<const KernelSet*> runnable_kernel_sets() {
    std::vector<const KernelSet*> v;
    for (const KernelSet& k : kRows)
        if (cpu_supports(k.isa)) v.push_back(&k);
    return v;
}

std::string isa_label(const KernelSet& row, Compute c) {
    const char* suffix = c == Compute::bf16_amx ? "_amx_bf16" : c == Compute::bf16_dot ? "_bf16" : "";
    return std::string(isa_name(row.isa)) + suffix;
}

std::string kernel_name(std::string_view kernel, const KernelSet& row, Compute c) {
    return std::string(kernel) + "/" + isa_label(row, c);
}

}  // namespace attn::detail
