#!/usr/bin/env bash
# The kernel tests under AddressSanitizer + UndefinedBehaviorSanitizer, run by ctest
# (`make test`): configures its own build dir with ATTN_SANITIZE=ON, builds only the
# kernel test binaries (and the size tests of the KV cache and the readers), and runs them on
# a reduced number of random cases.
#   asan_kernel_tests.sh <source dir> <build dir>
set -euo pipefail
src=$1
build=$2
gen=Ninja
command -v ninja >/dev/null 2>&1 || gen="Unix Makefiles"
# Configure every time: quick when nothing changed, and it repairs a half-configured dir.
cmake -S "$src" -B "$build" -G "$gen" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DATTN_SANITIZE=ON \
      -DATTN_BUILD_TOOLS=OFF -DATTN_BUILD_DEV=OFF -DATTN_BUILD_PYTHON=OFF -DATTN_BUILD_EXAMPLES=OFF \
      -DATTN_WITH_MPI=OFF >/dev/null
cmake --build "$build" -j "$(nproc)" --target test_flash test_exp2 test_nonfinite unit_sizes decode_tests
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
# 20 shards × 3 cases (each on every ISA, 1 and 2 threads) plus the fixed cases.
ATTN_FLASH_TEST_CASES_PER_SHARD=3 "$build/tests/kernels/test_flash"
"$build/tests/kernels/test_exp2"
"$build/tests/kernels/test_nonfinite"
# Sizes from user input: overflowing shapes, file headers, KV-cache capacities and appends.
"$build/tests/unit/unit_sizes"
"$build/tests/decode/decode_tests" --gtest_filter='KVCache*'
