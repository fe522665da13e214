#!/usr/bin/env bash
# The hardening-related Python tests with the module built under AddressSanitizer +
# UndefinedBehaviorSanitizer, run by ctest (`make test`): byte order and odd arrays (class 4),
# sizes and races (classes 1 and 6), torch inputs. The module is built in the sanitizer build
# dir shared with kernels_asan (tests/common/configure_asan.sh); the interpreter is not
# instrumented, so the sanitizer runtime is preloaded (tests/common/asan_preload.sh, which also
# turns leak detection off and lets impossible allocations return null).
#   asan_python_tests.sh <source dir> <build dir> <python>
set -euo pipefail
src=$1
build=$2
python=$3
"$src/tests/common/configure_asan.sh" "$src" "$build"
cmake --build "$build" -j "$(nproc)" --target attn_python
module=$(ls "$build"/python/attn/_attn*.so)  # the extension inside the attn package
# Reports go to files (pytest captures stderr, and an abort would lose them), shown below.
reports="$build/python_asan_reports"
rm -rf "$reports"
mkdir -p "$reports"
export ASAN_OPTIONS=abort_on_error=1:log_path=$reports/asan
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1:log_path=$reports/ubsan
export PYTHONPATH="$build/python" PYTHONDONTWRITEBYTECODE=1 OMP_NUM_THREADS=2
cd "$src/tests/python"
status=0
"$src/tests/common/asan_preload.sh" "$module" "$python" -m pytest -q -p no:cacheprovider \
  test_array_conversion.py test_sizes_and_races.py test_torch_inputs.py || status=$?
# A report is a finding; ASan's "failed to allocate" warnings (allocator_may_return_null, for the
# MemoryError tests) are not.
if compgen -G "$reports/*" >/dev/null && grep -q -E "ERROR: |runtime error|CHECK failed" "$reports"/*; then
  cat "$reports"/* >&2
  status=1
fi
exit $status
