#!/usr/bin/python3
"""PyTorch baselines for `attn bench`, run by the bench as a subprocess on the same shapes.

Prints one JSON object on its last line of stdout:
  {"status": "ok", "samples": [seconds, ...], "warmup_s": s, "peak_rss": bytes, ...}
or {"status": "unavailable"|"error", "note": "..."}.

Modes (the arguments are the sizes of bench/shapes.md):
  sdpa           hand-written attention, as the tutorials write it and users run it:
                 softmax(q @ k.transpose(-2, -1) * scale + mask) @ v   (no_grad)
  sdpa-backward  the same expression, forward + backward through autograd
  mha            nn.MultiheadAttention(E, h, batch_first=True) in eval + inference mode
                 (PyTorch's fused fast path), self-attention on (B, L, E)
Timing: one warm-up call, then up to --runs calls, stopping after --max-seconds of timed
calls (at least one); a warm-up longer than --max-seconds is itself the one sample — the same
rules as the C++ side (bench/harness.hpp).
"""
import argparse
import json
import math
import resource
import sys
import time


def status_kib(key):
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return -1


def reset_peak_rss():
    """VmHWM back to the current RSS (Linux >= 4.0), so the peak is of what runs next."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def emit(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def cpu_seconds():
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime


def cpu_share(cpu, wall, threads):
    """CPU time / (wall time x threads), 0 to 1: a busy stretch measures a little above 1 from the
    CPU clock's granularity, which is 1 (bench/machine.hpp's cpu_share, the C++ rows' rule)."""
    return min(1.0, max(0.0, cpu / (wall * threads))) if wall > 0 and threads >= 1 else 0.0


def time_calls(fn, runs, max_seconds, threads):
    """-> (samples, warm-up seconds, warm-up counted as the sample?, CPU share of the timed calls)"""
    cpu0 = cpu_seconds()
    t0 = time.perf_counter()
    fn()
    warmup = time.perf_counter() - t0
    if warmup >= max_seconds:  # the warm-up alone spent the budget: it is the one sample
        return [warmup], warmup, True, cpu_share(cpu_seconds() - cpu0, warmup, threads)
    cpu0 = cpu_seconds()
    samples, spent = [], 0.0
    for r in range(max(1, runs)):
        if r > 0 and spent >= max_seconds:
            break
        t0 = time.perf_counter()
        fn()
        dt = time.perf_counter() - t0
        samples.append(dt)
        spent += dt
    # Below ~0.1 s the CPU time is too coarse for a share: 0 = unknown (as on the C++ side).
    return samples, warmup, False, cpu_share(cpu_seconds() - cpu0, spent, threads) if spent >= 0.1 else 0.0


def causal_mask(torch, lq, lk, causal):
    """Additive (Lq, Lk) mask: -inf where query i may not see key j.
    top-left: j > i;  bottom-right: j > i + Lk - Lq."""
    if causal == "none":
        return None
    offset = 0 if causal == "top-left" else lk - lq
    hidden = torch.ones(lq, lk, dtype=torch.bool).triu(diagonal=1 + offset)
    return torch.zeros(lq, lk).masked_fill(hidden, float("-inf"))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=["sdpa", "sdpa-backward", "mha"], required=True)
    for name in ["B", "Hq", "Hkv", "Lq", "Lk", "Dk", "Dv", "E", "heads", "L"]:
        ap.add_argument("--" + name, type=int, default=0)
    ap.add_argument("--causal", choices=["none", "top-left", "bottom-right"], default="none")
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--max-seconds", type=float, default=15.0)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()

    try:
        import torch
    except ImportError as e:
        emit({"status": "unavailable", "note": "torch is not installed for %s (%s)" % (sys.executable, e)})
        return 0
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)

    def uniform(*shape, grad=False):
        return (torch.rand(*shape) * 2 - 1).requires_grad_(grad)

    if a.mode in ("sdpa", "sdpa-backward"):
        if min(a.B, a.Hq, a.Hkv, a.Lq, a.Lk, a.Dk, a.Dv) < 1 or a.Hq % a.Hkv:
            emit({"status": "error", "note": "bad sizes: B, Hq, Hkv, Lq, Lk, Dk, Dv must be >= 1 and Hkv | Hq"})
            return 0
        grad = a.mode == "sdpa-backward"
        q = uniform(a.B, a.Hq, a.Lq, a.Dk, grad=grad)
        k = uniform(a.B, a.Hkv, a.Lk, a.Dk, grad=grad)
        v = uniform(a.B, a.Hkv, a.Lk, a.Dv, grad=grad)
        mask = causal_mask(torch, a.Lq, a.Lk, a.causal)
        scale = 1.0 / math.sqrt(a.Dk)
        group = a.Hq // a.Hkv

        def attention(q, k, v):
            if group > 1:  # GQA as users write it in torch 1.13: copy each KV head `group` times
                k = k.repeat_interleave(group, dim=1)
                v = v.repeat_interleave(group, dim=1)
            s = q @ k.transpose(-2, -1) * scale
            if mask is not None:
                s = s + mask
            return torch.softmax(s, dim=-1) @ v

        if grad:
            dout = uniform(a.B, a.Hq, a.Lq, a.Dv)

            def fn():
                for t in (q, k, v):
                    t.grad = None
                attention(q, k, v).backward(dout)
            what = "autograd of softmax(q@k^T*scale+mask)@v (forward+backward)"
        else:
            def fn():
                with torch.no_grad():
                    attention(q, k, v)
            what = "softmax(q@k^T*scale+mask)@v"
    else:
        if min(a.B, a.L, a.E, a.heads) < 1 or a.E % a.heads:
            emit({"status": "error", "note": "bad sizes: B, L, E, heads must be >= 1 and heads | E"})
            return 0
        mha = torch.nn.MultiheadAttention(a.E, a.heads, batch_first=True).eval()
        x = torch.randn(a.B, a.L, a.E)

        def fn():
            with torch.inference_mode():
                mha(x, x, x, need_weights=False)
        what = "nn.MultiheadAttention (eval, inference_mode, need_weights=False)"

    was_reset = reset_peak_rss()
    baseline = status_kib("VmRSS")
    try:
        samples, warmup, warmup_counted, cpu_share = time_calls(fn, a.runs, a.max_seconds, a.threads)
    except RuntimeError as e:  # e.g. out of memory inside torch
        emit({"status": "error", "note": str(e).splitlines()[0][:300]})
        return 0
    emit({
        "status": "ok",
        "what": what,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "samples": samples,
        "warmup_s": warmup,
        "warmup_counted": warmup_counted,
        "cpu_share": cpu_share,
        "peak_rss": status_kib("VmHWM"),
        "baseline_rss": baseline,
        "peak_rss_reset": was_reset,
    })
    return 0


if __name__ == "__main__":
    sys.exit(main())
