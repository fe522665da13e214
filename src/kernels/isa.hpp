// One kernel table per instruction set. Each ISA's files (kernels/*/..._portable.cpp,
// kernels/*/..._avx2.cpp, kernels/*/..._avx512.cpp, gemm/gemm_*.cpp) define the entry points below; src/kernels/isa.cpp lists them
// as one row per ISA, and kernel_set() picks the row once per process (select_isa: the
// CPU's best, or what ATTN_ISA says). Adding an ISA means: its files, one enum value in
// core/cpu_features.hpp, one row in isa.cpp, its sources in src/CMakeLists.txt.
//
// bf16 compute (AVX-512 BF16, vdpbf16ps) is a member of the avx512 row, not a row of its own:
// KernelSet::flash_forward_bf16 (and backward_tile_bf16, gemm_bf16), null on the portable and
// avx2 rows, and called by flash_forward() (flash/flash.cpp) only when Q, K and V are all
// bfloat16 *and* cpu_features().has_avx512_bf16() (sgemm: A and B both bfloat16). Why not an
// `avx512_bf16` row: it would differ from the avx512 row in those entries (decode, dropout
// and exp2 are the same code), yet every test that runs each row would run the avx512 kernels
// twice on a shared machine, and every float32 call would report a new kernel name. Why not fold it into the avx512 row's
// flash_forward: AVX-512 CPUs without BF16 (Skylake-SP, Ice Lake) exist, and the row must run
// there; so the check is one branch at the front, outside any file with ISA flags. The same holds
// for AMX-BF16 (KernelSet::flash_forward_amx, Compute::bf16_amx): a member of the avx512 row.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "../core/cpu_features.hpp"

namespace attn::detail {

struct SdpaProblem;
struct FlashTiles;
struct FlashJob;
struct Dropout;
struct DropoutRowArgs;
struct TileArgs;
struct DecodeWork;
struct GemmArgs;

// Queries per flash panel, per row (KernelSet::flash_panel and each flash_<isa>.cpp's kPanel):
// 16 = 2 ymm (avx2) or four 4-lane vectors (portable), 32 = 2 zmm (avx512).
inline constexpr int kFlashPanelPortable = 16, kFlashPanelAvx2 = 16, kFlashPanelAvx512 = 32;

struct KernelSet {
    Isa isa;
    // Queries in one tile of the flash micro-kernels (a panel: their vector lanes; kFlashPanel*
    // above, each flash_<isa>.cpp's Ops::kPanel). Below one panel of rows per KV head the decode
    // kernel is the faster (decode/decode.hpp, auto_decode_declines).
    int flash_panel;
    // Flash forward over n whole problems in one task list (flash/flash_schedule.hpp); threads > 0.
    void (*flash_forward)(const FlashJob* jobs, std::int64_t n, const FlashTiles& tiles, int threads);
    // One (query block × key block) tile of the backward (backward/tile.hpp).
    void (*backward_tile)(const TileArgs& t);
    // Dropout factors of a row segment (core/dropout.hpp).
    void (*dropout_row)(const DropoutRowArgs& a);
    // The decode kernel over a planned problem (decode/decode.hpp).
    void (*decode)(const SdpaProblem& p, const DecodeWork& w);
    // y[i] = 2^x[i], the one vectorised exp of this ISA (simd/exp2.hpp states its error):
    // 0 for x < −126, +inf for x >= 128, NaN stays NaN.
    void (*exp2)(const float* x, float* y, std::size_t n);
    // y[i] = x[i] rounded to float16 (is_f16) or bfloat16 by attn/half.hpp's rule, bit for bit on
    // every row (simd/half_*.hpp; tests/kernels/test_narrow16.cpp): the 16-bit stores of
    // store_row and the MHA layer's 16-bit intermediates.
    void (*narrow16)(const float* x, std::uint16_t* y, std::size_t n, bool is_f16);
    // The packed GEMM (gemm/gemm.hpp) for K > 0, M > 0, N > 0; OpenMP's thread count.
    void (*gemm)(const GemmArgs& g);
    // The GEMM's packing of op(B) on its own (gemm/gemm.hpp PackedB): returns the floats the
    // panels take for g's K and N, and with dst not null writes them there.
    std::int64_t (*gemm_pack_b)(const GemmArgs& g, float* dst);
    // Flash forward with the two products on bf16 pairs (flash/bf16_dot.hpp) for all-bfloat16
    // Q, K, V; null on rows without it. Only on a CPU with AVX-512 BF16 (see above).
    void (*flash_forward_bf16)(const FlashJob* jobs, std::int64_t n, const FlashTiles& tiles, int threads) = nullptr;
    // The backward tile with its five products on bf16 pairs (backward/tile_avx512_bf16.cpp),
    // null on rows without it; flash_backward.cpp calls it under the same rule (bf16 compute).
    void (*backward_tile_bf16)(const TileArgs& t) = nullptr;
    // The GEMM on bf16 pairs (gemm/gemm_avx512_bf16.cpp) for bfloat16 A and B, and its packing
    // of a bfloat16 op(B) (PackedB's pair panels); null on rows without it. sgemm calls it for
    // all-bf16 operands on a CPU with AVX-512 BF16.
    void (*gemm_bf16)(const GemmArgs& g) = nullptr;
    std::int64_t (*gemm_pack_b_bf16)(const GemmArgs& g, float* dst) = nullptr;
    // The backward tile with its five products on AMX tiles (backward/tile_amx_bf16.cpp), null on
    // rows without it; flash_backward.cpp calls it instead of backward_tile_bf16 on a CPU with
    // AMX-BF16 (backward_compute: Compute::bf16_amx).
    void (*backward_tile_amx)(const TileArgs& t) = nullptr;
    // The GEMM on AMX tiles (gemm/gemm_amx_bf16.cpp) for bfloat16 A and B, null on rows without
    // it; sgemm calls it instead of gemm_bf16 on a CPU with AMX-BF16. It reads gemm_pack_b_bf16's
    // panels (the same pair layout): a PackedB serves both.
    void (*gemm_amx)(const GemmArgs& g) = nullptr;
    // Flash forward with the two products on AMX tiles (tdpbf16ps; flash/amx_dot.hpp) for
    // all-bfloat16 Q, K, V; null on rows without it. Only on a CPU with AMX-BF16 (the OS's grant
    // of the tile state included): flash_compute says Compute::bf16_amx.
    void (*flash_forward_amx)(const FlashJob* jobs, std::int64_t n, const FlashTiles& tiles, int threads) = nullptr;
};

// The row the library uses, chosen on first use (thread-safe); `why` (optional) says why.
const KernelSet& kernel_set(std::string* why = nullptr);

// The row of `isa`, or null when this CPU cannot run it (tests run every row it can).
const KernelSet* kernel_set_for(Isa isa);

// Every row this CPU can run, portable first (narrowest to widest).
std::vector<const KernelSet*> runnable_kernel_sets();

// How a kernel computed its products: float32 FMAs; bf16 pairs with float32 sums on vector
// registers (vdpbf16ps, AVX-512 BF16); or the same pairs on AMX tiles (tdpbf16ps, AMX-BF16).
// Both bf16 kinds round the same operands to bf16 (docs/conventions.md, "bf16 compute").
enum class Compute { f32, bf16_dot, bf16_amx };

// The path a kernel ran on, as reports name it: the row's ISA, then "_bf16" for bf16_dot and
// "_amx_bf16" for bf16_amx (flash_compute, backward_compute): "avx2", "avx512_bf16",
// "avx512_amx_bf16". bench/ and the tests read the suffix: every bf16 kind ends in "_bf16".
std::string isa_label(const KernelSet& row, Compute c = Compute::f32);
// A kernel's name in SdpaReport::kernel (and RingStats::kernel): "<kernel>/<isa_label>", as
// "flash/avx512_bf16", "flash-backward/avx512", "decode/avx2".
std::string kernel_name(std::string_view kernel, const KernelSet& row, Compute c = Compute::f32);

// Tests: while the guard lives, kernel_set() returns `k` (a runnable row), so the public
// entry points run that ISA. Not for concurrent use with other guards.
class ScopedKernelSet {
public:
    explicit ScopedKernelSet(const KernelSet& k);
    ~ScopedKernelSet();
    ScopedKernelSet(const ScopedKernelSet&) = delete;
    ScopedKernelSet& operator=(const ScopedKernelSet&) = delete;

private:
    const KernelSet* saved_;
};

// The entry points, one set per ISA file.
void flash_forward_portable(const FlashJob* jobs, std::int64_t n, const FlashTiles& tiles, int threads);
void flash_forward_avx2(const FlashJob* jobs, std::int64_t n, const FlashTiles& tiles, int threads);
void flash_forward_avx512(const FlashJob* jobs, std::int64_t n, const FlashTiles& tiles, int threads);
void flash_forward_avx512_bf16(const FlashJob* jobs, std::int64_t n, const FlashTiles& tiles, int threads);
void flash_forward_avx512_amx_bf16(const FlashJob* jobs, std::int64_t n, const FlashTiles& tiles, int threads);
void backward_tile_portable(const TileArgs& t);
void backward_tile_avx2(const TileArgs& t);
void backward_tile_avx512(const TileArgs& t);
void backward_tile_avx512_bf16(const TileArgs& t);
void backward_tile_amx_bf16(const TileArgs& t);
void dropout_row_portable(const DropoutRowArgs& a);
void dropout_row_avx2(const DropoutRowArgs& a);
void decode_portable(const SdpaProblem& p, const DecodeWork& w);
void decode_avx2(const SdpaProblem& p, const DecodeWork& w);
void decode_avx512(const SdpaProblem& p, const DecodeWork& w);
void exp2_portable(const float* x, float* y, std::size_t n);
void exp2_avx2(const float* x, float* y, std::size_t n);
void exp2_avx512(const float* x, float* y, std::size_t n);
void narrow16_portable(const float* x, std::uint16_t* y, std::size_t n, bool is_f16);
void narrow16_avx2(const float* x, std::uint16_t* y, std::size_t n, bool is_f16);
void narrow16_avx512(const float* x, std::uint16_t* y, std::size_t n, bool is_f16);
void gemm_portable(const GemmArgs& g);
std::int64_t gemm_pack_b_portable(const GemmArgs& g, float* dst);
void gemm_avx2(const GemmArgs& g);
std::int64_t gemm_pack_b_avx2(const GemmArgs& g, float* dst);
void gemm_avx512(const GemmArgs& g);
std::int64_t gemm_pack_b_avx512(const GemmArgs& g, float* dst);
void gemm_avx512_bf16(const GemmArgs& g);
std::int64_t gemm_pack_b_avx512_bf16(const GemmArgs& g, float* dst);
void gemm_amx_bf16(const GemmArgs& g);

}  // namespace attn::detail
