// CPU feature detection, done once per process, and the instruction-set choice for the
// fast kernels. Only files under an ISA folder/name (e.g. kernels/flash/flash_avx2.cpp)
// are compiled with ISA flags; everything else must run on any x86-64 (or non-x86) CPU,
// so the choice below is what keeps an older CPU from an illegal instruction.
#pragma once

#include <string>

namespace attn::detail {

struct CpuFeatures {
    bool avx2 = false;
    bool fma = false;
    bool f16c = false;
    // Everything the *_avx2.cpp files are compiled for (-mavx2 -mfma -mf16c).
    bool has_avx2_fma_f16c() const { return avx2 && fma && f16c; }
};

// Detected on first use (cached); thread-safe (a function-local static).
const CpuFeatures& cpu_features();

enum class Isa { generic, avx2 };

const char* isa_name(Isa isa);

// The ISA a fast kernel should use: the best the CPU supports, unless the environment
// variable ATTN_ISA says otherwise ("generic" forces the portable path, e.g. for tests;
// "avx2" on a CPU without AVX2+FMA+F16C is refused and falls back to generic).
// `why` (optional) gets a short explanation of the choice.
Isa select_isa(std::string* why = nullptr);

}  // namespace attn::detail
