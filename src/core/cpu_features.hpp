// CPU feature detection, done once per process, and the instruction-set choice for the
// fast kernels. Only files under an ISA folder/name (e.g. kernels/flash/flash_avx2.cpp)
// are compiled with ISA flags; everything else must run on any x86-64 (or non-x86) CPU,
// so the choice below is what keeps an older CPU from an illegal instruction.
#pragma once

#include <cstdint>
#include <string>

namespace attn::detail {

struct CpuFeatures {
    bool avx2 = false;
    bool fma = false;
    bool f16c = false;
    // AVX-512 foundation + vector-length, byte/word and dword/qword extensions, each set
    // only when the OS also saves the opmask and ZMM registers (XGETBV, see cpu_features.cpp).
    bool avx512f = false;
    bool avx512vl = false;
    bool avx512bw = false;
    bool avx512dq = false;
    // AVX-512 BF16 (vdpbf16ps, vcvtne2ps2bf16; CPUID.(EAX=7,ECX=1):EAX bit 5), under the same
    // OS-state condition. Not a row: the avx512 row's flash forward uses it for all-bf16
    // Q, K, V when has_avx512_bf16() (kernels/isa.hpp says why).
    bool avx512_bf16 = false;
    // AMX-TILE + AMX-BF16 (tdpbf16ps on 16×32 bf16 tiles; CPUID.(EAX=7,ECX=0):EDX bits 24 and
    // 22), set only when XCR0 enables the tile state (bits 17–18) *and* Linux granted this
    // process the tile data state (arch_prctl(ARCH_REQ_XCOMP_PERM), asked once here): without
    // that permission the first tile instruction is a SIGILL. Like avx512_bf16, not a row: the
    // avx512 row's bf16-compute entry points use it when has_amx_bf16().
    bool amx_bf16 = false;
    // One core's L2 cache in bytes (sysconf(_SC_LEVEL2_CACHE_SIZE), which glibc reads from CPUID),
    // or 1 MiB where the system does not say. It sizes cache blocks only (the GEMM's MC rows and
    // B block, gemm_driver.hpp), never an element's arithmetic: no result depends on it.
    std::int64_t l2_bytes = std::int64_t{1} << 20;
    // Everything the *_avx2.cpp files are compiled for (-mavx2 -mfma -mf16c).
    bool has_avx2_fma_f16c() const { return avx2 && fma && f16c; }
    // Everything the *_avx512.cpp files are compiled for (ATTN_AVX512_FLAGS: the AVX2 set
    // plus -mavx512f -mavx512vl -mavx512bw -mavx512dq); the AVX-512 row also reuses AVX2 code.
    bool has_avx512() const { return has_avx2_fma_f16c() && avx512f && avx512vl && avx512bw && avx512dq; }
    // Everything the *_avx512_bf16.cpp files are compiled for (ATTN_AVX512_BF16_FLAGS).
    bool has_avx512_bf16() const { return has_avx512() && avx512_bf16; }
    // Everything the *_amx_bf16.cpp files are compiled for (ATTN_AMX_BF16_FLAGS: the AVX-512
    // BF16 set plus -mamx-tile -mamx-bf16): their softmax and packing are AVX-512 BF16 code.
    bool has_amx_bf16() const { return has_avx512_bf16() && amx_bf16; }
};

// Detected on first use (cached); thread-safe (a function-local static). The environment
// variable ATTN_CPU_HIDE (e.g. "avx512", "amx_bf16" or "avx512_bf16,avx2") removes features, to
// run the library and its tests as on an older CPU; an unknown item is an attn::Error naming it.
// A hidden amx_bf16 is never asked of the OS.
const CpuFeatures& cpu_features();

// The instruction sets attn has kernels for; src/kernels/isa.cpp holds one row of kernels
// per value. `portable` is plain C++ for any CPU. Ordered from narrowest to widest.
enum class Isa { portable, avx2, avx512 };

const char* isa_name(Isa isa);  // "portable", "avx2", "avx512"

// What the CPU must have for `isa`, as the messages say it: "AVX2+FMA+F16C",
// "AVX-512 F+VL+BW+DQ (with OS-saved ZMM state) and AVX2+FMA+F16C".
const char* isa_requirement(Isa isa);

// The features `isa` needs that this CPU (or OS) lacks, e.g. "avx512f, avx512bw"; empty
// when it has them all.
std::string missing_features(Isa isa);

// Whether this CPU can run the kernels compiled for `isa`.
bool cpu_supports(Isa isa);

// The ISA the kernels should use: the widest the CPU supports, unless the environment
// variable ATTN_ISA names one ("portable" — or its old name "generic" —, "avx2", "avx512";
// "auto" or unset: the widest). A name that is not one of these, or a row this CPU cannot
// run, is an attn::Error naming ATTN_ISA, what it accepts and what it got — never a silent
// fallback, so a benchmark or test never measures another row than the one it asked for.
// `why` (optional) gets a short explanation of the choice.
Isa select_isa(std::string* why = nullptr);

}  // namespace attn::detail
