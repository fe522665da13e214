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

// The instruction sets attn has kernels for; src/kernels/isa.cpp holds one row of kernels
// per value. `portable` is plain C++ for any CPU.
enum class Isa { portable, avx2 };

const char* isa_name(Isa isa);  // "portable", "avx2"

// Whether this CPU can run the kernels compiled for `isa`.
bool cpu_supports(Isa isa);

// The ISA the kernels should use: the best the CPU supports, unless the environment
// variable ATTN_ISA says otherwise ("portable" — or its old name "generic" — forces the
// portable path, e.g. for tests; "avx2" on a CPU without AVX2+FMA+F16C is refused and falls
// back to portable). `why` (optional) gets a short explanation of the choice.
Isa select_isa(std::string* why = nullptr);

}  // namespace attn::detail
