# attn.PagedKVCache / attn.paged_attention: the same bits as attn.KVCache / decode_attention for
# the same tokens, fork isolation, and a full pool as a ValueError that changes nothing.
import numpy as np
import pytest

import attn


def tokens(rng, hkv, t, d):
    return rng.standard_normal((hkv, t, d), dtype=np.float32)


@pytest.mark.parametrize("page_size,dtype", [(16, "float32"), (32, "float16"), (1, "bfloat16")])
def test_paged_equals_contiguous(page_size, dtype):
    rng = np.random.default_rng(page_size)
    hkv, d, lengths = 2, 32, [50, 7, 130]
    paged = attn.PagedKVCache(hkv, d, 256, page_size=page_size, dtype=dtype)
    contiguous = attn.KVCache(len(lengths), hkv, d, max(lengths), dtype=dtype)
    seqs = []
    for b, n in enumerate(lengths):
        k, v = tokens(rng, hkv, n, d), tokens(rng, hkv, n, d)
        s = paged.add_sequence()
        paged.append(s, k[:, : n // 2], v[:, : n // 2])  # two appends: pages fill across calls
        paged.append(s, k[:, n // 2 :], v[:, n // 2 :])
        contiguous.append(k, v, batch_index=b)
        seqs.append(s)
    q = rng.standard_normal((3, 4, 1, d), dtype=np.float32)
    out, lse = attn.paged_attention(q, paged, seqs, return_lse=True)
    want, want_lse = attn.decode_attention(q, contiguous, return_lse=True)
    np.testing.assert_array_equal(out, want)
    np.testing.assert_array_equal(lse, want_lse)


def test_fork_isolation_and_full_pool():
    rng = np.random.default_rng(0)
    c = attn.PagedKVCache(1, 8, 3, page_size=4)
    a = c.add_sequence()
    c.append(a, tokens(rng, 1, 10, 8), tokens(rng, 1, 10, 8))
    b = c.fork(a)
    assert c.free_pages == 0 and c.pages_needed(b, 1) == 1
    with pytest.raises(ValueError, match="page pool is exhausted"):
        c.append(b, tokens(rng, 1, 1, 8), tokens(rng, 1, 1, 8))
    assert c.length(b) == 10 and c.page_table(b) == c.page_table(a)
    c.truncate(b, 7)  # b's last page is shared: writing into it copies it
    c.free(a)
    kb, vb = tokens(rng, 1, 1, 8), tokens(rng, 1, 1, 8)
    c.append(b, kb, vb)
    q = rng.standard_normal((1, 1, 1, 8), dtype=np.float32)
    # b's 8th token is its own: attention with only that key visible returns its value.
    out = attn.paged_attention(q, c, [b], window=(0, 0))
    np.testing.assert_array_equal(out[0, 0, 0], vb[0, 0])


def test_threads_keyword_and_a_non_iterable_seqs():
    # threads= as on every other attention call (it was missing here: a review found it); the
    # result does not depend on it. seqs must be an iterable, named in the TypeError.
    rng = np.random.default_rng(1)
    c = attn.PagedKVCache(2, 16, 64, page_size=8)
    s = c.add_sequence()
    c.append(s, tokens(rng, 2, 300, 16), tokens(rng, 2, 300, 16))
    q = rng.standard_normal((1, 4, 3, 16), dtype=np.float32)
    np.testing.assert_array_equal(attn.paged_attention(q, c, [s], threads=1), attn.paged_attention(q, c, [s], threads=2))
    with pytest.raises(TypeError, match="seqs: expected an iterable of sequence ids"):
        attn.paged_attention(q, c, s)


def test_seqs_as_a_torch_tensor():
    """A scheduler's ids in a torch tensor: iterated, its elements were 0-d tensors, which the
    ids' int rule refuses ("seqs: expected an int but got Tensor tensor(0)") though a NumPy array
    of them was read. An array-like is read through NumPy, as every array argument is."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(2)
    c = attn.PagedKVCache(2, 16, 64, page_size=8)
    s = [c.add_sequence() for _ in range(3)]
    for seq, n in zip(s, (30, 9, 17)):
        c.append(seq, tokens(rng, 2, n, 16), tokens(rng, 2, n, 16))
    q = rng.standard_normal((3, 4, 1, 16), dtype=np.float32)
    order = [s[2], s[0], s[1]]
    want = attn.paged_attention(q, c, order)
    for ids in (torch.tensor(order), torch.tensor(order, dtype=torch.int32), np.array(order)):
        np.testing.assert_array_equal(attn.paged_attention(q, c, ids), want)
    with pytest.raises(ValueError, match=r"seqs: expected one sequence id per batch row, shape \(B,\), but got shape \(1, 3\)"):
        attn.paged_attention(q, c, torch.tensor([order]))
    with pytest.raises(TypeError, match="seqs: expected an int but got float32"):
        attn.paged_attention(q, c, torch.tensor(order, dtype=torch.float32))


@pytest.mark.parametrize("lq,mask_kind", [(1, "bool"), (3, "float"), (40, "bool"), (2, "float16")])
def test_decode_and_paged_attention_take_attn_mask(lq, mask_kind):
    """attn_mask on the serving calls: column j is cache position j of each sequence, as in
    decode_attention's C++ options; checked against the float64 textbook on each sequence's
    visible keys. Lq = 40 runs flash (more than two panels of rows), 1–3 the decode kernel."""
    from reference import causal_keep, close, textbook

    rng = np.random.default_rng(400 + lq)
    hkv, hq, d, lengths = 2, 4, 16, [45, 61]
    n = max(lengths)
    contiguous = attn.KVCache(len(lengths), hkv, d, n)
    paged = attn.PagedKVCache(hkv, d, 64, page_size=8)
    ks, vs, seqs = [], [], []
    for b, length in enumerate(lengths):
        k, v = tokens(rng, hkv, length, d), tokens(rng, hkv, length, d)
        contiguous.append(k, v, batch_index=b)
        seqs.append(paged.add_sequence())
        paged.append(seqs[-1], k, v)
        ks.append(k)
        vs.append(v)
    q = rng.standard_normal((2, hq, lq, d), dtype=np.float32)
    if mask_kind == "bool":
        mask = rng.random((2, 1, lq, n)) < 0.7
        mask[0, 0, 0, :] = False  # a row with no visible key: output 0, lse -inf
        bias, keep = None, mask
    else:
        mask = rng.standard_normal((1, hq, lq, n)).astype(np.float16 if mask_kind == "float16" else np.float32)
        bias, keep = mask.astype(np.float64), None
    out, lse = attn.decode_attention(q, contiguous, attn_mask=mask, return_lse=True)
    paged_out, paged_lse = attn.paged_attention(q, paged, seqs, attn_mask=mask, return_lse=True)
    for b, length in enumerate(lengths):
        visible = causal_keep(lq, length, True)
        if keep is not None:
            visible = visible & keep[b, :, :, :length]
        sb = None if bias is None else np.broadcast_to(bias, (2, hq, lq, n))[b:b + 1, :, :, :length].copy()
        want, want_lse, _ = textbook(q[b:b + 1], ks[b][None], vs[b][None], visible, bias=sb)
        for o, l in ((out, lse), (paged_out, paged_lse)):
            close(o[b:b + 1], want)
            close(l[b:b + 1], want_lse)
    # The mask's last dim is the longest sequence; anything else names attn_mask.
    with pytest.raises(ValueError, match="attn_mask"):
        attn.decode_attention(q, contiguous, attn_mask=np.ones((lq, n + 1), bool))
    with pytest.raises(ValueError, match="attn_mask"):
        attn.paged_attention(q, paged, seqs, attn_mask=np.ones((lq, n - 1), bool))
    with pytest.raises(TypeError, match="attn_mask"):
        attn.decode_attention(q, contiguous, attn_mask=np.ones((lq, n), np.int32))


def test_cache_dtype_as_numpy_or_torch_dtype():
    """dtype= of both caches takes what MultiheadAttention's does: a str, a NumPy dtype or type, or
    a torch dtype (only a str was accepted: dtype=torch.bfloat16 said "expected a str")."""
    import torch
    for given, name in (("float16", "float16"), (np.float16, "float16"), (np.dtype("float32"), "float32"),
                        (torch.bfloat16, "bfloat16"), (torch.float16, "float16")):
        assert attn.KVCache(1, 1, 4, 4, dtype=given).dtype == name
        assert attn.PagedKVCache(1, 4, 4, dtype=given).dtype == name


def test_impl_keyword_picks_the_kernel_as_in_cpp():
    # C++'s SdpaOptions::impl had no Python keyword on decode_attention / paged_attention (a
    # parity audit): flash for any Lq, decode blocks of 16, the reference on a contiguous cache.
    rng = np.random.default_rng(3)
    k = rng.standard_normal((2, 30, 8)).astype(np.float32)
    v = rng.standard_normal((2, 30, 8)).astype(np.float32)
    q = rng.standard_normal((1, 4, 20, 8)).astype(np.float32)
    ref = attn.scaled_dot_product_attention(q.astype(np.float64), k[None].astype(np.float64), v[None].astype(np.float64),
                                            is_causal=True, causal_alignment="bottom-right", impl="reference")
    pool = attn.PagedKVCache(2, 8, 16, page_size=4)
    s = pool.add_sequence()
    pool.append(s, k, v)
    for impl in ("auto", "flash", "decode"):
        assert np.abs(attn.paged_attention(q, pool, [s], impl=impl) - ref).max() < 1e-5, impl
    with pytest.raises(ValueError, match="paged_attention: impl: only the decode and flash kernels read pages"):
        attn.paged_attention(q, pool, [s], impl="reference")
    cache = attn.KVCache(1, 2, 8, 32)
    cache.append(k[None], v[None])
    few = q[:, :, :4]
    want = attn.decode_attention(few, cache, impl="reference")
    for impl in ("auto", "decode", "flash"):
        assert np.abs(attn.decode_attention(few, cache, impl=impl) - want).max() < 1e-5, impl
    with pytest.raises(ValueError, match="decode_attention: impl: the decode kernel cannot run this call: Lq = 20 > 16"):
        attn.decode_attention(q, cache, impl="decode")
    with pytest.raises(ValueError, match="impl"):
        attn.decode_attention(few, cache, impl="fastest")
