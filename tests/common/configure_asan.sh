#!/usr/bin/env bash
# Configures the sanitizer build dir shared by the ASan/UBSan ctests (kernels_asan,
# python_asan): one configuration, so that whichever runs first builds the library once and
# the other reuses it (the tests hold the RESOURCE_LOCK asan_build, never building at once).
# Configured every time: quick when nothing changed, and it repairs a half-configured dir.
#   configure_asan.sh <source dir> <build dir>
set -euo pipefail
src=$1
build=$2
gen=Ninja
command -v ninja >/dev/null 2>&1 || gen="Unix Makefiles"
# -O1, not RelWithDebInfo's -O2: g++ compiles the sanitized kernels in 0.55–0.75× the CPU time and the
# tests run about as fast (docs/build.md#sanitizer-tests); ASan's own advice is -O1 too.
cmake -S "$src" -B "$build" -G "$gen" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g -DNDEBUG" \
      -DATTN_SANITIZE=ON \
      -DATTN_BUILD_TOOLS=OFF -DATTN_BUILD_DEV=OFF -DATTN_BUILD_PYTHON=ON -DATTN_BUILD_EXAMPLES=OFF \
      -DATTN_WITH_MPI=OFF >/dev/null
