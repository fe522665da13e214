# 16-bit inputs and outputs on the serving calls: decode_attention + KVCache, paged_attention +
# PagedKVCache, sdpa_varlen (+ backward). The keywords are scaled_dot_product_attention's:
# dtype="bfloat16" (uint16 arrays hold bfloat16 bits) and out_dtype=. Oracle: reference.textbook in
# float64 on the values the rounded inputs (and the cache's storage) hold; bound: the float32 one
# plus one rounding of a 16-bit output (half_reference.check).
import numpy as np
import pytest

import attn
from half_reference import check, check_lse, oracle, rounded, values

DTYPES = ["float32", "float16", "bfloat16"]


def bits_kw(*dtypes):
    return dict(dtype="bfloat16") if "bfloat16" in dtypes else {}


def serving_default(qd):
    """decode/paged/ring: out follows a 16-bit query, else float32."""
    return qd if qd in ("float16", "bfloat16") else "float32"


def check_out(ours, ref, od, vr, all_bf16):
    """half_reference.check, plus, when Q, K/V and out are all bfloat16 (bf16 compute, docs/conventions.md
    "bf16 compute": P is rounded to bf16 before P·V), |ΔO_id| <= 2^-8·max_j |v_jd| (per sequence and
    KV head, repeated over the query heads sharing it)."""
    if not all_bf16:
        return check(ours, ref, od)
    group = ref.shape[1] // vr.shape[1]
    vmax = np.repeat(np.abs(vr).max(axis=2, keepdims=True), group, axis=1)  # (B, Hq, 1, Dv)
    f32 = 1e-5 + 1e-5 * np.abs(ref) + 2.0 ** -8 * vmax
    bound = f32 + 2.0 ** -8 * (np.abs(ref) + f32)
    err = np.abs(np.asarray(ours, np.float64) - ref)
    assert np.all(err <= bound), f"max err {err.max():.3g}, worst excess {(err - bound).max():.3g}"


def bottom_right_keep(lq, lk):
    return np.tril(np.ones((lq, lk), bool), lk - lq)


@pytest.mark.parametrize("lq", [3, 20])  # the decode kernel; flash above 16 rows
@pytest.mark.parametrize("storage", DTYPES)
@pytest.mark.parametrize("qd", DTYPES)
def test_decode_attention_dtypes(qd, storage, lq):
    rng = np.random.default_rng(7)
    b, hq, hkv, lk, d = 2, 4, 2, 29, 16
    q32 = rng.standard_normal((b, hq, lq, d)).astype(np.float32)
    k32 = rng.standard_normal((b, hkv, lk, d)).astype(np.float32)
    v32 = rng.standard_normal((b, hkv, lk, d)).astype(np.float32)
    (q, qr), (k, kr), (v, vr) = rounded(q32, qd), rounded(k32, storage), rounded(v32, storage)
    cache = attn.KVCache(b, hkv, d, 64, dtype=storage)
    cache.append(k, v, **bits_kw(storage))  # K/V already in the storage dtype: stored exactly
    ref_out, ref_lse, _ = oracle(qr, kr, vr, keep=bottom_right_keep(lq, lk))
    out, lse = attn.decode_attention(q, cache, return_lse=True, **bits_kw(qd))
    od = serving_default(qd)
    check_out(values(out, od), ref_out, od, vr, qd == storage == od == "bfloat16")
    check_lse(lse, ref_lse, qd == storage == od == "bfloat16")
    for od in DTYPES:
        o = attn.decode_attention(q, cache, out_dtype=od, **bits_kw(qd))
        check_out(values(o, od), ref_out, od, vr, qd == storage == od == "bfloat16")


def test_kv_cache_append_rounds_float32_and_reads_bfloat16_bits():
    rng = np.random.default_rng(3)
    k32 = rng.standard_normal((1, 2, 5, 8)).astype(np.float32)
    kb, kr = rounded(k32, "bfloat16")
    a = attn.KVCache(1, 2, 8, 8, dtype="bfloat16")
    a.append(k32, k32)  # float32 rounded to the storage on append
    b = attn.KVCache(1, 2, 8, 8, dtype="bfloat16")
    b.append(kb, kb, dtype="bfloat16")  # the same values given as bits
    np.testing.assert_array_equal(a.keys()[:, :, :5], kr.astype(np.float32))
    np.testing.assert_array_equal(b.keys()[:, :, :5], kr.astype(np.float32))
    with pytest.raises(TypeError, match="dtype"):
        b.append(kb, kb)  # uint16 without dtype= is refused, naming the keyword
    with pytest.raises((TypeError, ValueError), match='expected "bfloat16"'):
        b.append(kb, kb, dtype="float16")


def test_decode_attention_bad_out_dtype_names_the_keyword():
    cache = attn.KVCache(1, 1, 4, 4)
    cache.append(np.ones((1, 1, 2, 4), np.float32), np.ones((1, 1, 2, 4), np.float32))
    with pytest.raises((TypeError, ValueError), match="out_dtype"):
        attn.decode_attention(np.ones((1, 1, 1, 4), np.float32), cache, out_dtype="int8")


@pytest.mark.parametrize("lq", [2, 19])
@pytest.mark.parametrize("storage", DTYPES)
@pytest.mark.parametrize("qd", DTYPES)
def test_paged_attention_dtypes(qd, storage, lq):
    rng = np.random.default_rng(11)
    hq, hkv, d, lens = 4, 2, 16, [23, 40]
    cache = attn.PagedKVCache(hkv, d, 16, page_size=16, dtype=storage)
    seqs, refs, vmax = [], [], []
    q32 = rng.standard_normal((len(lens), hq, lq, d)).astype(np.float32)
    q, qr = rounded(q32, qd)
    for i, n in enumerate(lens):
        (k, kr), (v, vr) = (rounded(rng.standard_normal((hkv, n, d)).astype(np.float32), storage) for _ in range(2))
        s = cache.add_sequence()
        cache.append(s, k, v, **bits_kw(storage))
        seqs.append(s)
        refs.append(oracle(qr[i:i + 1], kr[None], vr[None], keep=bottom_right_keep(lq, n))[0])
        vmax.append(vr[None])
    ref_out = np.concatenate(refs)
    out = attn.paged_attention(q, cache, seqs, **bits_kw(qd))
    od = serving_default(qd)
    if qd == storage == od == "bfloat16":
        for i in range(len(lens)):
            check_out(values(out, od)[i:i + 1], ref_out[i:i + 1], od, vmax[i], True)
    else:
        check(values(out, od), ref_out, od)
    o = attn.paged_attention(q, cache, seqs, out_dtype="float32", **bits_kw(qd))
    check(values(o, "float32"), ref_out, "float32")


def packed_problem(seed, qd, kvd, lens_q=(5, 0, 17), lens_k=(9, 4, 17), hq=4, hkv=2, d=8):
    rng = np.random.default_rng(seed)
    tq, tk = sum(lens_q), sum(lens_k)
    q = rounded(rng.standard_normal((tq, hq, d)).astype(np.float32), qd)
    k = rounded(rng.standard_normal((tk, hkv, d)).astype(np.float32), kvd)
    v = rounded(rng.standard_normal((tk, hkv, d)).astype(np.float32), kvd)
    cq = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
    ck = np.concatenate([[0], np.cumsum(lens_k)]).astype(np.int32)
    return q, k, v, cq, ck


@pytest.mark.parametrize("out_dtype", [None] + DTYPES)
@pytest.mark.parametrize("qd,kvd", [("float16", "float16"), ("bfloat16", "bfloat16"), ("float32", "float16"),
                                    ("float32", "bfloat16"), ("bfloat16", "float32")])
def test_sdpa_varlen_dtypes(qd, kvd, out_dtype):
    (q, qr), (k, kr), (v, vr), cq, ck = packed_problem(5, qd, kvd)
    out, lse = attn.sdpa_varlen(q, k, v, cq, ck, is_causal=True, causal_alignment="bottom-right", return_lse=True,
                                out_dtype=out_dtype, **bits_kw(qd, kvd))
    od = out_dtype or qd
    assert lse.dtype == np.float32
    ov = values(out, od)
    for s in range(len(cq) - 1):
        a, e, c, f = cq[s], cq[s + 1], ck[s], ck[s + 1]
        if e == a:
            continue
        # (T, H, D) → (1, H, T, D) for the oracle.
        tr = lambda x: np.transpose(x, (1, 0, 2))[None]  # noqa: E731
        ref_out, ref_lse, _ = oracle(tr(qr[a:e]), tr(kr[c:f]), tr(vr[c:f]), keep=bottom_right_keep(e - a, f - c))
        check_out(tr(ov[a:e]), ref_out, od, tr(vr[c:f]), qd == kvd == od == "bfloat16")
        check_lse(lse[a:e].T[None], ref_lse, qd == kvd == od == "bfloat16")


@pytest.mark.parametrize("gd", ["float16", "bfloat16"])
def test_sdpa_varlen_backward_half_gradients_are_the_float32_ones_rounded_once(gd):
    (q, _), (k, _), (v, _), cq, ck = packed_problem(9, gd, gd)
    kw = bits_kw(gd)
    out, lse = attn.sdpa_varlen(q, k, v, cq, ck, is_causal=True, return_lse=True, out_dtype="float32", **kw)
    g = np.random.default_rng(1).standard_normal(out.shape).astype(np.float32)
    g32 = attn.sdpa_varlen_backward(q, k, v, cq, ck, out, lse, g, is_causal=True, out_dtype="float32", **kw)
    g16 = attn.sdpa_varlen_backward(q, k, v, cq, ck, out, lse, g, is_causal=True, **kw)  # default: query's dtype
    for a, b in zip(g16, g32):
        assert a.dtype == (np.uint16 if gd == "bfloat16" else np.float16)
        np.testing.assert_array_equal(a, rounded(b, gd)[0])
        assert np.abs(b).max() > 0  # the comparison is not between zeros
