#!/usr/bin/env bash
# Runs a command whose (uninstrumented) Python interpreter imports an attn extension built under
# AddressSanitizer + UndefinedBehaviorSanitizer: python_asan and, in a -DATTN_SANITIZE=ON build,
# every test whose Python imports the module (tests/CMakeLists.txt, ATTN_PYTHON_LAUNCHER).
# The ASan runtime must be the first library of the process, so it is preloaded, and with it
# libstdc++: python is C, so libstdc++ would only arrive with the module, after ASan looked for
# the real __cxa_throw (its interceptor then aborts the first C++ exception: "CHECK failed:
# real___cxa_throw != 0"). The command's children inherit both (the attn CLI, instrumented
# anyway; mpirun and the Pythons it starts).
# ASAN_OPTIONS defaults, before the caller's own (a later option wins):
# - detect_leaks=0: CPython, numpy and torch keep allocations until exit by design;
# - allocator_may_return_null=1: tests ask for impossible sizes and expect MemoryError, which ASan
#   would otherwise report as a fatal "allocation size too big".
#   asan_preload.sh <extension .so> <command> [args...]
set -euo pipefail
module=$1
shift
libasan=$(ldd "$module" | awk '/libasan/ { print $3 }')
libstdcxx=$(ldd "$module" | awk '/libstdc\+\+/ { print $3 }')
if [ -z "$libasan" ] || [ -z "$libstdcxx" ]; then
  echo "asan_preload: $module is not linked with libasan and libstdc++" >&2
  exit 1
fi
export ASAN_OPTIONS="detect_leaks=0:allocator_may_return_null=1${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
export LD_PRELOAD="$libasan $libstdcxx${LD_PRELOAD:+ $LD_PRELOAD}"
exec "$@"
