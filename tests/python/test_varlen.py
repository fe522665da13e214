# attn.sdpa_varlen (and its backward, and `attn sdpa --cu-seqlens-q/-k`) on packed
# (total_tokens, H, D) arrays: every sequence against float64 torch textbook attention on that
# sequence alone (reference.py), with the same keywords as scaled_dot_product_attention.
import os
import subprocess

import numpy as np
import pytest
import torch

import attn
from asan import UNDER_ASAN
from reference import causal_keep, close, close_grads, textbook
from tsan import UNDER_TSAN


def packed_case(seed, lens_q, lens_k, hq=4, hkv=2, d=16, dv=8):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((sum(lens_q), hq, d), dtype=np.float32)
    k = rng.standard_normal((sum(lens_k), hkv, d), dtype=np.float32)
    v = rng.standard_normal((sum(lens_k), hkv, dv), dtype=np.float32)
    cq = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
    ck = np.concatenate([[0], np.cumsum(lens_k)]).astype(np.int64)
    return q, k, v, cq, ck


def per_sequence(x, cu, b):
    """Sequence b of a packed (T, H, D) array as (1, H, L, D)."""
    return np.ascontiguousarray(x[cu[b]:cu[b + 1]].transpose(1, 0, 2))[None]


CASES = [([5, 1, 17, 40], [9, 30, 17, 40]), ([3, 0, 20], [3, 7, 25]), ([64, 65], [100, 65])]


@pytest.mark.parametrize("lens", CASES)
@pytest.mark.parametrize("alignment", ["top-left", "bottom-right", None])
def test_forward_matches_each_sequence(lens, alignment):
    lq, lk = lens
    q, k, v, cq, ck = packed_case(1, lq, lk)
    kw = {} if alignment is None else {"is_causal": True, "causal_alignment": alignment}
    out, lse = attn.sdpa_varlen(q, k, v, cq, ck, return_lse=True, **kw)
    assert out.shape == (q.shape[0], q.shape[1], v.shape[2]) and lse.shape == q.shape[:2]
    for b in range(len(lq)):
        if lq[b] == 0:
            continue
        keep = None if alignment is None else causal_keep(lq[b], lk[b], alignment == "bottom-right")
        want_o, want_l, _ = textbook(per_sequence(q, cq, b), per_sequence(k, ck, b), per_sequence(v, ck, b), keep)
        close(out[cq[b]:cq[b + 1]].transpose(1, 0, 2)[None], want_o)
        close(lse[cq[b]:cq[b + 1]].T[None], want_l)


def test_scale_window_and_per_sequence_offsets():
    lq, lk = [4, 12, 7], [20, 12, 9]
    q, k, v, cq, ck = packed_case(2, lq, lk)
    offsets = np.array([16, 0, -3], dtype=np.int64)
    out = attn.sdpa_varlen(q, k, v, cq, ck, is_causal=True, window=(3, None), query_offset=offsets, scale=0.3)
    for b in range(3):
        i = np.arange(lq[b])[:, None] + offsets[b]
        j = np.arange(lk[b])[None, :]
        keep = (j <= i) & (j >= i - 3)
        want, _, _ = textbook(per_sequence(q, cq, b), per_sequence(k, ck, b), per_sequence(v, ck, b), keep, scale=0.3)
        close(out[cq[b]:cq[b + 1]].transpose(1, 0, 2)[None], want)


@pytest.mark.parametrize("slopes", ["paper", "per-sequence"])
def test_score_modifiers_match_each_sequence(slopes):
    # softcap, alibi_slopes and sinks per sequence, forward and backward (dsinks summed over the
    # sequences), as sdpa and sdpa_backward give each sequence alone. The keywords were missing
    # from the Python varlen functions (the C++ API and the CLI had them).
    lq, lk = [5, 1, 17, 40], [9, 30, 17, 40]
    q, k, v, cq, ck = packed_case(7, lq, lk)
    rng = np.random.default_rng(8)
    g = rng.standard_normal((q.shape[0], q.shape[1], v.shape[2]), dtype=np.float32)
    sinks = rng.standard_normal(q.shape[1]).astype(np.float32)
    per_seq = rng.uniform(0.0, 0.5, size=(len(lq), q.shape[1])).astype(np.float32)
    alibi = True if slopes == "paper" else per_seq
    kw = dict(is_causal=True, causal_alignment="bottom-right", softcap=4.0, sinks=sinks)
    out, lse = attn.sdpa_varlen(q, k, v, cq, ck, return_lse=True, alibi_slopes=alibi, **kw)
    dq, dk, dv, ds = attn.sdpa_varlen_backward(q, k, v, cq, ck, out, lse, g, alibi_slopes=alibi, **kw)
    ds_sum = np.zeros(q.shape[1])
    for b in range(len(lq)):
        one = dict(alibi_slopes=attn.alibi_slopes(q.shape[1]) if slopes == "paper" else per_seq[b], impl="reference", **kw)
        qs, ks, vs = per_sequence(q, cq, b), per_sequence(k, ck, b), per_sequence(v, ck, b)
        o1, l1 = attn.sdpa(qs, ks, vs, return_lse=True, **one)
        close(per_sequence(out, cq, b), o1.astype(np.float64))
        close(lse[cq[b]:cq[b + 1]].T[None], l1.astype(np.float64))
        dq1, dk1, dv1, ds1 = attn.sdpa_backward(qs, ks, vs, o1, l1, per_sequence(g, cq, b), **one)
        close_grads([(per_sequence(dq, cq, b), dq1), (per_sequence(dk, ck, b), dk1), (per_sequence(dv, ck, b), dv1)])
        ds_sum += ds1
    close(ds, ds_sum)


def test_backward_matches_torch_autograd():
    lq, lk = [6, 0, 30], [10, 4, 30]
    q, k, v, cq, ck = packed_case(3, lq, lk)
    out, lse = attn.sdpa_varlen(q, k, v, cq, ck, is_causal=True, causal_alignment="bottom-right", return_lse=True)
    g = np.random.default_rng(4).standard_normal(out.shape).astype(np.float32)
    dq, dk, dv = attn.sdpa_varlen_backward(q, k, v, cq, ck, out, lse, g, is_causal=True,
                                           causal_alignment="bottom-right")
    for b in range(3):
        tq, tk, tv = (torch.tensor(per_sequence(x, cu, b), dtype=torch.float64, requires_grad=True)
                      for x, cu in ((q, cq), (k, ck), (v, ck)))
        keep = torch.from_numpy(causal_keep(lq[b], lk[b], True))
        kk, vv = (t.repeat_interleave(2, dim=1) for t in (tk, tv))
        s = (tq @ kk.transpose(-1, -2) / np.sqrt(q.shape[-1])).masked_fill(~keep, float("-inf"))
        o = torch.nan_to_num(torch.softmax(s, -1)) @ vv
        o.backward(torch.tensor(per_sequence(g, cq, b), dtype=torch.float64))
        close_grads((got[cu[b]:cu[b + 1]].transpose(1, 0, 2)[None],
                     t.grad.numpy() if t.grad is not None else np.zeros(t.shape))
                    for got, t, cu in ((dq, tq, cq), (dk, tk, ck), (dv, tv, ck)))


def test_backward_reads_broadcast_out_and_lse():
    """out and lse are the backward's inputs: broadcast views give the results of contiguous copies
    (they were refused as outputs: "out: dimension 0 has stride 0")."""
    q, k, v, cq, ck = packed_case(8, [3, 5], [4, 6])
    rng = np.random.default_rng(5)
    out = np.broadcast_to(rng.standard_normal((1, q.shape[1], v.shape[2]), dtype=np.float32), q.shape[:2] + v.shape[2:])
    lse = np.broadcast_to(np.float32(0.25), q.shape[:2])
    g = rng.standard_normal(out.shape).astype(np.float32)
    got = attn.sdpa_varlen_backward(q, k, v, cq, ck, out, lse, g, is_causal=True)
    want = attn.sdpa_varlen_backward(q, k, v, cq, ck, np.ascontiguousarray(out), np.ascontiguousarray(lse), g,
                                     is_causal=True)
    for a, b in zip(got, want):
        assert np.array_equal(a, b)


@pytest.mark.parametrize("cq,msg", [([0, 5, 3], "non-decreasing"), ([1, 3, 8], "entry 0 must be 0"),
                                    ([0, 3, 7], "last entry must equal q's token count 8"),
                                    ([0, 3, 5, 8], "has 3 sequences|cu_seqlens_k: has 3 entries")])
def test_bad_cu_seqlens_is_a_value_error(cq, msg):
    q, k, v, _, ck = packed_case(5, [3, 5], [4, 6])
    with pytest.raises(ValueError, match=msg):
        attn.sdpa_varlen(q, k, v, np.array(cq, dtype=np.int32), ck)


def test_masks_and_key_lengths_are_refused():
    q, k, v, cq, ck = packed_case(6, [3, 5], [4, 6])
    with pytest.raises(ValueError, match="key_lengths: not accepted for packed sequences"):
        attn.sdpa_varlen(q, k, v, cq, ck, key_lengths=np.array([4, 6]))
    with pytest.raises(ValueError, match="attn_mask: not supported for packed sequences"):
        attn.sdpa_varlen(q, k, v, cq, ck, attn_mask=np.ones((8, 10), dtype=bool))


def test_query_offset_errors_count_the_sequences_n():
    # The packed call's offsets are one per sequence, (N,): its messages said (B,), a batch it has not.
    q, k, v, cq, ck = packed_case(8, [3, 5], [4, 6])
    with pytest.raises(ValueError, match=r"^sdpa_varlen: query_offset: expected shape \(N,\) = \(2,\) but got \(3,\)$"):
        attn.sdpa_varlen(q, k, v, cq, ck, is_causal=True, query_offset=np.zeros(3, np.int64))
    with pytest.raises(ValueError, match=r"^query_offset: expected an int or shape \(N,\)"):
        attn.sdpa_varlen(q, k, v, cq, ck, is_causal=True, query_offset=np.zeros((2, 1), np.int64))
    with pytest.raises(TypeError, match=r"^query_offset: expected an int or a \(N,\) int32/int64 array but got"):
        attn.sdpa_varlen(q, k, v, cq, ck, is_causal=True, query_offset=np.float32(1))


def test_alibi_slopes_errors_count_the_sequences_n(tmp_path):
    # Per-sequence slopes of the packed calls are (N, Hq): a slopes array of the wrong rank was
    # "expected (Hq,) or (B, Hq)", a batch the call has not. The CLI's packed path says (N, Hq) too.
    q, k, v, cq, ck = packed_case(8, [3, 5], [4, 6])
    h = q.shape[1]
    bad = np.full((1, 2, h), 0.5, np.float32)
    want = rf"^alibi_slopes: expected \(Hq,\) or \(N, Hq\) \(rank 1 to 2\) but got shape \(1, 2, {h}\)$"
    with pytest.raises(ValueError, match=want):
        attn.sdpa_varlen(q, k, v, cq, ck, alibi_slopes=bad)
    with pytest.raises(ValueError, match=want.replace(rf"\(1, 2, {h}\)", r"\(\)")):
        attn.sdpa_varlen(q, k, v, cq, ck, alibi_slopes=np.float32(0.5))
    out, lse = attn.sdpa_varlen(q, k, v, cq, ck, return_lse=True)
    with pytest.raises(ValueError, match=want):
        attn.sdpa_varlen_backward(q, k, v, cq, ck, out, lse, out, alibi_slopes=bad)
    # A (B, Hq) batch is still the padded calls' word.
    q4 = np.zeros((2, h, 3, 16), np.float32)
    with pytest.raises(ValueError, match=r"^alibi_slopes: expected \(Hq,\) or \(B, Hq\) \(rank 1 to 2\)"):
        attn.sdpa(q4, q4, q4, alibi_slopes=bad)
    if not os.environ.get("ATTN_BIN"):
        return
    for name, arr in (("q", q), ("k", k), ("v", v), ("cq", cq), ("ck", ck), ("a", bad)):
        np.save(tmp_path / f"{name}.npy", arr)
    res = subprocess.run([os.environ["ATTN_BIN"], "sdpa", "--q", "q.npy", "--k", "k.npy", "--v", "v.npy",
                          "--cu-seqlens-q", "cq.npy", "--cu-seqlens-k", "ck.npy", "--out", "o.npy", "--alibi-slopes",
                          "a.npy"], capture_output=True, text=True, cwd=tmp_path)
    assert (res.returncode, res.stderr) == (2, f"attn: error: sdpa_varlen: --alibi-slopes: packed sequences take (Hq,) = "
                                               f"({h},) or (N, Hq) = (2, {h}) slopes (one row per sequence) but got (1, 2, {h})\n")


@pytest.mark.skipif(not os.environ.get("ATTN_BIN"), reason="the attn CLI is not built")
def test_cli_packed_inputs_are_named_by_their_options(tmp_path):
    # A rank-4 --q on the packed path said "sdpa_varlen: q: expected a rank-3 tensor": the user
    # gave --q (a review found it).
    q, k, v, cq, ck = packed_case(9, [3, 5], [4, 6])
    for name, arr in (("q", q[None]), ("k", k), ("v", v), ("cq", cq), ("ck", ck)):
        np.save(tmp_path / f"{name}.npy", arr)
    res = subprocess.run([os.environ["ATTN_BIN"], "sdpa", "--q", "q.npy", "--k", "k.npy", "--v", "v.npy",
                          "--cu-seqlens-q", "cq.npy", "--cu-seqlens-k", "ck.npy", "--out", "o.npy"],
                         capture_output=True, text=True, cwd=tmp_path)
    assert res.returncode == 2
    assert res.stderr.startswith("attn: error: sdpa_varlen: --q: expected a rank-3 tensor (Tq, Hq, Dk) but got shape (1, 8, 4, 16)"), res.stderr
    assert not os.path.exists(tmp_path / "o.npy")


@pytest.mark.skipif(not os.environ.get("ATTN_BIN"), reason="the attn CLI is not built")
def test_cli_cu_seqlens(tmp_path):
    lq, lk = [5, 1, 17], [9, 30, 17]
    q, k, v, cq, ck = packed_case(7, lq, lk)
    files = {}
    for name, arr in (("q", q), ("k", k), ("v", v), ("cq", cq), ("ck", ck)):
        files[name] = str(tmp_path / f"{name}.npy")
        np.save(files[name], arr)
    o, l = str(tmp_path / "o.npy"), str(tmp_path / "l.npy")
    res = subprocess.run([os.environ["ATTN_BIN"], "sdpa", "--q", files["q"], "--k", files["k"], "--v", files["v"],
                          "--cu-seqlens-q", files["cq"], "--cu-seqlens-k", files["ck"], "--causal", "bottom-right",
                          "--out", o, "--lse", l], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    want_o, want_l = attn.sdpa_varlen(q, k, v, cq, ck, is_causal=True, causal_alignment="bottom-right",
                                      return_lse=True)
    np.testing.assert_array_equal(np.load(o), want_o)
    np.testing.assert_array_equal(np.load(l), want_l)
    bad = str(tmp_path / "bad.npy")
    np.save(bad, np.array([0, 4, 2, 23], dtype=np.int32))
    res = subprocess.run([os.environ["ATTN_BIN"], "sdpa", "--q", files["q"], "--k", files["k"], "--v", files["v"],
                          "--cu-seqlens-q", bad, "--cu-seqlens-k", files["ck"], "--out", str(tmp_path / "o2.npy")],
                         capture_output=True, text=True)
    assert res.returncode == 2
    assert "sdpa_varlen: --cu-seqlens-q: must be non-decreasing" in res.stderr
    assert not os.path.exists(tmp_path / "o2.npy")


@pytest.mark.skipif(not os.environ.get("ATTN_BIN"), reason="the attn CLI is not built")
def test_cli_cu_seqlens_backward(tmp_path):
    lq, lk = [4, 20], [9, 20]
    q, k, v, cq, ck = packed_case(8, lq, lk)
    g = np.random.default_rng(9).standard_normal((q.shape[0], q.shape[1], v.shape[2])).astype(np.float32)
    files = {}
    for name, arr in (("q", q), ("k", k), ("v", v), ("cq", cq), ("ck", ck), ("g", g)):
        files[name] = str(tmp_path / f"{name}.npy")
        np.save(files[name], arr)
    outs = {n: str(tmp_path / f"{n}.npy") for n in ("o", "dq", "dk", "dv")}
    res = subprocess.run([os.environ["ATTN_BIN"], "sdpa", "--q", files["q"], "--k", files["k"], "--v", files["v"],
                          "--cu-seqlens-q", files["cq"], "--cu-seqlens-k", files["ck"], "--causal", "top-left",
                          "--out", outs["o"], "--grad-out", files["g"], "--dq", outs["dq"], "--dk", outs["dk"],
                          "--dv", outs["dv"]], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    out, lse = attn.sdpa_varlen(q, k, v, cq, ck, is_causal=True, return_lse=True)
    want = attn.sdpa_varlen_backward(q, k, v, cq, ck, out, lse, g, is_causal=True)
    for name, w in zip(("dq", "dk", "dv"), want):
        np.testing.assert_array_equal(np.load(outs[name]), w)


def test_kept_scratch_is_released_on_request():
    # Long sequences are copied head-major into a buffer that sdpa_varlen keeps between calls.
    q, k, v, cq, ck = packed_case(5, [300, 260], [300, 260])
    attn.release_varlen_scratch()
    assert attn.varlen_scratch_bytes() == 0
    first = attn.sdpa_varlen(q, k, v, cq, ck, is_causal=True)
    assert attn.varlen_scratch_bytes() >= 2 * 560 * (16 + 8) * 4
    attn.release_varlen_scratch()
    assert attn.varlen_scratch_bytes() == 0
    again = attn.sdpa_varlen(q, k, v, cq, ck, is_causal=True)
    assert np.array_equal(first, again)
    attn.release_varlen_scratch()


@pytest.mark.skipif(UNDER_ASAN or UNDER_TSAN, reason="ASan and TSan abort on a 256 TiB operator new instead of throwing (asan.py)")
def test_a_cu_seqlens_too_long_to_hold_is_a_memory_error_naming_it():
    # 2^45 empty sequences are a valid call; their offsets need 256 TiB, past any user address
    # space (so the allocation fails whatever the overcommit policy). It was an anonymous
    # "std::bad_alloc".
    q = np.zeros((0, 1, 4), np.float32)
    cu = np.broadcast_to(np.zeros(1, np.int64), (2**45,))
    with pytest.raises(MemoryError, match=r"out of memory: cannot allocate 281474976710656 bytes \(256\.0 TiB\) for cu_seqlens_q"):
        attn.sdpa_varlen(q, q, q, cu, cu)
