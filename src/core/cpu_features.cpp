#include "cpu_features.hpp"

#include <cstdlib>
#include <string_view>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

namespace attn::detail {

const CpuFeatures& cpu_features() {
    static const CpuFeatures features = [] {
        CpuFeatures f;
#if defined(__x86_64__) || defined(__i386__)
        // libgcc's __builtin_cpu_supports also checks that the OS saves the YMM
        // registers (XGETBV), so "avx2" here means usable, not only present.
        __builtin_cpu_init();
        f.avx2 = __builtin_cpu_supports("avx2");
        f.fma = __builtin_cpu_supports("fma");
        // clang 14's __builtin_cpu_supports does not know "f16c": read CPUID.1:ECX itself
        // (the YMM state F16C needs is already required by "avx2" above).
        unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
        f.f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
#endif
        return f;
    }();
    return features;
}

const char* isa_name(Isa isa) { return isa == Isa::avx2 ? "avx2" : "portable"; }

bool cpu_supports(Isa isa) { return isa == Isa::portable || cpu_features().has_avx2_fma_f16c(); }

Isa select_isa(std::string* why) {
    const bool avx2_ok = cpu_supports(Isa::avx2);
    const char* env = std::getenv("ATTN_ISA");
    const std::string_view want = env != nullptr ? std::string_view(env) : std::string_view();
    auto say = [&](const std::string& s) {
        if (why != nullptr) *why = s;
    };
    if (want == "portable" || want == "generic") {
        say("ATTN_ISA=" + std::string(want) + " forces the portable path");
        return Isa::portable;
    }
    if (!want.empty() && want != "avx2" && want != "auto") {
        say("ATTN_ISA='" + std::string(want) + "' is not one of portable, avx2, auto: ignored; " +
            (avx2_ok ? "CPU has AVX2+FMA+F16C" : "CPU lacks AVX2+FMA+F16C"));
        return avx2_ok ? Isa::avx2 : Isa::portable;
    }
    if (avx2_ok) {
        say("CPU has AVX2+FMA+F16C");
        return Isa::avx2;
    }
    say(want == "avx2" ? "ATTN_ISA=avx2 refused: CPU lacks AVX2+FMA+F16C" : "CPU lacks AVX2+FMA+F16C");
    return Isa::portable;
}

}  // namespace attn::detail
