#!/usr/bin/env bash
# Three guards that keep a CPU without AVX2 (or without AVX-512) from an illegal instruction:
#  1. no ISA object (AVX2 or AVX-512) defines a shared (weak / COMDAT) symbol outside an
#     *avx2_ns / *avx512_ns namespace: the linker keeps one copy of such a symbol for the
#     whole program, and if it kept the ISA-flagged copy, generic code would run it;
#  2. (x86-64) no AVX2 object contains an AVX-512 instruction (a zmm, opmask or
#     xmm/ymm16–31 operand: EVEX only), so the avx2 row runs on a CPU without AVX-512;
#  3. (x86-64) no other object of the library contains a VEX/EVEX-encoded (AVX) instruction.
#   check_isa_symbols.sh <directory of the library's objects> <ISA object file>... [-- <AVX2 object file>...]
# Objects after "--" are the AVX2 ones (also ISA objects); the ones before it are the other ISA objects.
set -euo pipefail
dir=$1
shift
isa_objs=()
avx2_objs=()
seen_sep=0
for a in "$@"; do
  if [[ "$a" == "--" ]]; then seen_sep=1; continue; fi
  isa_objs+=("$a")
  [[ $seen_sep == 1 ]] && avx2_objs+=("$a")
done
shared_status=0  # every object is listed before failing, not only the first
for obj in "${isa_objs[@]}"; do
  [[ -f "$obj" ]] || { echo "check_isa_symbols: $obj not found" >&2; exit 1; }
  # Allowed: the personality routine's reference (g++) and clang's terminate trampoline (a
  # push and two calls, no vector code), both emitted by any file with exceptions.
  bad=$(nm -C "$obj" | awk '$2 ~ /^[WVu]$/' | grep -vE 'avx2_ns|avx512_ns' | grep -vE 'DW.ref.__gxx_personality_v0|__clang_call_terminate' || true)
  if [[ -n "$bad" ]]; then
    echo "shared symbols compiled with ISA flags in $obj (build with optimisation, or keep them out of the ISA file):"
    echo "$bad"
    shared_status=1
    continue
  fi
  echo "no shared symbols outside an ISA namespace in $(basename "$obj")"
done
[[ $shared_status == 0 ]] || exit 1
if [[ $(uname -m) == x86_64 ]] && command -v objdump >/dev/null; then
  for obj in "${avx2_objs[@]}"; do
    n=$(objdump -d --no-show-raw-insn "$obj" | grep -cE '%zmm|%k[0-7]|%[xy]mm(1[6-9]|2[0-9]|3[01])\b' || true)
    if [[ "$n" != 0 ]]; then
      echo "$obj: $n AVX-512 instructions in an AVX2 object"
      exit 1
    fi
  done
  [[ ${#avx2_objs[@]} != 0 ]] && echo "no AVX-512 instructions in the ${#avx2_objs[@]} AVX2 objects"
fi
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
      echo "$o: $n VEX/EVEX (AVX) instructions outside the ISA files"
      status=1
    fi
  done < <(find "$dir" -name '*.o' -print0)
  [[ $status == 0 ]] && echo "no AVX instructions outside the ISA files"
  exit $status
fi
