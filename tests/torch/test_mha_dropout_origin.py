# attn.torch.MultiheadAttention's dropout_origin: the functional's keyword (docs/conventions.md
# "Dropout", docs/torch.md), passed on to it. In training mode, with the same seed and origin, the
# layer's output, attention weights and every gradient are those of the same layer whose attention
# is the NumPy API's attn.sdpa / attn.sdpa_backward, bit for bit; a wrong origin is the NumPy
# API's error, word for word.
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import attn
import attn.torch as at

E, HEADS, P, SEED = 16, 4, 0.3, 11
ORIGIN = (1, 2, 5, 3)  # the key origin not a multiple of 4: the Philox block starts mid-way


def arr(t):
    return t.detach().numpy()


def layer():
    torch.manual_seed(0)
    m = at.MultiheadAttention(E, HEADS, dropout=P, batch_first=True, dtype=torch.float64)
    return m.train()


def inputs():
    g = torch.Generator().manual_seed(1)
    return [torch.randn(s, generator=g, dtype=torch.float64, requires_grad=True)
            for s in ((2, 7, E), (2, 9, E), (2, 9, E))]


def drawn_seed():
    """The seed the layer draws in training: torch's generator's next draw (docs/torch.md)."""
    torch.manual_seed(SEED)
    return int(torch.randint(0, 2**62, ()).item())


class NumpySdpa(torch.autograd.Function):
    """The layer's attention done by the NumPy API: attn.sdpa forward, attn.sdpa_backward backward."""

    @staticmethod
    def forward(ctx, q, k, v, seed, origin):
        out, lse = attn.sdpa(arr(q), arr(k), arr(v), dropout_p=P, dropout_seed=seed, dropout_origin=origin,
                             return_lse=True)
        ctx.save_for_backward(q, k, v)
        ctx.out, ctx.lse, ctx.seed, ctx.origin = out, lse, seed, origin
        return torch.from_numpy(out)

    @staticmethod
    def backward(ctx, g):
        q, k, v = ctx.saved_tensors
        grads = attn.sdpa_backward(arr(q), arr(k), arr(v), ctx.out, ctx.lse, arr(g), dropout_p=P,
                                   dropout_seed=ctx.seed, dropout_origin=ctx.origin)
        return (*(torch.from_numpy(x) for x in grads), None, None)


def reference(m, query, key, value, origin):
    """nn.MultiheadAttention's forward (batch_first, separate projections) written out, with the
    attention of the NumPy API on the same (N, H, L, Dh) views of the projections."""
    n, lq, lk, dh = query.size(0), query.size(1), key.size(1), E // HEADS
    wq, wk, wv = m.in_proj_weight.split(E)
    bq, bk, bv = m.in_proj_bias.split(E)
    q = F.linear(query, wq, bq).view(n, lq, HEADS, dh).transpose(1, 2)
    k = F.linear(key, wk, bk).view(n, lk, HEADS, dh).transpose(1, 2)
    v = F.linear(value, wv, bv).view(n, lk, HEADS, dh).transpose(1, 2)
    out = NumpySdpa.apply(q, k, v, drawn_seed(), origin)
    weights = attn.sdpa(arr(q), arr(k), arr(v), dropout_p=P, dropout_seed=drawn_seed(), dropout_origin=origin,
                        return_weights=True)[1]
    out = F.linear(out.transpose(1, 2).reshape(n, lq, E), m.out_proj.weight, m.out_proj.bias)
    return out, torch.from_numpy(weights)


def run(m, xs, origin, **kw):
    torch.manual_seed(SEED)
    return m(*xs, need_weights=True, average_attn_weights=False, dropout_origin=origin, **kw)


def gradients(m, xs, out):
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    return torch.autograd.grad(out, (*xs, *m.parameters()), g)


def test_forward_weights_and_backward_are_the_numpy_apis():
    m, xs = layer(), inputs()
    out, w = run(m, xs, ORIGIN)
    ref, ref_w = reference(m, *xs, ORIGIN)
    assert torch.equal(out, ref)
    assert torch.equal(w, ref_w)
    names = ["query", "key", "value"] + [name for name, _ in m.named_parameters()]
    for a, b, name in zip(gradients(m, xs, out), gradients(m, xs, ref), names):
        assert torch.equal(a, b), name
    # The origin moved the keep mask (else this test could not tell it was passed on), and
    # (0, 0, 0, 0) is the default: the call is the whole problem.
    assert not torch.equal(out, run(m, xs, None)[0])
    assert torch.equal(run(m, xs, (0, 0, 0, 0))[0], run(m, xs, None)[0])


def test_a_micro_batch_drops_what_the_whole_batch_drops():
    # Item 1 alone, placed at batch 1 of the whole, keeps the weights the whole batch keeps for it
    # (a dropped weight is exactly 0, a kept one a softmax weight > 0). torch's projection GEMMs
    # may round a batch of 1 and one of 2 differently: the values agree to float64 rounding.
    m, xs = layer(), inputs()
    whole, whole_w = run(m, xs, None)
    part, part_w = run(m, [x[1:] for x in xs], (1, 0, 0, 0))
    assert torch.equal(part_w == 0, whole_w[1:] == 0)
    assert torch.allclose(part_w, whole_w[1:], rtol=0, atol=1e-13)
    assert torch.allclose(part, whole[1:], rtol=0, atol=1e-13)
    alone_w = run(m, [x[1:] for x in xs], None)[1]  # without the origin: item 0's keep mask
    assert not torch.equal(alone_w == 0, whole_w[1:] == 0)


@pytest.mark.parametrize("origin", [(-1, 0, 0, 0), (0, 0, 2**32 - 6, 0), (1, 2, 3), "0000", (0, 0, 0.5, 0)])
@pytest.mark.parametrize("training", [True, False])  # checked without dropout too, as the functional does
def test_a_wrong_origin_is_the_numpy_apis_error(origin, training):
    m, xs = layer(), inputs()
    m.train(training)
    # The attention's problem: (N, H, L, Dh) projections.
    q, k = np.zeros((2, HEADS, 7, E // HEADS)), np.zeros((2, HEADS, 9, E // HEADS))
    with pytest.raises((TypeError, ValueError)) as core:
        attn.sdpa(q, k, k, dropout_p=P, dropout_seed=SEED, dropout_origin=origin)
    with pytest.raises(core.type) as e:
        m(*xs, dropout_origin=origin)
    assert str(e.value) == str(core.value)
    assert "dropout_origin" in str(e.value)
    # An empty batch is checked like any other (attn.torch answers it without the core's kernels).
    with pytest.raises(core.type) as empty:
        m(*(t[:0] for t in xs), dropout_origin=origin)
    assert str(empty.value) == str(core.value).replace("(B = 2)", "(B = 0)")
