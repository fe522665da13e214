#!/usr/bin/python3
"""attn's Python module next to torch in one process, and the binding's overhead.

  PYTHONPATH=build/python /usr/bin/python3 bench/python_bench.py [--rounds 5] [--runs 5] [--threads 2]
                                                               [--clock wall|cpu]
  --threads 1 --clock cpu: everything on one thread timed by process CPU time — the numbers a
  loaded shared machine cannot disturb much (set OMP_NUM_THREADS=1 too: attn uses OpenMP).

S1: scaled dot-product attention (1, 16, 1024, 1024, 64) float32.
    attn.scaled_dot_product_attention vs torch's textbook softmax(Q·Kᵀ/√d)·V (torch 1.13
    has no F.scaled_dot_product_attention); and vs attn._time_cpp_sdpa, the same attn::sdpa
    call timed in C++ on views built once — the binding's overhead is attn.sdpa's median over
    that median, minus 1. The two are timed call by call in alternation.
S6: MultiheadAttention(768, 12, batch_first=True), B=4, L=512, self-attention, eval mode,
    need_weights=False on both sides (torch under inference_mode).
Rounds alternate the contenders so that a shared machine's noise falls on all of them;
every number is a median of per-round medians.
"""
import argparse
import statistics
import time

import numpy as np
import torch

import attn


CLOCK = time.perf_counter


def median_time(fn, runs):
    fn()  # warm-up: page faults, thread pools
    ts = []
    for _ in range(runs):
        t0 = CLOCK()
        fn()
        ts.append(CLOCK() - t0)
    return statistics.median(ts)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--clock", choices=["wall", "cpu"], default="wall")
    a = ap.parse_args()
    for name in ("rounds", "runs", "threads"):
        if getattr(a, name) < 1:
            ap.error(f"--{name} must be >= 1 but got {getattr(a, name)}")
    global CLOCK
    cpu = a.clock == "cpu"
    CLOCK = time.process_time if cpu else time.perf_counter
    torch.set_num_threads(a.threads)
    rng = np.random.default_rng(0)

    # S1
    q, k, v = (rng.standard_normal((1, 16, 1024, 64), dtype=np.float32) for _ in range(3))
    tq, tk, tv = (torch.from_numpy(x) for x in (q, k, v))

    def torch_s1():
        with torch.inference_mode():
            return torch.softmax(tq @ tk.transpose(-1, -2) * (1 / 8.0), -1) @ tv

    err = np.abs(attn.sdpa(q, k, v) - torch_s1().numpy()).max()
    s1 = {"attn.sdpa (Python)": [], "attn::sdpa (C++ timer)": [], "torch textbook": []}
    attn.sdpa(q, k, v)
    attn._time_cpp_sdpa(q, k, v, 1, cpu)
    for _ in range(a.rounds):
        py_t, cpp_t = [], []
        for _ in range(a.runs):  # alternate call by call: the same noise on both
            t0 = CLOCK()
            attn.sdpa(q, k, v)
            py_t.append(CLOCK() - t0)
            cpp_t += attn._time_cpp_sdpa(q, k, v, 1, cpu)
        s1["attn.sdpa (Python)"].append(statistics.median(py_t))
        s1["attn::sdpa (C++ timer)"].append(statistics.median(cpp_t))
        s1["torch textbook"].append(median_time(torch_s1, a.runs))

    # S6
    torch.manual_seed(0)
    t = torch.nn.MultiheadAttention(768, 12, batch_first=True).eval()
    m = attn.MultiheadAttention(768, 12, batch_first=True)
    m.load_state_dict({n: p.numpy() for n, p in t.state_dict().items()})
    x = rng.standard_normal((4, 512, 768), dtype=np.float32)
    tx = torch.from_numpy(x)

    def torch_s6():
        with torch.inference_mode():
            return t(tx, tx, tx, need_weights=False)[0]

    err6 = np.abs(m(x, x, x, need_weights=False)[0] - torch_s6().numpy()).max()
    s6 = {"attn.MultiheadAttention": [], "torch nn.MultiheadAttention": []}
    for _ in range(a.rounds):
        s6["attn.MultiheadAttention"].append(median_time(lambda: m(x, x, x, need_weights=False), a.runs))
        s6["torch nn.MultiheadAttention"].append(median_time(torch_s6, a.runs))

    print(f"threads {a.threads} ({a.clock} clock), {a.rounds} rounds x {a.runs} runs; torch {torch.__version__}, attn {attn.__version__}")
    for name, shape, res, e in (("S1", "(1,16,1024,1024,64)", s1, err), ("S6", "B=4 L=512 E=768 h=12", s6, err6)):
        print(f"{name} {shape}   max |attn - torch| = {e:.2e}")
        for who, ts in res.items():
            print(f"  {who:30s} {statistics.median(ts) * 1e3:9.2f} ms   rounds: "
                  + " ".join(f"{x * 1e3:.1f}" for x in ts))
    py, cpp = statistics.median(s1["attn.sdpa (Python)"]), statistics.median(s1["attn::sdpa (C++ timer)"])
    ratios = [p / c for p, c in zip(s1["attn.sdpa (Python)"], s1["attn::sdpa (C++ timer)"])]
    print(f"S1 binding overhead: median {100 * (py / cpp - 1):+.2f}%  "
          f"(per-round {', '.join(f'{100 * (r - 1):+.1f}%' for r in ratios)})")
    print(f"S1 speed-up vs torch: {statistics.median(s1['torch textbook']) / py:.2f}x;  "
          f"S6: {statistics.median(s6['torch nn.MultiheadAttention']) / statistics.median(s6['attn.MultiheadAttention']):.2f}x")


if __name__ == "__main__":
    main()
