# attn.torch on empty inputs (a dim of size 0): the core has nothing to compute and refuses
# size-0 dims, so attn.torch answers such calls itself — but after every check the same call with
# data gets, in the same words. The option keywords only the core checks (softcap, window,
# dropout_origin, ...) were accepted silently on an empty call and refused on one with data.
import math

import pytest
import torch

import attn.torch as at
from torch_textbook import textbook

B, H, LQ, LK, E, EV = 2, 2, 3, 5, 4, 6


def tensors(lq=LQ, lk=LK, b=B, h=H, grad=False):
    g = torch.Generator().manual_seed(lq * 10 + lk)
    shapes = ((b, h, lq, E), (b, h, lk, E), (b, h, lk, EV))
    return [torch.randn(s, generator=g, dtype=torch.float64).requires_grad_(grad) for s in shapes]


# Each refused as a call with data refuses it; none of the messages names Lq or Lk, so the call
# with data (LQ queries, LK keys) and the empty one must say the very same words.
BAD = [
    {"softcap": -1.0},
    {"softcap": float("inf")},
    {"window": (-2, 0)},
    {"window": "ab"},
    {"window_alignment": "middle"},
    {"causal_alignment": "x", "is_causal": True},
    {"dropout_origin": (-1, 0, 0, 0)},
    {"dropout_origin": (0, 0, 0.5, 0)},
    {"dropout_origin": (1, 2, 3)},
    {"impl": "nope"},
    {"impl": "flash"},  # float64: the flash kernel cannot run the call (the message names no size)
    {"impl": "decode"},
    {"scale": float("inf")},
    {"query_offset": 2**62},
    {"key_lengths": torch.tensor([1, 2, 3])},
    {"sinks": torch.zeros(3)},
    {"sinks": torch.tensor([0.0, math.inf])},
    {"alibi_slopes": torch.ones(H + 1)},
    {"dropout_p": 0.2, "dropout_seed": -1},
    {"threads": -1},
    {"out_dtype": torch.int32},
]


@pytest.mark.parametrize("kw", BAD, ids=lambda kw: ",".join(kw))
@pytest.mark.parametrize("empty", ["no queries", "no keys"])
@pytest.mark.parametrize("grad", [False, True])  # the autograd Function's way, or the plain call's
def test_an_empty_call_refuses_what_a_call_with_data_refuses(kw, empty, grad):
    with pytest.raises((TypeError, ValueError)) as full:
        at.scaled_dot_product_attention(*tensors(grad=grad), **kw)
    lq, lk = (0, LK) if empty == "no queries" else (LQ, 0)
    with pytest.raises(full.type) as e:
        at.scaled_dot_product_attention(*tensors(lq, lk, grad=grad), **kw)
    assert str(e.value) == str(full.value)


def test_key_lengths_out_of_range_are_refused_without_queries():
    # The keys are there (Lk = 5): an entry past them is as wrong as with queries.
    kw = {"key_lengths": torch.tensor([1, 99])}
    with pytest.raises(ValueError) as full:
        at.scaled_dot_product_attention(*tensors(), **kw)
    with pytest.raises(ValueError) as e:
        at.scaled_dot_product_attention(*tensors(lq=0), **kw)
    assert str(e.value) == str(full.value) == "sdpa: key_lengths: entry 1 must be in [0, Lk=5] but got 99"


def test_an_empty_batch_still_checks_the_options():
    q, k, v = tensors(b=0)
    with pytest.raises(ValueError, match="^sdpa: softcap: must be 0 "):
        at.scaled_dot_product_attention(q, k, v, softcap=-1.0)
    with pytest.raises(ValueError, match=r"^sdpa: dropout_origin.row: must be >= 0 .* but got -1$"):
        at.scaled_dot_product_attention(q, k, v, dropout_origin=(0, 0, -1, 0))


# Valid options on empty inputs: still torch's answer (the math formula in torch, as torch 1.13
# has no F.scaled_dot_product_attention), with gradients of every input's shape.
GOOD = [
    {},
    {"softcap": 30.0, "window": (2, 1), "is_causal": True, "causal_alignment": "bottom-right"},
    {"dropout_p": 0.3, "dropout_seed": 7, "dropout_origin": (1, 2, 3, 4)},
    {"alibi_slopes": True},  # no heads: no slopes (attn.alibi_slopes(0) refuses 0 heads)
    {"key_lengths": torch.tensor([0, 0]), "query_offset": 3, "threads": 1},
]
EMPTY = {"no queries": dict(lq=0), "no keys": dict(lk=0), "no batch": dict(b=0), "no heads": dict(h=0)}


@pytest.mark.parametrize("kw", GOOD, ids=lambda kw: ",".join(kw) or "plain")
@pytest.mark.parametrize("empty", list(EMPTY))
def test_valid_empty_calls_answer_as_the_math_formula(kw, empty):
    if "key_lengths" in kw and empty == "no batch":
        kw = dict(kw, key_lengths=torch.tensor([], dtype=torch.int64))
    q, k, v = tensors(grad=True, **EMPTY[empty])
    out = at.scaled_dot_product_attention(q, k, v, **kw)
    ref = textbook(q, k, v, scale=1.0)  # every row sees no key, or there is no row: any mask gives this
    assert out.shape == ref.shape and out.dtype == ref.dtype and torch.equal(out, ref)
    g = torch.ones_like(ref)
    got = torch.autograd.grad(out, (q, k, v), g)
    want = torch.autograd.grad(ref, (q, k, v), g)
    for a, b, name in zip(got, want, ("dq", "dk", "dv")):
        assert a.shape == b.shape and torch.equal(a, b), name
