// bench/machine.hpp cpu_share: the share of its CPUs a timed stretch got, 0 to 1, however the
// CPU clock's granularity lands (a busy 2-thread trial measured 1.02; the JSON said so).
#include <gtest/gtest.h>

#include "machine.hpp"

namespace attn::bench {
namespace {

TEST(CpuShare, IsCpuTimeOverWallTimesThreads) {
    EXPECT_DOUBLE_EQ(cpu_share(1.0, 1.0, 2), 0.5);
    EXPECT_DOUBLE_EQ(cpu_share(0.3, 0.2, 2), 0.75);
}

TEST(CpuShare, AboveEveryCpuIsOne) {
    EXPECT_EQ(cpu_share(2.04, 1.0, 2), 1.0);
    EXPECT_EQ(cpu_share(0.26, 0.25, 1), 1.0);
}

TEST(CpuShare, WithoutWallTimeIsUnknown) {
    EXPECT_EQ(cpu_share(0.1, 0.0, 2), 0.0);
    EXPECT_EQ(cpu_share(0.1, 1.0, 0), 0.0);
}

}  // namespace
}  // namespace attn::bench
