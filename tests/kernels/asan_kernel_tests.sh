#!/usr/bin/env bash
# The kernel tests under AddressSanitizer + UndefinedBehaviorSanitizer, run by ctest
# (`make test`): configures the sanitizer build dir (tests/common/configure_asan.sh), builds only the
# kernel test binaries (and the size tests of the KV cache and the readers, and the MHA layer's), and runs them on
# a reduced number of random cases.
#   asan_kernel_tests.sh <source dir> <build dir>
set -euo pipefail
src=$1
build=$2
"$src/tests/common/configure_asan.sh" "$src" "$build"
cmake --build "$build" -j "$(nproc)" --target test_flash test_exp2 test_narrow16 test_nonfinite test_bf16_compute unit_sizes \
    decode_tests test_mha test_mha_backward test_half_forward
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
# 20 shards × 3 cases (each on every ISA, 1 and 2 threads) plus the fixed cases.
ATTN_FLASH_TEST_CASES_PER_SHARD=3 "$build/tests/kernels/test_flash"
"$build/tests/kernels/test_exp2"
# The vectorised 16-bit narrowing (row tails) and the 16-bit Q pack / O store of the flash kernels.
"$build/tests/kernels/test_narrow16"
"$build/tests/half/test_half_forward"
"$build/tests/kernels/test_nonfinite"
"$build/tests/kernels/test_bf16_compute"
# Sizes from user input: overflowing shapes, file headers, KV-cache capacities and appends.
"$build/tests/unit/unit_sizes"
"$build/tests/decode/decode_tests" --gtest_filter='KVCache*:DecodeKernel.SizeOneDims*'
# The MHA layer end to end (projections, masks, 16-bit weights and intermediates, errors): ~11 s.
"$build/tests/mha/test_mha"
# Training states from another layer or edited by hand: errors, never a read past a buffer.
"$build/tests/mha/test_mha_backward" --gtest_filter='MhaBackward.State*:MhaBackward.ArgumentErrors'
