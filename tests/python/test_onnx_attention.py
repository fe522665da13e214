"""attn's sdpa against ONNX's Attention operator semantics (opset 23/24), written here in NumPy.

The oracle `onnx_attention` below is an independent transcription of the semantics of
onnx/onnx onnx/reference/ops/op_attention.py (read at commit 04138e07da14f1eb60f5619f038e044eec365c1e;
facts carried over, not code), in float64, for what attn maps:
  * scores s = scale·Q·Kᵀ (ONNX multiplies Q and K by √scale each: equal in exact arithmetic),
    scale defaulting to 1/√head_size; GQA repeats each KV head for consecutive query heads;
  * softcap c > 0: s = c·tanh(s/c) BEFORE the mask (so −inf stays −inf);
  * attn_mask: bool True = may attend (False → −inf), or float added; a mask with fewer
    columns than the keys is padded with masked columns;
  * is_causal: key j visible iff j <= i + offset, offset = 0 without a cache (top-left for
    Lq != Lk), nonpad_kv_seqlen[b] − Lq with the external-cache lengths (bottom-right per
    sequence); nonpad_kv_seqlen also masks keys j >= nonpad_kv_seqlen[b];
  * qk_matmul_output_mode 0: s before the softcap; 1: after it (= mode 0 without softcap);
    2: after softcap + mask/bias; 3: the softmax;
  * softmax over the biased scores, then ·V.
The mapping to attn (docs/conventions.md "ONNX Attention"): is_causal → is_causal with
causal_alignment="top-left"; nonpad_kv_seqlen → key_lengths with causal_alignment
"bottom-right"; modes 0/1/2 → return_scores="scaled"/"softcapped"/"masked"; mode 3 →
return_weights. Where ONNX differs (tests at the end):
  * a row with no visible key: ONNX's softmax gives NaN (weights and output), attn 0;
  * bool attn_mask with is_causal: the reference turns the mask into (1 − mask)·(−inf), which
    is NaN (0·−inf) at every allowed position; the oracle keeps the intent (mask AND causal);
  * a short attn_mask is padded by ONNX; attn wants the full (broadcastable) shape.
attn computes in float32: |attn − oracle| <= 2e-5·(1 + |oracle|) (float32 rounding of
D-term dot products and a softmax; measured ~1e-6).
"""
import numpy as np
import pytest

import attn

TOL = 2e-5


def onnx_attention(Q, K, V, attn_mask=None, is_causal=False, scale=None, softcap=None, mode=None,
                   nonpad_kv_seqlen=None):
    """(output, qk_matmul_output) of ONNX Attention for 4-D Q (B, Hq, Lq, D), K/V (B, Hkv, Lk, D)."""
    Q, K, V = (np.asarray(t, np.float64) for t in (Q, K, V))
    B, Hq, Lq, D = Q.shape
    Lk = K.shape[2]
    if scale is None:
        scale = 1.0 / np.sqrt(D)
    rep = Hq // K.shape[1]
    K = np.repeat(K, rep, axis=1)  # kv head h serves query heads h·rep .. h·rep + rep − 1
    V = np.repeat(V, rep, axis=1)
    raw = scale * np.einsum("bhid,bhjd->bhij", Q, K)
    capped = softcap * np.tanh(raw / softcap) if softcap else raw

    bias = np.zeros((B, 1, Lq, Lk))
    if attn_mask is not None:
        m = np.asarray(attn_mask)
        if m.shape[-1] < Lk:  # ONNX pads a short mask with masked columns
            pad = [(0, 0)] * (m.ndim - 1) + [(0, Lk - m.shape[-1])]
            m = np.pad(m, pad, constant_values=False if m.dtype == np.bool_ else -np.inf)
        m = np.where(m, 0.0, -np.inf) if m.dtype == np.bool_ else m.astype(np.float64)
        bias = bias + m
    i = np.arange(Lq)[:, None]
    j = np.arange(Lk)[None, :]
    if is_causal:
        offset = np.zeros(B, np.int64) if nonpad_kv_seqlen is None else np.asarray(nonpad_kv_seqlen) - Lq
        allowed = j[None] <= i[None] + offset[:, None, None]  # (B, Lq, Lk)
        bias = bias + np.where(allowed, 0.0, -np.inf)[:, None]
    if nonpad_kv_seqlen is not None:
        valid = j[None] < np.asarray(nonpad_kv_seqlen)[:, None, None]  # (B, 1, Lk)
        bias = bias + np.where(valid, 0.0, -np.inf)[:, None]
    biased = capped + bias
    with np.errstate(invalid="ignore"):
        e = np.exp(biased - biased.max(axis=-1, keepdims=True))  # all −inf → NaN, as ONNX
        weights = e / e.sum(axis=-1, keepdims=True)
    out = weights @ V
    stage = {None: None, 0: raw, 1: capped, 2: biased, 3: weights}[mode]
    return out, stage


STAGES = {0: "scaled", 1: "softcapped", 2: "masked"}


def close(ours, ref):
    ours, ref = np.asarray(ours, np.float64), np.asarray(ref, np.float64)
    assert ours.shape == ref.shape
    if ref.size == 0:
        return
    same_inf = np.isinf(ref) & (ours == ref)
    with np.errstate(invalid="ignore"):  # inf − inf where both agree: masked out below
        err = np.where(same_inf, 0.0, np.abs(ours - ref) / (1.0 + np.abs(np.where(np.isinf(ref), 0.0, ref))))
    assert not np.isnan(err).any(), "NaN where the oracle has a number (or an inf of the other sign)"
    assert err.max() <= TOL, err.max()


def random_case(seed):
    rng = np.random.default_rng(seed)
    B, Hkv = int(rng.integers(1, 3)), int(rng.integers(1, 3))
    Hq = Hkv * int(rng.integers(1, 3))
    Lq, Lk, D = int(rng.integers(1, 9)), int(rng.integers(1, 12)), int(rng.choice([4, 8, 16]))
    q = rng.standard_normal((B, Hq, Lq, D)).astype(np.float32) * 2
    k = rng.standard_normal((B, Hkv, Lk, D)).astype(np.float32) * 2
    v = rng.standard_normal((B, Hkv, Lk, D)).astype(np.float32)
    mask_kind = ["none", "bool", "float"][seed % 3]
    mask = None
    if mask_kind == "bool":
        mask = rng.random((B, 1, Lq, Lk)) < 0.75
    elif mask_kind == "float":
        mask = (rng.standard_normal((1, Hq, Lq, Lk)) * 2).astype(np.float32)
        mask[rng.random(mask.shape) < 0.2] = -np.inf
    causal = bool(rng.integers(0, 2))
    softcap = [None, 1.5, 5.0][int(rng.integers(0, 3))]
    lengths = None
    if seed % 4 == 1:
        lengths = rng.integers(min(Lq, Lk) if causal else 0, Lk + 1, size=B).astype(np.int64)
    return dict(q=q, k=k, v=v, mask=mask, causal=causal, softcap=softcap, lengths=lengths)


def run_attn(c, **extra):
    kw = {}
    if c["lengths"] is not None:
        kw["key_lengths"] = c["lengths"]
        kw["causal_alignment"] = "bottom-right"
    return attn.scaled_dot_product_attention(
        c["q"], c["k"], c["v"], attn_mask=c["mask"], is_causal=c["causal"], softcap=c["softcap"], **kw, **extra)


def visible_rows(ref_weights):
    """Rows the oracle has a number for (it gives NaN to rows with no visible key)."""
    return ~np.isnan(ref_weights).any(axis=-1)


@pytest.mark.parametrize("seed", range(60))
def test_random_cases_all_modes(seed):
    c = random_case(seed)  # bool mask + causal: the oracle keeps ONNX's intent (module doc)
    args = dict(attn_mask=c["mask"], is_causal=c["causal"], softcap=c["softcap"], nonpad_kv_seqlen=c["lengths"])
    for mode, stage in STAGES.items():
        _, ref = onnx_attention(c["q"], c["k"], c["v"], mode=mode, **args)
        _, scores = run_attn(c, return_scores=stage)
        close(scores, ref)
    out_ref, w_ref = onnx_attention(c["q"], c["k"], c["v"], mode=3, **args)
    out, w = run_attn(c, return_weights=True)
    rows = visible_rows(w_ref)
    close(w[rows], w_ref[rows])
    close(out[rows], out_ref[rows])
    # The one difference: a row with no visible key is 0 in attn, NaN in ONNX.
    assert np.all(w[~rows] == 0) and np.all(out[~rows] == 0)


def test_cases_cover_the_kinds():
    cases = [random_case(s) for s in range(60)]
    assert any(c["softcap"] and c["mask"] is not None and c["causal"] for c in cases)
    assert any(c["lengths"] is not None and c["causal"] for c in cases)
    assert any(c["q"].shape[2] != c["k"].shape[2] and c["causal"] and c["lengths"] is None for c in cases)
    assert any(c["q"].shape[1] != c["k"].shape[1] for c in cases)


def test_softcap_sits_before_the_mask():
    """Capping after the mask would turn −inf into −c and leak weight to masked keys."""
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((1, 1, 3, 4)).astype(np.float32) for _ in range(3))
    mask = np.array([[True, False, True]] * 3)[None, None]
    _, w = attn.scaled_dot_product_attention(q, k, v, attn_mask=mask, softcap=2.0, return_weights=True)
    assert np.all(w[..., 1] == 0)
    _, ref = onnx_attention(q, k, v, attn_mask=mask, softcap=2.0, mode=3)
    close(w, ref)


def test_causal_without_cache_is_top_left():
    """ONNX is_causal with no past_key and no nonpad_kv_seqlen: offset 0 (top-left), also for
    Lq != Lk; attn's is_causal defaults to the same alignment. bottom-right differs there."""
    rng = np.random.default_rng(6)
    q = rng.standard_normal((1, 1, 3, 4)).astype(np.float32)
    k, v = (rng.standard_normal((1, 1, 6, 4)).astype(np.float32) for _ in range(2))
    _, ref = onnx_attention(q, k, v, is_causal=True, mode=2)
    _, s = attn.scaled_dot_product_attention(q, k, v, is_causal=True, return_scores="masked")
    close(s, ref)
    _, s_br = attn.scaled_dot_product_attention(q, k, v, is_causal=True, causal_alignment="bottom-right",
                                                return_scores="masked")
    assert np.isinf(ref[0, 0, 0, 1]) and np.isfinite(s_br[0, 0, 0, 1])


def test_short_mask_is_padded_by_onnx_not_by_attn():
    """ONNX pads an attn_mask with fewer columns than keys with masked ones; attn needs the
    full shape (the caller pads: False / −inf), and says so."""
    rng = np.random.default_rng(7)
    q = rng.standard_normal((1, 1, 2, 4)).astype(np.float32)
    k, v = (rng.standard_normal((1, 1, 5, 4)).astype(np.float32) for _ in range(2))
    short = np.array([[True, True, False], [True, False, True]])
    with pytest.raises(Exception, match="mask: shape \\(2, 3\\) cannot be broadcast"):
        attn.scaled_dot_product_attention(q, k, v, attn_mask=short)
    padded = np.pad(short, [(0, 0), (0, 2)], constant_values=False)
    out, w = attn.scaled_dot_product_attention(q, k, v, attn_mask=padded, return_weights=True)
    out_ref, w_ref = onnx_attention(q, k, v, attn_mask=short, mode=3)
    close(w, w_ref)
    close(out, out_ref)


def test_onnx_reference_bool_mask_with_causal_is_nan():
    """The fact the oracle departs from: (1 − mask)·(−inf) for a bool mask is NaN where the
    mask allows (0·−inf). attn (and the oracle) combine the bool mask with causal instead."""
    mask = np.array([True, False])
    with np.errstate(invalid="ignore"):
        as_reference = (1 - mask).astype(np.float32) * (-np.inf)
    assert np.isnan(as_reference[0]) and as_reference[1] == -np.inf
