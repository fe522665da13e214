#!/usr/bin/env bash
# Runs a command whose (uninstrumented) Python interpreter imports an attn extension built under
# ThreadSanitizer (-DATTN_SANITIZE=thread, clang): every test whose Python imports the module
# (tests/CMakeLists.txt, ATTN_PYTHON_LAUNCHER), as asan_preload.sh does for the ASan build.
# - The runtime is GCC's libtsan, preloaded: clang 14's shared TSan runtime crashes before main in
#   any program it is preloaded into (/bin/true too: its __cxa_atexit interceptor is called by
#   libstdc++'s constructors before the runtime has initialised). The extension's calls into the
#   runtime (__tsan_read4, __tsan_func_entry, ...) are the same in both.
# - OpenMP's synchronisation reaches TSan through Archer, which libomp loads from OMP_TOOL_LIBRARIES:
#   the programs of the build find it by themselves, an extension loaded into Python does not.
# - The attn executables of the build carry clang's TSan runtime, linked in: with a second runtime
#   preloaded they stop at start ("unexpected memory mapping"). The command's children inherit the
#   preload, so ATTN_BIN, the CLI the tests start, becomes tsan_cli.py, which drops it.
# The caller gives TSAN_OPTIONS (the build's, ATTN_TSAN_OPTIONS): the runtime reads them before the
# extension, and the defaults compiled into it, are loaded. Added before them (a later option wins):
# allocator_may_return_null=1, as asan_preload.sh does: tests ask for impossible sizes and expect
# MemoryError, which TSan's allocator would otherwise end the process on (exit status 66).
#   tsan_preload.sh <extension .so> <command> [args...]
set -euo pipefail
module=$1
shift
libtsan=$(gcc -print-file-name=libtsan.so.2)
libomp=$(ldd "$module" | awk '/libomp/ { print $3 }')
archer=$(dirname "${libomp:-/nonexistent}")/libarcher.so
if [ ! -f "$libtsan" ] || [ -z "$libomp" ] || [ ! -f "$archer" ]; then
  echo "tsan_preload: needs GCC's libtsan.so.2 (found: $libtsan) and libarcher.so beside the libomp $module links (found: ${libomp:-none})" >&2
  exit 1
fi
if [ -n "${ATTN_BIN:-}" ]; then
  export ATTN_TSAN_CLI="$ATTN_BIN"
  ATTN_BIN="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/tsan_cli.py"
  export ATTN_BIN
fi
export TSAN_OPTIONS="allocator_may_return_null=1${TSAN_OPTIONS:+:$TSAN_OPTIONS}"
export OMP_TOOL_LIBRARIES="$archer"
export LD_PRELOAD="$libtsan${LD_PRELOAD:+ $LD_PRELOAD}"
exec "$@"
