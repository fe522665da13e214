"""The flash kernel through the CLI (`attn sdpa --impl flash`) against PyTorch's
hand-written attention in float64: softmax(Q·Kᵀ·scale + mask)·V, with causal masks
built from torch.tril, a bool keep-mask, an additive mask, GQA (K/V heads repeated with
repeat_interleave in torch, never in attn) and Dk != Dv.

Tolerance: float32 rounding of inputs already equal (the same float32 arrays go to both);
attn computes in float32, torch in float64: |diff| <= 5e-6 + 5e-6·|ref| for these
unit-normal inputs with L <= 300, D <= 128 — about 40 float32 ulps of an O(1) value, for
dot products of up to 128 terms and sums of up to 300; the worst element measured uses
12 % of it. (The C++ tests derive a per-element bound; this is a second, independent
oracle with a fixed budget.)
"""
import os
import subprocess
import tempfile

import numpy as np
import pytest
import torch

ATTN = os.environ.get("ATTN_BIN", "attn")


def torch_attention(q, k, v, scale, keep=None, add=None, causal=None, lse=False):
    q, k, v = (torch.from_numpy(x).double() for x in (q, k, v))
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    s = q @ k.transpose(-1, -2) * scale
    lq, lk = s.shape[-2], s.shape[-1]
    if add is not None:
        s = s + torch.from_numpy(add).double()
    allowed = torch.ones(lq, lk, dtype=torch.bool)
    if causal == "top-left":
        allowed = torch.ones(lq, lk, dtype=torch.bool).tril(0)
    elif causal == "bottom-right":
        allowed = torch.ones(lq, lk, dtype=torch.bool).tril(lk - lq)
    allowed = allowed.expand_as(s)
    if keep is not None:
        allowed = allowed & torch.from_numpy(keep)
    s = s.masked_fill(~allowed, float("-inf"))
    m = s.amax(-1, keepdim=True)
    row_ok = torch.isfinite(m)
    p = torch.where(row_ok, torch.exp(s - torch.where(row_ok, m, torch.zeros_like(m))), torch.zeros_like(s))
    denom = p.sum(-1, keepdim=True)
    a = torch.where(denom > 0, p / torch.where(denom > 0, denom, torch.ones_like(denom)), torch.zeros_like(p))
    out = (a @ v).numpy()
    l = torch.where(denom[..., 0] > 0, (m[..., 0] + torch.log(denom[..., 0])), torch.full_like(denom[..., 0], float("-inf")))
    return out, l.numpy()


CASES = [
    # B, Hq, Hkv, Lq, Lk, Dk, Dv, causal, mask
    (1, 2, 2, 65, 65, 64, 64, "top-left", None),
    (2, 4, 2, 7, 130, 32, 48, "bottom-right", "bool"),
    (1, 8, 1, 1, 300, 128, 128, None, "add"),
    (1, 3, 3, 100, 63, 80, 16, "top-left", "add"),
    (2, 2, 1, 33, 33, 96, 96, None, "bool"),
]


@pytest.mark.parametrize("case", CASES)
def test_flash_matches_torch(case):
    B, Hq, Hkv, Lq, Lk, Dk, Dv, causal, mask = case
    rng = np.random.default_rng(Lq * 1000 + Lk)
    q = rng.standard_normal((B, Hq, Lq, Dk)).astype(np.float32)
    k = rng.standard_normal((B, Hkv, Lk, Dk)).astype(np.float32)
    v = rng.standard_normal((B, Hkv, Lk, Dv)).astype(np.float32)
    keep = add = None
    with tempfile.TemporaryDirectory() as d:
        paths = {n: os.path.join(d, n + ".npy") for n in ("q", "k", "v", "mask", "out", "lse")}
        np.save(paths["q"], q)
        np.save(paths["k"], k)
        np.save(paths["v"], v)
        cmd = [ATTN, "sdpa", "--q", paths["q"], "--k", paths["k"], "--v", paths["v"], "--out", paths["out"],
               "--lse", paths["lse"], "--impl", "flash", "--verbose"]
        if causal:
            cmd += ["--causal", causal]
        if mask == "bool":
            keep = rng.random((B, 1, Lq, Lk)) < 0.7
            np.save(paths["mask"], keep)
            cmd += ["--mask", paths["mask"]]
        elif mask == "add":
            add = (rng.standard_normal((Lq, Lk)) * 2).astype(np.float32)
            add[rng.random((Lq, Lk)) < 0.1] = -np.inf
            np.save(paths["mask"], add)
            cmd += ["--mask", paths["mask"]]
        r = subprocess.run(cmd, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        assert "ran: flash" in r.stderr
        out = np.load(paths["out"])
        lse = np.load(paths["lse"])
    ref, ref_lse = torch_attention(q, k, v, 1.0 / np.sqrt(Dk), keep, add, causal)
    assert not np.isnan(out).any()
    np.testing.assert_allclose(out, ref, rtol=5e-6, atol=5e-6)
    fin = np.isfinite(ref_lse)
    assert (np.isneginf(lse) == ~fin).all()
    np.testing.assert_allclose(lse[fin], ref_lse[fin], rtol=5e-6, atol=5e-6)
