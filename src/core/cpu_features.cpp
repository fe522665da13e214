#include "cpu_features.hpp"

#include <cstdlib>
#include <string_view>

#include "check.hpp"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#if defined(__linux__) && defined(__x86_64__)
#include <sys/syscall.h>
#endif
#if __has_include(<unistd.h>)
#include <unistd.h>  // sysconf
#endif

namespace attn::detail {

namespace {

#if defined(__x86_64__) || defined(__i386__)
// XCR0 (the OS-enabled register state): bits 1–2 SSE/AVX (XMM, YMM upper halves), 5–7
// AVX-512 (opmask, ZMM0–15 upper halves, ZMM16–31). Read with the xgetbv opcode bytes so
// this file needs no -mxsave.
unsigned long long read_xcr0() {
    unsigned eax = 0, edx = 0;
    __asm__ volatile(".byte 0x0f, 0x01, 0xd0" : "=a"(eax), "=d"(edx) : "c"(0));
    return (static_cast<unsigned long long>(edx) << 32) | eax;
}
#endif

#if defined(__linux__) && defined(__x86_64__)
// Linux (5.16+) keeps the AMX tile data state (XFEATURE_XTILEDATA, component 18: 8 KiB per
// thread) off until a process asks for it; a tile instruction before that is a SIGILL. The
// grant is for the whole process and every thread it starts. Constants from
// arch/x86/include/uapi/asm/prctl.h (Debian 12's glibc headers do not have them).
bool request_amx_permission() {
    constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}
#endif

// ATTN_CPU_HIDE=avx512,avx512_bf16,amx_bf16,avx2 (any of them, comma-separated): run as if the CPU
// lacked those features, so one machine can run the whole suite as an older CPU would — e.g.
// `ATTN_CPU_HIDE=avx512` on Sapphire Rapids or Zen 4/5 for an AVX2-only Zen 3: the avx512 row
// leaves runnable_kernel_sets(), its tests say "skipped: CPU lacks …", bf16 compute is off.
// Hiding can only take features away, never add one the CPU lacks.
void hide_features(CpuFeatures& f) {
    const char* env = std::getenv("ATTN_CPU_HIDE");
    if (env == nullptr) return;
    std::string_view rest(env);
    while (!rest.empty()) {
        const std::size_t comma = rest.find(',');
        const std::string_view name = rest.substr(0, comma);
        rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
        if (name == "avx512") {
            f.avx512f = f.avx512vl = f.avx512bw = f.avx512dq = f.avx512_bf16 = f.amx_bf16 = false;
        } else if (name == "avx512_bf16") {
            f.avx512_bf16 = f.amx_bf16 = false;
        } else if (name == "amx_bf16") {
            f.amx_bf16 = false;
        } else if (name == "avx2") {  // every row above portable needs AVX2+FMA+F16C
            f.avx2 = f.fma = f.f16c = false;
        } else {
            fail("ATTN_CPU_HIDE", "expected a comma-separated list of avx512, avx512_bf16, amx_bf16, avx2 but got ", quoted(env),
                 " (unknown item ", quoted(name), ")");
        }
    }
}

}  // namespace

std::string missing_features(Isa isa) {
    const CpuFeatures& f = cpu_features();
    std::string m;
    auto need = [&](bool ok, const char* name) {
        if (!ok) m += (m.empty() ? "" : ", ") + std::string(name);
    };
    if (isa == Isa::portable) return m;
    need(f.avx2, "avx2");
    need(f.fma, "fma");
    need(f.f16c, "f16c");
    if (isa == Isa::avx512) {
        need(f.avx512f, "avx512f");
        need(f.avx512vl, "avx512vl");
        need(f.avx512bw, "avx512bw");
        need(f.avx512dq, "avx512dq");
    }
    return m;
}

// The AmxTiles scopes open on this thread (kernels/simd/amx_tiles.hpp, which says why it counts);
// here, outside the files compiled with AMX flags.
thread_local constinit int amx_tiles_depth = 0;

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
        // AVX-512: the CPUID.7.0 bits, and only if OSXSAVE is set and XCR0 has the XMM, YMM,
        // opmask and both ZMM state components enabled (0xE6) — a hypervisor or kernel may
        // hide the ZMM state while CPUID still reports the instructions.
        const bool osxsave = (ecx & bit_OSXSAVE) != 0;
        unsigned a7 = 0, b7 = 0, c7 = 0, d7 = 0;
        if (osxsave && __get_cpuid_count(7, 0, &a7, &b7, &c7, &d7) != 0 && (read_xcr0() & 0xE6) == 0xE6) {
            f.avx512f = (b7 & bit_AVX512F) != 0;
            f.avx512dq = (b7 & bit_AVX512DQ) != 0;
            f.avx512bw = (b7 & bit_AVX512BW) != 0;
            f.avx512vl = (b7 & bit_AVX512VL) != 0;
            // Sub-leaf 1 exists when leaf 7's EAX (the highest sub-leaf) is at least 1.
            unsigned a71 = 0, b71 = 0, c71 = 0, d71 = 0;
            if (a7 >= 1 && __get_cpuid_count(7, 1, &a71, &b71, &c71, &d71) != 0) f.avx512_bf16 = (a71 & (1u << 5)) != 0;
            // AMX: TILE (EDX bit 24) and BF16 (bit 22), and XCR0's TILECFG and TILEDATA (bits 17, 18).
            f.amx_bf16 = (d7 & (1u << 24)) != 0 && (d7 & (1u << 22)) != 0 && (read_xcr0() & 0x60000) == 0x60000;
        }
#endif
        hide_features(f);
#if defined(_SC_LEVEL2_CACHE_SIZE)
        if (const long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE); l2 > 0) f.l2_bytes = l2;
#endif
#if defined(__linux__) && defined(__x86_64__)
        if (f.amx_bf16) f.amx_bf16 = request_amx_permission();
#else
        f.amx_bf16 = false;  // the tile state needs an OS that grants it; only Linux's way is known here
#endif
        return f;
    }();
    return features;
}

const char* isa_name(Isa isa) {
    switch (isa) {
        case Isa::avx512: return "avx512";
        case Isa::avx2: return "avx2";
        default: return "portable";
    }
}

const char* isa_requirement(Isa isa) {
    switch (isa) {
        case Isa::avx512: return "AVX-512 F+VL+BW+DQ (with OS-saved ZMM state) and AVX2+FMA+F16C";
        case Isa::avx2: return "AVX2+FMA+F16C";
        default: return "nothing";
    }
}

bool cpu_supports(Isa isa) {
    switch (isa) {
        case Isa::avx512: return cpu_features().has_avx512();
        case Isa::avx2: return cpu_features().has_avx2_fma_f16c();
        default: return true;
    }
}

Isa select_isa(std::string* why) {
    const char* env = std::getenv("ATTN_ISA");
    const std::string_view want = env != nullptr ? std::string_view(env) : std::string_view();
    auto say = [&](const std::string& s) {
        if (why != nullptr) *why = s;
    };
    auto has = [](Isa isa) { return std::string("CPU has ") + isa_requirement(isa); };
    if (want == "portable" || want == "generic") {
        say("ATTN_ISA=" + std::string(want) + " forces the portable path");
        return Isa::portable;
    }
    if (want == "avx2" || want == "avx512") {
        const Isa isa = want == "avx2" ? Isa::avx2 : Isa::avx512;
        if (!cpu_supports(isa))
            fail("ATTN_ISA", "'", want, "' needs a CPU with ", isa_requirement(isa), " but this CPU lacks ",
                 missing_features(isa), " (unset ATTN_ISA to use the widest row this CPU has)");
        say("ATTN_ISA=" + std::string(want) + " forces the " + isa_name(isa) + " path; " + has(isa));
        return isa;
    }
    if (!want.empty() && want != "auto")
        fail("ATTN_ISA", "expected one of auto, avx512, avx2, portable (or its old name generic) but got ", quoted(want));
    for (Isa isa : {Isa::avx512, Isa::avx2})
        if (cpu_supports(isa)) {
            say(has(isa));
            return isa;
        }
    say("CPU lacks AVX2+FMA+F16C");
    return Isa::portable;
}

}  // namespace attn::detail
