#!/usr/bin/env bash
# Installs the Debian packages attn needs, only those missing. Idempotent and quick when
# everything is present (one dpkg-query, no network). Usage: install-deps.sh build|test
set -euo pipefail

build_pkgs=(build-essential cmake ninja-build libcli11-dev libgtest-dev libopenblas-dev nlohmann-json3-dev)
test_pkgs=(python3 python3-numpy python3-torch python3-pytest)
# pip install --no-build-isolation . (setup.py) and its test in a venv: Debian's, no download.
test_pkgs+=(python3-pip python3-setuptools python3-wheel python3-venv)
# Heatmaps (attn heatmap, attn demo): cairo + pango, fonts with CJK; tests decode/render them.
build_pkgs+=(pkg-config libcairo2-dev libpango1.0-dev fonts-noto-cjk fonts-dejavu-core)
test_pkgs+=(python3-pil librsvg2-bin)
# The Python module (python/): pybind11 and the headers of /usr/bin/python3.
build_pkgs+=(pybind11-dev python3-dev)
# OpenMPI: attn::dist and `attn ring` build against it (ATTN_WITH_MPI), the ring tests run mpirun.
build_pkgs+=(libopenmpi-dev openmpi-bin)
# mpi4py: attn.dist's communicators from Python (tests/ring/test_ring_python.py, examples/ring_train.py).
test_pkgs+=(python3-mpi4py)
# Fuzzing (fuzz/, run by `make test` and `make fuzz`): clang 14, its libFuzzer and sanitizer
# runtimes (libclang-rt-14-dev) and its OpenMP (libomp-14-dev), since the fuzz build is all clang.
test_pkgs+=(clang-14 libclang-rt-14-dev libomp-14-dev)

case "${1:-build}" in
  build) want=("${build_pkgs[@]}") ;;
  test)  want=("${build_pkgs[@]}" "${test_pkgs[@]}") ;;
  *) echo "install-deps.sh: expected 'build' or 'test' but got '$1'" >&2; exit 2 ;;
esac
missing=()
for p in "${want[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] || missing+=("$p")
done
[[ ${#missing[@]} -eq 0 ]] && exit 0

echo "attn: installing missing Debian packages: ${missing[*]}"
sudo=()
if [[ $(id -u) -ne 0 ]]; then
  command -v sudo >/dev/null || { echo "attn: need root (or sudo) to install: ${missing[*]}" >&2; exit 1; }
  sudo=(sudo)
fi
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -q
"${sudo[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
