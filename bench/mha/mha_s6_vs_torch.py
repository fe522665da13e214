#!/usr/bin/python3
"""S6 (MHA layer, BERT-base: B=4, L=512, E=768, h=12) — attn beside PyTorch, in one run.

  /usr/bin/python3 bench/mha/mha_s6_vs_torch.py --bin build/bench/mha/attn_mha_s6 [--rounds 3] [--runs 5]

Rounds alternate attn (the attn_mha_s6 program: forward and its parts) and torch's
nn.MultiheadAttention(768, 12, batch_first=True) in eval mode under torch.inference_mode()
with need_weights=False — the conditions of its fused fast path, which the script checks
was taken (F.multi_head_attention_forward, the slow path, must not be called). Both use
2 threads. Alternating rounds spread a shared machine's noise over both sides; the
speed-up reported is the median over rounds of torch's median / attn's median.

--threads 1 --clock cpu: both sides on one thread, timed by process CPU time — numbers a
machine shared with other jobs does not inflate (wall time there measures the queue).
"""
import argparse
import json
import os
import statistics
import subprocess
import time

import torch
import torch.nn.functional as F


def torch_median(runs, clock):
    torch.manual_seed(0)
    m = torch.nn.MultiheadAttention(768, 12, batch_first=True).eval()
    x = torch.randn(4, 512, 768)
    calls = {"slow": 0}
    slow = F.multi_head_attention_forward

    def counting(*a, **k):
        calls["slow"] += 1
        return slow(*a, **k)

    F.multi_head_attention_forward = counting
    try:
        with torch.inference_mode():
            m(x, x, x, need_weights=False)  # warm-up
            t = []
            for _ in range(runs):
                t0 = clock()
                m(x, x, x, need_weights=False)
                t.append(clock() - t0)
    finally:
        F.multi_head_attention_forward = slow
    return statistics.median(t), calls["slow"] == 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--parts", default="all", help="attn_mha_s6 --parts: all, forward or projections")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--clock", choices=["wall", "cpu"], default="wall")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    clock = time.perf_counter if args.clock == "wall" else time.process_time
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), OPENBLAS_NUM_THREADS=str(args.threads))
    flop = None
    rows = []
    for r in range(args.rounds):
        out = subprocess.run([args.bin, "--runs", str(args.runs), "--parts", args.parts, "--clock", args.clock],
                             check=True, capture_output=True, text=True, env=env).stdout
        a = json.loads(out.strip().splitlines()[-1])
        flop = a["flop"]
        t, fast = torch_median(args.runs, clock)
        a["torch_s"] = t
        a["torch_fast_path"] = fast
        rows.append(a)
        parts = ", ".join(f"{k} {v['median_s'] * 1e3:.1f} ms ({v['gflops']:.1f} GFLOP/s)"
                          for k, v in a.items() if isinstance(v, dict) and "median_s" in v)
        print(f"round {r + 1}: attn {parts}; torch {t * 1e3:.1f} ms ({flop['forward'] / t * 1e-9:.1f} GFLOP/s, "
              f"fast path {'yes' if fast else 'NO'})", flush=True)
    summary = {"torch_version": torch.__version__, "threads": args.threads, "clock": args.clock, "flop": flop,
               "torch_median_s": statistics.median(r["torch_s"] for r in rows),
               "attention_kernel": rows[-1].get("attention_kernel", "")}
    for part in ("forward", "qkv_gemm", "out_gemm", "square_gemm", "attention"):
        if part in rows[0]:
            summary[part + "_median_s"] = statistics.median(r[part]["median_s"] for r in rows)
    if "forward" in rows[0]:
        summary["speedup_vs_torch"] = statistics.median(r["torch_s"] / r["forward"]["median_s"] for r in rows)
    if "qkv_gemm" in rows[0]:
        # projection rate as a fraction of the same BLAS on the square GEMM, per round
        summary["qkv_vs_square"] = statistics.median(
            r["qkv_gemm"]["gflops"] / r["square_gemm"]["gflops"] for r in rows)
        summary["out_vs_square"] = statistics.median(
            r["out_gemm"]["gflops"] / r["square_gemm"]["gflops"] for r in rows)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
