"""`mpirun -np P attn ring --grad-out dO.npy --dq --dk --dv` against torch autograd in float64
on the same attention (an independent oracle) and against `attn sdpa --grad-out` on the same
files; the backward's flag and shape errors across ranks.

Tolerance: per gradient, max |g - g_ref| <= 1e-5 * max |g_ref| (float32 forward and backward;
measured errors are printed by the C++ check, ring_backward_check, and sit near 5e-7)."""
import os
import subprocess

import numpy as np
import pytest
import torch

from test_ring_cli import ENV, ATTN, error_lines, make, mpirun


def torch_grads(q, k, v, do, causal=False, key_lengths=None, window=None, scale=None):
    """The gradients of <O, dO> for O = softmax(q kᵀ·scale + mask) v, by torch autograd in
    float64; the mask as include/attn/sdpa.hpp states it (top-left causal j <= i, key lengths,
    a top-left window i - left <= j <= i + right)."""
    q, k, v, do = (torch.tensor(x, dtype=torch.float64) for x in (q, k, v, do))
    for t in (q, k, v):
        t.requires_grad_(True)
    B, Hq, Lq, Dk = q.shape
    Hkv, Lk = k.shape[1], k.shape[2]
    kk, vv = (x.repeat_interleave(Hq // Hkv, dim=1) for x in (k, v))
    s = q @ kk.transpose(-1, -2) * (Dk ** -0.5 if scale is None else scale)
    i = torch.arange(Lq)[:, None]
    j = torch.arange(Lk)[None, :]
    n = torch.full((B,), Lk) if key_lengths is None else torch.tensor(key_lengths)
    keep = (j[None] < n[:, None, None]).expand(B, Lq, Lk)
    if causal:
        keep = keep & (j <= i)
    if window is not None:
        left, right = window
        if left >= 0:
            keep = keep & (j >= i - left)
        if right >= 0:
            keep = keep & (j <= i + right)
    s = s.masked_fill(~keep[:, None], float("-inf"))
    a = torch.softmax(s, dim=-1).nan_to_num(0.0)  # rows with no key: zero weights
    (a @ vv).backward(do)
    return [t.grad.numpy() for t in (q, k, v)]


def run_backward(tmp_path, np_, p, *extra):
    paths = {n: tmp_path / f"{n}_{np_}.npy" for n in ("o", "dq", "dk", "dv")}
    r = mpirun(np_, "--q", p["q"], "--k", p["k"], "--v", p["v"], "--out", paths["o"], "--grad-out", p["do"],
               "--dq", paths["dq"], "--dk", paths["dk"], "--dv", paths["dv"], *extra)
    assert r.returncode == 0, r.stderr
    return [np.load(paths[n]) for n in ("dq", "dk", "dv")]


def with_grad_out(tmp_path, arrays, p, seed=1):
    B, Hq, Lq, _ = arrays["q"].shape
    do = np.random.default_rng(seed).uniform(-1, 1, (B, Hq, Lq, arrays["v"].shape[3])).astype(np.float32)
    p["do"] = tmp_path / "do.npy"
    np.save(p["do"], do)
    return do


def check(got, ref):
    for name, g, r in zip(("dQ", "dK", "dV"), got, ref):
        assert g.dtype == np.float32 and g.shape == r.shape, (name, g.dtype, g.shape, r.shape)
        err = np.abs(g - r).max() / np.abs(r).max()
        assert err <= 1e-5, f"{name}: max error {err:.2e} of max |ref|"


@pytest.mark.parametrize("np_", [1, 2, 3, 4])
@pytest.mark.parametrize("causal", [False, True])
def test_matches_torch_autograd(tmp_path, np_, causal):
    arrays, p = make(tmp_path, 2, 4, 2, 37, 37, 12, 5)  # GQA, Dk != Dv, 37 not divisible by 2P
    do = with_grad_out(tmp_path, arrays, p)
    got = run_backward(tmp_path, np_, p, *(["--causal"] if causal else []))
    check(got, torch_grads(arrays["q"], arrays["k"], arrays["v"], do, causal=causal))


@pytest.mark.parametrize("np_", [2, 4])
@pytest.mark.parametrize("layout", ["zigzag", "contiguous"])
def test_window_key_lengths_equal_attn_sdpa(tmp_path, np_, layout):
    arrays, p = make(tmp_path, 2, 2, 1, 40, 40, 8, 8, seed=5)
    do = with_grad_out(tmp_path, arrays, p)
    np.save(tmp_path / "kl.npy", np.array([40, 23], dtype=np.int64))
    common = ["--q", p["q"], "--k", p["k"], "--v", p["v"], "--key-lengths", tmp_path / "kl.npy",
              "--causal", "top-left", "--window-left", "6", "--scale", "0.4"]
    sd = subprocess.run([ATTN, "sdpa", *map(str, common), "--out", str(tmp_path / "so.npy"), "--grad-out", str(p["do"]),
                         "--dq", str(tmp_path / "sdq.npy"), "--dk", str(tmp_path / "sdk.npy"),
                         "--dv", str(tmp_path / "sdv.npy")], capture_output=True, text=True, env=ENV)
    assert sd.returncode == 0, sd.stderr
    got = run_backward(tmp_path, np_, p, *common[6:], "--layout", layout)
    check(got, [np.load(tmp_path / f"sd{n}.npy") for n in ("q", "k", "v")])
    check(got, torch_grads(arrays["q"], arrays["k"], arrays["v"], do, causal=True, key_lengths=[40, 23], window=(6, -1),
                           scale=0.4))


@pytest.mark.parametrize("np_", [1, 3])
def test_flag_and_shape_errors_on_all_ranks_without_output(tmp_path, np_):
    arrays, p = make(tmp_path, 1, 2, 1, 12, 12, 4, 4)
    with_grad_out(tmp_path, arrays, p)
    out, dq, dk, dv = (tmp_path / f"{n}.npy" for n in ("o", "dq", "dk", "dv"))
    base = ["--q", p["q"], "--k", p["k"], "--v", p["v"], "--out", out]
    r = mpirun(np_, *base, "--grad-out", p["do"], "--dq", dq, "--dk", dk)
    assert r.returncode == 2 and error_lines(r) == [
        "attn: error: --grad-out: needs --dq, --dk and --dv (where to write the gradients)"], r.stderr
    r = mpirun(np_, *base, "--dq", dq)
    assert r.returncode == 2 and len(error_lines(r)) == 1 and "--dq/--dk/--dv: need --grad-out" in r.stderr, r.stderr
    np.save(tmp_path / "do5.npy", np.zeros((1, 2, 12, 5), np.float32))
    r = mpirun(np_, *base, "--grad-out", tmp_path / "do5.npy", "--dq", dq, "--dk", dk, "--dv", dv)
    assert r.returncode == 2 and len(error_lines(r)) == 1 and "must have O's shape" in r.stderr, r.stderr
    r = mpirun(np_, *base, "--grad-out", p["do"], "--dq", out, "--dk", dk, "--dv", dv)
    assert r.returncode == 2 and len(error_lines(r)) == 1, r.stderr
    # The reference backward normalises a block over its own keys: its ring gradients were O(1)
    # wrong (a review). It is refused on every rank before anything runs.
    r = mpirun(np_, *base, "--causal", "--impl", "reference", "--grad-out", p["do"], "--dq", dq, "--dk", dk, "--dv", dv)
    assert r.returncode == 2 and len(error_lines(r)) == 1 and "impl: the reference backward normalises each block" in r.stderr, r.stderr
    assert [f for f in (out, dq, dk, dv) if f.exists()] == [] and list(tmp_path.glob("*.npy.*")) == []


@pytest.mark.parametrize("np_", [1, 3])
def test_shard_outputs_hold_each_ranks_rows(tmp_path, np_):
    arrays, p = make(tmp_path, 1, 2, 1, 29, 29, 8, 4, seed=2)
    with_grad_out(tmp_path, arrays, p)
    whole = run_backward(tmp_path, np_, p, "--causal")
    names = {n: tmp_path / f"s{n}.npy" for n in ("o", "dq", "dk", "dv")}
    r = mpirun(np_, "--q", p["q"], "--k", p["k"], "--v", p["v"], "--out", names["o"], "--grad-out", p["do"],
               "--dq", names["dq"], "--dk", names["dk"], "--dv", names["dv"], "--causal", "--shard-outputs")
    assert r.returncode == 0, r.stderr
    assert not any(f.exists() for f in names.values())  # only the shards
    for rank in range(np_):
        # zigzag: rank r holds chunks r and 2P-1-r of 2P (chunk c: rows [c*L/2P, (c+1)*L/2P))
        rows = np.concatenate([np.arange(c * 29 // (2 * np_), (c + 1) * 29 // (2 * np_)) for c in (rank, 2 * np_ - 1 - rank)])
        for name, g in zip(("dq", "dk", "dv"), whole):
            shard = np.load(tmp_path / f"s{name}.rank{rank}.npy")
            assert np.array_equal(shard, g[:, :, rows]), (rank, name)


@pytest.mark.parametrize("np_", [2, 3])
@pytest.mark.parametrize("layout", ["zigzag", "contiguous"])
def test_score_modifiers_equal_attn_sdpa(tmp_path, np_, layout):
    """--softcap, --alibi, --sinks (and --dsinks) through the ring give `attn sdpa`'s O and
    gradients on the whole sequence. Top-left causal with key lengths below Lk puts the ALiBi
    (bottom-right) diagonal away from the causal one, so blocks exercise the edge shift."""
    arrays, p = make(tmp_path, 2, 4, 2, 33, 33, 8, 6, seed=9)
    with_grad_out(tmp_path, arrays, p)
    np.save(tmp_path / "kl.npy", np.array([33, 19], dtype=np.int64))
    np.save(tmp_path / "sinks.npy", np.array([0.5, -1.0, 2.0, 0.0], dtype=np.float32))
    common = ["--q", p["q"], "--k", p["k"], "--v", p["v"], "--key-lengths", tmp_path / "kl.npy", "--causal", "top-left",
              "--softcap", "3.0", "--alibi", "--sinks", tmp_path / "sinks.npy"]
    sd = subprocess.run([ATTN, "sdpa", *map(str, common), "--out", str(tmp_path / "so.npy"), "--grad-out", str(p["do"]),
                         "--dq", str(tmp_path / "sdq.npy"), "--dk", str(tmp_path / "sdk.npy"),
                         "--dv", str(tmp_path / "sdv.npy"), "--dsinks", str(tmp_path / "sds.npy")],
                        capture_output=True, text=True, env=ENV)
    assert sd.returncode == 0, sd.stderr
    got = run_backward(tmp_path, np_, p, *common[6:], "--layout", layout, "--dsinks", tmp_path / "rds.npy")
    check(got, [np.load(tmp_path / f"sd{n}.npy") for n in ("q", "k", "v")])
    o, so = np.load(tmp_path / f"o_{np_}.npy"), np.load(tmp_path / "so.npy")
    assert np.abs(o - so).max() <= 1e-5 * np.abs(so).max()
    ds, sds = np.load(tmp_path / "rds.npy"), np.load(tmp_path / "sds.npy")
    assert ds.shape == (4,) and np.abs(ds - sds).max() <= 1e-5 * np.abs(sds).max()


@pytest.mark.parametrize("np_", [2, 4])
@pytest.mark.parametrize("layout", ["zigzag", "contiguous"])
def test_dropout_equals_attn_sdpa(tmp_path, np_, layout):
    """--dropout P --seed N through the ring drops what `attn sdpa --dropout P --seed N` drops on
    the whole sequence: O and the gradients agree, while sdpa with seed N+1 is far from both
    (the comparison sees the mask)."""
    arrays, p = make(tmp_path, 2, 4, 2, 35, 35, 8, 6, seed=12)
    with_grad_out(tmp_path, arrays, p)
    common = ["--q", p["q"], "--k", p["k"], "--v", p["v"], "--causal", "top-left", "--dropout", "0.3"]

    def sdpa(seed, tag):
        r = subprocess.run([ATTN, "sdpa", *map(str, common), "--seed", str(seed), "--out", str(tmp_path / f"{tag}o.npy"),
                            "--grad-out", str(p["do"]), "--dq", str(tmp_path / f"{tag}dq.npy"),
                            "--dk", str(tmp_path / f"{tag}dk.npy"), "--dv", str(tmp_path / f"{tag}dv.npy")],
                           capture_output=True, text=True, env=ENV)
        assert r.returncode == 0, r.stderr
        return [np.load(tmp_path / f"{tag}{n}.npy") for n in ("o", "dq", "dk", "dv")]

    want, other = sdpa(77, "s"), sdpa(78, "x")
    got = run_backward(tmp_path, np_, p, *common[6:], "--seed", "77", "--layout", layout)
    o = np.load(tmp_path / f"o_{np_}.npy")
    check(got, want[1:])
    assert np.abs(o - want[0]).max() <= 1e-5 * np.abs(want[0]).max()
    assert np.abs(o - other[0]).max() > 1e-2 * np.abs(want[0]).max()
    assert np.abs(got[2] - other[3]).max() > 1e-2 * np.abs(want[3]).max()
