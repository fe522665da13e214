"""Times torch autograd of the hand-written attention's backward (the baseline of the
backward benchmark). Prints the median wall seconds and the median process CPU seconds of o.backward(dO)."""
import argparse
import math
import time

import torch

ap = argparse.ArgumentParser()
ap.add_argument("--B", type=int, required=True)
ap.add_argument("--H", type=int, required=True)
ap.add_argument("--L", type=int, required=True)
ap.add_argument("--D", type=int, required=True)
ap.add_argument("--causal", action="store_true")
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--runs", type=int, default=5)
a = ap.parse_args()
torch.set_num_threads(a.threads)
torch.manual_seed(0)
q, k, v = (torch.randn(a.B, a.H, a.L, a.D, requires_grad=True) for _ in range(3))
dO = torch.randn(a.B, a.H, a.L, a.D)
mask = torch.ones(a.L, a.L, dtype=torch.bool).tril() if a.causal else None
times, cpu = [], []
for r in range(a.runs + 1):
    s = (q @ k.transpose(-2, -1)) / math.sqrt(a.D)  # the tutorials' attention, as written
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    o = torch.softmax(s, dim=-1) @ v
    t0, c0 = time.perf_counter(), time.process_time()
    o.backward(dO)
    if r > 0:
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    q.grad = k.grad = v.grad = None
    del s, o
times.sort()
cpu.sort()
print(times[len(times) // 2], cpu[len(cpu) // 2])
