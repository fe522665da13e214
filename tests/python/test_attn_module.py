# The `attn` Python module against torch 1.13 (float64 textbook attention and autograd,
# nn.MultiheadAttention), on random cases, strided inputs and bad inputs.
# Run by ctest with PYTHONPATH = the build's python dir (tests/python/CMakeLists.txt).
import json
import os
import struct
import threading
import time

import numpy as np
import pytest
import torch

import attn
from reference import causal_keep, close, close_grads, textbook

RNG_SEEDS = range(24)


def make_case(seed):
    rng = np.random.default_rng(seed)
    b, hkv = int(rng.integers(1, 3)), int(rng.integers(1, 3))
    hq = hkv * int(rng.choice([1, 2]))
    lq, lk = int(rng.integers(1, 70)), int(rng.integers(1, 90))
    d, dv = int(rng.choice([8, 16, 32, 64])), int(rng.choice([8, 16, 64]))
    return dict(seed=seed, rng=rng, b=b, hq=hq, hkv=hkv, lq=lq, lk=lk, d=d, dv=dv,
                mask=["none", "bool", "float", "bool_bcast"][seed % 4],
                causal=[None, "top-left", "bottom-right"][seed % 3],
                scale=None if seed % 5 else 0.3, rank3=(seed % 7 == 3))


@pytest.mark.parametrize("seed", RNG_SEEDS)
def test_sdpa_random_vs_torch(seed):
    c = make_case(seed)
    rng = c["rng"]
    if c["rank3"]:
        c["b"] = 1
    q = rng.standard_normal((c["b"], c["hq"], c["lq"], c["d"]), dtype=np.float32)
    k = rng.standard_normal((c["b"], c["hkv"], c["lk"], c["d"]), dtype=np.float32)
    v = rng.standard_normal((c["b"], c["hkv"], c["lk"], c["dv"]), dtype=np.float32)
    keep = np.ones((c["b"], c["hq"], c["lq"], c["lk"]), bool)
    bias = None
    mask_arg = None
    if c["mask"] == "bool":
        mask_arg = rng.random((c["b"], c["hq"], c["lq"], c["lk"])) < 0.8
        keep &= mask_arg
    elif c["mask"] == "bool_bcast":
        mask_arg = rng.random((c["lq"], c["lk"])) < 0.7
        keep &= mask_arg
    elif c["mask"] == "float":
        mask_arg = (rng.standard_normal((1, c["hq"], c["lq"], c["lk"])) * 2).astype(np.float32)
        mask_arg[rng.random(mask_arg.shape) < 0.1] = -np.inf
        bias = mask_arg
    if c["causal"]:
        keep &= causal_keep(c["lq"], c["lk"], c["causal"] == "bottom-right")
    ref_o, ref_lse, ref_w = textbook(q, k, v, keep, bias, c["scale"])
    args = (q, k, v)
    if c["rank3"]:
        args = (q[0], k[0], v[0])
        if mask_arg is not None and mask_arg.ndim == 4:
            mask_arg = mask_arg[0]
        ref_o, ref_lse, ref_w = ref_o[0], ref_lse[0], ref_w[0]
    o, lse, w = attn.scaled_dot_product_attention(
        *args, attn_mask=mask_arg, is_causal=c["causal"] is not None, scale=c["scale"],
        causal_alignment=c["causal"] or "top-left", return_lse=True, return_weights=True)
    assert o.dtype == np.float32 and o.shape == ref_o.shape
    close(o, ref_o)
    close(w, ref_w)
    close(lse, ref_lse)
    # The plain call (no extra outputs, maybe another kernel) agrees too.
    close(attn.sdpa(*args, attn_mask=mask_arg, is_causal=c["causal"] is not None, scale=c["scale"],
                    causal_alignment=c["causal"] or "top-left"), ref_o)


def test_matches_torch_sdpa_convention_on_torch_defaults():
    # torch's default is_causal is top-left; a bool mask keeps True positions.
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((1, 2, 9, 8), dtype=np.float32) for _ in range(3))
    m = rng.random((9, 9)) < 0.5
    m[:, 0] = True
    ref = torch.softmax(torch.from_numpy(q).double() @ torch.from_numpy(k).double().transpose(-1, -2) / np.sqrt(8)
                        + torch.where(torch.from_numpy(m), 0.0, float("-inf")).double(), -1) @ torch.from_numpy(v).double()
    close(attn.sdpa(q, k, v, m), ref.numpy())


def test_float64_runs_on_reference_and_returns_float64():
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((2, 3, 11, 16)) for _ in range(3))
    o = attn.sdpa(q, k, v, is_causal=True)
    assert o.dtype == np.float64
    ref, _, _ = textbook(q, k, v, causal_keep(11, 11, False))
    assert np.abs(o - ref).max() < 1e-12


def test_key_lengths_and_empty_rows():
    rng = np.random.default_rng(2)
    q = rng.standard_normal((3, 2, 7, 8), dtype=np.float32)
    k = rng.standard_normal((3, 2, 10, 8), dtype=np.float32)
    v = rng.standard_normal((3, 2, 10, 8), dtype=np.float32)
    kl = np.array([10, 4, 0], dtype=np.int64)
    keep = np.arange(10)[None, None, None, :] < kl[:, None, None, None]
    keep = np.broadcast_to(keep, (3, 2, 7, 10))
    o, lse = attn.sdpa(q, k, v, key_lengths=kl, return_lse=True)
    ref_o, ref_lse, _ = textbook(q, k, v, keep)
    close(o, ref_o)
    assert np.all(o[2] == 0) and np.all(lse[2] == -np.inf)
    close(lse[:2], ref_lse[:2])


def test_strided_inputs_are_read_in_place():
    rng = np.random.default_rng(3)
    # (B, L, H, D) buffers seen as (B, H, L, D); a sliced head dim; a reversed key order.
    qb = rng.standard_normal((2, 13, 4, 32), dtype=np.float32)
    kb = rng.standard_normal((2, 4, 40, 48), dtype=np.float32)
    vb = rng.standard_normal((4, 2, 20, 16), dtype=np.float32)
    q = qb.transpose(0, 2, 1, 3)              # transposed view
    k = kb[:, :, ::2, 8:40]                   # step slice and offset slice: (2, 4, 20, 32)
    v = vb.transpose(1, 0, 2, 3)[:, :, ::-1]  # negative stride
    assert not q.flags.c_contiguous and not k.flags.c_contiguous
    before = attn._input_copies()
    o, w = attn.sdpa(q, k, v, is_causal=True, causal_alignment="bottom-right", return_weights=True)
    assert attn._input_copies() == before, "a strided view was copied"
    ref_o, _, ref_w = textbook(q, k, v, causal_keep(13, 20, True))
    close(o, ref_o)
    close(w, ref_w)
    # Broadcast (stride-0) key/value heads are fine as inputs as well.
    k1 = np.broadcast_to(rng.standard_normal((2, 1, 20, 32), dtype=np.float32), (2, 4, 20, 32))
    close(attn.sdpa(q, k1, v), textbook(q, k1, v)[0])
    assert attn._input_copies() == before


def test_unaligned_strides_are_copied_and_counted():
    rng = np.random.default_rng(4)
    rec = np.zeros((1, 2, 6, 8), dtype=[("x", "<f4"), ("pad", "u1")])  # 5-byte stride
    rec["x"] = rng.standard_normal((1, 2, 6, 8))
    q = rec["x"]
    assert q.strides[-1] == 5
    k = rng.standard_normal((1, 2, 6, 8), dtype=np.float32)
    before = attn._input_copies()
    o = attn.sdpa(q, k, k)
    assert attn._input_copies() == before + 1
    close(o, textbook(np.array(q), k, k)[0])


def test_outputs_own_their_memory_and_inputs_stay_untouched():
    rng = np.random.default_rng(6)
    q, k, v = (rng.standard_normal((1, 2, 5, 8), dtype=np.float32) for _ in range(3))
    saved = [x.copy() for x in (q, k, v)]
    o, lse, w = attn.sdpa(q, k, v, return_lse=True, return_weights=True)
    for a in (o, lse, w):
        assert a.flags.owndata and a.flags.c_contiguous
        assert not any(np.shares_memory(a, x) for x in (q, k, v))
    for x, s in zip((q, k, v), saved):
        assert np.array_equal(x, s)
    # Array-likes (lists) are converted like np.asarray.
    close(attn.sdpa(q.tolist(), k, v), textbook(q, k, v)[0])


def test_gil_is_released_during_compute():
    # A Python thread keeps counting while sdpa runs on another thread. With the GIL released it
    # ticks many times inside one call; with the GIL held, at most once or twice per call (at its
    # edges). Counted per call, and calls repeat until one saw 20 ticks, so a loaded machine (a
    # slow sleep, a fast call) makes the test longer, not wrong.
    rng = np.random.default_rng(7)
    q, k, v = (rng.standard_normal((1, 4, 512, 64), dtype=np.float32) for _ in range(3))
    calls = [0]  # odd while a call runs
    best = [0]   # the most ticks seen inside one call
    done = threading.Event()

    def worker():
        deadline = time.monotonic() + 60
        while best[0] < 20 and time.monotonic() < deadline:
            calls[0] += 1
            attn.sdpa(q, k, v, impl="reference")
            calls[0] += 1
        done.set()

    t = threading.Thread(target=worker)
    t.start()
    ticks_in, current = 0, -1
    while not done.is_set():
        c = calls[0]
        if c % 2 == 1:
            ticks_in = ticks_in + 1 if c == current else 1
            current = c
            best[0] = max(best[0], ticks_in)
        time.sleep(0.001)
    t.join()
    assert best[0] >= 20, f"the main thread ran at most {best[0]} times inside one sdpa call"


def test_dropout_is_seeded():
    rng = np.random.default_rng(8)
    q, k, v = (rng.standard_normal((1, 2, 16, 8), dtype=np.float32) for _ in range(3))
    a = attn.sdpa(q, k, v, dropout_p=0.5, dropout_seed=1)
    assert np.array_equal(a, attn.sdpa(q, k, v, dropout_p=0.5, dropout_seed=1))
    assert not np.array_equal(a, attn.sdpa(q, k, v, dropout_p=0.5, dropout_seed=2))
    # The returned (dropped, rescaled) weights reproduce the output.
    o, w = attn.sdpa(q, k, v, dropout_p=0.5, dropout_seed=1, return_weights=True)
    close(o, (w.astype(np.float64) @ v.astype(np.float64)))
    # No default seed: the same mask at every training step would be a silent bug. The backward,
    # sdpa_varlen (and its backward) and ring_attention take the same keyword, and refuse it by the
    # library's rule in its words, naming the call, with how Python passes a seed (the library's
    # words had lost the binding's hint, "(an int in [0, 2**64))").
    packed, cu = np.ascontiguousarray(q[0].transpose(1, 0, 2)), np.array([0, 16], np.int32)
    lse = np.zeros((16, 2), np.float32)
    for call, op, p in ((lambda: attn.sdpa(q, k, v, dropout_p=0.5), "sdpa", 0.5),
                        (lambda: attn.sdpa_backward(q, k, v, a, a[..., 0], a, dropout_p=0.1), "sdpa_backward", 0.1),
                        (lambda: attn.sdpa_varlen(packed, packed, packed, cu, cu, dropout_p=0.25), "sdpa_varlen", 0.25),
                        (lambda: attn.sdpa_varlen_backward(packed, packed, packed, cu, cu, packed, lse, packed,
                                                           dropout_p=0.75), "sdpa_varlen_backward", 0.75)):
        with pytest.raises(ValueError) as e:
            call()
        assert str(e.value) == (f"{op}: dropout_seed: dropout_p = {p} needs a seed (dropout_seed=N, an int in "
                                "[0, 2**64)): the keep mask is a function of it, so a training loop passes a new seed "
                                "each step and the backward the forward's (attn has no global generator)")
    assert np.array_equal(attn.sdpa(q, k, v), attn.sdpa(q, k, v, dropout_p=0.0, dropout_seed=5))


@pytest.mark.parametrize("bad, exc, words", [
    (dict(query=np.zeros((1, 2, 4, 8), np.int16)), TypeError, ["query", "int16"]),
    (dict(query=np.zeros((1, 2, 4, 8), np.int32)), TypeError, ["Q", "dtype", "int32"]),
    (dict(query=np.zeros((1, 1, 2, 4, 8), np.float32)), ValueError, ["query", "rank", "(1, 1, 2, 4, 8)"]),
    (dict(query=np.zeros((8,), np.float32)), ValueError, ["query", "rank", "(8,)"]),
    (dict(key=np.zeros((1, 2, 6, 4), np.float32)), ValueError, ["head dim", "4", "8"]),
    (dict(value=np.zeros((1, 2, 5, 8), np.float32)), ValueError, ["V", "5", "6"]),
    (dict(key=np.zeros((2, 6, 8), np.float32)), ValueError, ["rank"]),
    (dict(attn_mask=np.zeros((4, 6), np.int8)), TypeError, ["attn_mask", "int8"]),
    (dict(attn_mask=np.zeros((3, 6), bool)), ValueError, ["mask", "(3, 6)"]),
    (dict(causal_alignment="middle"), ValueError, ["causal_alignment", "middle"]),
    (dict(scale=float("nan")), ValueError, ["scale"]),
    # 0 in float32, where the kernels multiply by it (it was accepted: uniform weights).
    (dict(scale=-1e-50), ValueError, ["sdpa: scale: must be 0 or a normal float32", "but got -1e-50, "
                                      "which rounds to 0"]),
    # A float32 subnormal: the scale with fewer bits (it was accepted).
    (dict(scale=1e-40), ValueError, ["sdpa: scale: must be 0 or a normal float32 (|scale| >= 2^-126 ≈ 1.1754944e-38 "
                                     "there) but got 1e-40, a float32 subnormal"]),
    (dict(dropout_p=1.5), ValueError, ["dropout_p"]),
    (dict(key_lengths=np.array([1.0])), TypeError, ["key_lengths", "float64"]),
    (dict(key_lengths=np.array([3, 3])), ValueError, ["key_lengths"]),
    (dict(impl="gpu"), ValueError, ["gpu"]),
])
def test_bad_inputs_raise_clear_errors(bad, exc, words):
    args = dict(query=np.zeros((1, 2, 4, 8), np.float32), key=np.zeros((1, 2, 6, 8), np.float32),
                value=np.zeros((1, 2, 6, 8), np.float32))
    args.update(bad)
    with pytest.raises(exc) as e:
        attn.scaled_dot_product_attention(**args)
    for w in words:
        assert w in str(e.value), f"{w!r} not in {e.value}"


@pytest.mark.parametrize("seed", range(8))
def test_backward_vs_torch_autograd(seed):
    rng = np.random.default_rng(100 + seed)
    b, hkv = 2, 1 + seed % 2
    hq = hkv * (1 + seed % 3 % 2)
    lq, lk, d, dv = int(rng.integers(1, 50)), int(rng.integers(1, 60)), 16 * (1 + seed % 2), 16
    q = rng.standard_normal((b, hq, lq, d), dtype=np.float32)
    k = rng.standard_normal((b, hkv, lk, d), dtype=np.float32)
    v = rng.standard_normal((b, hkv, lk, dv), dtype=np.float32)
    g = rng.standard_normal((b, hq, lq, dv), dtype=np.float32)
    causal = seed % 2 == 1
    align = "bottom-right" if seed % 4 == 3 else "top-left"
    mask = (rng.random((lq, lk)) < 0.8) if seed % 3 == 0 else None
    keep = np.ones((lq, lk), bool)
    if causal:
        keep &= causal_keep(lq, lk, align == "bottom-right")
    if mask is not None:
        keep &= mask
    tq, tk, tv = (torch.from_numpy(x).double().requires_grad_() for x in (q, k, v))
    group = hq // hkv
    s = tq @ tk.repeat_interleave(group, 1).transpose(-1, -2) / np.sqrt(d)
    s = s.masked_fill(~torch.from_numpy(keep), float("-inf"))
    w = torch.nan_to_num(torch.softmax(s, -1), nan=0.0)
    (w @ tv.repeat_interleave(group, 1)).backward(torch.from_numpy(g).double())
    o, lse = attn.sdpa(q, k, v, mask, is_causal=causal, causal_alignment=align, return_lse=True)
    dq, dk, dv_ = attn.scaled_dot_product_attention_backward(q, k, v, o, lse, g, mask, is_causal=causal,
                                                             causal_alignment=align)
    assert dq.shape == q.shape and dk.shape == k.shape and dv_.shape == v.shape
    close_grads((ours, ref.numpy()) for ours, ref in ((dq, tq.grad), (dk, tk.grad), (dv_, tv.grad)))


def test_backward_rank3_and_strided():
    rng = np.random.default_rng(9)
    qb = rng.standard_normal((10, 2, 8), dtype=np.float32)
    q = qb.transpose(1, 0, 2)  # (H, L, D) from (L, H, D)
    k, v, g = (rng.standard_normal((2, 10, 8), dtype=np.float32) for _ in range(3))
    before = attn._input_copies()
    o, lse = attn.sdpa(q, k, v, is_causal=True, return_lse=True)
    dq, dk, dv = attn.sdpa_backward(q, k, v, o, lse, g, is_causal=True)
    assert attn._input_copies() == before
    tq, tk, tv = (torch.from_numpy(np.ascontiguousarray(x)).double().requires_grad_() for x in (q, k, v))
    s = (tq @ tk.transpose(-1, -2) / np.sqrt(8)).masked_fill(~torch.from_numpy(causal_keep(10, 10, False)),
                                                           float("-inf"))
    (torch.softmax(s, -1) @ tv).backward(torch.from_numpy(g).double())
    close_grads((ours, ref.numpy()) for ours, ref in ((dq, tq.grad), (dk, tk.grad), (dv, tv.grad)))


def test_backward_bad_inputs():
    z = np.zeros((1, 2, 4, 8), np.float32)
    with pytest.raises(ValueError, match="lse"):
        attn.sdpa_backward(z, z, z, z, np.zeros((1, 2, 5), np.float32), z)
    with pytest.raises(TypeError, match="dtype"):
        attn.sdpa_backward(z, z, z, z, np.zeros((1, 2, 4), np.float32), z.astype(np.int32))


@pytest.mark.parametrize("impl", ["flash", "reference"])
def test_backward_reads_broadcast_out_lse_and_grad_out(impl):
    """out, lse and grad_out are the backward's inputs: numpy broadcast views of them are read like
    any input, with the results of contiguous copies (they were refused as outputs: "out: dimension
    2 has stride 0 but size 8; an output cannot be a broadcast view")."""
    rng = np.random.default_rng(21)
    q = rng.standard_normal((1, 2, 8, 8), dtype=np.float32)
    out = np.broadcast_to(rng.standard_normal((1, 1, 1, 8), dtype=np.float32), (1, 2, 8, 8))
    lse = np.broadcast_to(np.float32(1.5), (1, 2, 8))
    g = np.broadcast_to(rng.standard_normal((1, 2, 1, 8), dtype=np.float32), (1, 2, 8, 8))
    got = attn.scaled_dot_product_attention_backward(q, q, q, out, lse, g, is_causal=True, impl=impl)
    want = attn.scaled_dot_product_attention_backward(q, q, q, *(np.ascontiguousarray(x) for x in (out, lse, g)),
                                                      is_causal=True, impl=impl)
    for a, b in zip(got, want):
        assert np.array_equal(a, b)


# ---- MultiheadAttention ----------------------------------------------------------------

def torch_mha(seed, e, h, kdim=None, vdim=None, bias=True, batch_first=False, add_bias_kv=False):
    torch.manual_seed(seed)
    t = torch.nn.MultiheadAttention(e, h, bias=bias, kdim=kdim, vdim=vdim, batch_first=batch_first,
                                    add_bias_kv=add_bias_kv).eval()
    with torch.no_grad():  # non-zero biases so that they are tested
        for name, p in t.named_parameters():
            if "bias" in name:
                p.normal_()
    ours = attn.MultiheadAttention(e, h, bias=bias, kdim=kdim, vdim=vdim, batch_first=batch_first,
                                   add_bias_kv=add_bias_kv)
    ours.load_state_dict({k: v.detach().numpy() for k, v in t.state_dict().items()})
    return t, ours


@pytest.mark.parametrize("seed", range(10))
def test_mha_random_vs_torch(seed):
    rng = np.random.default_rng(200 + seed)
    h = int(rng.choice([1, 2, 4]))
    e = h * int(rng.choice([4, 8, 16]))
    cross = seed % 3 == 1
    kdim, vdim = (e + 3, e + 5) if seed % 5 == 2 else (None, None)
    batch_first = seed % 2 == 0
    unbatched = seed % 7 == 6
    b, lq, lk = int(rng.integers(1, 4)), int(rng.integers(1, 20)), int(rng.integers(1, 20))
    if not (cross or kdim):
        lk = lq
    t, m = torch_mha(seed, e, h, kdim, vdim, batch_first=batch_first, add_bias_kv=seed == 4)

    def shaped(l, f):
        if unbatched:
            return rng.standard_normal((l, f), dtype=np.float32)
        return rng.standard_normal((b, l, f) if batch_first else (l, b, f), dtype=np.float32)

    q = shaped(lq, e)
    k = shaped(lk, kdim or e) if (cross or kdim) else q
    v = shaped(lk, vdim or e) if (cross or kdim) else q
    kpm = am = None
    if seed % 3 == 0 and not unbatched:
        kpm = rng.random((b, lk)) < 0.3
        kpm[:, 0] = False
    if seed % 4 == 1:
        am = (rng.standard_normal((lq, lk)) * 0.5).astype(np.float32)
    avg = seed % 2 == 1
    with torch.no_grad():
        to, tw = t(*(torch.from_numpy(x) for x in (q, k, v)),
                   key_padding_mask=None if kpm is None else torch.from_numpy(kpm),
                   attn_mask=None if am is None else torch.from_numpy(am), average_attn_weights=avg)
    o, w = m(q, k, v, key_padding_mask=kpm, attn_mask=am, average_attn_weights=avg)
    assert o.shape == tuple(to.shape) and w.shape == tuple(tw.shape)
    close(o, to.double().numpy(), atol=1e-5, rtol=1e-4)
    close(w, tw.double().numpy(), atol=1e-6, rtol=1e-4)
    o2, w2 = m.forward(q, k, v, key_padding_mask=kpm, attn_mask=am, need_weights=False)
    assert w2 is None
    close(o2, to.double().numpy(), atol=1e-5, rtol=1e-4)


def test_mha_state_dict_round_trip_and_properties():
    t, m = torch_mha(0, 16, 4, kdim=8, vdim=12)
    sd = m.state_dict()
    assert list(sd) == list(t.state_dict())
    for name, p in t.state_dict().items():
        assert np.array_equal(sd[name], p.numpy())
    sd["out_proj.weight"][:] = 0  # a copy: the layer is unchanged
    assert not np.array_equal(m.state_dict()["out_proj.weight"], sd["out_proj.weight"])
    assert (m.embed_dim, m.num_heads, m.head_dim, m.kdim, m.vdim, m.batch_first) == (16, 4, 4, 8, 12, False)



def test_a_bfloat16_layers_state_dict_loads_back_without_dtype():
    # state_dict() of a bfloat16 layer holds uint16 bits; loading it back needed dtype="bfloat16"
    # (a review found the round trip refused).
    m = attn.MultiheadAttention(16, 4, dtype="bfloat16")
    sd = m.state_dict()
    assert sd["in_proj_weight"].dtype == np.uint16
    sd["in_proj_weight"][:] = 0x3F80  # 1.0 in bfloat16
    m.load_state_dict(sd)
    assert np.array_equal(m.state_dict()["in_proj_weight"], sd["in_proj_weight"])
    with pytest.raises(TypeError, match="uint16"):  # a float32 layer still asks what uint16 means
        attn.MultiheadAttention(16, 4).load_state_dict(sd)

def write_safetensors_raw(path, entries):
    """entries: name -> (the format's dtype string, shape, the tensor's bytes)."""
    header, blobs, off = {}, [], 0
    for name, (dtype, shape, raw) in entries.items():
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    path.write_bytes(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def write_safetensors(path, tensors):
    write_safetensors_raw(path, {name: ("F32", a.shape, np.ascontiguousarray(a, dtype="<f4").tobytes())
                                 for name, a in tensors.items()})


def test_mha_load_safetensors(tmp_path):
    t, _ = torch_mha(3, 8, 2)
    f = tmp_path / "w.safetensors"
    write_safetensors(f, {k: v.numpy() for k, v in t.state_dict().items()})
    m = attn.MultiheadAttention(8, 2)
    m.load_safetensors(str(f))
    x = np.random.default_rng(0).standard_normal((5, 2, 8), dtype=np.float32)
    with torch.no_grad():
        to, _ = t(*(torch.from_numpy(x),) * 3)
    close(m(x, x, x)[0], to.double().numpy(), atol=1e-5, rtol=1e-4)
    with pytest.raises(ValueError, match="missing.safetensors"):
        m.load_safetensors(str(tmp_path / "missing.safetensors"))


def test_mha_load_safetensors_prefix_selects_a_layer_of_a_model(tmp_path):
    """A whole model's file (a layer's names behind "layers.1.self_attn.") was refused with "the
    prefix 'layers.1.self_attn.' to remove" and no way to remove it short of another safetensors
    reader; prefix= selects the layer as `attn mha --params FILE:PREFIX` does, reading only its
    tensors (another layer's U8 tensor is no error), and a missing prefix is named."""
    torch.manual_seed(7)
    model = torch.nn.TransformerEncoder(torch.nn.TransformerEncoderLayer(8, 2, dim_feedforward=16), 2).eval()
    entries = {k: ("F32", v.shape, v.numpy().astype("<f4").tobytes()) for k, v in model.state_dict().items()}
    entries["layers.0.quant.qweight"] = ("U8", [4], bytes(4))  # a dtype attn has no type for
    f = tmp_path / "model.safetensors"
    write_safetensors_raw(f, entries)
    m = attn.MultiheadAttention(8, 2)
    m.load_safetensors(f, prefix="layers.1.self_attn.")
    x = np.random.default_rng(1).standard_normal((5, 2, 8), dtype=np.float32)
    with torch.no_grad():
        want, _ = model.layers[1].self_attn(*(torch.from_numpy(x),) * 3)
    close(m(x, x, x)[0], want.double().numpy(), atol=1e-5, rtol=1e-4)
    del entries["layers.0.quant.qweight"]  # read without a prefix, it would be the error
    plain = tmp_path / "plain.safetensors"
    write_safetensors_raw(plain, entries)
    with pytest.raises(ValueError, match=r"plain.safetensors' holds 2 attention layers whose names carry a prefix "
                                         r"\('layers.0.self_attn.out_proj.weight'\): select one with "
                                         r"prefix='layers.0.self_attn.'"):
        attn.MultiheadAttention(8, 2).load_safetensors(plain)
    with pytest.raises(ValueError, match=r"end the prefix with '.' \(prefix='layers.1.self_attn.'\)"):
        m.load_safetensors(f, prefix="layers.1.self_attn")
    with pytest.raises(ValueError, match="load_safetensors: prefix: expected a layer's prefix"):
        m.load_safetensors(f, prefix="")
    close(m(x, x, x)[0], want.double().numpy(), atol=1e-5, rtol=1e-4)  # refused loads changed nothing


def test_mha_load_safetensors_dtype_in_the_file_is_a_value_error(tmp_path):
    """A file's tensor of a dtype attn does not read (an fp8 checkpoint's F8_E4M3), or reads but
    the layer does not take (I32), is a fault of the file: a ValueError naming the tensor and the
    dtype, as every other file error is (it was a TypeError: the message mentions a dtype)."""
    m = attn.MultiheadAttention(4, 1)
    for dtype in ["F8_E4M3", "F8_E5M2", "U8"]:
        f = tmp_path / (dtype + ".safetensors")
        write_safetensors_raw(f, {"in_proj_weight": (dtype, [12, 4], bytes(48))})
        with pytest.raises(ValueError, match=f"{f.name}': tensor 'in_proj_weight': dtype {dtype} is not supported "
                                             r"\(F32, F16, BF16, F64, I64, I32 or BOOL\)"):
            m.load_safetensors(f)
    f = tmp_path / "i32.safetensors"
    write_safetensors_raw(f, {"in_proj_weight": ("I32", [12, 4], bytes(192)), "in_proj_bias": ("F32", [12], bytes(48)),
                              "out_proj.weight": ("F32", [4, 4], bytes(64)), "out_proj.bias": ("F32", [4], bytes(16))})
    with pytest.raises(ValueError, match="tensor 'in_proj_weight': expected a floating dtype but got int32"):
        m.load_safetensors(f)


def test_save_safetensors_from_a_torch_module(tmp_path):
    """attn.save_safetensors writes what load_safetensors and `attn mha --params` read (the
    independent reader: the test's own parse of the header and bytes); a torch.save file is named
    as such (it said "header length 5787… runs past the end of the file")."""
    t, _ = torch_mha(3, 8, 2)
    f = tmp_path / "w.safetensors"
    attn.save_safetensors(f, t.state_dict(), metadata={"format": "pt"})
    raw = f.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    assert header.pop("__metadata__") == {"format": "pt"}
    for name, want in t.state_dict().items():
        entry = header[name]
        assert entry["dtype"] == "F32" and entry["shape"] == list(want.shape)
        got = np.frombuffer(raw[8 + n + entry["data_offsets"][0]:8 + n + entry["data_offsets"][1]], "<f4")
        assert np.array_equal(got.reshape(want.shape), want.numpy()), name
    m = attn.MultiheadAttention(8, 2)
    m.load_safetensors(f)
    x = np.random.default_rng(0).standard_normal((5, 2, 8), dtype=np.float32)
    with torch.no_grad():
        to, _ = t(*(torch.from_numpy(x),) * 3)
    close(m(x, x, x)[0], to.double().numpy(), atol=1e-5, rtol=1e-4)
    # 16-bit tensors keep their dtype: float16 as F16, bfloat16 bits (dtype="bfloat16") as BF16.
    half = tmp_path / "h.safetensors"
    bits = np.array([0x3F80, 0xC000], np.uint16)  # bfloat16 1.0, -2.0
    attn.save_safetensors(half, {"h": np.array([0.5, 3.0], np.float16), "b": bits}, dtype="bfloat16")
    raw = half.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    assert header["h"]["dtype"] == "F16" and header["b"]["dtype"] == "BF16"
    b0, b1 = header["b"]["data_offsets"]
    assert np.array_equal(np.frombuffer(raw[8 + n + b0:8 + n + b1], "<u2"), bits)
    # A bfloat16 model's state_dict (torch.bfloat16 tensors have no NumPy form): written as BF16, bit for bit.
    tb = torch.nn.MultiheadAttention(8, 2).to(torch.bfloat16)
    bf = tmp_path / "bf.safetensors"
    attn.save_safetensors(bf, tb.state_dict())
    raw = bf.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    for name, want in tb.state_dict().items():
        assert header[name]["dtype"] == "BF16", name
        o0, o1 = header[name]["data_offsets"]
        assert np.array_equal(np.frombuffer(raw[8 + n + o0:8 + n + o1], "<i2"), want.view(torch.int16).flatten().numpy()), name
    # Only the torch.bfloat16 entries are read as bits: a uint16 array beside them still needs dtype="bfloat16".
    with pytest.raises(TypeError, match=r"tensors\['u'\]: .*uint16"):
        attn.save_safetensors(tmp_path / "mixed.safetensors", {"w": torch.ones(2, dtype=torch.bfloat16),
                                                               "u": np.arange(4, dtype=np.uint16)})
    # A torch.save file (zip archive; a pickle with _use_new_zipfile_serialization=False).
    for new_zip in (True, False):
        pt = tmp_path / "w.pt"
        torch.save(t.state_dict(), pt, _use_new_zipfile_serialization=new_zip)
        with pytest.raises(ValueError, match="is a (zip archive|pickle) .torch.save writes these., not a safetensors"):
            m.load_safetensors(pt)
    with pytest.raises(TypeError, match="tensors: expected a dict"):
        attn.save_safetensors(f, [1, 2])


def test_mha_strided_inputs_and_no_copy_in_binding():
    t, m = torch_mha(5, 16, 4, batch_first=True)
    rng = np.random.default_rng(10)
    xb = rng.standard_normal((7, 3, 16), dtype=np.float32)
    x = xb.transpose(1, 0, 2)  # (B, L, E) view of an (L, B, E) buffer
    before = attn._input_copies()
    o, w = m(x, x, x, is_causal=False)
    assert attn._input_copies() == before
    with torch.no_grad():
        to, tw = t(*(torch.from_numpy(np.ascontiguousarray(x)),) * 3)
    close(o, to.double().numpy(), atol=1e-5, rtol=1e-4)
    close(w, tw.double().numpy(), atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("make, exc, words", [
    (lambda: attn.MultiheadAttention(10, 3), ValueError, ["10", "3"]),
    (lambda: attn.MultiheadAttention(8, 2, dropout=0.1), ValueError, ["dropout"]),
    (lambda: attn.MultiheadAttention(8, 2, dtype=np.float64), TypeError, ["dtype: parameters are float32, float16 or bfloat16"]),
])
def test_mha_bad_config(make, exc, words):
    with pytest.raises(exc) as e:
        make()
    for w in words:
        assert w in str(e.value)


def test_mha_device_is_torchs_cpu_in_any_spelling():
    # torch.device("cpu", 0) is "cpu:0", which torch's module takes: it was "only 'cpu' is supported
    # but got cpu:0".
    for device in ("cpu", "cpu:0", torch.device("cpu"), torch.device("cpu", 0)):
        assert attn.MultiheadAttention(8, 2, device=device).state_dict()["in_proj_weight"].shape == (24, 8)
    for device in ("cuda", "cuda:0", "cpu:", "cpu:x", "cpux", torch.device("meta")):
        with pytest.raises(ValueError) as e:
            attn.MultiheadAttention(8, 2, device=device)
        assert str(e.value) == f"device: only 'cpu' is supported but got {device}"


# dropout= out of [0, 1) is a probability out of range: refused by attn's rule for one (the
# layer's, detail::require_dropout_p) in its words with torch's name for the argument — it was
# this class's "inference-only … expected 0.0 but got 1.500000". A probability in range is the
# class's own refusal (it does not train), quoting the value as given.
@pytest.mark.parametrize("p, message", [
    (1.5, "MultiHeadAttention: dropout: must be in [0, 1) but got 1.5"),
    (1, "MultiHeadAttention: dropout: must be in [0, 1) but got 1"),
    (-0.1, "MultiHeadAttention: dropout: must be in [0, 1) but got -0.1"),
    (float("nan"), "MultiHeadAttention: dropout: must be in [0, 1) but got nan"),
    (0.1234567, "dropout: attn's MultiheadAttention is inference-only (eval mode); expected 0.0 but got 0.1234567"),
])
def test_mha_dropout_is_a_probability_by_attns_rule(p, message):
    with pytest.raises(ValueError) as e:
        attn.MultiheadAttention(8, 2, dropout=p)
    assert str(e.value) == message


def test_mha_bad_inputs_and_state_dicts():
    m = attn.MultiheadAttention(8, 2)
    x = np.zeros((4, 2, 8), np.float32)
    with pytest.raises(ValueError, match="query"):
        m(np.zeros((4, 2, 6), np.float32), x, x)
    with pytest.raises(ValueError, match="query"):
        m(np.zeros((1, 4, 2, 8), np.float32), x, x)
    with pytest.raises(TypeError, match="int16"):
        m(x.astype(np.int16), x, x)
    with pytest.raises(ValueError, match="key_padding_mask"):
        m(x, x, x, key_padding_mask=np.zeros((3, 4), bool))
    sd = m.state_dict()
    del sd["in_proj_bias"]
    with pytest.raises(ValueError, match="in_proj_bias"):
        m.load_state_dict(sd)
    sd = m.state_dict()
    sd["out_proj.weight"] = np.zeros((8, 7), np.float32)
    with pytest.raises(ValueError, match="out_proj.weight"):
        m.load_state_dict(sd)
    with pytest.raises(TypeError, match="str"):
        m.load_state_dict({1: np.zeros(3, np.float32)})


# ---- KVCache and decode ----------------------------------------------------------------

def decode_reference(q, keys, values, lengths, causal=True, scale=None):
    """q (B, Hq, Lq, D); keys/values (B, Hkv, cap, ·) float64; sequence b sees its first
    lengths[b] positions, new query i (bottom-right) positions 0 .. n_b − Lq + i."""
    b_, hq, lq, _ = q.shape
    outs, lses = [], []
    for b in range(b_):
        n = int(lengths[b])
        keep = causal_keep(lq, n, True) if causal else np.ones((lq, n), bool)
        o, lse, _ = textbook(q[b:b + 1], keys[b:b + 1, :, :n], values[b:b + 1, :, :n], keep, scale=scale)
        outs.append(o)
        lses.append(lse)
    return np.concatenate(outs), np.concatenate(lses)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_kv_cache_decode_vs_torch(dtype):
    rng = np.random.default_rng(300)
    b, hkv, hq, d, dv = 2, 2, 4, 32, 16
    cache = attn.KVCache(b, hkv, d, 8, value_dim=dv, dtype=dtype, grow=True)
    assert cache.dtype == dtype and cache.capacity == 8
    full_k = np.zeros((b, hkv, 64, d), np.float32)
    full_v = np.zeros((b, hkv, 64, dv), np.float32)
    lengths = np.zeros(b, np.int64)
    # Prompts of different lengths, one sequence at a time (the second from a strided view).
    for i, n in enumerate((13, 5)):
        kn = rng.standard_normal((hkv, n, d), dtype=np.float32)
        vn = rng.standard_normal((n, hkv, dv), dtype=np.float32).transpose(1, 0, 2)
        cache.append(kn, vn, batch_index=i)
        full_k[i, :, :n], full_v[i, :, :n] = kn, vn
        lengths[i] = n
    assert cache.lengths.tolist() == [13, 5] and cache.capacity >= 13
    rd = (lambda x: x.astype(np.float16).astype(np.float64)) if dtype == "float16" else (lambda x: x.astype(np.float64))
    for step, lq in enumerate((1, 3, 1)):
        kn = rng.standard_normal((b, hkv, lq, d), dtype=np.float32)
        vn = rng.standard_normal((b, hkv, lq, dv), dtype=np.float32)
        cache.append(kn, vn)
        for i in range(b):
            full_k[i, :, lengths[i]:lengths[i] + lq] = kn[i]
            full_v[i, :, lengths[i]:lengths[i] + lq] = vn[i]
        lengths += lq
        q = rng.standard_normal((b, hq, lq, d), dtype=np.float32)
        o, lse = attn.decode_attention(q, cache, return_lse=True)
        ref_o, ref_lse = decode_reference(q, rd(full_k), rd(full_v), lengths)
        close(o, ref_o)
        close(lse, ref_lse)
    assert cache.lengths.tolist() == lengths.tolist()
    close(cache.keys()[0, :, :lengths[0]], rd(full_k[0, :, :lengths[0]]), atol=0, rtol=0)
    # Rolling back and resetting.
    cache.truncate(10, batch_index=0)
    cache.truncate(6)
    assert cache.lengths.tolist() == [6, 6]
    cache.reset(1)
    assert cache.lengths.tolist() == [6, 0]
    cache.reset()
    assert cache.lengths.tolist() == [0, 0]


def test_decode_non_causal_and_sdpa_with_float16_kv():
    rng = np.random.default_rng(301)
    cache = attn.KVCache(1, 1, 16, 32)
    k = rng.standard_normal((1, 1, 20, 16), dtype=np.float32)
    v = rng.standard_normal((1, 1, 20, 16), dtype=np.float32)
    cache.append(k, v)
    q = rng.standard_normal((1, 4, 2, 16), dtype=np.float32)
    ref = textbook(q, k, v, scale=0.5)[0]
    close(attn.decode_attention(q, cache, is_causal=False, scale=0.5), ref)
    # sdpa's decode path takes float16 K/V directly (MQA: 4 query heads on 1 KV head).
    o = attn.sdpa(q, k.astype(np.float16), v.astype(np.float16), scale=0.5)
    close(o, textbook(q, k.astype(np.float16), v.astype(np.float16), scale=0.5)[0])


def test_kv_cache_overflow_and_bad_inputs():
    cache = attn.KVCache(1, 2, 8, 4)  # no growth
    k = np.zeros((1, 2, 3, 8), np.float32)
    cache.append(k, k)
    with pytest.raises(ValueError, match="nothing was written"):
        cache.append(k, k)
    assert cache.lengths.tolist() == [3]  # nothing written on error
    with pytest.raises(ValueError, match="k_new"):
        cache.append(np.zeros((2, 3, 8), np.float32), np.zeros((2, 3, 8), np.float32))
    with pytest.raises(TypeError, match="int8"):
        attn.KVCache(1, 2, 8, 4, dtype="int8")
    with pytest.raises(ValueError):
        attn.KVCache(1, 0, 8, 4)
    # Lq > 16 is no longer refused (it runs as prefill), but causal needs Lq cached positions.
    with pytest.raises(ValueError, match="holds 3 positions .* 17 new queries"):
        attn.decode_attention(np.zeros((1, 2, 17, 8), np.float32), cache)
    with pytest.raises(ValueError, match="heads 3 .* the cache.s kv_heads 2"):
        attn.decode_attention(np.zeros((1, 3, 1, 8), np.float32), cache)
    with pytest.raises(TypeError):
        attn.decode_attention(np.zeros((1, 2, 1, 8), np.int32), cache)
    grow = attn.KVCache(1, 1, 8, 2, grow=True)
    grow.append(np.ones((1, 1, 9, 8), np.float32), np.ones((1, 1, 9, 8), np.float32))
    assert grow.capacity >= 9 and grow.lengths.tolist() == [9]


def test_help_lists_the_classes_and_dist_imports_as_a_submodule():
    import importlib
    import pydoc

    text = pydoc.plaintext.document(attn)
    classes = text.split("\nCLASSES\n")[1].split("\nFUNCTIONS\n")[0]
    for name in ("KVCache", "PagedKVCache", "MultiheadAttention"):
        assert f"class {name}(" in classes, name
    if hasattr(attn, "dist"):  # built with MPI
        assert importlib.import_module("attn.dist") is attn.dist


@pytest.mark.skipif(not hasattr(attn, "dist"), reason="skipped: attn built without MPI (no attn.dist)")
def test_rank_segments_match_exact_chunks_up_to_the_largest_rank_count():
    # Chunk c of n over L rows is [c·L // n, (c+1)·L // n) (Python's exact integers); zigzag gives
    # rank r chunks r and 2P−1−r of 2P. P from 2^30 on made 2·P overflow int (negative segments).
    def chunk(L, n, c):
        return (c * L // n, (c + 1) * L // n - c * L // n)

    for L in (0, 10, 12345, 2**40 + 7, 2**62 + 11):
        for P in (1, 3, 2**29 + 1, 2**30, 2**31 - 1):
            for r in {0, 1 % P, P // 2, P - 1}:
                want = [chunk(L, 2 * P, r), chunk(L, 2 * P, 2 * P - 1 - r)]
                assert attn.dist.rank_segments(L, P, r) == want, (L, P, r)
                assert attn.dist.rank_segments(L, P, r, layout="contiguous") == [chunk(L, P, r)], (L, P, r)


@pytest.mark.skipif(not hasattr(attn, "dist"), reason="skipped: attn built without MPI (no attn.dist)")
@pytest.mark.parametrize("args, exc, message", [
    # pybind11's casters took True as 1 (segments of one rank) and answered the others with
    # "incompatible function arguments" and the whole signature.
    ((10, True, 0), TypeError, "P: expected an int but got bool True"),
    ((10.5, 2, 0), TypeError, "L: expected an int but got float 10.5"),
    ((10, 2, "0"), TypeError, "rank: expected an int but got str '0'"),
    ((10, 2, 0, 1), TypeError, "layout: expected a str but got int 1"),
    ((2**70, 2, 0), ValueError, "L: expected an int64 but got 1180591620717411303424"),
    # Past int's range, not truncated into another P (2^32 + 2 read as 2). The range is said as it
    # is: "|P| < 2^31" was not, -2^31 fits an int (and is then named by the library's rule).
    ((10, 2**32 + 2, 0), ValueError, "rank_segments: P: expected an int of MPI's range, [-2^31, 2^31 - 1], but got 4294967298"),
    ((10, 2, -2**32), ValueError, "rank_segments: rank: expected an int of MPI's range, [-2^31, 2^31 - 1], but got -4294967296"),
    ((10, 2**31, 0), ValueError, "rank_segments: P: expected an int of MPI's range, [-2^31, 2^31 - 1], but got 2147483648"),
    ((10, -2**31 - 1, 0), ValueError, "rank_segments: P: expected an int of MPI's range, [-2^31, 2^31 - 1], but got -2147483649"),
    ((10, -2**31, 0), ValueError, "rank_segments: expected 0 <= rank < P with P >= 1 but got rank 0 of P = -2147483648"),
    ((10, 2, -2**31), ValueError, "rank_segments: expected 0 <= rank < P with P >= 1 but got rank -2147483648 of P = 2"),
])
def test_rank_segments_arguments_are_named(args, exc, message):
    with pytest.raises(exc) as e:
        attn.dist.rank_segments(*args)
    assert str(e.value) == message
    assert attn.dist.rank_segments(np.int64(10), np.int32(2), np.int64(1)) == [(2, 3), (5, 2)]


@pytest.mark.parametrize("impl", ["reference", "flash", "decode"])
def test_a_minus_inf_score_is_a_masked_key(impl):
    # docs/conventions.md, "Non-finite values": a -inf score (q·k = -inf) is a weight of exactly 0
    # in every kernel; a row whose only visible score is -inf has no visible key (out 0, lse -inf);
    # a +inf score is NaN. Two rows per head (decode takes a few queries per KV head).
    rng = np.random.default_rng(5)
    k = rng.standard_normal((1, 1, 6, 8)).astype(np.float32)
    v = rng.standard_normal((1, 1, 6, 8)).astype(np.float32)
    k[0, 0, 2] = 0.0
    k[0, 0, 2, 0] = np.inf             # key 2's score is q[0]·inf
    q = rng.standard_normal((1, 1, 2, 8)).astype(np.float32)
    q[0, 0, :, 0] = [-1.0, 1.0]       # row 0 scores key 2 at -inf, row 1 at +inf
    o, lse = attn.sdpa(q, k, v, return_lse=True, impl=impl)
    keep = np.ones((1, 1, 1, 6), bool)
    keep[..., 2] = False
    want, want_lse = textbook(q[:, :, :1], k, v, keep)[:2]
    close(o[:, :, :1], want)
    np.testing.assert_allclose(lse[0, 0, 0], np.asarray(want_lse).reshape(-1)[0], rtol=1e-5)
    assert np.isnan(o[0, 0, 1]).all() and np.isnan(lse[0, 0, 1])
    # Key 2 alone visible to row 0 (key_lengths = 3 and causal would not isolate it: a bool mask).
    only = np.zeros((1, 1, 2, 6), bool)
    only[..., 2] = True
    o, lse = attn.sdpa(q, k, v, attn_mask=only, return_lse=True, impl="reference" if impl == "decode" else impl)
    assert np.array_equal(o[0, 0, 0], np.zeros(8, np.float32)) and lse[0, 0, 0] == -np.inf


def test_package_namespace_holds_no_loop_helpers():
    # __init__.py's loop variable and import alias leaked as attn._cls and attn._sys.
    assert not {"_cls", "_sys"} & set(dir(attn))


def test_every_public_callable_says_what_it_does():
    # help(attn.X) is a user's first stop: pybind11 shows only the signature when a binding has
    # no docstring (PagedKVCache's methods had none).
    import inspect

    def described(obj):
        lines = [line for line in (inspect.getdoc(obj) or "").splitlines() if line.strip()]
        # pybind11 puts the signature lines first: "name(self: ..., ...) -> T"
        return any(not (line.split("(")[0].strip().isidentifier() and "->" in line) for line in lines)

    missing = []
    for name in sorted(n for n in dir(attn) if not n.startswith("_")):
        obj = getattr(attn, name)
        if inspect.ismodule(obj) or not callable(obj):
            continue
        if not described(obj):
            missing.append(name)
        if inspect.isclass(obj):
            for member, value in vars(obj).items():
                if member.startswith("_") and member != "__init__":
                    continue
                if isinstance(value, property):
                    if not (value.__doc__ or "").strip():
                        missing.append(f"{name}.{member}")
                elif callable(value) and not described(value):
                    missing.append(f"{name}.{member}")
    assert missing == []


def fallocate_works(directory):
    """Whether the file system of `directory` has fallocate (AtomicFile::reserve relies on it)."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(os.path.join(directory, "probe"), os.O_CREAT | os.O_WRONLY, 0o600)
    try:
        return libc.fallocate(fd, 0, ctypes.c_long(0), ctypes.c_long(4096)) == 0
    finally:
        os.close(fd)
        os.unlink(os.path.join(directory, "probe"))


def test_save_safetensors_of_views_too_large_for_any_file(tmp_path):
    # Broadcast views (stride 0) stand for any number of bytes. Their offsets wrapped past 2^64
    # (a header whose end came before its begin) and the data was then written until the disk
    # was full; a size the file system cannot take (fallocate) is now refused before any byte.
    if not fallocate_works(tmp_path):
        pytest.skip("the temporary directory's file system has no fallocate: the 4 PiB file would be written")
    n = (2**63 - 8) // 8
    huge = np.broadcast_to(np.zeros(1, np.int64), (n,))
    with pytest.raises(ValueError, match=r"z\.safetensors': the data of tensors up to 'b': .* exceeds 9223372036854775807"):
        attn.save_safetensors(str(tmp_path / "z.safetensors"), {"a": huge, "b": huge, "c": huge})
    big = np.broadcast_to(np.zeros(1, np.float32), (2**50,))  # 4 PiB: no file system here holds it
    with pytest.raises(ValueError, match=r"z\.safetensors': write failed: the file needs \d+ bytes, more than the file system takes"):
        attn.save_safetensors(str(tmp_path / "z.safetensors"), {"a": big})
    assert os.listdir(tmp_path) == []
