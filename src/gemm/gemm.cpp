// The GEMM entry point: argument checks, the trivial cases, and the ISA row.
#include "gemm.hpp"

#include <algorithm>
#include <cstdlib>
#include <limits>
#include <memory>

#include "../core/allocate.hpp"
#include "../core/check.hpp"
#include "../core/checked_size.hpp"
#include "../kernels/isa.hpp"

namespace attn::detail {
namespace {

struct FreeDeleter {
    void operator()(float* p) const { std::free(p); }
};

struct Workspace {
    std::unique_ptr<float, FreeDeleter> data;
    std::int64_t floats = 0;
};

thread_local Workspace t_workspace[2];

void check(const GemmArgs& g) {
    if (g.M < 0 || g.N < 0 || g.K < 0) fail("gemm", "expected sizes >= 0 but got M=", g.M, " N=", g.N, " K=", g.K);
    // Each operand's rows must be at least as wide as the row the GEMM reads from them.
    const std::int64_t a_row = g.ta ? g.M : g.K, b_row = g.tb ? g.K : g.N;
    if (g.lda < std::max<std::int64_t>(a_row, 1)) fail("gemm", "lda ", g.lda, " is narrower than A's rows (", a_row, ")");
    if (g.ldb < std::max<std::int64_t>(b_row, 1)) fail("gemm", "ldb ", g.ldb, " is narrower than B's rows (", b_row, ")");
    // (In column blocks, C's rows are each block's: c_block wide, the last maybe narrower.)
    const std::int64_t c_row = g.c_block > 0 ? std::min(g.N, g.c_block) : g.N;
    if (g.ldc < std::max<std::int64_t>(c_row, 1)) fail("gemm", "ldc ", g.ldc, " is narrower than C's rows (", c_row, ")");
    if (g.c_block < 0) fail("gemm", "c_block: expected >= 0 but got ", g.c_block);
    if (g.a_group < 0) fail("gemm", "a_group: expected >= 0 but got ", g.a_group);
    if (g.a_group > 0 && g.ta) fail("gemm", "a_group: row groups of A need A untransposed (ta = false)");
    if (g.bias != nullptr && g.beta != 0.0f) fail("gemm", "bias: expected beta = 0 with a bias but got beta = ", g.beta);
}

// The row has the bf16 pair kernel and this CPU runs it (sgemm and pack_b add: A and B bf16).
// Not the kernels' rule (asks_bf16_products, src/sdpa/problem.hpp), which also wants a bf16
// output: their bf16 compute rounds an intermediate (P, dS) to bf16, while the pairs here only
// multiply the caller's own bf16 values, each product exact in float32, into a float32 C.
bool bf16_pairs_run(const KernelSet& row) { return row.gemm_bf16 != nullptr && cpu_features().has_avx512_bf16(); }

// Of the bf16 pair calls, those this CPU runs on AMX tiles (gemm_amx_bf16.cpp): the same
// panels, 16·16·32 products per instruction. ATTN_CPU_HIDE=amx_bf16 keeps them on vdpbf16ps.
bool bf16_amx_runs(const KernelSet& row) { return row.gemm_amx != nullptr && cpu_features().has_amx_bf16(); }

}  // namespace

float* gemm_workspace(int slot, std::int64_t floats) noexcept {
    Workspace& w = t_workspace[slot];
    if (w.floats < floats) {
        w.data.reset();
        w.floats = 0;
        std::int64_t bytes = 0;
        if (__builtin_mul_overflow(floats, static_cast<std::int64_t>(sizeof(float)), &bytes)) return nullptr;
        w.data.reset(static_cast<float*>(allocate_aligned_or_null(bytes, 64)));
        if (w.data == nullptr) return nullptr;
        w.floats = floats;
    }
    return w.data.get();
}

void throw_gemm_workspace_refused(int slot, std::int64_t floats) {
    std::int64_t bytes = 0;
    if (__builtin_mul_overflow(floats, static_cast<std::int64_t>(sizeof(float)), &bytes))
        bytes = std::numeric_limits<std::int64_t>::max();
    throw_out_of_memory(bytes, slot == 0 ? "the GEMM's packing buffer of op(A)'s panels (one per thread)"
                                         : "the GEMM's packing buffer of op(B)'s panels");
}

bool PackedB::fits(const KernelSet& row, std::int64_t K, std::int64_t N) const {
    return panels_ != nullptr && isa_ == row.isa && K_ == K && N_ == N;
}

PackedB pack_b(const KernelSet& row, const GemmArgs& g) {
    // Only op(B)'s side is checked (M and the other operands are not part of a packed weight).
    GemmArgs b = g;
    b.ta = false;
    b.M = 0;
    b.lda = std::max<std::int64_t>(b.K, 1);
    b.ldc = std::max<std::int64_t>(b.N, 1);
    check(b);
    if ((b.b16 == GemmHalf::none ? static_cast<const void*>(b.B) : b.B16) == nullptr && b.K > 0 && b.N > 0)
        fail("gemm", "pack_b: B is null");
    PackedB p;
    // The panels `pack` writes, in a buffer of their own (floats: their size).
    auto panels_of = [&](std::int64_t (*pack)(const GemmArgs&, float*), std::int64_t floats) {
        const std::int64_t bytes = checked_mul("gemm", "packed B", floats, static_cast<std::int64_t>(sizeof(float)));
        float* panels = static_cast<float*>(allocate_aligned(bytes, 64, "a packed GEMM weight"));
        std::shared_ptr<const float> owner(panels, [](const float* q) { std::free(const_cast<float*>(q)); });
        pack(b, panels);
        return owner;
    };
    const std::int64_t floats = row.gemm_pack_b(b, nullptr);
    if (floats == 0) return p;  // K or N is 0: nothing to pack (sgemm reads no B then)
    p.panels_ = panels_of(row.gemm_pack_b, floats);
    if (b.b16 == GemmHalf::bf16 && bf16_pairs_run(row)) {
        p.pair_floats_ = row.gemm_pack_b_bf16(b, nullptr);
        p.pair_panels_ = panels_of(row.gemm_pack_b_bf16, p.pair_floats_);
    }
    p.isa_ = row.isa;
    p.K_ = b.K;
    p.N_ = b.N;
    p.floats_ = floats;
    return p;
}

PackedB pack_b(const GemmArgs& g) { return pack_b(kernel_set(), g); }

void sgemm(const KernelSet& row, const GemmArgs& g_in) {
    check(g_in);
    GemmArgs g = g_in;
    // All-bf16 operands on a CPU with AVX-512 BF16: the pair kernel, or its AMX one (gemm.hpp, "bf16 pairs").
    const bool pairs = g.a16 == GemmHalf::bf16 && g.b16 == GemmHalf::bf16 && bf16_pairs_run(row);
    // A packed op(B) for this row and shape replaces B (its pair panels for the pair kernel);
    // any other (another row, a stale shape) is ignored and B is packed as usual.
    g.packed_panels = nullptr;
    if (g.packed != nullptr && g.packed->fits(row, g.K, g.N))
        g.packed_panels = pairs ? g.packed->pair_panels() : g.packed->panels();
    if (g.M == 0 || g.N == 0) return;
    if (g.K == 0) {  // op(A)·op(B) = 0: C = beta·C (or the bias), without reading A or B (nor C when beta = 0)
        for (std::int64_t i = 0; i < g.M; ++i)
            for (std::int64_t j = 0; j < g.N; ++j)
                *c_at(g, i, j) = g.bias != nullptr ? g.bias[j] : g.beta == 0.0f ? 0.0f : g.beta * *c_at(g, i, j);
        return;
    }
    const Interrupt interrupt;
    g.interrupt = &interrupt;
    if (pairs && bf16_amx_runs(row)) row.gemm_amx(g);
    else if (pairs) row.gemm_bf16(g);
    else row.gemm(g);
    interrupt.throw_if_requested();
}

void sgemm(const GemmArgs& g) { sgemm(kernel_set(), g); }

}  // namespace attn::detail
