#!/usr/bin/env bash
# The AVX2 object must not define any shared (weak / COMDAT) symbol outside its own
# namespace: the linker keeps one copy of such a symbol for the whole program, and if it
# kept the -mavx2 copy, generic code would run AVX2 instructions on a CPU without them.
#   check_isa_symbols.sh <object file>
set -euo pipefail
obj=$1
[[ -f "$obj" ]] || { echo "check_isa_symbols: $obj not found" >&2; exit 1; }
bad=$(nm -C "$obj" | awk '$2 ~ /^[WVu]$/' | grep -v 'flash_avx2_ns' | grep -v 'DW.ref.__gxx_personality_v0' || true)
if [[ -n "$bad" ]]; then
  echo "shared symbols compiled with AVX2 flags in $obj (build with optimisation, or keep them out of the ISA file):"
  echo "$bad"
  exit 1
fi
echo "no shared symbols outside flash_avx2_ns in $(basename "$obj")"
