// attn's own single-precision GEMM (the MHA projections and their gradients):
//
//   C (M, N), row stride ldc  =  op(A) · op(B)  +  beta · C        row-major throughout;
//   op(A) is (M, K): A (M, K) row stride lda, or with ta its transpose (A is (K, M));
//   op(B) is (K, N): B (K, N) row stride ldb, or with tb its transpose (B is (N, K)).
//
// beta = 0 never reads C (NaN or poison there does not leak into the result). GemmArgs::bias
// adds a bias per column (the projections' bias) in the micro-kernel's epilogue.
//
// Deterministic: the result does not depend on the thread count. Every element of C is one
// chain of FMAs over k = 0, 1, …, K−1 in KC-sized chunks whose bounds depend only on K
// (gemm_driver.hpp); threads only split the (M, N) plane, never K. It does depend on the
// ISA row (the portable, AVX2 and AVX-512 micro-kernels use other chunkings).
//
// bf16 pairs: with A and B both bfloat16 on a CPU with AVX-512 BF16, the avx512 row multiplies
// pairs of k (vdpbf16ps, gemm_avx512_bf16.cpp): twice the products per instruction. Each
// product is exact in float32, so every element is still a chain of at most 2K + 2 rounded
// additions (the bound of tests/gemm); the pairing changes the order, and bf16 inputs below
// 2^-126 count as 0 (a denormal sum flushes to 0). A PackedB serves it through its pair panels.
// On a CPU with AMX-BF16 the same calls run on AMX tiles instead (tdpbf16ps, gemm_amx_bf16.cpp:
// a 32 × 32 block of C in four 16 × 16 tiles, 16·16·32 products per instruction) with the same
// rule — each accumulation rounded to nearest even, bf16 inputs below 2^-126 read as 0, denormal
// sums flushed (Intel SDM, TDPBF16PS) — so the same bound, on the same pair panels of op(B).
// Its bits differ from the pair kernel's (another order within a pair step); ATTN_CPU_HIDE=amx_bf16
// keeps a process on the pair kernel.
//
// The structure (GotoBLAS/BLIS): per (NC columns, KC depth) block, op(B) is packed once into
// NR-column slivers shared by all threads; each thread packs MC rows of op(A) into MR-row
// panels of its own and runs the ISA's MR × NR micro-kernel over them (docs/kernels.md,
// "The projection GEMM"). M <= 4 (a decode step) skips the shared B block: each thread packs
// one B sliver at a time for an M-row instance of the micro-kernel, same arithmetic per element.
#pragma once

#include <cstdint>
#include <memory>

#include "../core/cpu_features.hpp"
#include "../core/interrupt.hpp"

namespace attn::detail {

struct KernelSet;
class PackedB;

// The element type of a 16-bit operand: widened to float32 while packing (exactly: every
// f16 and bf16 value is a float32), so the micro-kernels and the fp32 accumulation are the
// float32 GEMM's. (half_mha, issue 14: the MHA layer's 16-bit weights and activations.)
enum class GemmHalf : std::uint8_t { none, f16, bf16 };

struct GemmArgs {
    bool ta = false, tb = false;
    std::int64_t M = 0, N = 0, K = 0;
    const float* A = nullptr;
    std::int64_t lda = 0;
    const float* B = nullptr;
    std::int64_t ldb = 0;
    float beta = 0.0f;
    float* C = nullptr;
    std::int64_t ldc = 0;
    // Column biases (N floats) or null: C = op(A)·op(B) + bias[j], added in the epilogue of the
    // first K chunk (sum + bias, one rounding: the bits of C filled with the bias and beta = 1,
    // without that extra pass over C). Only with beta = 0.
    const float* bias = nullptr;
    // C in column blocks (0: one row-major C). With c_block > 0, C's columns [q·c_block,
    // (q+1)·c_block) are a matrix of their own at C + q·c_block_stride, row stride ldc:
    // C(i, j) at C + (j / c_block)·c_block_stride + i·ldc + j % c_block (c_at below). The MHA
    // layer's projections write each head's (rows, d_h) rows so (head_layout.hpp). Only the
    // store's addresses change: the same products, the same bits.
    std::int64_t c_block = 0, c_block_stride = 0;
    // op(A)'s rows in groups (0: one matrix; only without ta). With a_group > 0, rows
    // [q·a_group, (q+1)·a_group) are a matrix of their own at A + q·a_group_stride, row stride
    // lda: row i at A + (i / a_group)·a_group_stride + (i % a_group)·lda (a_row below). The MHA
    // layer reads a seq-first input's (L, B, E) rows batch by batch so, to store its head-major
    // rows in (b, l) order (head_layout.hpp). Only the packing's addresses change: C's row i is
    // the same chain of products on op(A)'s row i, the same bits.
    std::int64_t a_group = 0, a_group_stride = 0;
    // A 16-bit A or B: with a16 (b16) not none, A16 (B16) is read instead of A (B), in the same
    // layout (ta/tb, lda/ldb in elements). C stays float32.
    GemmHalf a16 = GemmHalf::none, b16 = GemmHalf::none;
    const std::uint16_t* A16 = nullptr;
    const std::uint16_t* B16 = nullptr;
    // op(B) packed once (pack_b below; a constant weight): used instead of B/B16 when it was
    // packed on this call's row for this K and N — else B/B16 are read as usual, so they must
    // stay valid. The result is bit-identical either way (the same panels, the same kernel).
    const PackedB* packed = nullptr;
    // The L2 size (bytes) the A and B blocks are fitted to (gemm_driver.hpp, cache_blocks); 0: this
    // CPU's (CpuFeatures::l2_bytes). The bits do not depend on it — only the order tiles are
    // computed in — so tests set it to run another CPU's blocks here.
    std::int64_t l2_bytes = 0;
    // (Set by sgemm for the driver: the packed panels it uses, or null. Not for callers.)
    const float* packed_panels = nullptr;
    // (Set by sgemm too: the caller's interrupt flag, core/interrupt.hpp. Once it is set, the
    // driver's threads skip their blocks left, and sgemm throws attn::Interrupted.)
    const Interrupt* interrupt = nullptr;
};

// Where row i of g's op(A) begins, in elements from A (A16): without ta (GemmArgs::a_group).
inline std::int64_t a_row(const GemmArgs& g, std::int64_t i) {
    if (g.a_group <= 0) return i * g.lda;
    return (i / g.a_group) * g.a_group_stride + (i % g.a_group) * g.lda;
}

// Where element (i, j) of g's C is stored (GemmArgs::c_block).
inline float* c_at(const GemmArgs& g, std::int64_t i, std::int64_t j) {
    if (g.c_block <= 0) return g.C + i * g.ldc + j;
    return g.C + (j / g.c_block) * g.c_block_stride + i * g.ldc + j % g.c_block;
}

// op(B) (K × N) of a GEMM in one kernel-table row's panel layout, packed by the routine the
// GEMM packs with on every call (so a GEMM on it is bit-identical to the unpacked call, on any
// thread count): per K chunk (the driver's chunk bounds, a function of K), the ceil(N / NR)
// column slivers, each kc × NR k-major, zero-padded. Immutable once built; copies share it.
// 16-bit B is widened exactly while packing (float32 panels: 2× a 16-bit weight's bytes). A
// bfloat16 B on a row and CPU with the bf16 pair kernel is packed a second time as pair words
// (pair_panels: the weight's own bytes), for calls whose A is bfloat16 too.
class PackedB {
public:
    PackedB() = default;
    bool empty() const { return panels_ == nullptr; }
    // Packed on `row` for op(B) of K rows and N columns.
    bool fits(const KernelSet& row, std::int64_t K, std::int64_t N) const;
    const float* panels() const { return panels_.get(); }
    const float* pair_panels() const { return pair_panels_.get(); }  // null unless bf16 pairs (above)
    std::int64_t bytes() const { return (floats_ + pair_floats_) * static_cast<std::int64_t>(sizeof(float)); }

private:
    friend PackedB pack_b(const KernelSet& row, const GemmArgs& g);
    Isa isa_ = Isa::portable;
    std::int64_t K_ = 0, N_ = 0, floats_ = 0, pair_floats_ = 0;
    std::shared_ptr<const float> panels_, pair_panels_;
};

// Packs op(B) of g (tb, K, N, B or B16 with b16, ldb; the rest of g is ignored) on `row`.
// Throws attn::Error for bad sizes or ldb, attn::OutOfMemory when the panels do not fit.
PackedB pack_b(const KernelSet& row, const GemmArgs& g);
PackedB pack_b(const GemmArgs& g);  // on kernel_set()

// On the kernel table's row (kernel_set()), OpenMP's current thread count. Throws attn::Error
// ("gemm: ...") for negative sizes or a leading dimension narrower than its row.
void sgemm(const GemmArgs& g);

// The same on a given row (tests and benchmarks compare rows).
void sgemm(const KernelSet& row, const GemmArgs& g);

// A per-thread scratch buffer of at least `floats` floats, 64-byte aligned, kept between
// calls (so a GEMM does not page-fault its packing buffers in every call). Slot 0: the packed
// A panels of the calling thread; slot 1: the packed B block shared by a call's threads (M <= 4:
// the thread's own B sliver). Null when the system refuses the memory: the driver takes them
// inside its parallel region, which no exception may leave (std::terminate), and after the
// region says the refusal with throw_gemm_workspace_refused.
float* gemm_workspace(int slot, std::int64_t floats) noexcept;

// Throws attn::OutOfMemory for a refused gemm_workspace(slot, floats), naming the buffer and
// its bytes. (Not in the ISA-compiled driver: it builds the message's std::string.)
[[noreturn]] void throw_gemm_workspace_refused(int slot, std::int64_t floats);

}  // namespace attn::detail
