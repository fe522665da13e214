"""attn sdpa (the CLI) against PyTorch 1.13 in float64, on random cases.

Every case draws its own sizes from a fixed seed: B, Hkv, Hq = group * Hkv, Lq, Lk in 1..300
(never a power of two above 1), Dk, Dv in 1..256; float32 or float64 inputs; any combination of
a bool keep-mask or an additive float mask (with -inf entries) of various broadcast shapes,
causal in both alignments, key lengths (including 0 and lengths shorter than Lq), a sliding
window in both alignments, a query offset (one for every sequence or one per sequence), custom
scales; --weights and --lse on most cases.

The alignment rule (docs/conventions.md): query i of sequence b has its diagonal at
d_b(i) = i + offset_b, with offset_b = the query offset when given (either alignment), else 0
(top-left) or n_b − Lq (bottom-right), n_b = key_lengths[b] (Lk without key lengths). Causal
keeps j <= d_b(i); the window keeps d_b(i) − left <= j <= d_b(i) + right; key lengths keep j < n_b.

The reference is the textbook expression written here with torch ops in float64 from the very
values the CLI reads (S = Q Kᵀ·scale + bias, masked_fill(−inf), softmax, A·V). torch 1.13 gives
NaN on a row with no visible key; attn's contract is out 0, weights 0, lse −inf there, so the
reference is corrected on exactly those rows.

Tolerance: |got − ref| ≤ 1e-5·(1 + |ref|) (outputs are float32; their rounding alone is ~6e-8).
When the default kernel choice runs on float32 inputs it is the flash kernel, which computes in
float32: its scores carry the rounding of an fp32 dot product, up to (Dk+2)·u·|scale|·Σ_d|q·k|
(u = 2^-24) — with scale 1 and Dk = 178 that alone is ~1e-4 on a score, more than 1e-5 on the
output. Those runs get that derived term on top (fp32_bound.py: the same first-order bound as
tests/kernels/test_flash.cpp).
Masked weights must be exactly 0. Failures print the case (seed and parameters) to reproduce:
    ATTN_BIN=build/tools/attn /usr/bin/python3 -m pytest tests/torch/test_sdpa_vs_torch.py -k 'case_017'
"""
import math

import numpy as np
import pytest
import torch

import fp32_bound
from cli_util import listing, run_attn

N_CASES = 240
BASE_SEED = 20240611
RTOL = 1e-5
# Work per case, B·Hq·Lq·Lk·(Dk + Dv) multiply-adds, bounded so the whole file runs in well
# under a minute on one core while every size still reaches its range (B = Hq = 1 when large).
WORK_BUDGET = 12_000_000
# Largest |got − ref| / (1 + |ref|) seen per output, printed by the last test of the file.
MAX_ERR = {"out": 0.0, "lse": 0.0, "weights": 0.0}


def _not_pow2(rng, lo, hi):
    while True:
        n = int(rng.integers(lo, hi + 1))
        if n == 1 or n & (n - 1) != 0:
            return n


def make_case(idx):
    """Draws case idx (deterministic) → dict of parameters and numpy inputs."""
    seed = BASE_SEED + idx
    rng = np.random.default_rng(seed)
    # Lengths: a mix of small and large, Lq = 1 (decoding) now and then.
    Lq = 1 if rng.random() < 0.08 else _not_pow2(rng, 1, 300)
    Lk = _not_pow2(rng, 1, 300)
    Dk = _not_pow2(rng, 1, 256)
    Dv = Dk if rng.random() < 0.3 else _not_pow2(rng, 1, 256)
    per_head = Lq * Lk * (Dk + Dv)
    max_heads = max(1, WORK_BUDGET // per_head)
    Hkv = int(rng.integers(1, min(4, max_heads) + 1))
    group = int(rng.integers(1, max(1, min(4, max_heads // Hkv)) + 1))
    Hq = Hkv * group
    B = int(rng.integers(1, max(1, min(3, max_heads // Hq)) + 1))
    dtype = np.float32 if rng.random() < 0.7 else np.float64

    c = dict(idx=idx, seed=seed, B=B, Hq=Hq, Hkv=Hkv, Lq=Lq, Lk=Lk, Dk=Dk, Dv=Dv, dtype=np.dtype(dtype).name)
    # Now and then K and V come in the other float type than Q (each file is read as it is).
    kv_dtype = dtype if rng.random() < 0.85 else (np.float64 if dtype == np.float32 else np.float32)
    if kv_dtype != dtype:
        c["kv_dtype"] = np.dtype(kv_dtype).name
    c["q"] = rng.standard_normal((B, Hq, Lq, Dk)).astype(dtype)
    c["k"] = rng.standard_normal((B, Hkv, Lk, Dk)).astype(kv_dtype)
    c["v"] = rng.standard_normal((B, Hkv, Lk, Dv)).astype(kv_dtype)

    full = (B, Hq, Lq, Lk)
    mask_kind = rng.choice(["none", "bool", "additive"], p=[0.3, 0.4, 0.3])
    c["mask_kind"] = str(mask_kind)
    if mask_kind != "none":
        shapes = [(B, 1, 1, Lk), (B, 1, Lq, Lk), (Lq, Lk), full, (Lk,), (1, Hq, 1, Lk), (B, Hq, 1, 1), (Lq, 1)]
        shape = shapes[int(rng.integers(len(shapes)))]
        c["mask_shape"] = shape
        if mask_kind == "bool":
            m = rng.random(shape) < rng.uniform(0.3, 0.97)
            if rng.random() < 0.3:  # whole rows / sequences with no visible key
                m.reshape(-1, shape[-1])[rng.integers(0, m.size // shape[-1])] = False
            c["mask"] = m
        else:
            mdt = np.float32 if rng.random() < 0.5 else np.float64
            m = (rng.standard_normal(shape) * 3).astype(mdt)
            m[rng.random(shape) < rng.uniform(0.0, 0.5)] = -np.inf
            if rng.random() < 0.3:
                m.reshape(-1, shape[-1])[rng.integers(0, m.size // shape[-1])] = -np.inf
            c["mask"] = m
            c["mask_dtype"] = np.dtype(mdt).name
    c["causal"] = str(rng.choice(["none", "top-left", "bottom-right"], p=[0.4, 0.3, 0.3]))
    if rng.random() < 0.35:
        # Now and then every length is below Lq: bottom-right rows with nothing visible.
        hi = Lk if rng.random() < 0.6 else min(Lk, max(Lq - 1, 0))
        lens = rng.integers(0, hi + 1, size=B)
        if rng.random() < 0.3:
            lens[rng.integers(0, B)] = 0
        c["key_lengths"] = lens.astype(np.int32 if rng.random() < 0.5 else np.int64)
    if rng.random() < 0.3:
        left = int(rng.integers(-1, Lk + 1))
        right = int(rng.integers(-1, Lk + 1)) if rng.random() < 0.6 else -1
        if left < 0 and right < 0:
            left = int(rng.integers(0, Lk + 1))
        c["window"] = (left, right, str(rng.choice(["top-left", "bottom-right"])))
    if rng.random() < 0.2 and (c["causal"] != "none" or "window" in c):  # alone it places nothing: refused
        # The position of query 0 among the keys: negative, inside, or past the last key.
        lo, hi = -Lq - 2, Lk + 2
        if rng.random() < 0.5:
            c["query_offset"] = int(rng.integers(lo, hi + 1))
        else:
            c["query_offsets"] = rng.integers(lo, hi + 1, size=B).astype(np.int32 if rng.random() < 0.5 else np.int64)
    if rng.random() < 0.4:
        c["scale"] = float(rng.choice([rng.uniform(-2.0, 2.0), rng.uniform(0.0, 0.1), 1.0, 0.0]))
    c["want_weights"] = B * Hq * Lq * Lk <= 400_000 and rng.random() < 0.8
    c["want_lse"] = rng.random() < 0.8
    return c


def describe(c):
    keys = ["idx", "seed", "B", "Hq", "Hkv", "Lq", "Lk", "Dk", "Dv", "dtype", "kv_dtype", "mask_kind", "mask_shape", "mask_dtype",
            "causal", "window", "query_offset", "scale", "want_weights", "want_lse"]
    d = {k: c[k] for k in keys if k in c}
    if "key_lengths" in c:
        d["key_lengths"] = c["key_lengths"].tolist()
    if "query_offsets" in c:
        d["query_offsets"] = c["query_offsets"].tolist()
    return str(d)


def torch_reference(c):
    """The textbook in float64 torch ops → (out, weights, lse, keep) with attn's fully-masked-row rule."""
    B, Hq, Lq, Lk, Hkv = c["B"], c["Hq"], c["Lq"], c["Lk"], c["Hkv"]
    q = torch.from_numpy(c["q"]).double()
    k = torch.from_numpy(c["k"]).double().repeat_interleave(Hq // Hkv, dim=1)  # query head h reads KV head h // group
    v = torch.from_numpy(c["v"]).double().repeat_interleave(Hq // Hkv, dim=1)
    scale = c.get("scale", 1.0 / math.sqrt(c["Dk"]))
    s = torch.matmul(q, k.transpose(-1, -2)) * scale
    keep = torch.ones((B, Hq, Lq, Lk), dtype=torch.bool)
    if c["mask_kind"] == "additive":
        s = s + torch.from_numpy(c["mask"]).double()
    elif c["mask_kind"] == "bool":
        keep = keep & torch.from_numpy(c["mask"])
    i = torch.arange(Lq).view(1, 1, Lq, 1)
    j = torch.arange(Lk).view(1, 1, 1, Lk)
    # n_b: sequence b's valid keys; every diagonal below is per sequence, shape (B, 1, Lq, 1).
    n = torch.from_numpy(c["key_lengths"].astype(np.int64)) if "key_lengths" in c else torch.full((B,), Lk)
    n = n.view(B, 1, 1, 1)
    keep = keep & (j < n)

    def diagonal(align):
        if "query_offset" in c:
            return i + c["query_offset"]
        if "query_offsets" in c:
            return i + torch.from_numpy(c["query_offsets"].astype(np.int64)).view(B, 1, 1, 1)
        return i + 0 * n if align == "top-left" else i + n - Lq

    if c["causal"] != "none":  # query i sees keys 0..d_b(i)
        keep = keep & (j <= diagonal(c["causal"]))
    if "window" in c:
        left, right, align = c["window"]
        d = diagonal(align)
        if left >= 0:
            keep = keep & (j >= d - left)
        if right >= 0:
            keep = keep & (j <= d + right)
    s = s.masked_fill(~keep, -math.inf)
    a = torch.softmax(s, dim=-1)
    empty = torch.isneginf(s).all(dim=-1)  # no visible key: torch gives NaN, attn gives 0 / −inf
    a = a.masked_fill(empty.unsqueeze(-1), 0.0)
    out = torch.matmul(a, v)
    lse = torch.logsumexp(s, dim=-1).masked_fill(empty, -math.inf)
    zero_weight = ~keep | torch.isneginf(s)
    return out.numpy(), a.numpy(), lse.numpy(), zero_weight.numpy()


def fp32_terms(c, a):
    """Error terms of a float32 kernel (flash, decode) → (out, lse, weights) arrays to add to the
    bound (fp32_bound.py derives them)."""
    g = c["Hq"] // c["Hkv"]
    q = c["q"].astype(np.float64)
    k = np.repeat(c["k"].astype(np.float64), g, axis=1)
    v = np.repeat(c["v"].astype(np.float64), g, axis=1)
    bias = c["mask"] if c["mask_kind"] == "additive" else None
    return fp32_bound.fp32_terms(q, k, v, c.get("scale", 1.0 / math.sqrt(c["Dk"])), a, bias)


def check_close(name, got, ref, c, extra=None):
    assert got.dtype == np.float32, f"{name}: dtype {got.dtype}, expected float32\ncase: {describe(c)}"
    assert got.shape == ref.shape, f"{name}: shape {got.shape}, expected {ref.shape}\ncase: {describe(c)}"
    ninf = np.isneginf(ref)
    bad_inf = ninf != np.isneginf(got)
    err = np.where(ninf, 0.0, np.abs(got.astype(np.float64) - np.where(ninf, 0.0, ref)))
    bound = RTOL * (1.0 + np.abs(np.where(ninf, 0.0, ref)))
    if extra is not None:
        bound = bound + np.where(ninf, 0.0, extra) + 2.0 ** -24 * np.abs(np.where(ninf, 0.0, ref))
    bad = bad_inf | ~(err <= bound)  # NaN in got fails here
    if bad.any():
        idx = tuple(int(x) for x in np.argwhere(bad)[0])
        worst = float(np.nanmax(np.where(ninf, 0.0, err / bound)))
        pytest.fail(f"{name}: {int(bad.sum())} of {bad.size} elements out of tolerance; first at {idx}: "
                    f"got {got[idx]!r}, ref {ref[idx]!r}; worst err/bound {worst:.3g}\ncase: {describe(c)}")
    if err.size and extra is None:  # the fixed budget's record: runs without the fp32 term
        MAX_ERR[name] = max(MAX_ERR[name], float(np.max(err / (1.0 + np.abs(np.where(ninf, 0.0, ref))))))


@pytest.mark.parametrize("idx", range(N_CASES), ids=[f"case_{i:03d}" for i in range(N_CASES)])
def test_random_case(idx, tmp_path):
    c = make_case(idx)
    np.save(tmp_path / "q.npy", c["q"])
    np.save(tmp_path / "k.npy", c["k"])
    np.save(tmp_path / "v.npy", c["v"])
    args = ["sdpa", "--q", tmp_path / "q.npy", "--k", tmp_path / "k.npy", "--v", tmp_path / "v.npy",
            "--out", tmp_path / "o.npy"]
    if idx % 2:  # half the cases name the oracle explicitly, half take the default kernel choice
        args += ["--impl", "reference"]
    if c["mask_kind"] != "none":
        np.save(tmp_path / "m.npy", c["mask"])
        args += ["--mask", tmp_path / "m.npy"]
    if c["causal"] != "none":
        args += ["--causal", c["causal"]]
    if "key_lengths" in c:
        np.save(tmp_path / "kl.npy", c["key_lengths"])
        args += ["--key-lengths", tmp_path / "kl.npy"]
    if "window" in c:
        left, right, align = c["window"]
        args += ["--window-left", left, "--window-right", right, "--window-align", align]
    if "query_offset" in c:
        args += ["--query-offset", c["query_offset"]]
    if "query_offsets" in c:
        np.save(tmp_path / "qo.npy", c["query_offsets"])
        args += ["--query-offsets", tmp_path / "qo.npy"]
    if "scale" in c:
        args += ["--scale", repr(c["scale"])]
    if c["want_weights"]:
        args += ["--weights", tmp_path / "w.npy"]
    if c["want_lse"]:
        args += ["--lse", tmp_path / "l.npy"]

    r = run_attn(*args)
    assert r.returncode == 0, f"exit {r.returncode}: {r.stderr}\ncase: {describe(c)}"
    assert r.stderr == "", f"unexpected stderr: {r.stderr}\ncase: {describe(c)}"

    out, w, lse, zero_weight = torch_reference(c)
    # The default choice runs the float32 flash kernel when every input is float32.
    flash = idx % 2 == 0 and c["dtype"] == "float32" and "kv_dtype" not in c
    e_out, e_lse, e_w = fp32_terms(c, w) if flash else (None, None, None)
    check_close("out", np.load(tmp_path / "o.npy"), out, c, e_out)
    if c["want_lse"]:
        check_close("lse", np.load(tmp_path / "l.npy"), lse, c, e_lse)
    if c["want_weights"]:
        got_w = np.load(tmp_path / "w.npy")
        check_close("weights", got_w, w, c, e_w)
        leaked = zero_weight & (got_w != 0.0)
        assert not leaked.any(), (f"weights: {int(leaked.sum())} masked positions have non-zero weight, first at "
                                  f"{tuple(int(x) for x in np.argwhere(leaked)[0])}\ncase: {describe(c)}")
    # Only the requested outputs exist: no temporary files left behind.
    expected = {"q.npy", "k.npy", "v.npy", "o.npy"} | ({"m.npy"} if c["mask_kind"] != "none" else set()) \
        | ({"kl.npy"} if "key_lengths" in c else set()) | ({"qo.npy"} if "query_offsets" in c else set()) \
        | ({"w.npy"} if c["want_weights"] else set()) \
        | ({"l.npy"} if c["want_lse"] else set())
    assert set(listing(tmp_path)) == expected


def test_case_mix_covers_every_feature():
    """The random cases really exercise every mask kind, alignment and dtype (guards the generator)."""
    cases = [make_case(i) for i in range(N_CASES)]
    seen = lambda pred: sum(1 for c in cases if pred(c))  # noqa: E731
    assert seen(lambda c: c["mask_kind"] == "bool") >= 30
    assert seen(lambda c: c["mask_kind"] == "additive") >= 30
    assert seen(lambda c: c["causal"] == "top-left") >= 30
    assert seen(lambda c: c["causal"] == "bottom-right") >= 30
    assert seen(lambda c: c["causal"] == "bottom-right" and c["Lq"] > c["Lk"]) >= 5
    assert seen(lambda c: "key_lengths" in c) >= 30
    assert seen(lambda c: "key_lengths" in c and (c["key_lengths"] == 0).any()) >= 5
    # The per-sequence bottom-right rule: lengths that differ and lengths below Lq (empty rows).
    bottom_right_by_lengths = lambda c: (c["causal"] == "bottom-right" and "key_lengths" in c  # noqa: E731
                                         and "query_offset" not in c and "query_offsets" not in c)
    assert seen(lambda c: bottom_right_by_lengths(c) and (c["key_lengths"] < c["Lq"]).any()) >= 10
    assert seen(lambda c: bottom_right_by_lengths(c) and len(set(c["key_lengths"].tolist())) > 1) >= 3
    assert seen(lambda c: "window" in c and c["window"][2] == "bottom-right" and "key_lengths" in c) >= 5
    assert seen(lambda c: "query_offset" in c) >= 10
    assert seen(lambda c: "query_offsets" in c and c["B"] > 1) >= 5
    assert seen(lambda c: ("query_offset" in c or "query_offsets" in c) and c["causal"] != "none") >= 10
    assert seen(lambda c: ("query_offset" in c or "query_offsets" in c) and "window" in c) >= 3
    assert seen(lambda c: "window" in c and c["window"][2] == "top-left") >= 10
    assert seen(lambda c: "window" in c and c["window"][2] == "bottom-right") >= 10
    assert seen(lambda c: "scale" in c) >= 30
    assert seen(lambda c: c["dtype"] == "float64") >= 30
    assert seen(lambda c: "kv_dtype" in c) >= 15
    assert seen(lambda c: c["Hq"] > c["Hkv"] > 1) >= 10  # GQA
    assert seen(lambda c: c["Hq"] > c["Hkv"] == 1) >= 10  # MQA
    assert seen(lambda c: c["Dk"] != c["Dv"]) >= 100
    assert seen(lambda c: c["Lq"] > 200 or c["Lk"] > 200) >= 30
    assert seen(lambda c: c["Dk"] > 200 or c["Dv"] > 200) >= 20
    assert seen(lambda c: c["mask_kind"] != "none" and c["causal"] != "none" and "key_lengths" in c) >= 5
    for c in cases:
        for n in ("Lq", "Lk", "Dk", "Dv"):
            assert c[n] == 1 or c[n] & (c[n] - 1) != 0, f"{n} = {c[n]} is a power of two"


def test_zz_report_max_errors(capsys):
    """Runs last (file order): prints the worst relative error of each output over all cases."""
    with capsys.disabled():
        print("\nmax |got - ref| / (1 + |ref|) over the random cases: " +
              ", ".join(f"{k} {v:.2e}" for k, v in MAX_ERR.items()))
    assert all(v <= RTOL for v in MAX_ERR.values())
