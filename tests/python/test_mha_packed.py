"""attn.MultiheadAttention.forward_packed (packed (T, E) rows + cu_seqlens) against torch 1.13's
nn.MultiheadAttention run on each sequence alone, in float64 on the same float32 weights.

attn computes in float32 (projections, flash or reference attention), so per case
max|attn - torch| <= 1e-5 * max|torch| (fp32 rounding of O(E)-term dot products; measured
worst is printed with -s). Covers self-attention (key/value omitted), cross-attention with
kdim/vdim and cu_seqlens_k different from cu_seqlens, causal in both alignments, int32 offsets,
an empty sequence, and the errors for bad cu_seqlens; and forward()'s causal_alignment, whose
meaning forward_packed applies per sequence.
"""
import numpy as np
import pytest
import torch

import attn
from reference import causal_keep

REL_TOL = 1e-5


def torch_layer(m, E, h, kdim=None, vdim=None):
    t = torch.nn.MultiheadAttention(E, h, kdim=kdim, vdim=vdim, batch_first=True, dtype=torch.float64)
    sd = {k: torch.from_numpy(np.asarray(v, dtype=np.float64)) for k, v in m.state_dict().items()}
    t.load_state_dict(sd)
    return t.eval()


def random_layer(rng, E, h, kdim=None, vdim=None):
    m = attn.MultiheadAttention(E, h, kdim=kdim, vdim=vdim, batch_first=True)
    sd = {k: (rng.standard_normal(v.shape) / np.sqrt(v.shape[-1])).astype(np.float32) for k, v in m.state_dict().items()}
    m.load_state_dict(sd)
    return m


def offsets(lengths, dtype=np.int64):
    return np.concatenate([[0], np.cumsum(lengths)]).astype(dtype)


def torch_rows(t, q, k, v, cq, ck, causal):
    out = []
    for b in range(len(cq) - 1):
        qb = torch.from_numpy(q[cq[b]:cq[b + 1]].astype(np.float64))[None]
        kb = torch.from_numpy(k[ck[b]:ck[b + 1]].astype(np.float64))[None]
        vb = torch.from_numpy(v[ck[b]:ck[b + 1]].astype(np.float64))[None]
        if qb.shape[1] == 0:
            continue
        mask = None
        if causal:  # True or "top-left": query i sees keys 0..i; "bottom-right": keys 0..i + Lk - Lq
            mask = ~torch.from_numpy(causal_keep(qb.shape[1], kb.shape[1], causal == "bottom-right"))
        with torch.no_grad():
            y, _ = t(qb, kb, vb, attn_mask=mask, need_weights=False)
        out.append(y[0].numpy())
    return np.concatenate(out) if out else np.zeros((0, q.shape[1]))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("offset_dtype", [np.int64, np.int32])
def test_self_attention_matches_torch_per_sequence(causal, offset_dtype):
    rng = np.random.default_rng(5)
    E, h = 32, 4
    m = random_layer(rng, E, h)
    lengths = [7, 1, 0, 30, 12]
    x = rng.standard_normal((sum(lengths), E)).astype(np.float32)
    cu = offsets(lengths, offset_dtype)
    got = m.forward_packed(x, cu, is_causal=causal)
    assert got.shape == (sum(lengths), E) and got.dtype == np.float32
    want = torch_rows(torch_layer(m, E, h), x, x, x, cu, cu, causal)
    err = np.abs(got - want).max() / np.abs(want).max()
    print(f"self causal={causal}: max rel diff {err:.3g}")
    assert err <= REL_TOL


def test_cross_attention_with_own_key_offsets():
    rng = np.random.default_rng(6)
    E, h, kdim, vdim = 24, 3, 10, 14
    m = random_layer(rng, E, h, kdim=kdim, vdim=vdim)
    lq, lk = [4, 9, 2], [11, 3, 6]
    q = rng.standard_normal((sum(lq), E)).astype(np.float32)
    k = rng.standard_normal((sum(lk), kdim)).astype(np.float32)
    v = rng.standard_normal((sum(lk), vdim)).astype(np.float32)
    got = m.forward_packed(q, offsets(lq), k, v, cu_seqlens_k=offsets(lk))
    want = torch_rows(torch_layer(m, E, h, kdim, vdim), q, k, v, offsets(lq), offsets(lk), False)
    err = np.abs(got - want).max() / np.abs(want).max()
    print(f"cross: max rel diff {err:.3g}")
    assert err <= REL_TOL


@pytest.mark.parametrize("alignment", ["top-left", "bottom-right"])
def test_causal_cross_attention_in_both_alignments(alignment):
    # Lq != Lk in every sequence: bottom-right aligns to each sequence's own lengths (Lq <= Lk: a
    # row with no key would be torch's NaN).
    rng = np.random.default_rng(8)
    E, h = 16, 2
    m = random_layer(rng, E, h)
    lq, lk = [3, 5, 1], [7, 9, 4]
    q = rng.standard_normal((sum(lq), E)).astype(np.float32)
    kv = rng.standard_normal((sum(lk), E)).astype(np.float32)
    got = m.forward_packed(q, offsets(lq), kv, kv, cu_seqlens_k=offsets(lk), is_causal=True, causal_alignment=alignment)
    want = torch_rows(torch_layer(m, E, h), q, kv, kv, offsets(lq), offsets(lk), alignment)
    assert np.abs(got - want).max() / np.abs(want).max() <= REL_TOL
    if alignment == "bottom-right":
        top = m.forward_packed(q, offsets(lq), kv, kv, cu_seqlens_k=offsets(lk), is_causal=True)
        assert not np.allclose(got, top)  # the alignment matters here


@pytest.mark.parametrize("alignment", ["top-left", "bottom-right"])
def test_forward_takes_the_causal_alignment(alignment):
    # attn.MultiheadAttention.forward: is_causal=True is torch's top-left; causal_alignment=
    # "bottom-right" aligns the mask to the end (query i sees keys 0..i + Lk - Lq: new tokens
    # after Lk - Lq earlier ones). Lq = 3 < Lk = 7, against torch with the explicit mask.
    rng = np.random.default_rng(9)
    E, h = 16, 2
    m = random_layer(rng, E, h)
    q = rng.standard_normal((2, 3, E)).astype(np.float32)
    kv = rng.standard_normal((2, 7, E)).astype(np.float32)
    got, w = m.forward(q, kv, kv, is_causal=True, causal_alignment=alignment)
    mask = ~torch.from_numpy(causal_keep(3, 7, alignment == "bottom-right"))
    with torch.no_grad():
        want, want_w = torch_layer(m, E, h)(*(torch.from_numpy(x.astype(np.float64)) for x in (q, kv, kv)), attn_mask=mask)
    assert np.abs(got - want.numpy()).max() / np.abs(want.numpy()).max() <= REL_TOL
    assert np.abs(w - want_w.numpy()).max() <= REL_TOL
    with pytest.raises(ValueError, match=r"causal_alignment: expected \"top-left\" or \"bottom-right\" but got \"bottom\""):
        m.forward(q, kv, kv, is_causal=True, causal_alignment="bottom")
    # With an appended key (no position) either alignment is refused, named as this call's keyword.
    biased = attn.MultiheadAttention(E, h, batch_first=True, add_bias_kv=True)
    with pytest.raises(ValueError, match=r"MultiHeadAttention: is_causal: not supported together with add_bias_kv .*"
                                         r"pass a causal attn_mask"):
        biased.forward(q, kv, kv, is_causal=True, causal_alignment=alignment)


def test_threads_do_not_change_the_result():
    rng = np.random.default_rng(7)
    m = random_layer(rng, 16, 2)
    lengths = [40, 3, 70]
    x = rng.standard_normal((sum(lengths), 16)).astype(np.float32)
    a = m.forward_packed(x, offsets(lengths), is_causal=True, threads=1)
    b = m.forward_packed(x, offsets(lengths), is_causal=True, threads=2)
    assert np.array_equal(a, b)


def test_bad_offsets_are_clear_errors():
    m = attn.MultiheadAttention(8, 2, batch_first=True)
    x = np.zeros((6, 8), np.float32)
    # The method's argument is cu_seqlens (the core's cu_seqlens_q), and names it so.
    with pytest.raises(ValueError, match=r"\bcu_seqlens: last entry must equal q's token count 6 but got 5"):
        m.forward_packed(x, np.array([0, 2, 5]))
    with pytest.raises(ValueError, match=r"cu_seqlens_k: last entry must equal k's token count 6 but got 5"):
        m.forward_packed(x, np.array([0, 2, 6]), cu_seqlens_k=np.array([0, 2, 5]))
    with pytest.raises(ValueError, match="non-decreasing"):
        m.forward_packed(x, np.array([0, 4, 2, 6]))
    with pytest.raises((ValueError, TypeError), match="query"):
        m.forward_packed(np.zeros((6, 7), np.float32), np.array([0, 6]))
    # cu_seqlens_q inside a sentence is renamed too (only "cu_seqlens_q: " was).
    with pytest.raises(ValueError, match=r"cu_seqlens_k: has 2 entries \(1 sequences\) but cu_seqlens has 3") as e:
        m.forward_packed(x, np.array([0, 1, 6]), x, cu_seqlens_k=np.array([0, 6]))
    assert "cu_seqlens_q" not in str(e.value)
    # An integer query or key is named before any conversion (was "to_dtype: can only convert …").
    for q, k in ((np.ones((6, 8), np.int32), None), (x, np.ones((6, 8), np.int32))):
        with pytest.raises((ValueError, TypeError), match=r"forward_packed: (query|key): dtype must be float32"):
            m.forward_packed(q, np.array([0, 6]), k)
