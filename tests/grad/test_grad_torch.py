"""attn sdpa --grad-out … against torch 1.13 autograd of the textbook expression, through
the CLI. float32 inputs run the tiled backward; torch computes in float64 from the same
float32 values. Dropout uses an independent numpy Philox4x32-10 of the documented keying.

Tolerance (float32 kernel): max |attn − torch| ≤ 3e-5 · the case's largest gradient —
fp32 rounding ε = 6e-8 over sums of up to ~2·10⁴ terms with random signs grows like
√n·ε ≈ 1e-5; 3e-5 leaves room for cancellation. float64 inputs (the reference): 1e-10.
"""
import os
import subprocess
import tempfile

import sys

import numpy as np
import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from reference import dropout_factor, philox4x32_10  # noqa: E402  (tests/python/reference.py)

ATTN = os.environ.get("ATTN_BIN", "attn")
TOL32 = 3e-5
TOL64 = 1e-10


def test_philox_known_answers():
    # Random123 tests/kat_vectors, the philox4x32 10 lines.
    vecs = [((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
            ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
            ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
             (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1))]
    for ctr, key, want in vecs:
        got = philox4x32_10([np.array([c]) for c in ctr], key)
        assert tuple(int(g[0]) for g in got) == want


def keep_mask(c, kl, qo):
    """Structural masks as the docs define them: (B, 1, Lq, Lk) bool, True = may attend.
    Query i of sequence b has its diagonal at d_b(i) = i + offset_b: the query offset qo ((B,))
    when given, else 0 (top-left) or n_b − Lq (bottom-right), n_b = kl[b] (Lk without kl)."""
    B, Lq, Lk = c["B"], c["Lq"], c["Lk"]
    i = np.arange(Lq)[None, None, :, None]
    j = np.arange(Lk)[None, None, None, :]
    n = (kl if kl is not None else np.full(B, Lk)).astype(np.int64)[:, None, None, None]

    def diagonal(align):
        if qo is not None:
            return i + qo.astype(np.int64)[:, None, None, None]
        return i + 0 * n if align == "top-left" else i + n - Lq

    keep = np.broadcast_to(j < n, (B, 1, Lq, Lk)).copy()
    if c["causal"] != "none":
        keep &= j <= diagonal(c["causal"])
    if c["window"] is not None:
        left, right, align = c["window"]
        d = diagonal(align)
        if left >= 0:
            keep &= j >= d - left
        if right >= 0:
            keep &= j <= d + right
    return keep


def torch_grads(c, q, k, v, dO, mask, kl, qo, drop):
    """Textbook attention in float64 with autograd; returns O, dQ, dK, dV."""
    q, k, v = (torch.tensor(x, dtype=torch.float64, requires_grad=True) for x in (q, k, v))
    g = c["Hq"] // c["Hkv"]
    kk, vv = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    s = (q @ kk.transpose(-2, -1)) * (1.0 / np.sqrt(c["Dk"]))
    keep = torch.tensor(keep_mask(c, kl, qo))
    if mask is not None and mask.dtype == np.bool_:
        keep = keep & torch.tensor(mask)
    elif mask is not None:
        s = s + torch.tensor(mask, dtype=torch.float64)
    keep = keep.expand(s.shape)
    s = s.masked_fill(~keep, float("-inf"))
    if mask is not None and mask.dtype != np.bool_:
        keep = keep & torch.isfinite(s)
    dead = ~keep.any(-1, keepdim=True)  # rows with no visible key: output 0, no gradient
    a = torch.softmax(s.masked_fill(dead, 0.0), dim=-1) * (~dead)
    if drop is not None:
        a = a * torch.tensor(drop)
    o = a @ vv
    (o * torch.tensor(dO, dtype=torch.float64)).sum().backward()
    return o.detach().numpy(), q.grad.numpy(), k.grad.numpy(), v.grad.numpy()


def run_cli(tmp, c, q, k, v, dO, mask, kl, qo):
    files = {"q": q, "k": k, "v": v, "do": dO}
    for n, x in files.items():
        np.save(os.path.join(tmp, n + ".npy"), x)
    cmd = [ATTN, "sdpa"] + [f"--{n}={os.path.join(tmp, n + '.npy')}" for n in "qkv"]
    cmd += ["--out", os.path.join(tmp, "o.npy"), "--grad-out", os.path.join(tmp, "do.npy")]
    cmd += [f"--{n}={os.path.join(tmp, n + '.npy')}" for n in ("dq", "dk", "dv")]
    if mask is not None:
        np.save(os.path.join(tmp, "mask.npy"), mask)
        cmd += ["--mask", os.path.join(tmp, "mask.npy")]
    if kl is not None:
        np.save(os.path.join(tmp, "kl.npy"), kl)
        cmd += ["--key-lengths", os.path.join(tmp, "kl.npy")]
    if qo is not None:
        np.save(os.path.join(tmp, "qo.npy"), qo)
        cmd += ["--query-offsets", os.path.join(tmp, "qo.npy")]
    if c["causal"] != "none":
        cmd += ["--causal", c["causal"]]
    if c["window"] is not None:
        cmd += ["--window-left", str(c["window"][0]), "--window-right", str(c["window"][1]),
                "--window-align", c["window"][2]]
    if c["p"] > 0:
        cmd += ["--dropout", str(c["p"]), "--seed", str(c["seed"])]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return [np.load(os.path.join(tmp, n + ".npy")) for n in ("o", "dq", "dk", "dv")]


def random_case(rng, t):
    Hkv = int(rng.choice([1, 2, 3]))
    Dk = int(rng.choice([1, 3, 8, 16, 24, 40, 64]))
    c = dict(B=int(rng.choice([1, 2])), Hkv=Hkv, Hq=Hkv * int(rng.choice([1, 2, 4])),
             Lq=int(rng.choice([1, 2, 9, 31, 64, 65, 97])), Lk=int(rng.choice([1, 3, 17, 64, 65, 80, 150])),
             Dk=Dk, Dv=Dk if rng.random() < 0.5 else int(rng.choice([1, 5, 16, 33])),
             causal=["none", "top-left", "bottom-right"][t % 3],
             mask=["none", "bool", "additive", "none"][(t // 3) % 4],
             window=None, kl=rng.random() < 0.25, p=0.3 if rng.random() < 0.2 else 0.0,
             seed=int(rng.integers(0, 2**63)))
    if rng.random() < 0.15:
        c["window"] = (int(rng.integers(0, 10)), int(rng.integers(-1, 4)), ["top-left", "bottom-right"][t % 2])
    # Drawn after the rest so the earlier parameters of each seed stay what they were.
    c["kl_below_lq"] = rng.random() < 0.5  # key lengths up to Lq − 1: bottom-right rows with no key
    # A per-sequence query offset, where something measures from it (alone the CLI refuses it).
    c["qo"] = rng.random() < 0.15 and (c["causal"] != "none" or c["window"] is not None)
    if t % 9 == 2:  # every ninth case: bottom-right with per-sequence key lengths, maybe a window
        c.update(causal="bottom-right", kl=True, qo=False)
    return c


def make_inputs(c, rng, dtype):
    q = rng.standard_normal((c["B"], c["Hq"], c["Lq"], c["Dk"])).astype(dtype)
    k = rng.standard_normal((c["B"], c["Hkv"], c["Lk"], c["Dk"])).astype(dtype)
    v = rng.standard_normal((c["B"], c["Hkv"], c["Lk"], c["Dv"])).astype(dtype)
    dO = rng.standard_normal((c["B"], c["Hq"], c["Lq"], c["Dv"])).astype(dtype)
    mask = None
    if c["mask"] == "bool":  # broadcast from (Lq, Lk) or (B, Hq, Lq, Lk)
        shape = (c["Lq"], c["Lk"]) if rng.random() < 0.5 else (c["B"], c["Hq"], c["Lq"], c["Lk"])
        mask = rng.random(shape) > 0.3
    elif c["mask"] == "additive":
        mask = rng.standard_normal((c["B"], 1, c["Lq"], c["Lk"])).astype(dtype)
        mask[rng.random(mask.shape) < 0.2] = -np.inf
    hi = min(c["Lk"], c["Lq"] - 1) if c["kl_below_lq"] else c["Lk"]
    kl = rng.integers(0, max(hi, 0) + 1, size=c["B"]).astype(np.int64) if c["kl"] else None
    qo = rng.integers(-c["Lq"], c["Lk"] + 2, size=c["B"]).astype(np.int32) if c["qo"] else None
    return q, k, v, dO, mask, kl, qo


def check_case(c, dtype, tol, seed):
    rng = np.random.default_rng(seed)
    q, k, v, dO, mask, kl, qo = make_inputs(c, rng, dtype)
    drop = dropout_factor(c["p"], c["seed"], c["B"], c["Hq"], c["Lq"], c["Lk"]) if c["p"] > 0 else None
    want = torch_grads(c, q, k, v, dO, mask, kl, qo, drop)
    with tempfile.TemporaryDirectory() as tmp:
        got = run_cli(tmp, c, q, k, v, dO, mask, kl, qo)
    for g in got[1:]:  # gradients keep the inputs' dtype (O is always written as float32)
        assert g.dtype == dtype
        assert np.isfinite(g).all()
    den = max(np.abs(w).max() for w in want[1:]) + 1e-300
    errs = [np.abs(g - w).max() / den for g, w in zip(got[1:], want[1:])]
    oerr = np.abs(got[0] - want[0]).max() / (np.abs(want[0]).max() + 1e-300)
    assert max(errs) <= tol and oerr <= max(tol, 1e-6), f"{c}: relative errors dq/dk/dv {errs}, out {oerr}"
    print(f"[grad-err] {np.dtype(dtype).name} {max(errs):.3e}")  # shown with pytest -s
    return max(errs)


CASES32 = [random_case(np.random.default_rng(1000 + t), t) for t in range(110)]


@pytest.mark.parametrize("t", range(len(CASES32)))
def test_float32_tiled_backward_matches_torch(t):
    check_case(CASES32[t], np.float32, TOL32, 2000 + t)


CASES64 = [random_case(np.random.default_rng(5000 + t), t) for t in range(24)]


def test_cases_exercise_the_per_sequence_rule():
    """Guards the generator: bottom-right with key lengths (some below Lq), query offsets."""
    cases = CASES32 + CASES64
    assert sum(c["causal"] == "bottom-right" and c["kl"] for c in cases) >= 15
    assert sum(c["causal"] == "bottom-right" and c["kl"] and c["kl_below_lq"] and c["Lq"] > 1 for c in cases) >= 5
    assert sum(c["qo"] and (c["causal"] != "none" or c["window"] is not None) for c in cases) >= 8
    assert sum(c["window"] is not None and c["kl"] for c in cases) >= 2


@pytest.mark.parametrize("t", range(len(CASES64)))
def test_float64_reference_backward_matches_torch(t):
    check_case(CASES64[t], np.float64, TOL64, 6000 + t)


def test_grad_out_errors_leave_no_files(tmp_path):
    rng = np.random.default_rng(0)
    for n, s in [("q", (1, 2, 5, 4)), ("k", (1, 2, 6, 4)), ("v", (1, 2, 6, 3)), ("bad", (1, 2, 6, 3))]:
        np.save(tmp_path / f"{n}.npy", rng.standard_normal(s).astype(np.float32))
    base = [ATTN, "sdpa", "--q", str(tmp_path / "q.npy"), "--k", str(tmp_path / "k.npy"), "--v",
            str(tmp_path / "v.npy"), "--out", str(tmp_path / "o.npy")]
    grads = ["--dq", str(tmp_path / "dq.npy"), "--dk", str(tmp_path / "dk.npy"), "--dv", str(tmp_path / "dv.npy")]
    cases = [
        (["--grad-out", str(tmp_path / "bad.npy")] + grads, "sdpa_backward: --grad-out: expected the shape of out (1, 2, 5, 3) but got (1, 2, 6, 3)"),
        (["--grad-out", str(tmp_path / "bad.npy"), "--dq", str(tmp_path / "dq.npy")], "--grad-out: needs --dq, --dk and --dv"),
        (grads, "need --grad-out"),
        (["--grad-out", str(tmp_path / "bad.npy"), "--dq", str(tmp_path / "o.npy"), "--dk", str(tmp_path / "dk.npy"),
          "--dv", str(tmp_path / "dv.npy")], ("--dq: path", "--out")),
        # The library's rule and words (require_dropout_p), with the option for the field.
        (["--dropout", "1.5"], "sdpa: --dropout: must be in [0, 1) but got 1.5"),
        (["--dropout", "-0.1"], "sdpa: --dropout: must be in [0, 1) but got -0.1"),
        # No default seed (the same mask in every run) and no seed without dropout (it changes nothing).
        (["--dropout", "0.25"], "sdpa: --seed: --dropout = 0.25 needs a seed"),
        (["--seed", "3"], "--seed: only with --dropout P > 0"),
        # The same for the other qualifiers (they were accepted and changed nothing).
        (["--window-align", "bottom-right"], "--window-align: only with --window-left or --window-right"),
        (["--scores-stage", "scaled"], "--scores-stage: only with --scores"),
    ]
    for extra, msg in cases:
        r = subprocess.run(base + extra, capture_output=True, text=True)
        assert r.returncode == 2, (extra, r.stderr)
        for part in (msg,) if isinstance(msg, str) else msg:  # the CLI's own wording may change
            assert part in r.stderr, (extra, r.stderr)
        assert not any((tmp_path / f).exists() for f in ("o.npy", "dq.npy", "dk.npy", "dv.npy")), extra
