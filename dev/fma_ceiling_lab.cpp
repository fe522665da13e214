// fma_ceiling_lab: how fast can a broadcast-form micro-kernel run on this CPU with its operands hot
// in L1? The FMA peak `attn bench` reports is a loop on registers; every GEMM-like product of attn
// (the projection GEMM, flash's qk/pv tiles, the backward's products) also loads a B vector per
// column vector and broadcasts an A scalar per row each k. This lab times the GEMM rows' tiles
// (avx2: 6 × 16, avx512: 6 × 64) four ways — operands in registers, B loaded, A broadcast from
// memory, both (the kernel) — on one thread, per thread-CPU-second, so the ratio of the kernel's
// form to the register form is the ceiling no kernel of that form passes here
// (docs/kernels-lab.md, gemm-10).
//
// usage: fma_ceiling_lab [--kc N] [--seconds S] [--isa avx2|avx512]
//   --kc: k steps per pass (default 128: B 32 KiB on avx512, in a 48 KiB L1d; 768 streams it
//   from the L2 as the projections' 768-deep slivers do). --seconds: per form (default 0.5).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "core/cpu_features.hpp"
#include "fma_ceiling.hpp"

namespace {

[[noreturn]] void usage_error(const std::string& what) {
    std::fprintf(stderr, "fma_ceiling_lab: %s\nusage: fma_ceiling_lab [--kc N] [--seconds S] [--isa avx2|avx512]\n",
                 what.c_str());
    std::exit(2);
}

void print(const char* isa, int kc, const fma_ceiling::FormRates& r) {
    std::printf("%s tile %d x %d, kc %d (GFLOP per thread-CPU-second, %% of the register form)\n", isa, r.rows,
                r.columns, kc);
    const struct {
        const char* name;
        double value;
    } rows[] = {{"operands in registers", r.registers},
                {"B vectors loaded", r.b_loads},
                {"A scalars broadcast from memory", r.a_broadcasts},
                {"both (the kernel's form)", r.kernel}};
    for (const auto& row : rows)
        std::printf("  %-32s %7.1f  %5.1f %%\n", row.name, row.value, 100.0 * row.value / r.registers);
}

}  // namespace

int main(int argc, char** argv) {
    int kc = 128;
    double seconds = 0.5;
    std::string isa;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        auto value = [&]() -> std::string {
            if (i + 1 >= argc) usage_error(a + " needs a value");
            return argv[++i];
        };
        if (a == "--help" || a == "-h") {
            std::printf("usage: fma_ceiling_lab [--kc N] [--seconds S] [--isa avx2|avx512]\n");
            return 0;
        } else if (a == "--kc") {
            kc = std::atoi(value().c_str());
            if (kc < 1 || kc > 1 << 16) usage_error("--kc must be 1 .. 65536, got " + std::string(argv[i]));
        } else if (a == "--seconds") {
            seconds = std::atof(value().c_str());
            if (!(seconds > 0.0 && seconds <= 60.0)) usage_error("--seconds must be in (0, 60], got " + std::string(argv[i]));
        } else if (a == "--isa") {
            isa = value();
            if (isa != "avx2" && isa != "avx512") usage_error("--isa must be avx2 or avx512, got " + isa);
        } else {
            usage_error("unknown option " + a);
        }
    }
    // Operand buffers for either tile, allocated here (fma_ceiling.hpp says why).
    const std::size_t a_bytes = static_cast<std::size_t>(kc) * 16 * sizeof(float), b_bytes = static_cast<std::size_t>(kc) * 64 * sizeof(float);
    std::unique_ptr<float, decltype(&std::free)> a(static_cast<float*>(std::aligned_alloc(64, a_bytes)), &std::free),
        b(static_cast<float*>(std::aligned_alloc(64, b_bytes)), &std::free);
    if (!a || !b) usage_error("out of memory for --kc " + std::to_string(kc));
    const auto& cpu = attn::detail::cpu_features();
    const bool run_avx512 = isa.empty() ? cpu.has_avx512() : isa == "avx512";
    const bool run_avx2 = isa.empty() || isa == "avx2";
    if (run_avx2) {
        if (cpu.has_avx2_fma_f16c()) print("avx2", kc, fma_ceiling::avx2::measure(kc, seconds, a.get(), b.get()));
        else std::printf("avx2: skipped: CPU lacks avx2/fma\n");
    }
    if (run_avx512) {
        if (cpu.has_avx512()) print("avx512", kc, fma_ceiling::avx512::measure(kc, seconds, a.get(), b.get()));
        else std::printf("avx512: skipped: CPU lacks avx512f\n");
    }
    return 0;
}
