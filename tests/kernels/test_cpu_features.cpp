// cpu_features() against what the Linux kernel reports in /proc/cpuinfo's "flags": the
// AVX-512 BF16 and AMX bits attn reads itself (CPUID, XCR0 and, for AMX, the OS's grant of the
// tile state). The kernel lists a feature only when it supports it, so on Linux the two agree
// unless ATTN_CPU_HIDE takes a feature away (then attn must report it absent).
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "core/cpu_features.hpp"

namespace {

// The first "flags" line of /proc/cpuinfo, padded with spaces; empty where there is none.
std::string cpuinfo_flags() {
    std::ifstream in("/proc/cpuinfo");
    std::string line;
    while (std::getline(in, line))
        if (line.rfind("flags", 0) == 0) {
            const auto colon = line.find(':');
            if (colon != std::string::npos) return " " + line.substr(colon + 1) + " ";
        }
    return {};
}

bool listed(const std::string& flags, const char* name) { return flags.find(std::string(" ") + name + " ") != std::string::npos; }

bool hidden(const char* name) {
    const char* env = std::getenv("ATTN_CPU_HIDE");
    return env != nullptr && ("," + std::string(env) + ",").find(std::string(",") + name + ",") != std::string::npos;
}

TEST(CpuFeatures, Avx512Bf16AndAmxAgreeWithTheKernelsFlags) {
    const std::string flags = cpuinfo_flags();
    if (flags.empty()) GTEST_SKIP() << "skipped: no /proc/cpuinfo flags line";
    if (std::getenv("ATTN_CPU_HIDE") != nullptr && !hidden("amx_bf16") && !hidden("avx512_bf16") && !hidden("avx512"))
        GTEST_SKIP() << "skipped: ATTN_CPU_HIDE hides other features";
    const attn::detail::CpuFeatures& f = attn::detail::cpu_features();
    const bool bf16 = listed(flags, "avx512_bf16") && !hidden("avx512") && !hidden("avx512_bf16");
    const bool amx = listed(flags, "amx_tile") && listed(flags, "amx_bf16") && bf16 && !hidden("amx_bf16");
    EXPECT_EQ(f.has_avx512_bf16(), bf16 && f.has_avx512()) << "flags:" << flags;
    EXPECT_EQ(f.has_amx_bf16(), amx && f.has_avx512()) << "flags:" << flags;
    if (!amx) std::printf("amx: skipped: CPU lacks amx_bf16 (or it is hidden)\n");
}

}  // namespace
