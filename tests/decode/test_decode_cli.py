"""`attn sdpa` with float16 K/V .npy files: the decode path for fewer rows per KV head (group·Lq) than
one flash panel (16 queries, 32 on the avx512 row), flash from there on and for Lq > 16."""
import os
import subprocess

import numpy as np
import pytest

ATTN = os.environ.get("ATTN_BIN", "attn")


def reference(q, k, v, causal_bottom_right):
    """Attention in float64 on the exact values of the inputs (float16 converts exactly)."""
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    B, Hq, Lq, D = q.shape
    Hkv, Lk = k.shape[1], k.shape[2]
    k = np.repeat(k, Hq // Hkv, axis=1)
    v = np.repeat(v, Hq // Hkv, axis=1)
    s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(D)
    if causal_bottom_right:
        i = np.arange(Lq)[:, None]
        j = np.arange(Lk)[None, :]
        s = np.where(j <= i + Lk - Lq, s, -np.inf)
    s = s - s.max(-1, keepdims=True)
    p = np.exp(s)
    p /= p.sum(-1, keepdims=True)
    return p @ v


def run(tmp_path, q, k, v, *extra):
    paths = {}
    for name, arr in (("q", q), ("k", k), ("v", v)):
        paths[name] = str(tmp_path / f"{name}.npy")
        np.save(paths[name], arr)
    out = str(tmp_path / "o.npy")
    res = subprocess.run([ATTN, "sdpa", "--q", paths["q"], "--k", paths["k"], "--v", paths["v"], "--out", out,
                          "--verbose", *extra], capture_output=True, text=True)
    return res, out


# Group 4 (8 query heads, 2 KV heads): 4, 12 rows per KV head run decode on every row; 64 fill a
# panel on every row and run flash.
@pytest.mark.parametrize("Lq,causal,kernel", [(1, False, "decode"), (3, True, "decode"), (16, True, "flash")])
def test_float16_kv_runs_decode_below_one_flash_panel(tmp_path, Lq, causal, kernel):
    rng = np.random.default_rng(Lq)
    q = rng.standard_normal((2, 8, Lq, 64)).astype(np.float32)
    k = rng.standard_normal((2, 2, 300, 64)).astype(np.float16)
    v = rng.standard_normal((2, 2, 300, 64)).astype(np.float16)
    extra = ["--causal", "bottom-right"] if causal else []
    res, out = run(tmp_path, q, k, v, *extra)
    assert res.returncode == 0, res.stderr
    assert f"ran: {kernel}" in res.stderr and "float16" in res.stderr, res.stderr
    if kernel == "flash":
        assert f"decode: declined, group·Lq = {4 * Lq} rows per KV head reach " in res.stderr, res.stderr
        assert "one flash panel of " in res.stderr and "(16-bit K or V)" in res.stderr, res.stderr
    got = np.load(out)
    want = reference(q, k, v, causal)
    # Same float16 values on both sides: only fp32 arithmetic differs; the bound of docs/conventions.md.
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)


def test_float16_kv_with_long_query_block_runs_flash(tmp_path):
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 2, 20, 16)).astype(np.float32)
    k = rng.standard_normal((1, 2, 30, 16)).astype(np.float16)
    v = rng.standard_normal((1, 2, 30, 16)).astype(np.float16)
    res, out = run(tmp_path, q, k, v)
    assert res.returncode == 0, res.stderr
    assert "decode: declined, Lq = 20 > 16" in res.stderr and "ran: flash" in res.stderr, res.stderr
    assert "K float16, V float16" in res.stderr, res.stderr
    # docs/conventions.md, "16-bit inputs and outputs": 1e-5·(1 + |ref|) on the same float16 values.
    np.testing.assert_allclose(np.load(out), reference(q, k, v, False), atol=1e-5, rtol=1e-5)
    # The reference reads float16 directly and agrees with float64 math on the same values.
    res, out = run(tmp_path, q, k, v, "--impl", "reference")
    assert res.returncode == 0, res.stderr
    np.testing.assert_allclose(np.load(out), reference(q, k, v, False), atol=1e-6, rtol=1e-5)


def test_float16_query_is_read_and_out_follows_it(tmp_path):
    # Issue 14: Q may be float16 too; O comes out in Q's dtype (--out-dtype picks another).
    rng = np.random.default_rng(3)
    q = rng.standard_normal((1, 1, 2, 4)).astype(np.float16)
    k = rng.standard_normal((1, 1, 3, 4)).astype(np.float16)
    res, out = run(tmp_path, q, k, k, "--impl", "reference")
    assert res.returncode == 0, res.stderr
    got = np.load(out)
    assert got.dtype == np.float16
    # One float16 rounding of the float64 result (half an ulp: 2^-11 relative) plus float32 error.
    want = reference(q, k, k, False)
    assert np.all(np.abs(got - want) <= 2.0 ** -11 * np.abs(want) + 1e-5)
