#!/usr/bin/env bash
# ggml's CPU flash-attention decode step on S5/S7 (f16 and f32 K/V, 2 threads) — a peer figure
# for issue 16, target 4 (docs/decode.md, "Beside ggml"). Not part of the build or the tests.
# Fetches the prebuilt ggml of the npm package @node-llama-cpp/linux-x64 3.22.1 (ggml 0.25.1,
# commit 0ad4a86; CPU variants per microarchitecture), links the harness against the base
# library and the variant for this CPU, checks one step against a double-precision softmax, and
# times steady and cold steps.   usage: dev/peers/ggml/run.sh [WORKDIR=/tmp/attn-ggml] [VARIANT=zen4]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
work="${1:-/tmp/attn-ggml}"
variant="${2:-zen4}"
mkdir -p "$work/lib"
cd "$work"
if [ ! -f package/bins/linux-x64/libggml-base.so ]; then
    npm pack @node-llama-cpp/linux-x64@3.22.1 >/dev/null
    tar xzf node-llama-cpp-linux-x64-3.22.1.tgz
fi
for f in libggml-base.so "libggml-cpu-$variant.so"; do ln -sf "$work/package/bins/linux-x64/$f" "lib/$f"; done
g++ -O2 -std=c++17 -o fa_decode_bench "$here/fa_decode_bench.cpp" -I"$here" -L"$work/lib" -l"ggml-cpu-$variant" \
    -lggml-base -ldl -Wl,-rpath,"$work/lib"
for shape in S5 S7; do
    for kv in f16 f32; do
        ./fa_decode_bench "$shape" "$kv" check
        ./fa_decode_bench "$shape" "$kv" time 15 2
    done
done
