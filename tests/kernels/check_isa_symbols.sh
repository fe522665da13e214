#!/usr/bin/env bash
# Two guards that keep a CPU without AVX2 from an illegal instruction:
#  1. no AVX2 object defines a shared (weak / COMDAT) symbol outside an *avx2_ns namespace:
#     the linker keeps one copy of such a symbol for the whole program, and if it kept the
#     -mavx2 copy, generic code would run AVX2 instructions;
#  2. (x86-64) no other object of the library contains a VEX-encoded (AVX) instruction.
#   check_isa_symbols.sh <directory of the library's objects> <AVX2 object file>...
set -euo pipefail
dir=$1
shift
isa_objs=("$@")
for obj in "${isa_objs[@]}"; do
  [[ -f "$obj" ]] || { echo "check_isa_symbols: $obj not found" >&2; exit 1; }
  bad=$(nm -C "$obj" | awk '$2 ~ /^[WVu]$/' | grep -v 'avx2_ns' | grep -v 'DW.ref.__gxx_personality_v0' || true)
  if [[ -n "$bad" ]]; then
    echo "shared symbols compiled with AVX2 flags in $obj (build with optimisation, or keep them out of the ISA file):"
    echo "$bad"
    exit 1
  fi
  echo "no shared symbols outside an avx2 namespace in $(basename "$obj")"
done
is_isa_obj() {
  local o
  for o in "${isa_objs[@]}"; do [[ "$1" -ef "$o" ]] && return 0; done
  return 1
}
if [[ $(uname -m) == x86_64 ]] && command -v objdump >/dev/null; then
  status=0
  while IFS= read -r -d '' o; do
    is_isa_obj "$o" && continue
    n=$(objdump -d --no-show-raw-insn "$o" | grep -cE '^\s+[0-9a-f]+:\s+v[a-z]' || true)
    if [[ "$n" != 0 ]]; then
      echo "$o: $n VEX (AVX) instructions outside the ISA file"
      status=1
    fi
  done < <(find "$dir" -name '*.o' -print0)
  [[ $status == 0 ]] && echo "no AVX instructions outside the ISA files"
  exit $status
fi
