"""`mpirun -np P attn ring` against attention computed here in float64 with numpy (an
independent oracle) and against `attn sdpa` on the same files; error handling across ranks.

Tolerance: |O - O_ref| <= 1e-5 (O is a convex combination of V rows with |V| <= 2, computed in
float32: rounding stays near 1e-7)."""
import os
import subprocess

import numpy as np
import pytest

ATTN = os.environ["ATTN_BIN"]
MPIEXEC = os.environ.get("ATTN_MPIEXEC", "mpirun")
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMP_NUM_THREADS="1",
           ATTN_NUM_THREADS="1")


def mpirun(np_, *args):
    cmd = [MPIEXEC, "-q", "--oversubscribe", "-np", str(np_), ATTN, "ring", *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=120)


def attention(q, k, v, causal=False, scale=None, key_lengths=None):
    """q (B, Hq, Lq, Dk), k (B, Hkv, Lk, Dk), v (B, Hkv, Lk, Dv) → (B, Hq, Lq, Dv), float64."""
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    B, Hq, Lq, Dk = q.shape
    Hkv, Lk = k.shape[1], k.shape[2]
    k = np.repeat(k, Hq // Hkv, axis=1)
    v = np.repeat(v, Hq // Hkv, axis=1)
    s = q @ k.transpose(0, 1, 3, 2) * (1 / np.sqrt(Dk) if scale is None else scale)
    keep = np.ones((B, 1, Lq, Lk), dtype=bool)
    if causal:
        keep &= np.tril(np.ones((Lq, Lk), dtype=bool))
    if key_lengths is not None:
        keep &= (np.arange(Lk)[None, :] < np.asarray(key_lengths)[:, None])[:, None, None, :]
    s = np.where(keep, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0)
    w = np.exp(s - m)
    den = w.sum(axis=-1, keepdims=True)
    return np.where(den > 0, (w / np.where(den > 0, den, 1)) @ v, 0.0)


def make(tmp_path, B, Hq, Hkv, Lq, Lk, Dk, Dv, seed=0, dtype=np.float32):
    rng = np.random.default_rng(seed)
    arrays = {"q": rng.uniform(-2, 2, (B, Hq, Lq, Dk)), "k": rng.uniform(-2, 2, (B, Hkv, Lk, Dk)),
              "v": rng.uniform(-2, 2, (B, Hkv, Lk, Dv))}
    paths = {}
    for name, a in arrays.items():
        paths[name] = tmp_path / f"{name}.npy"
        np.save(paths[name], a.astype(dtype))
    return {n: a.astype(dtype) for n, a in arrays.items()}, paths


CASES = [  # B, Hq, Hkv, Lq, Lk, Dk, Dv
    (1, 1, 1, 16, 16, 8, 8),
    (2, 4, 2, 37, 37, 12, 5),   # GQA, Dk != Dv, length not divisible by P
    (1, 3, 1, 50, 50, 7, 9),    # MQA
    (1, 2, 2, 23, 41, 6, 6),    # cross-attention, Lq != Lk
]


@pytest.mark.parametrize("np_", [1, 2, 3, 4])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", CASES, ids=lambda s: "x".join(map(str, s)))
def test_matches_float64_attention(tmp_path, np_, causal, shape):
    arrays, p = make(tmp_path, *shape)
    out = tmp_path / "o.npy"
    args = ["--q", p["q"], "--k", p["k"], "--v", p["v"], "--out", out] + (["--causal"] if causal else [])
    r = mpirun(np_, *args)
    assert r.returncode == 0, r.stderr
    o = np.load(out)
    assert o.dtype == np.float32 and o.shape == shape[:2] + (shape[3], shape[6])
    ref = attention(arrays["q"], arrays["k"], arrays["v"], causal=causal)
    err = np.abs(o - ref).max()
    assert err <= 1e-5, f"max |O - O_ref| = {err}"


@pytest.mark.parametrize("np_", [2, 3])
def test_equals_attn_sdpa_with_scale_key_lengths_and_contiguous_layout(tmp_path, np_):
    arrays, p = make(tmp_path, 3, 2, 1, 29, 29, 5, 4, seed=3)
    lengths = np.array([29, 11, 0], dtype=np.int64)
    np.save(tmp_path / "kl.npy", lengths)
    common = ["--q", p["q"], "--k", p["k"], "--v", p["v"], "--scale", "0.7", "--key-lengths", tmp_path / "kl.npy"]
    sd = subprocess.run([ATTN, "sdpa", *map(str, common), "--causal", "top-left", "--out", str(tmp_path / "s.npy")],
                        capture_output=True, text=True, env=ENV)
    assert sd.returncode == 0, sd.stderr
    ref = attention(arrays["q"], arrays["k"], arrays["v"], causal=True, scale=0.7, key_lengths=lengths)
    for layout in ["zigzag", "contiguous"]:
        out = tmp_path / f"o_{layout}.npy"
        r = mpirun(np_, *common, "--causal", "--layout", layout, "--out", out)
        assert r.returncode == 0, r.stderr
        o = np.load(out)
        assert np.abs(o - np.load(tmp_path / "s.npy")).max() <= 1e-5
        assert np.abs(o - ref).max() <= 1e-5
        assert np.all(o[2] == 0)  # a sequence with no valid key gives O = 0, never NaN


def test_float64_inputs_and_stats(tmp_path):
    arrays, p = make(tmp_path, 1, 2, 2, 40, 40, 8, 8, seed=5, dtype=np.float64)
    out = tmp_path / "o.npy"
    r = mpirun(4, "--q", p["q"], "--k", p["k"], "--v", p["v"], "--out", out, "--causal", "--stats")
    assert r.returncode == 0, r.stderr
    assert np.abs(np.load(out) - attention(arrays["q"], arrays["k"], arrays["v"], causal=True)).max() <= 1e-5
    lines = [l for l in r.stderr.splitlines() if l.startswith("ring: rank")]
    assert len(lines) == 4, r.stderr
    assert "compute max/min" in r.stderr


def error_lines(r):
    return [l for l in r.stderr.splitlines() if "error" in l]


@pytest.mark.parametrize("np_", [1, 3])
def test_missing_input_fails_on_all_ranks_without_output(tmp_path, np_):
    _, p = make(tmp_path, 1, 1, 1, 8, 8, 4, 4)
    out = tmp_path / "o.npy"
    r = mpirun(np_, "--q", tmp_path / "nope.npy", "--k", p["k"], "--v", p["v"], "--out", out)
    assert r.returncode == 2, (r.returncode, r.stderr)
    errs = error_lines(r)
    assert len(errs) == 1 and errs[0].startswith("attn: error:") and "nope.npy" in errs[0], r.stderr
    assert not out.exists() and list(tmp_path.glob("o.npy*")) == []


@pytest.mark.parametrize("np_", [1, 4])
def test_shape_error_reported_once(tmp_path, np_):
    _, p = make(tmp_path, 1, 2, 2, 12, 12, 4, 4)
    np.save(tmp_path / "k5.npy", np.zeros((1, 2, 12, 5), np.float32))
    out = tmp_path / "o.npy"
    r = mpirun(np_, "--q", p["q"], "--k", tmp_path / "k5.npy", "--v", p["v"], "--out", out)
    assert r.returncode == 2
    errs = error_lines(r)
    assert errs == ["attn: error: ring_attention: K: head dim 5 does not match Q's head dim 4"], r.stderr
    assert not out.exists()


def test_v_length_mismatch_and_bad_layout(tmp_path):
    _, p = make(tmp_path, 1, 1, 1, 12, 12, 4, 4)
    np.save(tmp_path / "v9.npy", np.zeros((1, 1, 9, 4), np.float32))
    out = tmp_path / "o.npy"
    r = mpirun(2, "--q", p["q"], "--k", p["k"], "--v", tmp_path / "v9.npy", "--out", out)
    assert r.returncode == 2 and len(error_lines(r)) == 1 and "has length 9" in r.stderr, r.stderr
    r = mpirun(2, "--q", p["q"], "--k", p["k"], "--v", p["v"], "--out", out, "--layout", "striped")
    assert r.returncode == 2 and error_lines(r) == [
        "attn: error: layout: expected zigzag or contiguous but got 'striped'"], r.stderr
    r = mpirun(2, "--q", p["q"], "--k", p["k"], "--v", p["v"], "--out", tmp_path / "no_dir" / "o.npy")
    assert r.returncode == 2 and len(error_lines(r)) == 1 and "not writable" in r.stderr, r.stderr
    assert not out.exists()
