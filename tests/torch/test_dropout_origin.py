# attn.torch's dropout_origin: the core's keyword (a piece of a larger problem takes the whole's
# keep decisions, docs/conventions.md "Dropout"), which attn.torch passes to the forward and to
# its autograd backward. Same seed and origin: attn.scaled_dot_product_attention's bits and the
# NumPy backward's gradients; a float mask's gradient is the textbook's with the keep mask the
# NumPy API reports; a wrong origin is the NumPy API's error, word for word.
import numpy as np
import pytest
import torch

import attn
import attn.torch as at

P, SEED = 0.3, 2**40 + 9
ORIGIN = (1, 2, 5, 3)  # the key origin not a multiple of 4: the Philox block starts mid-way


def inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g, dtype=torch.float64, requires_grad=True)
            for s in ((2, 3, 7, 8), (2, 3, 9, 8), (2, 3, 9, 4))]


def arr(t):
    return t.detach().numpy()


def test_forward_and_backward_are_the_numpy_apis():
    q, k, v = inputs()
    out = at.scaled_dot_product_attention(q, k, v, dropout_p=P, dropout_seed=SEED, dropout_origin=ORIGIN)
    ref, lse = attn.sdpa(arr(q), arr(k), arr(v), dropout_p=P, dropout_seed=SEED, dropout_origin=ORIGIN,
                         return_lse=True)
    assert torch.equal(out, torch.from_numpy(ref))
    # The origin moved the mask (else this test could not tell it was passed on).
    assert not np.array_equal(ref, attn.sdpa(arr(q), arr(k), arr(v), dropout_p=P, dropout_seed=SEED))
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    out.backward(g)
    grads = attn.sdpa_backward(arr(q), arr(k), arr(v), ref, lse, arr(g), dropout_p=P, dropout_seed=SEED,
                               dropout_origin=ORIGIN)
    for t, name, want in zip((q, k, v), ("dq", "dk", "dv"), grads):
        assert torch.equal(t.grad, torch.from_numpy(want)), name


def test_a_float_masks_gradient_takes_the_same_keep_mask():
    q, k, v = inputs(2)
    mask = torch.randn(2, 1, 7, 9, generator=torch.Generator().manual_seed(3), dtype=torch.float64,
                       requires_grad=True)
    out = at.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=P, dropout_seed=SEED,
                                          dropout_origin=ORIGIN)
    _, w = attn.sdpa(arr(q), arr(k), arr(v), attn_mask=arr(mask), dropout_p=P, dropout_seed=SEED,
                     dropout_origin=ORIGIN, return_weights=True)
    keep = torch.from_numpy(w != 0).double()  # the NumPy API's keep decisions (a softmax weight is > 0)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    out.backward(g)
    tq, tk, tv, tm = (t.detach().clone().requires_grad_() for t in (q, k, v, mask))
    ref = (torch.softmax(tq @ tk.transpose(-1, -2) / 8**0.5 + tm, -1) * keep / (1 - P)) @ tv
    ref.backward(g)
    # float64 throughout: a few ulps of the values (|out| and the gradients are O(1) here).
    assert torch.allclose(out, ref, rtol=0, atol=1e-12)
    for t, r, name in ((q, tq, "dq"), (k, tk, "dk"), (v, tv, "dv"), (mask, tm, "dmask")):
        assert torch.allclose(t.grad, r.grad, rtol=0, atol=1e-12), name


@pytest.mark.parametrize("origin", [(-1, 0, 0, 0), (0, 0, 2**32, 0), (0, 0, 0, 2**70), (1, 2, 3), "0000",
                                    (0, 0, 0.5, 0)])
@pytest.mark.parametrize("p", [P, 0.0])  # the numpy API checks the origin without dropout too
@pytest.mark.parametrize("grad", [False, True])  # the autograd Function's forward, or the core's call
def test_a_wrong_origin_is_the_numpy_apis_error(origin, p, grad):
    q, k, v = inputs()
    with pytest.raises((TypeError, ValueError)) as core:
        attn.sdpa(arr(q), arr(k), arr(v), dropout_p=p, dropout_seed=SEED, dropout_origin=origin)
    with torch.set_grad_enabled(grad), pytest.raises(core.type) as e:
        at.scaled_dot_product_attention(q, k, v, dropout_p=p, dropout_seed=SEED, dropout_origin=origin)
    assert str(e.value) == str(core.value)
    assert "dropout_origin" in str(e.value)
