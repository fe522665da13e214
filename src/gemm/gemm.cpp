// The GEMM entry point: argument checks, the trivial cases, and the ISA row.
#include "gemm.hpp"

#include <algorithm>
#include <cstdlib>
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
    if (g.ldc < std::max<std::int64_t>(g.N, 1)) fail("gemm", "ldc ", g.ldc, " is narrower than C's rows (", g.N, ")");
}

}  // namespace

float* gemm_workspace(int slot, std::int64_t floats) {
    Workspace& w = t_workspace[slot];
    if (w.floats < floats) {
        w.data.reset();
        w.floats = 0;
        const std::int64_t bytes = checked_mul("gemm", "packing buffer", floats, static_cast<std::int64_t>(sizeof(float)));
        w.data.reset(static_cast<float*>(allocate_aligned(bytes, 64, "the GEMM's packing buffer")));
        w.floats = floats;
    }
    return w.data.get();
}

void sgemm(const KernelSet& row, const GemmArgs& g) {
    check(g);
    if (g.M == 0 || g.N == 0) return;
    if (g.K == 0) {  // op(A)·op(B) = 0: C = beta·C, without reading A or B (nor C when beta = 0)
        for (std::int64_t i = 0; i < g.M; ++i)
            for (std::int64_t j = 0; j < g.N; ++j)
                g.C[i * g.ldc + j] = g.beta == 0.0f ? 0.0f : g.beta * g.C[i * g.ldc + j];
        return;
    }
    row.gemm(g);
}

void sgemm(const GemmArgs& g) { sgemm(kernel_set(), g); }

}  // namespace attn::detail
