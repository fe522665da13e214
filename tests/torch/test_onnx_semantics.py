"""attn sdpa (the CLI) against ONNX `Attention`'s masking rules, on random cases.

ONNX's rules, written here in NumPy float64 (our own code). Sources: onnx/onnx
onnx/reference/ops/op_attention.py (`_compute_attention`, `_apply_causal`; the version read,
commit 04138e07, covers opset 24 and has no window yet) for causal + nonpad_kv_seqlen and the
past cache; for windows, the opset-25 `left_window_size`/`right_window_size` attributes as
onnx/onnx pull request 8108 (merged) states them: "a query at absolute position p = offset + i
attends key j iff p − left <= j <= p + right", offset being the same per-batch offset as causal
masking. Every rule measures from one number per sequence, the position of query 0 among the keys:
    offset_b = past_len                     when past_key is given (K = past ++ new keys),
             = nonpad_kv_seqlen[b] − Lq     when only nonpad_kv_seqlen is given (a static cache),
             = 0                            otherwise.
  causal (is_causal = 1):  query i sees key j iff j <= i + offset_b
  window (left/right):     p = i + offset_b;  p − left <= j <= p + right  (−1 = unbounded side)
  padding (nonpad given):  j < nonpad_kv_seqlen[b]
  GQA:                     query head h reads KV head h // (Hq / Hkv) (np.repeat on the heads)
attn expresses the same problems as (see `attn_args`):
  static cache  --key-lengths nonpad --causal bottom-right --window-align bottom-right
                (bottom-right is per sequence: i + key_lengths[b] − Lq), or the same offsets
                given explicitly with --query-offsets (nonpad − Lq, one per sequence)
  past cache    K = past ++ new, --query-offset past_len (+ --key-lengths nonpad if given);
                the new block may be longer or shorter than Q
  no cache      --causal top-left, --window-align top-left

Where ONNX and attn differ: a row with no visible key (e.g. nonpad_kv_seqlen[b] < Lq under
causal masking: the first Lq − nonpad rows) is a softmax over only −inf in ONNX's reference,
which gives NaN; attn gives out 0, weights 0 and lse −inf. The test checks both on those rows
(ONNX NaN, attn 0 / −inf) and compares everything else.

Tolerance: outputs are float32. `--impl reference` accumulates in double: |got − ref| <=
1e-6·(1 + |ref|) (the output rounding alone is 6e-8 relative). The default kernel choice on
float32 inputs runs a float32 kernel (decode below two flash panels of rows per KV head, else flash:
the test checks which ran); it gets the derived float32 term of fp32_bound.py on top. The
reference runs also write the weights, of which the masked ones must be exactly 0.
Reproduce one case:  ATTN_BIN=build/tools/attn /usr/bin/python3 -m pytest tests/torch/test_onnx_semantics.py -k case_007
"""
import math
import re

import numpy as np
import pytest

import fp32_bound
from cli_util import run_attn

N_CASES = 72
BASE_SEED = 24_0025
RTOL = 1e-6
KINDS = ("static", "static_as_offsets", "past", "past_nonpad", "no_cache")


# ---- ONNX's rules -------------------------------------------------------------------------

def onnx_offsets(B, Lq, past_len=None, nonpad=None):
    """offset_b, the position of query 0 among the keys, as ONNX derives it from the cache."""
    if past_len is not None:
        return np.full(B, past_len, dtype=np.int64)
    if nonpad is not None:
        return nonpad.astype(np.int64) - Lq
    return np.zeros(B, dtype=np.int64)


def onnx_attention(q, k, v, past_k=None, past_v=None, nonpad=None, is_causal=False, left=-1, right=-1,
                   scale=None):
    """ONNX Attention in float64 → (Y, weights, lse, allowed). Y and weights are NaN on rows with
    no visible key (ONNX's softmax of an all −inf row); lse is −inf there."""
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    past_len = None
    if past_k is not None:
        past_len = past_k.shape[2]
        k = np.concatenate([past_k.astype(np.float64), k], axis=2)
        v = np.concatenate([past_v.astype(np.float64), v], axis=2)
    B, Hq, Lq, Dk = q.shape
    T = k.shape[2]
    group = Hq // k.shape[1]
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    scale = 1.0 / math.sqrt(Dk) if scale is None else scale

    off = onnx_offsets(B, Lq, past_len, nonpad).reshape(B, 1, 1, 1)
    i = np.arange(Lq).reshape(1, 1, Lq, 1)
    j = np.arange(T).reshape(1, 1, 1, T)
    allowed = np.ones((B, 1, Lq, T), dtype=bool)
    if is_causal:
        allowed &= j <= i + off
    p = i + off
    if left >= 0:
        allowed &= j >= p - left
    if right >= 0:
        allowed &= j <= p + right
    if nonpad is not None:
        allowed &= j < nonpad.reshape(B, 1, 1, 1)
    allowed = np.broadcast_to(allowed, (B, Hq, Lq, T))

    s = np.where(allowed, np.matmul(q, np.swapaxes(k, -1, -2)) * scale, -np.inf)
    with np.errstate(invalid="ignore"):
        m = s.max(axis=-1, keepdims=True)
        e = np.exp(s - m)  # NaN on an all −inf row, as in ONNX's reference softmax
        w = e / e.sum(axis=-1, keepdims=True)
    y = np.matmul(w, v)
    empty = ~allowed.any(axis=-1)
    with np.errstate(divide="ignore"):
        lse = np.where(empty, -np.inf, m[..., 0] + np.log(np.where(empty, 1.0, e.sum(axis=-1))))
    return y, w, lse, allowed, k, v, scale


# ---- random cases --------------------------------------------------------------------------

def make_case(idx):
    rng = np.random.default_rng(BASE_SEED + idx)
    kind = KINDS[idx % len(KINDS)]
    Hkv = int(rng.integers(1, 3))
    c = dict(idx=idx, kind=kind, B=int(rng.integers(1, 4)), Hkv=Hkv, Hq=Hkv * int(rng.integers(1, 3)),
             Lq=int(rng.choice([1, 2, 3, 5, 9, 16, 17, 23, 40])), Dk=int(rng.integers(1, 33)))
    c["Dv"] = c["Dk"] if rng.random() < 0.4 else int(rng.integers(1, 33))
    B, Lq = c["B"], c["Lq"]
    if kind in ("static", "static_as_offsets"):
        T = int(rng.integers(1, 61))
        # Lengths shorter than Lq now and then: rows with nothing visible under causal masking.
        hi = T if rng.random() < 0.5 else min(T, max(Lq - 1, 0))
        c["nonpad"] = rng.integers(0, hi + 1, size=B).astype(np.int64)
        c["Lnew"] = T
    elif kind in ("past", "past_nonpad"):
        c["past_len"] = int(rng.integers(0, 40))
        c["Lnew"] = int(rng.integers(1, 2 * Lq + 3))  # the new block may be longer than Q
        if kind == "past_nonpad":
            T = c["past_len"] + c["Lnew"]
            c["nonpad"] = rng.integers(0, T + 1, size=B).astype(np.int64)
    else:
        c["Lnew"] = int(rng.integers(1, 61))
    c["is_causal"] = bool(rng.random() < 0.75)
    if rng.random() < 0.45:
        c["left"] = int(rng.integers(-1, 12))
        c["right"] = int(rng.integers(-1, 4)) if rng.random() < 0.4 else (0 if c["is_causal"] else -1)
        if c["left"] < 0 and c["right"] < 0:
            c["left"] = int(rng.integers(0, 12))
    if rng.random() < 0.3:
        c["scale"] = float(rng.uniform(0.05, 1.5))
    c["q"] = rng.standard_normal((B, c["Hq"], Lq, c["Dk"])).astype(np.float32)
    c["k"] = rng.standard_normal((B, Hkv, c["Lnew"], c["Dk"])).astype(np.float32)
    c["v"] = rng.standard_normal((B, Hkv, c["Lnew"], c["Dv"])).astype(np.float32)
    if "past_len" in c:
        c["past_k"] = rng.standard_normal((B, Hkv, c["past_len"], c["Dk"])).astype(np.float32)
        c["past_v"] = rng.standard_normal((B, Hkv, c["past_len"], c["Dv"])).astype(np.float32)
    return c


def describe(c):
    d = {n: c[n] for n in ("idx", "kind", "B", "Hq", "Hkv", "Lq", "Lnew", "past_len", "Dk", "Dv", "is_causal", "left",
                           "right", "scale") if n in c}
    if "nonpad" in c:
        d["nonpad"] = c["nonpad"].tolist()
    return str(d)


def onnx_of(c):
    return onnx_attention(c["q"], c["k"], c["v"], c.get("past_k"), c.get("past_v"), c.get("nonpad"), c["is_causal"],
                          c.get("left", -1), c.get("right", -1), c.get("scale"))


def attn_args(c, tmp):
    """The same problem as attn sdpa arguments (K/V as ONNX's present_key/present_value)."""
    k, v = c["k"], c["v"]
    if "past_len" in c:
        k = np.concatenate([c["past_k"], k], axis=2)
        v = np.concatenate([c["past_v"], v], axis=2)
    for n, x in (("q", c["q"]), ("k", k), ("v", v)):
        np.save(tmp / f"{n}.npy", x)
    args = ["sdpa", "--q", tmp / "q.npy", "--k", tmp / "k.npy", "--v", tmp / "v.npy", "--out", tmp / "o.npy",
            "--lse", tmp / "l.npy"]
    if "nonpad" in c:
        np.save(tmp / "kl.npy", c["nonpad"])
        args += ["--key-lengths", tmp / "kl.npy"]
    align = {"static": "bottom-right", "no_cache": "top-left"}.get(c["kind"], "top-left")
    if c["kind"] == "static_as_offsets" and (c["is_causal"] or "left" in c):  # the per-sequence offsets spelled out
        np.save(tmp / "qo.npy", (c["nonpad"] - c["Lq"]).astype(np.int32))
        args += ["--query-offsets", tmp / "qo.npy"]
    if "past_len" in c and (c["is_causal"] or "left" in c):  # the CLI refuses an offset that places nothing
        args += ["--query-offset", c["past_len"]]
    if c["is_causal"]:
        args += ["--causal", align]
    if "left" in c:
        args += ["--window-left", c["left"], "--window-right", c["right"], "--window-align", align]
    if "scale" in c:
        args += ["--scale", repr(c["scale"])]
    return args


CASES = [make_case(i) for i in range(N_CASES)]


def check(name, got, ref, rows_ok, c, impl, extra=None):
    """got vs ref on the rows where ONNX has an answer; a masked weight (ref 0) must be exactly 0."""
    assert got.dtype == np.float32 and got.shape == ref.shape, f"{name}: {got.dtype} {got.shape}\ncase: {describe(c)}"
    mask = np.broadcast_to(rows_ok.reshape(rows_ok.shape + (1,) * (ref.ndim - rows_ok.ndim)), ref.shape)
    r = np.where(mask, ref, 0.0)
    g = np.where(mask, got.astype(np.float64), 0.0)
    fin = np.isfinite(r)
    bound = RTOL * (1.0 + np.abs(np.where(fin, r, 0.0)))
    if extra is not None:
        bound = bound + np.where(fin, extra, 0.0) + fp32_bound.U * np.abs(np.where(fin, r, 0.0))
    bad = np.where(fin, ~(np.abs(g - np.where(fin, r, 0.0)) <= bound), g != r)
    if name == "weights":
        bad |= mask & (ref == 0.0) & (got != 0.0)
    if bad.any():
        at = tuple(int(x) for x in np.argwhere(bad)[0])
        pytest.fail(f"{impl} {name}: {int(bad.sum())} of {bad.size} elements off; first at {at}: got {got[at]!r}, "
                    f"ONNX {ref[at]!r}\ncase: {describe(c)}")


@pytest.mark.parametrize("impl", ["reference", "auto"])
@pytest.mark.parametrize("idx", range(N_CASES), ids=[f"case_{i:03d}" for i in range(N_CASES)])
def test_matches_onnx(idx, impl, tmp_path):
    c = CASES[idx]
    y, w, lse, allowed, k, v, scale = onnx_of(c)
    # The reference also writes the weights; auto does not ask for them, so that it may run the
    # decode kernel (decode never forms weights): for Lq <= 16 with fewer rows per KV head
    # (group·Lq) than two flash panels (float32 K/V; a panel is 32 queries on the avx512 row, 16
    # on the others), and flash otherwise.
    extra_args = ["--weights", tmp_path / "w.npy"] if impl == "reference" else ["--verbose"]
    r = run_attn(*attn_args(c, tmp_path), "--impl", impl, *extra_args)
    assert r.returncode == 0, f"exit {r.returncode}: {r.stderr}\ncase: {describe(c)}"
    if impl == "auto":
        row = re.search(r"\b(portable|avx2|avx512)(?:_bf16)? path", r.stderr)
        assert row, f"no kernel row named: {r.stderr}"
        panel = 32 if row.group(1) == "avx512" else 16
        kernel = "decode" if c["Lq"] <= 16 and c["Hq"] // c["Hkv"] * c["Lq"] < 2 * panel else "flash"
        assert f"ran: {kernel}" in r.stderr, f"expected the {kernel} kernel: {r.stderr}\ncase: {describe(c)}"
    else:
        assert r.stderr == "", r.stderr
    out, got_lse = np.load(tmp_path / "o.npy"), np.load(tmp_path / "l.npy")
    got_w = np.load(tmp_path / "w.npy") if impl == "reference" else None

    empty = ~allowed.any(axis=-1)  # (B, Hq, Lq): no visible key
    # Where the two conventions differ: ONNX's softmax gives NaN, attn gives 0 and −inf.
    assert np.isnan(y[empty]).all() and np.isnan(w[empty]).all()
    assert (out[empty] == 0.0).all(), f"{impl}: empty rows not 0\ncase: {describe(c)}"
    assert got_w is None or (got_w[empty] == 0.0).all(), f"{impl}: empty rows' weights not 0\ncase: {describe(c)}"
    assert np.isneginf(got_lse[empty]).all(), f"{impl}: empty rows' lse not -inf\ncase: {describe(c)}"

    extra = [None, None, None]
    if impl == "auto":  # float32 inputs: a float32 kernel runs (decode or flash)
        a = np.where(empty[..., None], 0.0, w)
        extra = fp32_bound.fp32_terms(c["q"].astype(np.float64), k, v, scale, a)
    ok = ~empty
    check("out", out, y, ok, c, impl, extra[0])
    check("lse", got_lse, lse, ok, c, impl, extra[1])
    if got_w is not None:
        check("weights", got_w, w, ok, c, impl, extra[2])


def test_cases_cover_every_rule():
    """Guards the generator: every cache representation, windows with lengths, empty rows."""
    seen = lambda pred: sum(1 for c in CASES if pred(c))  # noqa: E731
    for kind in KINDS:
        assert seen(lambda c: c["kind"] == kind) >= 12
    assert seen(lambda c: c["kind"].startswith("static") and c["is_causal"] and (c["nonpad"] < c["Lq"]).any()) >= 8
    assert seen(lambda c: c["kind"].startswith("static") and c["B"] > 1 and len(set(c["nonpad"].tolist())) > 1) >= 10
    assert seen(lambda c: "nonpad" in c and "left" in c) >= 8
    assert seen(lambda c: c["kind"].startswith("past") and c["Lnew"] > c["Lq"]) >= 8
    assert seen(lambda c: c["kind"].startswith("past") and "left" in c) >= 4
    assert seen(lambda c: c["Hq"] // c["Hkv"] * c["Lq"] < 16) >= 20  # decode on every row
    assert seen(lambda c: c["Lq"] > 16) >= 15  # flash
    assert seen(lambda c: c["Lq"] <= 16 and c["Hq"] // c["Hkv"] * c["Lq"] >= 32) >= 3  # flash: a panel of rows
    assert seen(lambda c: c["Hq"] > c["Hkv"]) >= 10
    assert seen(lambda c: (~onnx_of(c)[3].any(axis=-1)).any()) >= 10  # rows with nothing visible
