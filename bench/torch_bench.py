#!/usr/bin/python3
"""attn.torch beside torch's own attention in one process (issue 15's benchmark).

  PYTHONPATH=build/python /usr/bin/python3 bench/torch_bench.py [--rounds 3] [--runs 3]
      [--threads 2] [--clock wall|cpu] [--only gpt,bert,s1]
  --threads 1 --clock cpu: process CPU time on one thread, what a loaded shared machine
  disturbs least (OMP_NUM_THREADS=1 too).

gpt:  one training step (forward + backward + AdamW) of examples/tiny_gpt's GPT with 4 layers,
      d_model 256, 4 heads, L = 1024, batch 4: torch 1.13's attention (the textbook with a
      causal mask: it has no F.scaled_dot_product_attention) vs
      attn.torch.scaled_dot_product_attention(is_causal=True). Same weights, same batch.
bert: BERT-base nn.TransformerEncoderLayer(768, 12, 3072, batch_first=True) inference,
      B = 4, L = 512, under torch.inference_mode: torch's (its fused fast path) vs the same
      layer after attn.torch.replace_attention.
s1:   the binding's overhead: attn.torch.scaled_dot_product_attention on (1, 16, 1024, 64)
      float32 tensors vs attn._time_cpp_sdpa (the same attn::sdpa call timed in C++),
      alternated call by call; overhead = median ratio - 1.
Rounds alternate the contenders so that the machine's noise falls on all of them; each
round's number is the median of its runs; the report gives the median and every round.
"""
import argparse
import copy
import os
import statistics
import sys
import time

import torch
from torch import nn

import attn
import attn.torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples", "tiny_gpt"))
import tiny_gpt  # noqa: E402

CLOCK = time.perf_counter


def timed(fn, runs):
    ts = []
    for _ in range(runs):
        t0 = CLOCK()
        fn()
        ts.append(CLOCK() - t0)
    return statistics.median(ts)


def report(title, results, base, fast):
    print(title)
    for who, ts in results.items():
        print(f"  {who:34s} {statistics.median(ts) * 1e3:10.1f} ms   rounds: " + " ".join(f"{x * 1e3:.1f}" for x in ts))
    ratios = sorted(b / f for b, f in zip(results[base], results[fast]))
    print(f"  speed-up {statistics.median(results[base]) / statistics.median(results[fast]):.2f}x "
          f"(per round {ratios[0]:.2f}..{ratios[-1]:.2f})")


def gpt(a):
    torch.manual_seed(0)
    models = {}
    for who in ("torch", "attn"):
        m = tiny_gpt.GPT(256, 1024, d=256, heads=4, layers=4, attention=who)
        if models:
            m.load_state_dict(models["torch"][0].state_dict())
        models[who] = (m, torch.optim.AdamW(m.parameters(), lr=1e-4))
    tokens = torch.randint(0, 256, (4, 1024))
    target = torch.randint(0, 256, (4, 1024))

    def step(who):
        m, opt = models[who]
        loss = nn.functional.cross_entropy(m(tokens).reshape(-1, 256), target.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.item()

    first = {who: step(who) for who in models}  # warm-up; the same loss from the same weights
    print(f"gpt: first-step loss torch {first['torch']:.6f} attn {first['attn']:.6f}")
    res = {"torch attention": [], "attn.torch sdpa": []}
    for _ in range(a.rounds):
        res["torch attention"].append(timed(lambda: step("torch"), a.runs))
        res["attn.torch sdpa"].append(timed(lambda: step("attn"), a.runs))
    report("gpt training step (4 layers, d 256, 4 heads, L 1024, B 4)", res, "torch attention", "attn.torch sdpa")


def bert(a):
    torch.manual_seed(0)
    ref = nn.TransformerEncoderLayer(768, 12, 3072, dropout=0.1, batch_first=True).eval()
    ours = attn.torch.replace_attention(copy.deepcopy(ref))
    x = torch.randn(4, 512, 768)
    with torch.inference_mode():
        err = (ref(x) - ours(x)).abs().max().item()
        print(f"bert: max |attn - torch| = {err:.2e}")
        res = {"torch (fast path)": [], "attn (replace_attention)": []}
        ref(x), ours(x)
        for _ in range(a.rounds):
            res["torch (fast path)"].append(timed(lambda: ref(x), a.runs))
            res["attn (replace_attention)"].append(timed(lambda: ours(x), a.runs))
    report("bert-base TransformerEncoderLayer inference (B 4, L 512)", res, "torch (fast path)",
           "attn (replace_attention)")


def s1(a):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 16, 1024, 64, generator=g) for _ in range(3))
    qn, kn, vn = q.numpy(), k.numpy(), v.numpy()
    cpu = CLOCK is time.process_time
    attn.torch.sdpa(q, k, v)
    attn._time_cpp_sdpa(qn, kn, vn, 1, cpu)
    res = {"attn.torch.sdpa (Python)": [], "attn::sdpa (C++ timer)": []}
    for _ in range(a.rounds):
        py_t, cpp_t = [], []
        for _ in range(a.runs * 3):
            t0 = CLOCK()
            attn.torch.sdpa(q, k, v)
            py_t.append(CLOCK() - t0)
            cpp_t += attn._time_cpp_sdpa(qn, kn, vn, 1, cpu)
        res["attn.torch.sdpa (Python)"].append(statistics.median(py_t))
        res["attn::sdpa (C++ timer)"].append(statistics.median(cpp_t))
    print("s1 (1, 16, 1024, 1024, 64) float32")
    for who, ts in res.items():
        print(f"  {who:34s} {statistics.median(ts) * 1e3:10.2f} ms   rounds: " + " ".join(f"{x * 1e3:.2f}" for x in ts))
    ratios = [p / c - 1 for p, c in zip(res["attn.torch.sdpa (Python)"], res["attn::sdpa (C++ timer)"])]
    med = statistics.median(res["attn.torch.sdpa (Python)"]) / statistics.median(res["attn::sdpa (C++ timer)"]) - 1
    print(f"  binding overhead: median {100 * med:+.2f}% (per round "
          + ", ".join(f"{100 * r:+.1f}%" for r in ratios) + ")")
    # The same overhead measured where the noise cannot hide it: the binding's fixed cost per
    # call (a (1, 1, 4, 8) problem, Python call vs the C++ call), as a fraction of S1's C++ time.
    tq, tk, tv = (torch.randn(1, 1, 4, 8, generator=g) for _ in range(3))
    tn = [x.numpy() for x in (tq, tk, tv)]
    py_tiny, cpp_tiny = [], []
    for _ in range(a.rounds):
        t0 = CLOCK()
        for _ in range(2000):
            attn.torch.sdpa(tq, tk, tv)
        py_tiny.append((CLOCK() - t0) / 2000)
        cpp_tiny.append(statistics.median(attn._time_cpp_sdpa(*tn, 2000, cpu)))
    fixed = statistics.median(py_tiny) - statistics.median(cpp_tiny)
    print(f"  fixed cost per call {fixed * 1e6:.1f} us (tiny problem: Python {statistics.median(py_tiny) * 1e6:.1f} us, "
          f"C++ {statistics.median(cpp_tiny) * 1e6:.1f} us) = {100 * fixed / statistics.median(res['attn::sdpa (C++ timer)']):.3f}% of S1")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--clock", choices=["wall", "cpu"], default="wall")
    ap.add_argument("--only", default="gpt,bert,s1")
    a = ap.parse_args()
    cases = {"gpt": gpt, "bert": bert, "s1": s1}
    for name in ("rounds", "runs", "threads"):
        if getattr(a, name) < 1:
            ap.error(f"--{name} must be >= 1 but got {getattr(a, name)}")
    unknown = [n for n in a.only.split(",") if n not in cases]
    if unknown:
        ap.error(f"--only: unknown case(s) {', '.join(map(repr, unknown))}; expected a comma-separated list of {', '.join(cases)}")
    global CLOCK
    CLOCK = time.process_time if a.clock == "cpu" else time.perf_counter
    torch.set_num_threads(a.threads)
    print(f"threads {a.threads} ({a.clock} clock), {a.rounds} rounds x {a.runs} runs; "
          f"torch {torch.__version__}, attn {attn.__version__}", flush=True)
    for name in a.only.split(","):
        cases[name](a)
        sys.stdout.flush()


if __name__ == "__main__":
    main()
