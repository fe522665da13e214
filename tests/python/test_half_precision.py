# float16 / bfloat16 through the NumPy API (issue 14): float16 arrays, uint16 arrays of bfloat16
# bits under dtype="bfloat16", out_dtype=, the results' dtypes, and clear errors. Every result is
# checked against the float64 textbook on the rounded inputs (half_reference.py), not against a
# kernel, so these pass whichever kernel the core picks.
import numpy as np
import pytest

import attn
from half_reference import HALF_ULP, check, check_lse, oracle, rounded, values

DTYPES = ["float32", "float16", "bfloat16"]


def problem(seed, b=2, hq=4, hkv=2, lq=5, lk=37, d=16):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((b, hq, lq, d)).astype(np.float32),
            rng.standard_normal((b, hkv, lk, d)).astype(np.float32),
            rng.standard_normal((b, hkv, lk, d)).astype(np.float32))


@pytest.mark.parametrize("qd", DTYPES)
@pytest.mark.parametrize("kvd", DTYPES)
@pytest.mark.parametrize("impl", ["reference", "auto"])
def test_forward_dtype_mix(qd, kvd, impl):
    q32, k32, v32 = problem(1)
    (q, qr), (k, kr), (v, vr) = rounded(q32, qd), rounded(k32, kvd), rounded(v32, kvd)
    ref_out, ref_lse, _ = oracle(qr, kr, vr, keep=np.tril(np.ones((5, 37), bool), 32))
    kw = dict(dtype="bfloat16") if "bfloat16" in (qd, kvd) else {}
    out, lse = attn.scaled_dot_product_attention(q, k, v, is_causal=True, causal_alignment="bottom-right",
                                                 return_lse=True, impl=impl, **kw)
    check(values(out, qd), ref_out, qd)  # out in q's dtype by default
    check_lse(lse, ref_lse, qd == kvd == "bfloat16")


@pytest.mark.parametrize("out_dtype", DTYPES)
@pytest.mark.parametrize("qd", ["float32", "float16", "bfloat16"])
def test_out_dtype(qd, out_dtype):
    q32, k32, v32 = problem(2, lq=7, lk=9)
    (q, qr), (k, kr), (v, vr) = (rounded(x, qd) for x in (q32, k32, v32))
    ref_out, _, ref_w = oracle(qr, kr, vr)
    out, w = attn.scaled_dot_product_attention(q, k, v, dtype="bfloat16", out_dtype=out_dtype, impl="reference",
                                               return_weights=True)
    assert out.dtype == (np.uint16 if out_dtype == "bfloat16" else np.dtype(out_dtype))
    check(values(out, out_dtype), ref_out, out_dtype)
    assert w.dtype == np.float32  # weights stay float32
    check(w, ref_w, "float32")


def test_out_dtype_accepts_numpy_types_and_float64_keeps_float64():
    q32, k32, v32 = problem(3, lq=3, lk=4)
    out = attn.scaled_dot_product_attention(q32, k32, v32, out_dtype=np.float16, impl="reference")
    assert out.dtype == np.float16
    out64, lse64 = attn.scaled_dot_product_attention(*(x.astype(np.float64) for x in (q32, k32, v32)),
                                                     return_lse=True)
    assert out64.dtype == np.float64 and lse64.dtype == np.float64
    assert attn.scaled_dot_product_attention(q32, k32, v32, out_dtype=np.float64).dtype == np.float64


def test_strided_half_inputs_are_read_in_place():
    # (B, L, H, D) buffers seen as (B, H, L, D): no copy for float16 or bfloat16 bits either.
    rng = np.random.default_rng(4)
    base = [rng.standard_normal((2, 11, 4, 8)).astype(np.float32) for _ in range(3)]
    for dt in ["float16", "bfloat16"]:
        arrays = [rounded(x, dt) for x in base]
        views = [a.transpose(0, 2, 1, 3) for a, _ in arrays]
        ref_out, _, _ = oracle(*(r.transpose(0, 2, 1, 3) for _, r in arrays))
        before = attn._input_copies()
        out = attn.scaled_dot_product_attention(*views, dtype="bfloat16", impl="reference")
        assert attn._input_copies() == before
        check(values(out, dt), ref_out, dt)


def test_decode_shape_float16_cache_with_float32_query():
    # One query of a 2-head group against an f16 cache: the decode kernel takes it (auto).
    q32, k32, v32 = problem(5, lq=1, lk=300, d=64)
    (k, kr), (v, vr) = rounded(k32, "float16"), rounded(v32, "float16")
    ref_out, _, _ = oracle(q32, kr, vr)
    out = attn.scaled_dot_product_attention(q32, k, v)
    check(values(out, "float32"), ref_out, "float32")
    for out_dtype in ["float16", "bfloat16"]:  # a 16-bit out: decode writes float32 today
        out = attn.scaled_dot_product_attention(q32, k, v, out_dtype=out_dtype)
        check(values(out, out_dtype), ref_out, out_dtype)


def textbook_grads(qr, kr, vr, gr):
    """dq, dk, dv of <softmax(q kᵀ/√D) v, g> (GQA: K/V heads repeated), by torch autograd in float64
    on the float64 values the rounded inputs hold."""
    import torch
    tq, tk, tv = (torch.from_numpy(np.asarray(x, np.float64)).requires_grad_() for x in (qr, kr, vr))
    group = tq.shape[1] // tk.shape[1]
    s = tq @ tk.repeat_interleave(group, 1).transpose(-1, -2) / np.sqrt(tq.shape[-1])
    (torch.softmax(s, -1) @ tv.repeat_interleave(group, 1)).backward(torch.from_numpy(np.asarray(gr, np.float64)))
    return [t.grad.numpy() for t in (tq, tk, tv)]


def test_backward_half():
    q32, k32, v32 = problem(6, lq=6, lk=10)
    g32 = np.random.default_rng(7).standard_normal((2, 4, 6, 16)).astype(np.float32)
    for dt in ["float16", "bfloat16"]:
        (q, qr), (k, kr), (v, vr), (g, gr) = (rounded(x, dt) for x in (q32, k32, v32, g32))
        out, lse = attn.scaled_dot_product_attention(q, k, v, return_lse=True, dtype="bfloat16", impl="reference",
                                                     out_dtype="float32")
        dq, dk, dv = attn.scaled_dot_product_attention_backward(q, k, v, out, lse, g, dtype="bfloat16",
                                                                out_dtype="float32")
        for ours, ref in zip((dq, dk, dv), textbook_grads(qr, kr, vr, gr)):
            assert ours.dtype == np.float32
            check(ours, ref, "float32")


def check_grads(grads, refs, dtypes):
    """Each gradient holds its dtype and is within the stated backward bound (docs/conventions.md,
    "Backward with 16-bit tensors": float32 O): 2e-5 × the call's largest reference gradient,
    plus one rounding into a 16-bit gradient's dtype."""
    budget = 2e-5 * max(np.abs(r).max() for r in refs)
    for name, ours, ref, dt in zip(("dq", "dk", "dv"), grads, refs, dtypes):
        got = values(ours, dt)  # asserts the dtype
        assert np.all(np.isfinite(got)), f"{name}: non-finite"
        err = np.abs(got - ref)
        bound = budget + HALF_ULP[dt] * (np.abs(ref) + budget)
        assert np.all(err <= bound), f"{name}: max err {err.max():.3g}, worst excess {(err - bound).max():.3g}"


# dq in query's dtype, dk in key's, dv in value's (docs/conventions.md, "The gradients' dtypes");
# through query's dtype a float32 key's gradient kept bfloat16's 8 bits.
@pytest.mark.parametrize("qd, kd, vd", [("float16", "bfloat16", "bfloat16"), ("bfloat16", "float32", "float32"),
                                        ("float32", "float16", "bfloat16"), ("bfloat16", "float16", "float32"),
                                        ("float32", "float64", "float64"), ("float64", "float32", "bfloat16")])
@pytest.mark.parametrize("impl", ["reference", "auto"])
def test_backward_each_gradient_in_its_inputs_dtype(qd, kd, vd, impl):
    q32, k32, v32 = problem(8, lq=6, lk=19)
    g32 = np.random.default_rng(9).standard_normal((2, 4, 6, 16)).astype(np.float32)
    (q, qr), (k, kr), (v, vr) = rounded(q32, qd), rounded(k32, kd), rounded(v32, vd)
    kw = dict(dtype="bfloat16", impl=impl)
    # float32 O (float64 for a float64 query, its default): no 16-bit-O term in the bound.
    out, lse = attn.scaled_dot_product_attention(q, k, v, return_lse=True,
                                                 out_dtype=None if qd == "float64" else "float32", **kw)
    grads = attn.scaled_dot_product_attention_backward(q, k, v, out, lse, g32, **kw)
    check_grads(grads, textbook_grads(qr, kr, vr, g32), (qd, kd, vd))
    # out_dtype= still sets all three.
    grads16 = attn.scaled_dot_product_attention_backward(q, k, v, out, lse, g32, out_dtype="float16", **kw)
    assert [x.dtype for x in grads16] == [np.float16] * 3


def test_float16_query_keeps_a_bfloat16_values_gradient_past_65504_finite():
    # dV = Pᵀ·dO beyond float16's range: in value's bfloat16 it is finite (in query's float16 it
    # was inf). V's rows nearly equal keep dS = P∘(dP − D), so dQ and dK, within float16.
    q32, k32, _ = problem(10, lq=8, lk=3)
    v32 = (1 + 0.01 * np.random.default_rng(11).standard_normal(k32.shape)).astype(np.float32)
    g32 = (3e4 * np.random.default_rng(12).uniform(0.5, 1.5, (2, 4, 8, 16))).astype(np.float32)
    (q, qr), (k, kr), (v, vr) = rounded(q32, "float16"), rounded(k32, "bfloat16"), rounded(v32, "bfloat16")
    out, lse = attn.scaled_dot_product_attention(q, k, v, return_lse=True, dtype="bfloat16", out_dtype="float32")
    refs = textbook_grads(qr, kr, vr, g32)
    assert np.abs(refs[2]).max() > 65504 and np.abs(refs[0]).max() < 6e4 and np.abs(refs[1]).max() < 6e4
    grads = attn.scaled_dot_product_attention_backward(q, k, v, out, lse, g32, dtype="bfloat16")
    check_grads(grads, refs, ("float16", "bfloat16", "bfloat16"))


def test_varlen_backward_each_gradient_in_its_inputs_dtype():
    # One packed sequence (L, H, D) is the (1, H, L, D) problem transposed.
    q32, k32, v32 = problem(13, b=1, lq=7, lk=12)
    g32 = np.random.default_rng(14).standard_normal((1, 4, 7, 16)).astype(np.float32)
    (q, qr), (k, kr), (v, vr) = rounded(q32, "float16"), rounded(k32, "bfloat16"), rounded(v32, "float32")
    packed = lambda a: np.ascontiguousarray(a[0].transpose(1, 0, 2))  # noqa: E731
    cq, ck = np.array([0, 7], np.int32), np.array([0, 12], np.int32)
    out, lse = attn.sdpa_varlen(packed(q), packed(k), packed(v), cq, ck, return_lse=True, dtype="bfloat16",
                                out_dtype="float32")
    grads = attn.sdpa_varlen_backward(packed(q), packed(k), packed(v), cq, ck, out, lse, packed(g32), dtype="bfloat16")
    check_grads(grads, [packed(r) for r in textbook_grads(qr, kr, vr, g32)], ("float16", "bfloat16", "float32"))


def test_out_dtype_float64_where_the_call_writes_float64():
    """out_dtype="float64" (or np.float64), as the CLI's --out-dtype float64 (docs/conventions.md,
    "The CLI's output dtype"): the reference keeps its double result, a float32 kernel's is widened
    exactly. It was refused everywhere (only a float64 query gave a float64 out)."""
    q32, k32, v32 = problem(15, lq=6, lk=9)
    g32 = np.random.default_rng(16).standard_normal((2, 4, 6, 16)).astype(np.float32)
    q64, k64, v64 = (x.astype(np.float64) for x in (q32, k32, v32))
    sdpa, back = attn.scaled_dot_product_attention, attn.scaled_dot_product_attention_backward
    # The reference on float32 inputs computes in double: a float64 out has the float64 inputs' bits.
    out = sdpa(q32, k32, v32, out_dtype="float64", impl="reference")
    assert out.dtype == np.float64
    np.testing.assert_array_equal(out, sdpa(q64, k64, v64, impl="reference"))
    assert np.abs(out - sdpa(q32, k32, v32, impl="reference")).max() > 0  # not the float32 result widened
    # Its backward too: dq, dk, dv float64, within the stated bound of the float64 textbook.
    o32, lse = sdpa(q32, k32, v32, return_lse=True, impl="reference")
    grads = back(q32, k32, v32, o32, lse, g32, out_dtype=np.float64, impl="reference")
    check_grads(grads, textbook_grads(q32, k32, v32, g32), ("float64",) * 3)
    # A float32 kernel's result, widened exactly: forward and backward (flash reads 16-bit inputs too).
    q16, _ = rounded(q32, "float16")
    o16, lse16 = sdpa(q16, k32, v32, return_lse=True, out_dtype="float32")
    np.testing.assert_array_equal(sdpa(q16, k32, v32, out_dtype="float64"), o16.astype(np.float64))
    wide = back(q16, k32, v32, o16, lse16, g32, out_dtype="float64")
    for ours, f32 in zip(wide, back(q16, k32, v32, o16, lse16, g32, out_dtype="float32")):
        assert ours.dtype == np.float64
        np.testing.assert_array_equal(ours, f32.astype(np.float64))
    # Packed sequences: sdpa_varlen and its backward.
    packed = lambda a: np.ascontiguousarray(a[0].transpose(1, 0, 2))  # noqa: E731
    cq, ck = np.array([0, 6], np.int32), np.array([0, 9], np.int32)
    pq, pk, pv, pg = (packed(x) for x in (q32, k32, v32, g32))
    po, plse = attn.sdpa_varlen(pq, pk, pv, cq, ck, return_lse=True)
    np.testing.assert_array_equal(attn.sdpa_varlen(pq, pk, pv, cq, ck, out_dtype="float64"), po.astype(np.float64))
    for ours, f32 in zip(attn.sdpa_varlen_backward(pq, pk, pv, cq, ck, po, plse, pg, out_dtype="float64"),
                         attn.sdpa_varlen_backward(pq, pk, pv, cq, ck, po, plse, pg)):
        assert ours.dtype == np.float64
        np.testing.assert_array_equal(ours, f32.astype(np.float64))
    # The serving calls: decode_attention on a KVCache, paged_attention on a PagedKVCache.
    cache = attn.KVCache(2, 2, 16, 16)
    cache.append(k32, v32)
    q1 = np.ascontiguousarray(q32[:, :, :1])
    np.testing.assert_array_equal(attn.decode_attention(q1, cache, out_dtype="float64"),
                                  attn.decode_attention(q1, cache).astype(np.float64))
    pages = attn.PagedKVCache(2, 16, 8, page_size=4)
    seqs = [pages.add_sequence() for _ in range(2)]
    for b, s in enumerate(seqs):
        pages.append(s, k32[b], v32[b])
    np.testing.assert_array_equal(attn.paged_attention(q1, pages, seqs, out_dtype="float64"),
                                  attn.paged_attention(q1, pages, seqs).astype(np.float64))


def test_decode_attention_lse_of_a_float64_query_is_float64():
    """lse is float64 for a float64 query, float32 otherwise, from every call that returns one
    (docs/conventions.md, "The CLI's output dtype"). decode_attention, which runs a float64 query
    on the double reference as sdpa does, returned its lse rounded to float32."""
    q32, k32, v32 = problem(3, lq=3, lk=11)
    q = q32.astype(np.float64) * 1.1  # values float32 does not hold
    cache = attn.KVCache(2, 2, 16, 16)
    cache.append(k32, v32)
    out, lse = attn.decode_attention(q, cache, return_lse=True, out_dtype="float64")
    ref_out, ref_lse, _ = oracle(q, k32.astype(np.float64), v32.astype(np.float64),
                                 keep=np.tril(np.ones((3, 11), bool), 8))
    assert lse.dtype == np.float64
    # Both in double: a few ulps of double apart, where a float32 lse is ~1e-8 away.
    np.testing.assert_allclose(lse, ref_lse, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(out, ref_out, rtol=1e-12, atol=1e-12)
    assert attn.decode_attention(q32, cache, return_lse=True)[1].dtype == np.float32


def test_out_dtype_float64_is_refused_where_the_call_computes_in_float32():
    # The MHA layer writes float32, float16 or bfloat16 (attn.dist's ring: tests/ring).
    m = attn.MultiheadAttention(16, 2)
    x = np.zeros((3, 16), np.float32)
    refused = r'expected "float32", "float16", "bfloat16" or None but got str \'float64\': this call computes in float32'
    for kw in ("out_dtype", "intermediate_dtype"):
        with pytest.raises(TypeError, match=kw + ": " + refused):
            m(x, x, x, **{kw: "float64"})
    with pytest.raises(TypeError, match="out_dtype: " + refused):
        m.forward_incremental(x, attn.KVCache(1, 2, 8, 4), out_dtype="float64")


def test_uint16_without_dtype_is_a_type_error_naming_the_keyword():
    q32, k32, v32 = problem(8, lq=2, lk=3)
    k, _ = rounded(k32, "bfloat16")
    with pytest.raises(TypeError, match=r'key: unsupported dtype uint16 .*dtype="bfloat16"'):
        attn.scaled_dot_product_attention(q32, k, v32)


# A wrong dtype keyword is a TypeError, as every dtype problem of the module (module.cpp).
@pytest.mark.parametrize("kw, pattern", [
    (dict(dtype="float8"), r'dtype: .*expected "bfloat16"'),
    (dict(dtype=np.uint16), r"dtype: "),
    (dict(out_dtype="int8"), r"out_dtype: expected"),
    (dict(out_dtype="float64x"), r"out_dtype: expected"),
    (dict(out_dtype=3), r"out_dtype: expected"),
    (dict(out_dtype=np.int16), r"out_dtype: expected"),
])
def test_bad_dtype_keywords(kw, pattern):
    q32, k32, v32 = problem(9, lq=2, lk=3)
    with pytest.raises(TypeError, match=pattern):
        attn.scaled_dot_product_attention(q32, k32, v32, **kw)


def test_half_mask_is_its_values():
    # A 16-bit model's float mask (float16, or bfloat16 bits with dtype="bfloat16"): the same
    # bits as its values given as float32 (it was refused, with a message asking for the
    # dtype="bfloat16" the call already had; a review found it).
    q32, k32, v32 = problem(10, lq=5, lk=7)
    m = np.random.default_rng(4).standard_normal((5, 7)).astype(np.float32)
    m[0, 2] = -np.inf
    for dtype in ("float16", "bfloat16"):
        mh, mv = rounded(m, dtype)
        qh, _ = rounded(q32, dtype)
        kh, _ = rounded(k32, dtype)
        vh, _ = rounded(v32, dtype)
        kw = {"dtype": "bfloat16"} if dtype == "bfloat16" else {}
        got = attn.scaled_dot_product_attention(qh, kh, vh, attn_mask=mh, out_dtype="float32", **kw)
        want = attn.scaled_dot_product_attention(qh, kh, vh, attn_mask=mv.astype(np.float32), out_dtype="float32", **kw)
        assert np.array_equal(got, want), dtype
    with pytest.raises(TypeError, match="attn_mask"):  # uint16 without dtype="bfloat16": not a mask dtype
        attn.scaled_dot_product_attention(q32, k32, v32, attn_mask=np.zeros((5, 7), np.uint16))


def test_mha_half_masks_are_their_values():
    # The MHA layer's float masks under dtype="bfloat16": uint16 bits read as bfloat16, the
    # same bits as their values given as float32 (both masks were refused, with a message asking
    # for the dtype="bfloat16" the call already had; an exploratory test found it).
    r = np.random.default_rng(5)
    m = attn.MultiheadAttention(16, 4, batch_first=True)
    x = r.standard_normal((2, 3, 16)).astype(np.float32)
    am = r.standard_normal((3, 3)).astype(np.float32)
    am[1, 0] = -np.inf
    kpm = r.standard_normal((2, 3)).astype(np.float32)
    amh, amv = rounded(am, "bfloat16")
    kpmh, kpmv = rounded(kpm, "bfloat16")
    got, gw = m(x, x, x, dtype="bfloat16", attn_mask=amh, key_padding_mask=kpmh)
    want, ww = m(x, x, x, dtype="bfloat16", attn_mask=amv.astype(np.float32), key_padding_mask=kpmv.astype(np.float32))
    assert np.array_equal(got, want) and np.array_equal(gw, ww)
    with pytest.raises(TypeError, match="key_padding_mask"):  # without dtype="bfloat16": refused
        m(x, x, x, key_padding_mask=kpmh)
