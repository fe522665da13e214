#!/usr/bin/env bash
# Builds attn's libFuzzer targets in a clang build dir of their own (the main build stays
# g++) and runs each for SECONDS: `make fuzz` (FUZZ_SECONDS, default 300) and ctest (15 s,
# so that a regression in a parser fails `make test`).
#   fuzz/run.sh <source dir> <build dir> <seconds per target> [target...]
# Inputs: the seeds in fuzz/corpus/<target>/ (in the repo, read only: small valid and invalid
# files, and every input that ever found a bug) and <build dir>/corpus/<target>/ (what the
# fuzzer learnt in earlier runs, kept). A finding is written to <build dir>/findings/<target>/
# (crash-*, timeout-*, oom-*, leak-*) and makes the script exit 1 after every target ran.
set -euo pipefail
src=$(cd "$1" && pwd)
build=$2
seconds=$3
shift 3
targets=("$@")
[[ ${#targets[@]} -gt 0 ]] || targets=(fuzz_npy fuzz_safetensors fuzz_cli_args fuzz_array)

cxx=${ATTN_FUZZ_CXX:-}
if [[ -z "$cxx" ]]; then
  for c in clang++-14 clang++; do command -v "$c" >/dev/null 2>&1 && { cxx=$c; break; }; done
fi
[[ -n "$cxx" ]] || { echo "fuzz: no clang++ found (Debian: make deps-test installs clang-14 libclang-rt-14-dev libomp-14-dev)" >&2; exit 1; }
gen=Ninja
command -v ninja >/dev/null 2>&1 || gen="Unix Makefiles"
launcher=()
command -v ccache >/dev/null 2>&1 && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
# Configure every time: quick when nothing changed, and it repairs a half-configured dir.
cmake -S "$src" -B "$build" -G "$gen" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER="$cxx" "${launcher[@]}" \
      -DATTN_BUILD_FUZZ=ON -DATTN_BUILD_TESTS=OFF -DATTN_BUILD_DEV=OFF -DATTN_BUILD_PYTHON=OFF \
      -DATTN_BUILD_EXAMPLES=OFF -DATTN_WITH_MPI=OFF >/dev/null
cmake --build "$build" -j "$(nproc)" --target "${targets[@]}"

# Leaks are findings; UBSan stops at the first report, like ASan.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:allocator_may_return_null=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
# One thread: the machine is shared, and results must not depend on scheduling.
export OMP_NUM_THREADS=1 ATTN_NUM_THREADS=1
status=0
for t in "${targets[@]}"; do
  learnt="$build/corpus/$t"
  found="$build/findings/$t"
  mkdir -p "$learnt" "$found"
  log="$build/findings/$t.log"
  echo "fuzz: $t for ${seconds} s (log: $log)"
  # -timeout: an input that runs longer is a hang; -rss_limit_mb: one that needs more is a finding.
  if ! "$build/fuzz/$t" "$learnt" "$src/fuzz/corpus/$t" -max_total_time="$seconds" -timeout=10 \
       -rss_limit_mb=2048 -max_len=8192 -print_final_stats=1 -artifact_prefix="$found/" >"$log" 2>&1; then
    echo "fuzz: $t FOUND A BUG — input in $found, report:" >&2
    grep -m1 -E -A30 "ERROR: |FINDING|runtime error|deadly signal" "$log" >&2 || tail -40 "$log" >&2
    status=1
  fi
  grep -E "stat::number_of_executed_units|stat::new_units_added" "$log" | sort -u | sed "s/^/fuzz: $t: /" || true
done
exit $status
