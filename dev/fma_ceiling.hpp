// fma_ceiling_lab's per-ISA entry points (dev/fma_ceiling_lab.cpp).
#pragma once

namespace fma_ceiling {

// GFLOP per thread-CPU-second of the micro-kernel's FMAs with their operands in registers, with
// B's vectors loaded, with A's scalars broadcast from memory, and with both (the kernel's form).
struct FormRates {
    double registers = 0, b_loads = 0, a_broadcasts = 0, kernel = 0;
    int rows = 0, columns = 0;
};

// a: at least kc·16 floats, b: at least kc·64 floats, both on 64 bytes (enough for either tile).
namespace avx2 {
FormRates measure(int kc, double seconds, float* a, float* b);
}
namespace avx512 {
FormRates measure(int kc, double seconds, float* a, float* b);
}

}  // namespace fma_ceiling
