# window=(left, right), window_alignment and query_offset in Python (forward, backward,
# decode) against float64 torch textbook attention masked by reference.visible — the
# alignment rule written from its definition, not from attn's code.
import numpy as np
import pytest
import torch

import attn
from reference import close, close_grads, textbook, visible

ALIGNMENTS = ("top-left", "bottom-right")


def random_side(rng, lk):
    """One window side: unbounded (None or −1) or a bound from 0 to past Lk."""
    r = rng.random()
    if r < 0.15:
        return None
    if r < 0.3:
        return -1
    return int(rng.integers(0, lk + 3))


def random_case(seed):
    """A random problem with every masking keyword drawn independently; kwargs for attn.sdpa
    and the keep mask that the definition gives."""
    rng = np.random.default_rng(1000 + seed)
    b, hkv = int(rng.integers(1, 4)), int(rng.integers(1, 3))
    hq = hkv * int(rng.choice([1, 2]))
    lq = int(rng.choice([int(rng.integers(1, 17)), int(rng.integers(17, 70))]))  # decode and prefill sizes
    lk = int(rng.integers(1, 80))
    d, dv = int(rng.choice([8, 16, 32])), int(rng.choice([8, 16]))
    q = rng.standard_normal((b, hq, lq, d), dtype=np.float32)
    k = rng.standard_normal((b, hkv, lk, d), dtype=np.float32)
    v = rng.standard_normal((b, hkv, lk, dv), dtype=np.float32)
    kw = {}
    key_lengths = None
    if rng.random() < 0.5:
        key_lengths = rng.integers(0, lk + 1, size=b).astype(rng.choice([np.int32, np.int64]))
        kw["key_lengths"] = key_lengths
    causal = [None, "top-left", "bottom-right"][int(rng.integers(0, 3))]
    if causal:
        kw.update(is_causal=True, causal_alignment=causal)
    window = None
    if rng.random() < 0.8:
        window = (random_side(rng, lk), random_side(rng, lk))
        kw.update(window=window, window_alignment=ALIGNMENTS[int(rng.integers(0, 2))])
    offset = None
    r = rng.random()
    if r < 0.3:
        offset = int(rng.integers(-lq - 3, lk + 3))
        kw["query_offset"] = offset
    elif r < 0.6:
        offset = rng.integers(-lq - 3, lk + 3, size=b).astype(rng.choice([np.int32, np.int64]))
        kw["query_offset"] = offset
    keep = visible(b, lq, lk, key_lengths, causal, window, kw.get("window_alignment", "top-left"), offset)
    return q, k, v, kw, keep


def check_empty_rows(o, lse, keep):
    """Rows with no visible key: exactly 0 and lse −inf (never NaN)."""
    empty = ~keep.any(-1)
    empty = np.broadcast_to(empty, lse.shape)
    assert np.all(o[empty] == 0)
    assert np.all(lse[empty] == -np.inf)
    assert not np.isnan(o).any() and not np.isnan(lse).any()


@pytest.mark.parametrize("impl", ["auto", "reference"])
@pytest.mark.parametrize("seed", range(40))
def test_window_and_query_offset_vs_torch(seed, impl):
    q, k, v, kw, keep = random_case(seed)
    ref_o, ref_lse, ref_w = textbook(q, k, v, keep)
    o, lse = attn.sdpa(q, k, v, return_lse=True, impl=impl, **kw)
    close(o, ref_o)
    close(lse, ref_lse)
    check_empty_rows(o, lse, keep)
    # With weights (another kernel path for auto: decode never forms them).
    o2, w = attn.sdpa(q, k, v, return_weights=True, impl=impl, **kw)
    close(o2, ref_o)
    close(w, ref_w)


def test_cases_cover_empty_rows_and_both_offset_kinds():
    # The random cases above must reach what they claim to test.
    empty = per_seq = scalar = 0
    for seed in range(40):
        _, _, _, kw, keep = random_case(seed)
        empty += int((~keep.any(-1)).any())
        per_seq += isinstance(kw.get("query_offset"), np.ndarray)
        scalar += isinstance(kw.get("query_offset"), int)
    assert empty >= 5 and per_seq >= 5 and scalar >= 5, (empty, per_seq, scalar)


def test_window_sides_by_hand():
    # Lq = Lk = 6, top-left, window (1, 2): query i sees keys i−1 .. i+2 — a band drawn by hand.
    rng = np.random.default_rng(7)
    q, k, v = (rng.standard_normal((1, 1, 6, 8), dtype=np.float32) for _ in range(3))
    band = np.array([[1, 1, 1, 0, 0, 0],
                     [1, 1, 1, 1, 0, 0],
                     [0, 1, 1, 1, 1, 0],
                     [0, 0, 1, 1, 1, 1],
                     [0, 0, 0, 1, 1, 1],
                     [0, 0, 0, 0, 1, 1]], bool)
    _, w = attn.sdpa(q, k, v, window=(1, 2), return_weights=True)
    assert np.array_equal(w[0, 0] > 0, band)
    # None and −1 both mean unbounded; (None, None) is no window at all.
    close(attn.sdpa(q, k, v, window=(None, 0)), textbook(q, k, v, np.tril(np.ones((6, 6), bool)))[0])
    close(attn.sdpa(q, k, v, window=(-1, -1)), textbook(q, k, v)[0])


def test_query_offset_replaces_both_alignments():
    # One offset for every sequence equals bottom-right when it is Lk − Lq, for causal and window.
    rng = np.random.default_rng(8)
    q = rng.standard_normal((2, 2, 5, 16), dtype=np.float32)
    k, v = (rng.standard_normal((2, 2, 12, 16), dtype=np.float32) for _ in range(2))
    br = attn.sdpa(q, k, v, is_causal=True, causal_alignment="bottom-right", window=(3, 0),
                   window_alignment="bottom-right")
    for alignment in ALIGNMENTS:
        off = attn.sdpa(q, k, v, is_causal=True, causal_alignment=alignment, window=(3, 0),
                        window_alignment=alignment, query_offset=7)
        assert np.array_equal(off, br)
    # numpy integer scalars are ints; a (B,) array is one offset per sequence.
    assert np.array_equal(attn.sdpa(q, k, v, is_causal=True, query_offset=np.int64(7)),
                          attn.sdpa(q, k, v, is_causal=True, query_offset=np.array([7, 7], np.int32)))


@pytest.mark.parametrize("seed", range(8))
def test_backward_window_and_query_offset_vs_autograd(seed):
    q, k, v, kw, keep = random_case(100 + seed)
    g = np.random.default_rng(seed).standard_normal((*q.shape[:3], v.shape[3])).astype(np.float32)
    tq, tk, tv = (torch.from_numpy(x).double().requires_grad_() for x in (q, k, v))
    group = q.shape[1] // k.shape[1]
    s = tq @ tk.repeat_interleave(group, 1).transpose(-1, -2) / np.sqrt(q.shape[-1])
    t_keep = torch.from_numpy(np.broadcast_to(keep, s.shape).copy())
    any_key = t_keep.any(-1, keepdim=True)
    # A row with no visible key contributes nothing (and no NaN to autograd).
    s = torch.where(any_key, s.masked_fill(~t_keep, float("-inf")), torch.zeros_like(s))
    w = torch.softmax(s, -1) * any_key
    (w @ tv.repeat_interleave(group, 1)).backward(torch.from_numpy(g).double())
    o, lse = attn.sdpa(q, k, v, return_lse=True, **kw)
    dq, dk, dv = attn.sdpa_backward(q, k, v, o, lse, g, **kw)
    close_grads((ours, ref.numpy()) for ours, ref in ((dq, tq.grad), (dk, tk.grad), (dv, tv.grad)))


@pytest.mark.parametrize("seed", range(12))
def test_decode_window_alignment_and_query_offset(seed):
    rng = np.random.default_rng(2000 + seed)
    b, hkv, hq, d = 3, 2, 4, 16
    lengths = rng.integers(1, 40, size=b)
    lq = int(rng.choice([1, 4, 16]))
    lengths = np.maximum(lengths, lq)  # causal needs Lq cached positions
    cache = attn.KVCache(b, hkv, d, 48)
    keys = rng.standard_normal((b, hkv, 48, d), dtype=np.float32)
    vals = rng.standard_normal((b, hkv, 48, d), dtype=np.float32)
    for i in range(b):
        cache.append(keys[i, :, :lengths[i]], vals[i, :, :lengths[i]], batch_index=i)
    n = int(lengths.max())
    q = rng.standard_normal((b, hq, lq, d), dtype=np.float32)
    kw = dict(window=(random_side(rng, n), random_side(rng, n)))
    causal = ALIGNMENTS[seed % 2]
    kw["causal_alignment"] = causal
    if seed % 3:
        kw["window_alignment"] = ALIGNMENTS[(seed // 2) % 2]
    offset = None
    if seed % 4 == 1:
        offset = rng.integers(-2, n, size=b)
        kw["query_offset"] = offset
    elif seed % 4 == 3:
        offset = int(rng.integers(-2, n))
        kw["query_offset"] = offset
    keep = visible(b, lq, n, lengths, causal, kw["window"], kw.get("window_alignment", "bottom-right"), offset)
    ref_o, ref_lse, _ = textbook(q, keys[:, :, :n], vals[:, :, :n], keep)
    o, lse = attn.decode_attention(q, cache, return_lse=True, **kw)
    close(o, ref_o)
    close(lse, ref_lse)
    check_empty_rows(o, lse, keep)


def test_decode_keeps_window_left_and_defaults_to_bottom_right():
    rng = np.random.default_rng(9)
    cache = attn.KVCache(2, 1, 8, 32)
    lengths = np.array([20, 9])
    keys = rng.standard_normal((2, 1, 20, 8), dtype=np.float32)
    for i, n in enumerate(lengths):
        cache.append(keys[i, :, :n], keys[i, :, :n], batch_index=i)
    q = rng.standard_normal((2, 2, 3, 8), dtype=np.float32)
    keep = visible(2, 3, 20, lengths, "bottom-right", (4, None), "bottom-right")
    ref = textbook(q, keys, keys, keep)[0]
    close(attn.decode_attention(q, cache, window_left=4), ref)
    close(attn.decode_attention(q, cache, window=(4, None)), ref)
    with pytest.raises(ValueError, match="window_left"):
        attn.decode_attention(q, cache, window_left=4, window=(4, 0))
    # More than 16 queries run too (as prefill), with the same rule.
    q17 = rng.standard_normal((2, 2, 17, 8), dtype=np.float32)
    keep = visible(2, 17, 20, lengths, None, (2, None), "bottom-right")
    close(attn.decode_attention(q17, cache, is_causal=False, window=(2, None)), textbook(q17, keys, keys, keep)[0])


@pytest.mark.parametrize("bad, exc, words", [
    (dict(window=(1,)), TypeError, ["window", "(left, right)", "(1,)"]),
    (dict(window=3), TypeError, ["window", "(left, right)", "3"]),
    (dict(window=(1.5, 0)), TypeError, ["window", "1.5"]),
    (dict(window=(-2, 0)), ValueError, ["window", "left=-2"]),
    (dict(window=(0, 0), window_alignment="centre"), ValueError, ["window_alignment", "centre"]),
    (dict(query_offset=1.5), TypeError, ["query_offset", "float"]),
    # A 0-d array or tensor is named as given: it was "but got int64 scalar", which np.int64(3) is,
    # and that is taken.
    (dict(query_offset=np.array(3)), TypeError, ["query_offset", "but got ndarray array(3)"]),
    (dict(query_offset=torch.tensor(3)), TypeError, ["query_offset", "but got Tensor tensor(3)"]),
    (dict(query_offset=np.array([1.0])), TypeError, ["query_offset", "dtype"]),
    (dict(query_offset=np.array([1, 2, 3])), ValueError, ["query_offset", "3"]),
    (dict(query_offset=np.zeros((1, 1), np.int64)), ValueError, ["query_offset", "(1, 1)"]),
    (dict(query_offset=2 ** 70), ValueError, ["query_offset", str(2 ** 70)]),
    (dict(query_offset=2 ** 61), ValueError, ["query_offset", "2^60"]),
])
def test_bad_window_and_offset(bad, exc, words):
    z = np.zeros((1, 2, 4, 8), np.float32)
    with pytest.raises(exc) as e:
        attn.sdpa(z, z, z, **bad)
    for w in words:
        assert w in str(e.value), f"{w!r} not in {e.value}"
