# attn.torch.MultiheadAttention against torch.nn.MultiheadAttention (float64, the same weights
# through state_dict both ways): outputs, attention weights and every gradient, for each
# constructor option and mask kind; training-mode dropout; replace_attention inside
# nn.TransformerEncoder, whose eval-mode fast path would otherwise bypass it.
import copy

import pytest
import torch
from torch import nn

import attn
import attn.torch as at


def pair(**kw):
    torch.manual_seed(0)
    ref = nn.MultiheadAttention(dtype=torch.float64, **kw)
    if kw.get("add_bias_kv"):  # torch initializes them with xavier_normal_; make them matter
        with torch.no_grad():
            ref.bias_k.normal_()
            ref.bias_v.normal_()
    ours = at.MultiheadAttention(dtype=torch.float64, **kw)
    assert list(ours.state_dict()) == list(ref.state_dict())
    ours.load_state_dict(ref.state_dict())
    return ref, ours


def padding(n, s, kind):
    pad = torch.zeros(n, s, dtype=torch.bool)
    pad[0, s - 2:] = True  # sequence 0 has two padded keys
    return pad if kind == "bool" else torch.zeros(n, s, dtype=torch.float64).masked_fill(pad, -1e4)


def attn_mask(lq, s, kind, n_h=None):
    keep = torch.rand(lq, s) > 0.3
    keep[:, 0] = True
    masked = ~keep if n_h is None else (~keep).expand(n_h, lq, s).clone()
    return masked if kind == "bool" else torch.randn(masked.shape, dtype=torch.float64)


CONFIGS = {
    "self": dict(ctor={}, cross=False),
    "batch_first": dict(ctor={"batch_first": True}, cross=False),
    "cross": dict(ctor={}, cross=True),
    "kdim/vdim": dict(ctor={"kdim": 6, "vdim": 5}, cross=True),
    "no bias": dict(ctor={"bias": False}, cross=False),
    "bias_kv": dict(ctor={"add_bias_kv": True}, cross=False),
    "zero_attn": dict(ctor={"add_zero_attn": True}, cross=True),
}
MASKS = {
    "none": {},
    "padding bool": {"key_padding_mask": "bool"},
    "padding float": {"key_padding_mask": "float"},
    "attn_mask 2-D bool": {"attn_mask": "bool"},
    "attn_mask 3-D float": {"attn_mask": "float3"},
    "both bool": {"key_padding_mask": "bool", "attn_mask": "bool"},
}


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("average", [True, False])
def test_against_torch(config, mask, average):
    c = CONFIGS[config]
    e, h, n, lq, lk = 8, 2, 3, 4, 6
    ref, ours = pair(embed_dim=e, num_heads=h, **c["ctor"])
    bf = c["ctor"].get("batch_first", False)
    shape = (lambda L, d: (n, L, d)) if bf else (lambda L, d: (L, n, d))
    x = torch.randn(shape(lq, e), dtype=torch.float64, requires_grad=True)
    if c["cross"]:
        k = torch.randn(shape(lk, c["ctor"].get("kdim", e)), dtype=torch.float64, requires_grad=True)
        v = torch.randn(shape(lk, c["ctor"].get("vdim", e)), dtype=torch.float64, requires_grad=True)
        args = (x, k, v)
    else:
        lk = lq
        args = (x, x, x)
    s = lk + (1 if c["ctor"].get("add_bias_kv") else 0) + (1 if c["ctor"].get("add_zero_attn") else 0)
    kw = {}
    m = MASKS[mask]
    if "key_padding_mask" in m:
        kw["key_padding_mask"] = padding(n, lk, m["key_padding_mask"])
    if m.get("attn_mask") == "bool":
        kw["attn_mask"] = attn_mask(lq, lk, "bool")
    elif m.get("attn_mask") == "float3":
        kw["attn_mask"] = attn_mask(lq, lk, "float", n * h)
    del s
    r_out, r_w = ref(*args, average_attn_weights=average, **kw)
    o_out, o_w = ours(*args, average_attn_weights=average, **kw)
    assert o_out.shape == r_out.shape and o_w.shape == r_w.shape
    assert torch.allclose(o_out, r_out, atol=1e-12, rtol=1e-10), (o_out - r_out).abs().max()
    assert torch.allclose(o_w, r_w, atol=1e-12), (o_w - r_w).abs().max()
    g = torch.randn_like(r_out)
    leaves = list(dict.fromkeys(args))
    r_grads = torch.autograd.grad(r_out, leaves + list(ref.parameters()), g)
    o_grads = torch.autograd.grad(o_out, leaves + list(ours.parameters()), g)
    for (name, _), a, b in zip([("input", None)] * len(leaves) + list(ref.named_parameters()), o_grads, r_grads):
        assert torch.allclose(a, b, atol=1e-11, rtol=1e-9), (name, (a - b).abs().max())


def test_unbatched_and_need_weights_false():
    ref, ours = pair(embed_dim=8, num_heads=4)
    x = torch.randn(5, 8, dtype=torch.float64)
    pad = torch.tensor([False, False, False, True, False])
    r, rw = ref(x, x, x, key_padding_mask=pad)
    o, ow = ours(x, x, x, key_padding_mask=pad)
    assert o.shape == (5, 8) and ow.shape == (5, 5)
    assert torch.allclose(o, r, atol=1e-12) and torch.allclose(ow, rw, atol=1e-12)
    o2, none = ours(x, x, x, key_padding_mask=pad, need_weights=False)
    assert none is None and torch.allclose(o2, r, atol=1e-12)


@pytest.mark.parametrize("lq", [1, 4, 16, 17])
def test_need_weights_does_not_change_the_output_bits(lq):
    # As torch 1.13's module: O is computed by the call without weights (the decode kernel for
    # Lq <= 16 in float32), the weights by a second call, so asking for them changes no bit of O
    # (docs/conventions.md, the MHA layer's "Weights": attn's C++ layer differs there).
    torch.manual_seed(0)
    m = at.MultiheadAttention(64, 4, batch_first=True).eval()
    x, mem = torch.randn(2, lq, 64), torch.randn(2, 300, 64)
    with torch.no_grad():
        with_weights, w = m(x, mem, mem, need_weights=True)
        without, none = m(x, mem, mem, need_weights=False)
    assert w.shape == (2, lq, 300) and none is None
    assert torch.equal(with_weights, without)


@pytest.mark.parametrize("layout", ["sequence_first", "batch_first", "unbatched"])
def test_self_attention_projects_with_one_gemm_in_every_layout(layout, monkeypatch):
    # One input tensor: the packed in_proj_weight in one GEMM (as torch's _in_projection_packed),
    # then the output projection — 2 linear calls; three distinct inputs take 3 + 1. The check
    # is made on the tensors the caller passed, not on the batch-first views made from them.
    kw = {"batch_first": True} if layout == "batch_first" else {}
    ref, ours = pair(embed_dim=8, num_heads=2, **kw)
    shape = {"sequence_first": (6, 3, 8), "batch_first": (3, 6, 8), "unbatched": (6, 8)}[layout]
    x = torch.randn(shape, dtype=torch.float64)
    r, _ = ref(x, x, x)
    calls = []
    linear = torch.nn.functional.linear
    monkeypatch.setattr(torch.nn.functional, "linear", lambda *a, **k: calls.append(a[1].shape) or linear(*a, **k))
    o, _ = ours(x, x, x)
    assert calls == [(24, 8), (8, 8)], calls
    assert torch.allclose(o, r, atol=1e-12)
    calls.clear()
    o3, _ = ours(x, x.clone(), x.clone())
    assert calls == [(8, 8)] * 4, calls
    assert torch.allclose(o3, r, atol=1e-12)


def test_state_dict_loads_both_ways():
    torch.manual_seed(1)
    ours = at.MultiheadAttention(8, 2, kdim=4, vdim=3, add_bias_kv=True)
    ref = nn.MultiheadAttention(8, 2, kdim=4, vdim=3, add_bias_kv=True)
    ref.load_state_dict(ours.state_dict())
    for (a, x), (b, y) in zip(ours.state_dict().items(), ref.state_dict().items()):
        assert a == b and torch.equal(x, y)
    assert all(isinstance(p, nn.Parameter) for p in ours.parameters())


def test_training_dropout():
    torch.manual_seed(0)
    m = at.MultiheadAttention(16, 4, dropout=0.5, batch_first=True)
    x = torch.randn(2, 9, 16)
    m.train()
    torch.manual_seed(3)
    a, wa = m(x, x, x)
    torch.manual_seed(3)
    b, wb = m(x, x, x)
    c, _ = m(x, x, x)
    assert torch.equal(a, b) and torch.equal(wa, wb) and not torch.equal(a, c)
    # The returned weights are the dropped ones: per head a kept weight is scaled by 2, a dropped one is 0.
    _, w_heads = m(x, x, x, average_attn_weights=False)
    m.eval()
    e, we = m(x, x, x, average_attn_weights=False)
    assert not torch.allclose(a, e)
    assert ((w_heads == 0) | torch.isclose(w_heads, 2 * we)).all()
    assert 0.3 < (w_heads == 0).float().mean() < 0.7
    a.sum().backward()
    assert m.in_proj_weight.grad is not None and torch.isfinite(m.in_proj_weight.grad).all()


def encoder(dropout):
    layer = nn.TransformerEncoderLayer(128, 4, dim_feedforward=256, dropout=dropout, batch_first=True)
    return nn.TransformerEncoder(layer, 2)


@pytest.mark.parametrize("p", [1.5, -0.25, 1])
def test_training_dropout_out_of_range_is_refused_in_attns_words(p):
    # torch's constructor takes any dropout; training uses it. It was refused as sdpa's argument
    # ("dropout_p: expected a float in [0, 1) …", a name the module's user never wrote) after a seed
    # had been drawn from torch's generator; now by attn's rule, in attn.MultiheadAttention's words.
    m = at.MultiheadAttention(16, 4, dropout=p, batch_first=True)
    x = torch.randn(2, 5, 16)
    rng = torch.get_rng_state()
    with pytest.raises(ValueError) as e:
        m(x, x, x)
    assert str(e.value) == f"MultiHeadAttention: dropout: must be in [0, 1) but got {p}"
    with pytest.raises(ValueError) as core:
        attn.MultiheadAttention(16, 4, dropout=p)
    assert str(core.value) == str(e.value)
    assert torch.equal(torch.get_rng_state(), rng)  # refused before a seed was drawn
    m.eval()  # torch ignores dropout in eval mode, and so does attn
    assert m(x, x, x)[0].shape == x.shape


def test_replace_attention_in_an_encoder_eval_fast_path():
    torch.manual_seed(0)
    ref = encoder(0.0).eval()
    ours = at.replace_attention(copy.deepcopy(ref))
    calls = []
    for layer in ours.layers:
        assert type(layer.self_attn) is at.MultiheadAttention
        layer.self_attn.register_forward_hook(lambda *a: calls.append(1))
    x = torch.randn(2, 10, 128)
    pad = torch.zeros(2, 10, dtype=torch.bool)
    pad[1, 7:] = True
    with torch.inference_mode():
        for kw in ({}, {"src_key_padding_mask": pad}):
            r, o = ref(x, **kw), ours(x, **kw)
            if kw:  # torch's nested-tensor fast path gives 0 at padded positions; compare the rest
                r, o = r[~pad], o[~pad]
            assert torch.allclose(o, r, atol=2e-5, rtol=1e-4), (o - r).abs().max()
    assert len(calls) == 4  # attn ran in both layers, both calls: the fast path was not taken


def reverse_task(steps, dropout, attention, seed=0, lr=1e-3):
    """An encoder learning to output its input reversed (position i must read L-1-i: only
    attention can); returns the loss of each step."""
    torch.manual_seed(seed)
    vocab, length = 16, 12
    emb, pos, head = nn.Embedding(vocab, 128), nn.Parameter(torch.randn(length, 128)), nn.Linear(128, vocab)
    enc = encoder(dropout)
    if attention == "attn":
        at.replace_attention(enc)
    params = list(emb.parameters()) + [pos] + list(enc.parameters()) + list(head.parameters())
    opt = torch.optim.Adam(params, lr=lr)
    gen = torch.Generator().manual_seed(seed + 1)
    losses = []
    enc.train()
    for _ in range(steps):
        x = torch.randint(0, vocab, (16, length), generator=gen)
        logits = head(enc(emb(x) + pos))
        loss = nn.functional.cross_entropy(logits.reshape(-1, vocab), x.flip(1).reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


@pytest.fixture
def one_thread():
    """Training runs hundreds of small ops: on a loaded 2-core machine each 2-thread OpenMP
    region waits for a core, which makes a 2-second run take minutes."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def test_training_matches_torch(one_thread):
    torch_losses = reverse_task(50, 0.0, "torch")
    attn_losses = reverse_task(50, 0.0, "attn")
    assert torch_losses[-1] < 0.5 * torch_losses[0]  # the task is being learnt
    # Same seed, same data, same math: the curves differ only by float32 rounding (~1e-7
    # relative per op), which 50 Adam steps grow but keep far below 1e-4 of the loss.
    for i, (a, b) in enumerate(zip(torch_losses, attn_losses)):
        assert abs(a - b) <= 1e-4 * abs(a), (i, a, b)
    assert torch_losses != attn_losses  # attn really ran: bit-identical curves would mean torch's path


def test_training_with_dropout_learns(one_thread):
    for attention in ("torch", "attn"):
        losses = reverse_task(100, 0.1, attention)
        first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
        assert first > 2.5 and last < 0.1, (attention, first, last)  # chance: ln 16 = 2.77


@pytest.mark.parametrize("shape", [(0, 5, 16), (2, 0, 16)])
def test_an_empty_batch_or_sequence_gives_torchs_empty_result(shape):
    # nn.MultiheadAttention returns empty results for an empty batch or sequence; the core
    # refuses size-0 dims, so the wrapper answers these itself (it raised "batch must be >= 1":
    # a review found it). Gradients flow (all empty or zero).
    torch.manual_seed(3)
    ours = at.MultiheadAttention(16, 4, batch_first=True)
    ref = nn.MultiheadAttention(16, 4, batch_first=True)
    ref.load_state_dict(ours.state_dict())
    x = torch.randn(*shape, requires_grad=True)
    out, w = ours(x, x, x)
    want, want_w = ref(x, x, x)
    assert out.shape == want.shape and w.shape == want_w.shape
    out.sum().backward()
    assert x.grad is not None and x.grad.shape == x.shape


def test_functional_with_no_keys_gives_zeros_with_gradients():
    q = torch.randn(2, 3, 4, 8, requires_grad=True)
    k = torch.randn(2, 3, 0, 8, requires_grad=True)
    out = at.scaled_dot_product_attention(q, k, k)
    assert out.shape == (2, 3, 4, 8) and not out.any()  # a row that sees no key gives 0 (attn's rule)
    out.sum().backward()
    assert q.grad is not None and not q.grad.any()
    assert at.scaled_dot_product_attention(q[:, :, :0], k, k).shape == (2, 3, 0, 8)


@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("key_shape, value_shape, words", [
    # key and value of the same size but different (S, N): was accepted and gave garbage
    ((7, 3, 16), (21, 1, 16), ["key shape {k} does not match value shape {v}"]),
    ((7, 3, 16), (6, 3, 16), ["key shape {k} does not match value shape {v}"]),
    ((7, 2, 16), (7, 2, 16), ["key", "batch size 3", "{k}"]),
    ((7, 3, 8), (7, 3, 16), ["key", "feature dim 16", "{k}"]),
    ((7, 3, 16), (7, 3, 8), ["value", "feature dim 16", "{v}"]),
])
def test_inconsistent_query_key_value_are_named_like_torch(batch_first, key_shape, value_shape, words):
    # Shapes written (L, N, E), given (N, L, E) with batch_first; the message names them as given.
    lay = (lambda s: (s[1], s[0], s[2])) if batch_first else (lambda s: s)
    m = at.MultiheadAttention(16, 4, batch_first=batch_first)
    x, key, value = torch.randn(lay((5, 3, 16))), torch.randn(lay(key_shape)), torch.randn(lay(value_shape))
    with pytest.raises(ValueError) as e:
        m(x, key, value)
    for w in words:
        w = w.format(k=lay(key_shape), v=lay(value_shape))
        assert w in str(e.value), str(e.value)


@pytest.mark.parametrize("option", ["add_bias_kv", "add_zero_attn"])
def test_is_causal_with_an_appended_key_is_refused(option):
    # The appended key has no position: is_causal hid it from all but the last query (torch,
    # with the causal attn_mask padded by one visible column, lets every query see it).
    ref, ours = pair(embed_dim=8, num_heads=2, batch_first=True, **{option: True})
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    causal = torch.ones(5, 5, dtype=torch.bool).triu(1)  # True = masked (torch's convention)
    with pytest.raises(ValueError) as e:
        ours(x, x, x, attn_mask=causal, is_causal=True)
    for w in ("is_causal", option, "attn_mask"):
        assert w in str(e.value), str(e.value)
    # the suggested way gives torch's result
    o, ow = ours(x, x, x, attn_mask=causal)
    r, rw = ref(x, x, x, attn_mask=causal)
    assert torch.allclose(o, r, atol=1e-12) and torch.allclose(ow, rw, atol=1e-12)


@pytest.mark.parametrize("ctor, call, words", [
    # the mask shape is checked before the appended key's column is added to it
    ({"add_bias_kv": True}, {"attn_mask": torch.zeros(5, 8, dtype=torch.bool)},
     ["attn_mask", "expected shape (5, 7)", "got (5, 8)"]),
    ({"add_bias_kv": True, "add_zero_attn": True}, {"attn_mask": torch.zeros(5, 6, dtype=torch.bool)},
     ["attn_mask", "expected shape (5, 7)", "got (5, 6)"]),
    ({"add_zero_attn": True}, {"key_padding_mask": torch.zeros(2, 8, dtype=torch.bool)},
     ["key_padding_mask", "expected shape (2, 7)", "got (2, 8)"]),
    # unbatched: torch's (S,) key_padding_mask, and the caller's shape in the message
    ({}, {"key_padding_mask": torch.zeros(1, 7, dtype=torch.bool), "unbatched": True},
     ["key_padding_mask", "expected shape (7,)", "got (1, 7)"]),
])
def test_mask_shape_errors_name_the_callers_shapes(ctor, call, words):
    m = at.MultiheadAttention(16, 4, **ctor)
    call = dict(call)
    if call.pop("unbatched", False):
        x, kv = torch.randn(5, 16), torch.randn(7, 16)
    else:
        x, kv = torch.randn(5, 2, 16), torch.randn(7, 2, 16)
    with pytest.raises(ValueError) as e:
        m(x, kv, kv, **call)
    for w in words:
        assert w in str(e.value), str(e.value)


def test_non_float_input_is_a_named_dtype_error():
    m = at.MultiheadAttention(16, 4)
    x = torch.randn(5, 2, 16)
    with pytest.raises(TypeError) as e:
        m(x, x.int(), x)
    assert "key" in str(e.value) and "got torch.int32" in str(e.value), str(e.value)


@pytest.mark.parametrize("grad", [True, False])
def test_jit_and_functorch_are_refused_clearly(grad):
    # torch.jit.trace under no_grad froze the traced input's result into the graph (a new input got
    # the old output); script failed on attn's Python source; vmap/grad failed with "Cannot access
    # data pointer of Tensor that doesn't have storage" (an exploratory test found them).
    layer = at.replace_attention(nn.TransformerEncoderLayer(16, 2, 32, batch_first=True)).eval()
    x = torch.randn(2, 5, 16)
    with torch.set_grad_enabled(grad):
        with pytest.raises(RuntimeError, match="attn.torch cannot be traced by torch.jit"):
            torch.jit.trace(layer, (x,))
        with pytest.raises(RuntimeError, match="cannot be traced by torch.jit"):
            torch.jit.trace(lambda q: at.scaled_dot_product_attention(q, q, q), (x.view(2, 5, 2, 8),))
    with pytest.raises(RuntimeError, match="cannot be scripted by torch.jit"):
        torch.jit.script(layer)
    functorch = pytest.importorskip("functorch")
    q = torch.randn(3, 2, 4, 8)
    with pytest.raises(RuntimeError, match="does not support functorch transforms"):
        functorch.vmap(lambda t: at.scaled_dot_product_attention(t, t, t))(q)
    with pytest.raises(RuntimeError, match="does not support functorch transforms"):
        functorch.grad(lambda t: at.scaled_dot_product_attention(t, t, t).sum())(q[0])
    # Outside a trace or transform, the same calls run.
    assert layer(x).shape == x.shape
    assert at.scaled_dot_product_attention(q, q, q).shape == q.shape


@pytest.mark.parametrize("which", ["query", "value", "mask"])
def test_forward_mode_ad_is_refused_not_dropped(which):
    # A dual tensor that did not also require grad went the no-autograd way, whose conversion
    # dropped its tangent: the output's tangent was None and nothing said so.
    import torch.autograd.forward_ad as fwAD
    q = torch.randn(1, 2, 5, 8, dtype=torch.float64)
    mask = torch.zeros(5, 5, dtype=torch.float64)
    with fwAD.dual_level():
        dual = {n: fwAD.make_dual(t, torch.randn_like(t)) for n, t in (("query", q), ("value", q), ("mask", mask))}
        args = dict(query=q, value=q, mask=mask)
        args[which] = dual[which]
        with pytest.raises(RuntimeError, match="does not support forward-mode AD.*: " + which.replace("mask", "attn_mask")):
            at.scaled_dot_product_attention(args["query"], q, args["value"], attn_mask=args["mask"])
        # A dual level without dual inputs is fine; a sparse mask still gets its own named error.
        assert at.scaled_dot_product_attention(q, q, q).shape == q.shape
        with pytest.raises(TypeError, match="attn_mask"):
            at.scaled_dot_product_attention(q, q, q, attn_mask=mask.to_sparse())
    assert at.scaled_dot_product_attention(q, q, q, attn_mask=mask).shape == q.shape
