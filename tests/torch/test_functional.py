# attn.torch.scaled_dot_product_attention against the float64 textbook: forward and
# gradients (torch.autograd.gradcheck in float64; attn's float32 against the float64
# reference), every mask kind, GQA, Lq != Lk, strided inputs read in place, dropout.
import numpy as np
import pytest
import torch

import attn
import attn.torch as at
from torch_textbook import causal_keep, lengths_keep, textbook, window_keep


def rand(*shape, dtype=torch.float64, grad=True):
    return torch.randn(*shape, dtype=dtype).requires_grad_(grad)


# name → (attn keywords, textbook keep/bias) for q (B=2, H=2, Lq=3), k/v (B=2, Hkv=1, Lk=5):
# small, for gradcheck's numerical Jacobian.
def cases():
    lq, lk = 3, 5
    bool_mask = torch.rand(2, 1, lq, lk) > 0.4
    bool_mask[..., 0] = True  # every row sees a key
    lengths = torch.tensor([2, 5])
    return {
        "none": ({}, None, None),
        "bool mask": ({"attn_mask": bool_mask}, bool_mask, None),
        "float mask": ({"attn_mask": "float"}, None, "float"),
        "causal": ({"is_causal": True}, causal_keep(lq, lk), None),
        "causal bottom-right": ({"is_causal": True, "causal_alignment": "bottom-right"},
                                causal_keep(lq, lk, True), None),
        "window": ({"window": (1, 2)}, window_keep(lq, lk, 1, 2), None),
        "key_lengths": ({"key_lengths": lengths}, lengths_keep(lengths, lq, lk), None),
        "causal + float mask": ({"is_causal": True}, causal_keep(lq, lk), "float"),
    }


def inputs(dtype, grad=True):
    torch.manual_seed(0)
    return rand(2, 2, 3, 4, dtype=dtype, grad=grad), rand(2, 1, 5, 4, dtype=dtype, grad=grad), \
        rand(2, 1, 5, 3, dtype=dtype, grad=grad)


def resolve(kw, bias_kind, dtype):
    """The float mask (requires grad) for the cases that use one."""
    kw = dict(kw)
    bias = None
    if bias_kind == "float":
        bias = torch.randn(1, 2, 3, 5, dtype=dtype).requires_grad_()
        kw["attn_mask"] = bias
    return kw, bias


@pytest.mark.parametrize("name", list(cases()))
def test_gradcheck_float64(name):
    kw, keep, bias_kind = cases()[name]
    q, k, v = inputs(torch.float64)
    kw, bias = resolve(kw, bias_kind, torch.float64)
    args = (q, k, v) + ((bias,) if bias is not None else ())

    def f(q, k, v, *b):
        extra = dict(kw)
        if b:
            extra["attn_mask"] = b[0]
        # One thread: gradcheck makes hundreds of tiny calls, and a 2-thread OpenMP region costs
        # milliseconds on a loaded machine. Thread counts are covered below.
        return at.scaled_dot_product_attention(q, k, v, enable_gqa=True, threads=1, **extra)

    ours = f(*args)
    ref = textbook(q, k, v, keep, bias)
    assert torch.allclose(ours, ref, atol=1e-12, rtol=1e-12), (ours - ref).abs().max()
    assert torch.autograd.gradcheck(f, args)
    # and the gradients against the textbook's
    g = torch.randn_like(ref)
    ours_g = torch.autograd.grad(ours, args, g)
    ref_g = torch.autograd.grad(ref, args, g)
    for a, b in zip(ours_g, ref_g):
        assert torch.allclose(a, b, atol=1e-11, rtol=1e-11), (a - b).abs().max()


@pytest.mark.parametrize("name", list(cases()))
def test_float32_against_float64(name):
    kw, keep, bias_kind = cases()[name]
    q, k, v = inputs(torch.float32)
    kw, bias = resolve(kw, bias_kind, torch.float32)
    ours = at.scaled_dot_product_attention(q, k, v, enable_gqa=True, **kw)
    assert ours.dtype == torch.float32
    ref = textbook(q, k, v, keep, bias)
    assert torch.allclose(ours.double(), ref, atol=2e-5, rtol=2e-5), (ours.double() - ref).abs().max()
    g = torch.randn_like(ref)
    args = (q, k, v) + ((bias,) if bias is not None else ())
    ours_g = torch.autograd.grad(ours, args, g.float())
    ref_g = torch.autograd.grad(ref, args, g)
    for a, b in zip(ours_g, ref_g):
        assert a.dtype == torch.float32
        assert torch.allclose(a.double(), b.double(), atol=1e-4, rtol=1e-4), (a.double() - b).abs().max()


def test_bool_and_float_mask_together():
    # A float mask holding -inf where a bool mask would say False: the same result.
    q, k, v = inputs(torch.float64, grad=False)
    keep = torch.rand(3, 5) > 0.5
    keep[:, 0] = True
    added = torch.zeros(3, 5, dtype=torch.float64).masked_fill(~keep, float("-inf"))
    a = at.scaled_dot_product_attention(q, k, v, attn_mask=keep, enable_gqa=True)
    b = at.scaled_dot_product_attention(q, k, v, attn_mask=added, enable_gqa=True)
    assert torch.allclose(a, b, atol=1e-14) and torch.allclose(a, textbook(q, k, v, keep), atol=1e-12)


def test_ranks_and_lq_ne_lk():
    for shape_q, shape_k in (((5, 8), (9, 8)), ((3, 5, 8), (3, 9, 8)), ((2, 3, 1, 8), (2, 3, 9, 8))):
        q, k, v = rand(*shape_q), rand(*shape_k), rand(*shape_k)
        out = at.scaled_dot_product_attention(q, k, v)
        assert out.shape == shape_q
        ref = textbook(q, k, v)
        assert torch.allclose(out, ref, atol=1e-12)
        for a, b in zip(torch.autograd.grad(out.sum(), (q, k, v)), torch.autograd.grad(ref.sum(), (q, k, v))):
            assert torch.allclose(a, b, atol=1e-11)


def test_strided_inputs_read_in_place():
    # Projections laid out (B, L, H, D) seen as (B, H, L, D), a sliced key, an expanded mask.
    x = torch.randn(2, 7, 3, 4, 8)
    q, k, v = (x[:, :, i].transpose(1, 2) for i in range(3))
    k = k[:, :, ::1]
    mask = (torch.rand(1, 1, 1, 7) > 0.3).expand(2, 4, 7, 7)
    mask = mask | torch.eye(7, dtype=torch.bool)
    before = attn._input_copies()
    out = at.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert attn._input_copies() == before
    assert not q.is_contiguous()
    assert torch.allclose(out.double(), textbook(q, k, v, mask), atol=2e-5)
    # and in the backward (grad_out from a transpose is strided too)
    qg = q.clone().requires_grad_()
    before = attn._input_copies()
    at.scaled_dot_product_attention(qg, k, v).transpose(1, 2).sum().backward()
    assert attn._input_copies() == before


def test_scale():
    q, k, v = inputs(torch.float64, grad=False)
    out = at.scaled_dot_product_attention(q, k, v, scale=0.3, enable_gqa=True)
    assert torch.allclose(out, textbook(q, k, v, scale=0.3), atol=1e-12)


def test_float_arguments_take_0dim_tensors_as_torch_does():
    # torch's argument parser reads a `float` argument (F.scaled_dot_product_attention's dropout_p
    # and scale in torch 2.x) from a 0-dim tensor that does not require grad, and refuses other
    # tensors; torch 1.13's native torch.dropout(input, float p, bool train) shows the rule.
    x = torch.ones(4)
    assert torch.equal(torch.dropout(x, torch.tensor(0.3), False), x)
    for refused in (torch.tensor([0.3]), torch.tensor(0.3, requires_grad=True)):
        with pytest.raises(TypeError):
            torch.dropout(x, refused, False)
    q, k, v = inputs(torch.float64, grad=False)
    for scale in (torch.tensor(0.3, dtype=torch.float64), torch.tensor(0.3), torch.tensor(2)):
        expected = at.scaled_dot_product_attention(q, k, v, scale=scale.item(), enable_gqa=True)
        assert torch.equal(at.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=True), expected)
    expected = at.scaled_dot_product_attention(q, k, v, dropout_p=0.25, dropout_seed=7, enable_gqa=True)
    got = at.scaled_dot_product_attention(q, k, v, dropout_p=torch.tensor(0.25), dropout_seed=7, enable_gqa=True)
    assert torch.equal(got, expected)
    for name in ("scale", "dropout_p"):
        for refused in (torch.tensor([0.25]), torch.tensor(0.25, requires_grad=True), torch.tensor(True)):
            with pytest.raises(TypeError) as e:
                at.scaled_dot_product_attention(q, k, v, enable_gqa=True, **{name: refused})
            assert str(e.value).startswith(f"{name}: expected a float"), str(e.value)


def test_enable_gqa_is_read_by_the_rule_of_every_bool_keyword():
    # is_causal (the core's bool rule) took NumPy's bool_ and said "is_causal: expected True or
    # False but got int 1"; enable_gqa, checked by a rule of its own, refused bool_ with "expected
    # a bool but got True", which hid the type at fault. One rule for both now.
    q, k, v = inputs(torch.float64, grad=False)  # 2 query heads, 1 KV head
    expected = at.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    got = at.scaled_dot_product_attention(q, k, v, is_causal=np.bool_(True), enable_gqa=np.bool_(True))
    assert torch.equal(got, expected)
    for name in ("is_causal", "enable_gqa"):
        with pytest.raises(TypeError) as e:
            at.scaled_dot_product_attention(q, k, v, **dict({"enable_gqa": True, name: 1}))
        assert str(e.value) == f"{name}: expected True or False but got int 1"


def test_dropout_seeded_by_torch():
    q, k, v = inputs(torch.float64)
    torch.manual_seed(5)
    a = at.scaled_dot_product_attention(q, k, v, dropout_p=0.3, enable_gqa=True)
    b = at.scaled_dot_product_attention(q, k, v, dropout_p=0.3, enable_gqa=True)
    torch.manual_seed(5)
    c = at.scaled_dot_product_attention(q, k, v, dropout_p=0.3, enable_gqa=True)
    assert torch.equal(a, c) and not torch.equal(a, b)
    assert not torch.allclose(a, at.scaled_dot_product_attention(q, k, v, enable_gqa=True))
    # The backward uses the forward's mask: gradcheck of one fixed seed.
    f = lambda q, k, v: at.scaled_dot_product_attention(q, k, v, dropout_p=0.3, dropout_seed=11,  # noqa: E731
                                                         enable_gqa=True, threads=1)
    assert torch.autograd.gradcheck(f, (q, k, v))
    bias = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    g = lambda q, k, v, b: at.scaled_dot_product_attention(q, k, v, b, dropout_p=0.3, dropout_seed=11,  # noqa: E731
                                                            enable_gqa=True, threads=1)
    assert torch.autograd.gradcheck(g, (q, k, v, bias))


def test_no_grad_needed_gives_no_graph():
    q, k, v = inputs(torch.float32)
    with torch.no_grad():
        assert at.scaled_dot_product_attention(q, k, v, enable_gqa=True).grad_fn is None
    assert at.scaled_dot_product_attention(q, k, v, enable_gqa=True).grad_fn is not None


def test_threads_follow_torch_and_are_given_back():
    q, k, v = inputs(torch.float32, grad=False)
    before = attn.get_num_threads()
    ref = at.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    for n in (1, 2, 3):
        out = at.scaled_dot_product_attention(q, k, v, enable_gqa=True, threads=n)
        assert torch.equal(out, ref)
        assert attn.get_num_threads() == before


@pytest.mark.parametrize("call, error, words", [
    (lambda q, k, v: at.sdpa(q.to("meta"), k, v), ValueError, ["query", "CPU", "meta"]),
    (lambda q, k, v: at.sdpa(q, k.int(), v), TypeError, ["key", "dtype", "torch.bfloat16", "got torch.int32"]),
    (lambda q, k, v: at.sdpa(q, k, v.to(torch.complex64)), TypeError, ["value", "complex64"]),  # bfloat16 is read since issue 14
    # attn.torch's own dtype words, not the core's list of the NumPy dtypes it reads (int32, bool)
    (lambda q, k, v: at.sdpa(q.to(torch.complex64), k, v), TypeError,
     ["query", "expected dtype torch.float32, torch.float64, torch.float16 or torch.bfloat16", "got torch.complex64"]),
    (lambda q, k, v: at.sdpa(q, k, v, attn_mask=torch.ones(5, 7, dtype=torch.uint8)), TypeError,
     ["attn_mask", "unsupported dtype uint8"]),
    (lambda q, k, v: at.sdpa(q, k, v[..., :6, :]), ValueError, ["V"]),
    (lambda q, k, v: at.sdpa(q, k[:, :1], v[:, :1]), ValueError, ["enable_gqa"]),
    (lambda q, k, v: at.sdpa(q.numpy(), k, v), TypeError, ["query", "torch.Tensor", "ndarray"]),
    (lambda q, k, v: at.sdpa(q, k, v, attn_mask=torch.ones(3, 3)), ValueError, ["mask"]),
    (lambda q, k, v: at.sdpa(q, k, v, attn_mask=torch.ones(5, 7, dtype=torch.int64)), TypeError, ["attn_mask"]),
    (lambda q, k, v: at.sdpa(q, k, v, dropout_p="0.1"), TypeError, ["dropout_p"]),
    (lambda q, k, v: at.sdpa(q, k, v, dropout_p=1.5), ValueError, ["dropout_p"]),
    (lambda q, k, v: at.sdpa(q, k, v, scale=1e-40), ValueError, ["sdpa: scale: must be 0 or a normal float32",
                                                                "but got 1e-40, a float32 subnormal"]),
    (lambda q, k, v: at.sdpa(q, k, v, is_causal="yes"), TypeError, ["is_causal"]),
    (lambda q, k, v: at.sdpa(q, k, v, threads="2"), TypeError, ["threads"]),
    (lambda q, k, v: at.sdpa(q, k, v, threads=-1), ValueError, ["threads: expected a thread count from 1 to 4096 (or 0 or None: torch.get_num_threads()) but got -1"]),
    (lambda q, k, v: at.sdpa(q, k, v, no_such_keyword=1), TypeError, ["no_such_keyword"]),
    (lambda q, k, v: at.sdpa(q, k, v, enable_gqa=1), TypeError, ["enable_gqa"]),
])
def test_errors_name_the_argument(call, error, words):
    q, k, v = torch.randn(2, 4, 5, 8), torch.randn(2, 4, 7, 8), torch.randn(2, 4, 7, 8)
    with pytest.raises(error) as e:
        call(q, k, v)
    for w in words:
        assert w in str(e.value), str(e.value)


class _Uint16View(torch.Tensor):
    """Stands in for a torch.uint16 tensor on a torch without that dtype (before 2.3): its NumPy
    form is uint16, as a real one's is."""

    def numpy(self):
        return self.as_subclass(torch.Tensor).numpy().view(np.uint16)


def _uint16_mask(shape):
    if hasattr(torch, "uint16"):
        return torch.zeros(shape, dtype=torch.uint16)
    return torch.zeros(shape, dtype=torch.int16).as_subclass(_Uint16View)


def test_a_uint16_tensor_is_not_read_as_bfloat16_bits():
    """bfloat16 crosses to the core as a uint16 array of its bits, under the dtype="bfloat16"
    every attn.torch call passes: a uint16 mask was read as a bfloat16 one and added to the scores,
    where every other integer mask is refused (it was refused too, by attn.torch's own mask rule,
    until the core's took over)."""
    q, k, v = torch.randn(1, 2, 3, 8), torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8)
    with pytest.raises(TypeError) as e:
        at.scaled_dot_product_attention(q, k, v, attn_mask=_uint16_mask((3, 5)))
    assert str(e.value).startswith("attn_mask: unsupported dtype "), str(e.value)
    assert "a uint16 tensor would be read as bfloat16" in str(e.value)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8, torch.int8])
def test_a_mask_dtype_is_refused_in_the_core_words(dtype):
    # Which dtypes a mask may have is the core's rule: attn.torch had its own check and wording
    # ("expected a bool or floating-point mask but got torch.int64"), the NumPy call another.
    q, k, v = torch.randn(2, 4, 5, 8), torch.randn(2, 4, 7, 8), torch.randn(2, 4, 7, 8)
    mask = torch.ones(5, 7, dtype=dtype)
    with pytest.raises(TypeError) as from_torch:
        at.sdpa(q, k, v, attn_mask=mask)
    with pytest.raises(TypeError) as from_numpy:
        attn.scaled_dot_product_attention(q.numpy(), k.numpy(), v.numpy(), attn_mask=mask.numpy())
    assert str(from_torch.value) == str(from_numpy.value)
    assert str(from_torch.value).startswith("attn_mask: ")


def test_thread_count_in_effect_during_the_call(monkeypatch):
    # The count attn's next call uses (attn.get_num_threads()) while the extension runs:
    # torch.get_num_threads() by default (threads=None or 0), `threads=` when given; the previous
    # count after.
    seen = []
    real = attn.scaled_dot_product_attention

    def spy(*args, **kwargs):
        seen.append(attn.get_num_threads())
        return real(*args, **kwargs)

    monkeypatch.setattr(attn, "scaled_dot_product_attention", spy)
    q, k, v = inputs(torch.float32, grad=False)
    torch_threads = torch.get_num_threads()
    before = attn.get_num_threads()
    try:
        for n in (1, 3):
            torch.set_num_threads(n)
            at.scaled_dot_product_attention(q, k, v, enable_gqa=True)
            assert seen[-1] == n
            at.scaled_dot_product_attention(q, k, v, enable_gqa=True, threads=0)
            assert seen[-1] == n
    finally:
        torch.set_num_threads(torch_threads)
    at.scaled_dot_product_attention(q, k, v, enable_gqa=True, threads=5)
    assert seen[-1] == 5 and attn.get_num_threads() == before


# Score modifiers through the autograd Function (docs/conventions.md, "Score modifiers"): sinks
# get a gradient, softcap and ALiBi shape the scores. Sinks and slopes are dyadic and gradcheck's
# step is 2^-12: the core keeps both in float32, so σ ± eps must be exact there for the numerical
# Jacobian to see the float64 function (a rounded step would be noise of ~1e-8/eps).
SINKS = (0.5, -1.25)
SLOPES = (0.5, 0.25)
EPS = 2.0 ** -12


def modifier_cases():
    lq, lk = 3, 5
    return {  # name → (attn keywords, textbook keywords, keep)
        "sinks": ({}, {}, None),
        "sinks + softcap": ({"softcap": 2.0}, {"softcap": 2.0}, None),
        "sinks + alibi": ({"alibi": True}, {"alibi": True}, None),
        "sinks + causal": ({"is_causal": True}, {}, causal_keep(lq, lk)),
        "sinks + softcap + alibi + causal bottom-right": (
            {"softcap": 2.0, "alibi": True, "is_causal": True, "causal_alignment": "bottom-right"},
            {"softcap": 2.0, "alibi": True}, causal_keep(lq, lk, True)),
        "softcap + alibi, no sinks": ({"softcap": 2.0, "alibi": True, "no_sinks": True},
                                      {"softcap": 2.0, "alibi": True}, None),
    }


def modifier_call(name):
    """(f, args, reference) for a case: f(q, k, v[, sinks]) through attn.torch, the textbook's output."""
    kw, ref_kw, keep = (dict(x) if isinstance(x, dict) else x for x in modifier_cases()[name])
    q, k, v = inputs(torch.float64)
    with_sinks = not kw.pop("no_sinks", False)
    if kw.pop("alibi", False):
        kw["alibi_slopes"] = torch.tensor(SLOPES, dtype=torch.float64)
        ref_kw["alibi"] = kw["alibi_slopes"]
    args = (q, k, v)
    if with_sinks:
        args += (torch.tensor(SINKS, dtype=torch.float64, requires_grad=True),)

    def f(q, k, v, *s):
        extra = dict(kw, sinks=s[0]) if s else kw
        return at.scaled_dot_product_attention(q, k, v, enable_gqa=True, threads=1, **extra)

    ref = textbook(q, k, v, keep, sinks=args[3] if with_sinks else None, **ref_kw)
    return f, args, ref


@pytest.mark.parametrize("name", list(modifier_cases()))
def test_modifiers_gradcheck_float64(name):
    f, args, ref = modifier_call(name)
    ours = f(*args)
    assert torch.allclose(ours, ref, atol=1e-12, rtol=1e-12), (ours - ref).abs().max()
    assert torch.autograd.gradcheck(f, args, eps=EPS)
    g = torch.randn_like(ref)
    for a, b in zip(torch.autograd.grad(ours, args, g), torch.autograd.grad(ref, args, g)):
        assert a.dtype == b.dtype
        assert torch.allclose(a, b, atol=1e-11, rtol=1e-11), (a - b).abs().max()


def test_sinks_float32_against_float64():
    q, k, v = inputs(torch.float32)
    sinks = torch.tensor(SINKS, dtype=torch.float32, requires_grad=True)
    ours = at.scaled_dot_product_attention(q, k, v, enable_gqa=True, sinks=sinks, softcap=2.0, is_causal=True)
    ref = textbook(q, k, v, causal_keep(3, 5), sinks=sinks, softcap=2.0)
    assert ours.dtype == torch.float32
    assert torch.allclose(ours.double(), ref, atol=2e-5, rtol=2e-5), (ours.double() - ref).abs().max()
    g = torch.randn_like(ref)
    args = (q, k, v, sinks)
    for a, b in zip(torch.autograd.grad(ours, args, g.float()), torch.autograd.grad(ref, args, g)):
        assert a.dtype == torch.float32
        assert torch.allclose(a.double(), b.double(), atol=1e-4, rtol=1e-4), (a.double() - b).abs().max()


def test_sink_gradient_alone_and_without_grad():
    # Only the sinks require grad: the Function still runs, and .grad lands on them alone.
    q, k, v = inputs(torch.float64, grad=False)
    sinks = torch.tensor(SINKS, dtype=torch.float64, requires_grad=True)
    out = at.scaled_dot_product_attention(q, k, v, enable_gqa=True, sinks=sinks)
    assert out.grad_fn is not None
    out.sum().backward()
    ref_sinks = sinks.detach().clone().requires_grad_()
    textbook(q, k, v, sinks=ref_sinks).sum().backward()
    assert torch.allclose(sinks.grad, ref_sinks.grad, atol=1e-12), (sinks.grad, ref_sinks.grad)
    # Detached sinks: the plain call, the same output, no graph.
    plain = at.scaled_dot_product_attention(q, k, v, enable_gqa=True, sinks=sinks.detach())
    assert plain.grad_fn is None and torch.allclose(plain, out, atol=1e-14)


def test_sinks_with_float_mask_gradient():
    # A float mask's gradient with a sink in the softmax: the sink takes mass, the formula holds.
    q, k, v = inputs(torch.float64)
    bias = torch.randn(1, 2, 3, 5, dtype=torch.float64).requires_grad_()
    sinks = torch.tensor(SINKS, dtype=torch.float64, requires_grad=True)
    f = lambda q, k, v, b, s: at.scaled_dot_product_attention(q, k, v, b, enable_gqa=True, threads=1,  # noqa: E731
                                                              sinks=s, softcap=2.0)
    args = (q, k, v, bias, sinks)
    assert torch.allclose(f(*args), textbook(q, k, v, bias=bias, sinks=sinks, softcap=2.0), atol=1e-12)
    assert torch.autograd.gradcheck(f, args, eps=EPS)


def test_alibi_slopes_requiring_grad_are_refused():
    q, k, v = inputs(torch.float64)
    slopes = torch.tensor(SLOPES, dtype=torch.float64, requires_grad=True)
    with pytest.raises(ValueError) as e:
        at.scaled_dot_product_attention(q, k, v, enable_gqa=True, alibi_slopes=slopes)
    assert "alibi_slopes" in str(e.value) and "detach" in str(e.value)
    with torch.no_grad():  # no gradient wanted: allowed
        at.scaled_dot_product_attention(q, k, v, enable_gqa=True, alibi_slopes=slopes)



# Tensors the backward reads again. attn reads them in place, so each must be either saved
# (torch's version check turns a change in place into its usual error) or copied.
def _options(what):
    """Fresh keywords of a call that passes `what` as a tensor."""
    return {
        "bool mask": {"attn_mask": torch.ones(4, 4, dtype=torch.bool)},
        "sinks": {"sinks": torch.tensor(SINKS)},  # float32: attn reads the tensor's own memory
        "key_lengths": {"key_lengths": torch.tensor([4])},
        "query_offset": {"query_offset": torch.tensor([0]), "is_causal": True},
        "alibi_slopes": {"alibi_slopes": torch.tensor(SLOPES)},  # float32, likewise
    }[what]


def _change_in_place(what, options):
    """The next micro-batch refilling the buffer before this one's backward."""
    if what == "bool mask":
        options["attn_mask"][:, 2:] = False
    elif what == "sinks":
        options["sinks"].add_(3.0)
    elif what == "key_lengths":
        options["key_lengths"].fill_(1)
    elif what == "query_offset":
        options["query_offset"].fill_(-3)
    else:
        options["alibi_slopes"].mul_(4.0)


def _changed_in_place(what):
    """(output, q, grad_out, dq of the unchanged problem), `what` changed after the forward."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 4, 8, requires_grad=True) for _ in range(3))
    g = torch.randn(1, 2, 4, 8)
    want = torch.autograd.grad(at.scaled_dot_product_attention(q, k, v, **_options(what)), q, g)[0]
    options = _options(what)
    out = at.scaled_dot_product_attention(q, k, v, **options)
    _change_in_place(what, options)
    return out, q, g, want


@pytest.mark.parametrize("what", ["bool mask", "sinks"])
def test_mask_or_sinks_changed_in_place_before_backward_is_torchs_error(what):
    out, q, g, _ = _changed_in_place(what)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        torch.autograd.grad(out, q, g)


@pytest.mark.parametrize("what", ["key_lengths", "query_offset", "alibi_slopes"])
def test_option_tensors_changed_after_forward_keep_the_forwards_gradient(what):
    # (N,)/(H,) options: the Function keeps copies, so the gradient is the forward's problem's.
    out, q, g, want = _changed_in_place(what)
    assert torch.equal(torch.autograd.grad(out, q, g)[0], want)


def test_output_changed_in_place_before_backward_is_torchs_error():
    # The backward reads the output's memory as attn's `out`: `out += 1` (relu_(), an in-place
    # dropout) before backward gave wrong gradients; now the output is saved and checked.
    q, k, v = inputs(torch.float32)
    out = at.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    out.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()
    # out of place is fine, and the float mask's gradient (which reads out too) still works
    bias = torch.randn(3, 5, requires_grad=True)
    (at.scaled_dot_product_attention(q, k, v, bias, enable_gqa=True) + 1.0).sum().backward()
    assert bias.grad is not None and torch.isfinite(bias.grad).all()


def test_double_backward_is_a_clear_error():
    # create_graph=True used to return gradients that silently did not depend on the inputs
    # (a wrong gradient penalty, a zero Hessian).
    q, k, v = inputs(torch.float64)
    f = lambda q, k, v: at.scaled_dot_product_attention(q, k, v, enable_gqa=True, threads=1)  # noqa: E731
    with pytest.raises(RuntimeError, match="no double backward.*torch's own attention"):
        torch.autograd.grad(f(q, k, v).sum(), q, create_graph=True)
    with pytest.raises(RuntimeError, match="no double backward"):
        torch.autograd.gradgradcheck(f, (q, k, v))
    with pytest.raises(RuntimeError, match="no double backward"):
        torch.autograd.functional.hessian(lambda q: f(q, k, v).pow(2).sum(), q)
    # an ordinary backward is unaffected
    assert torch.autograd.grad(f(q, k, v).sum(), q)[0].shape == q.shape


@pytest.mark.parametrize("grad", [False, True])
def test_return_scores_is_an_unexpected_keyword(grad):
    q, k, v = inputs(torch.float32, grad=grad)
    with pytest.raises(TypeError, match="unexpected keyword argument 'return_scores'"):
        at.scaled_dot_product_attention(q, k, v, enable_gqa=True, return_scores="scaled")


def test_unknown_keyword_lists_each_keyword_once():
    q, k, v = inputs(torch.float32, grad=False)
    with pytest.raises(TypeError) as e:
        at.scaled_dot_product_attention(q, k, v, enable_gqa=True, no_such_keyword=1)
    listed = str(e.value).split("takes ")[1].rstrip(")").split(", ")
    assert len(listed) == len(set(listed)), listed
    assert "threads" in listed and "window" in listed and "return_scores" not in listed, listed


@pytest.mark.parametrize("kw, keep", [
    ({}, None),
    ({"scale": 0.5}, None),
    ({"is_causal": True}, causal_keep(3, 4)),
    ({"attn_mask": "bool"}, "bool"),
])
def test_head_dim_zero_averages_the_visible_values(kw, keep):
    # E = 0: every score is the empty sum 0, so the weights are uniform over the visible keys
    # (torch: the mean of their values). attn.torch answered zeros.
    torch.manual_seed(0)
    q, k, v = rand(2, 2, 3, 0), rand(2, 2, 4, 0), rand(2, 2, 4, 5)
    if keep == "bool":
        keep = torch.tensor([[True, False, True, False], [False, True, True, True], [True, True, True, True]])
        kw = dict(kw, attn_mask=keep)
    out = at.scaled_dot_product_attention(q, k, v, **kw)
    ref = textbook(q, k, v, keep, scale=1.0)  # any scale: 0 · scale = 0
    assert torch.allclose(out, ref, atol=1e-12), (out - ref).abs().max()
    g = torch.randn_like(ref)
    for a, b in zip(torch.autograd.grad(out, (q, k, v), g), torch.autograd.grad(ref, (q, k, v), g)):
        assert a.shape == b.shape and torch.allclose(a, b, atol=1e-12)
    # float32, without autograd
    with torch.no_grad():
        out32 = at.scaled_dot_product_attention(q.float(), k.float(), v.float(), **kw)
    assert out32.dtype == torch.float32 and torch.allclose(out32.double(), ref, atol=1e-6)


@pytest.mark.parametrize("shapes, kw, error, words", [
    (((2, 2, 6, 9), (2, 2, 6, 8)), {}, ValueError, ["K: head dim 9", "Q's head dim 8"]),
    (((2, 2, 6, 8), (2, 2, 5, 8)), {}, ValueError, ["V: length 5", "K's length 6"]),
    (((2, 6, 8), (2, 6, 8)), {}, ValueError, ["key/value", "rank of query (4)", "(2, 6, 8)"]),
    (((1, 2, 6, 8), (1, 2, 6, 8)), {}, ValueError, ["K: batch 1", "Q's batch 2"]),
    (((2, 3, 6, 8), (2, 3, 6, 8)), {}, ValueError, ["enable_gqa"]),
    (((2, 3, 6, 8), (2, 3, 6, 8)), {"enable_gqa": True}, ValueError, ["Q: heads 2", "multiple of K/V's heads 3"]),
    (((2, 1, 6, 8), (2, 2, 6, 8)), {"enable_gqa": True}, ValueError, ["V: heads 2", "K's heads 1"]),
    (((2, 2, 6, 8), (2, 2, 6, 8)), {"dropout_p": 5.0}, ValueError, ["sdpa: dropout_p: must be in [0, 1) but got 5"]),
    (((2, 2, 6, 8), (2, 2, 6, 8)), {"attn_mask": torch.ones(3, 1, 6, dtype=torch.bool)}, ValueError,
     ["attn_mask: shape (3, 1, 6) cannot be broadcast", "dimension 0 is 3, expected 1 or 2"]),
    (((2, 2, 6, 8), (2, 2, 6, 8)), {"attn_mask": torch.ones(1, 1, 1, 1, 6)}, ValueError,
     ["attn_mask", "(rank 0 to 4)", "(1, 1, 1, 1, 6)"]),
    (((2, 2, 6, 8), (2, 2, 6, 8)), {"attn_mask": torch.ones(1, 6, dtype=torch.uint8)}, TypeError, ["attn_mask"]),
    (((2, 2, 6, 8), (2, 2, 6, 8)), {"no_such_keyword": 1}, TypeError, ["no_such_keyword"]),
])
def test_empty_calls_are_checked_like_any_other(shapes, kw, error, words):
    # No queries (L = 0): the core computes nothing, but the call is checked by its rules
    # (attn._check_sdpa) and refused in the words of the same call with queries (L = 3).
    k, v = (torch.randn(s) for s in shapes)
    for lq in (0, 3):
        with pytest.raises(error) as e:
            at.scaled_dot_product_attention(torch.randn(2, 2, lq, 8), k, v, **kw)
        for w in words:
            assert w in str(e.value), (lq, str(e.value))


@pytest.mark.parametrize("q_shape, mask_shape, layout", [
    ((3, 5, 8), (1, 3, 5, 6), "(H, Lq, Lk) (rank 0 to 3)"),
    ((3, 5, 8), (2, 3, 5, 6), "(H, Lq, Lk) (rank 0 to 3)"),
    ((5, 8), (1, 5, 6), "(Lq, Lk) (rank 0 to 2)"),
    ((5, 8), (1, 1, 1, 6), "(Lq, Lk) (rank 0 to 2)"),
    ((3, 0, 8), (1, 3, 0, 6), "(H, Lq, Lk) (rank 0 to 3)"),  # an empty call: the same rule
])
@pytest.mark.parametrize("kind", [torch.bool, torch.float64])
def test_a_mask_of_higher_rank_than_the_query_is_refused(q_shape, mask_shape, layout, kind):
    # The result has the query's shape; a mask of higher rank would broadcast the scores past it.
    # torch 2.x refuses such a mask (its math path adds the mask to the scores in place: "output
    # with shape [3, 5, 6] doesn't match the broadcast shape [1, 3, 5, 6]"); attn returned a
    # result of the query's shape, as if the mask's leading 1s were not there.
    q = rand(*q_shape)
    k, v = rand(*q_shape[:-2], 6, 8), rand(*q_shape[:-2], 6, 4)
    torch.manual_seed(0)
    if kind == torch.bool:
        mask = torch.rand(mask_shape) > 0.3
        mask[..., 0] = True  # a visible key in every row (torch 1.13's softmax: NaN otherwise)
    else:
        mask = torch.randn(mask_shape, dtype=kind)
    expected = f"attn_mask: expected a mask broadcastable to query's {layout} but got shape {mask_shape}"
    with pytest.raises(ValueError) as e:
        at.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert str(e.value) == expected
    with pytest.raises(ValueError) as e:  # the NumPy module: the same rule
        attn.scaled_dot_product_attention(*(t.detach().numpy() for t in (q, k, v)), attn_mask=mask.numpy())
    assert str(e.value) == expected
    # The same mask without its extra leading dims is taken, and gives torch's result.
    if q.numel():
        fit = mask.reshape(mask_shape[-len(q_shape):]) if mask_shape[0] == 1 else mask[0]
        out = at.scaled_dot_product_attention(q, k, v, attn_mask=fit)
        assert out.shape == q_shape[:-1] + (4,)
        assert torch.allclose(out, textbook(q, k, v, fit if kind == torch.bool else None,
                                            bias=None if kind == torch.bool else fit), atol=1e-12)


@pytest.mark.parametrize("p", [1.5, -0.1, 1, float("nan")])
def test_dropout_p_out_of_range_in_the_numpy_apis_words(p):
    # attn's rule for a probability and its words, as attn.scaled_dot_product_attention's (it was
    # attn.torch's own "dropout_p: expected a float in [0, 1) but got …").
    q = torch.randn(1, 2, 4, 8)
    with pytest.raises(ValueError) as e:
        at.scaled_dot_product_attention(q, q, q, dropout_p=p)
    with pytest.raises(ValueError) as core:
        attn.scaled_dot_product_attention(q.numpy(), q.numpy(), q.numpy(), dropout_p=p, dropout_seed=1)
    assert str(e.value) == str(core.value) == f"sdpa: dropout_p: must be in [0, 1) but got {p}"


def test_dropout_p_past_floats_range_is_out_of_range():
    # An int too large for a float is out of [0, 1) too: a ValueError, not float()'s OverflowError.
    q = torch.randn(1, 2, 4, 8)
    for p, shown in ((10**400, "inf"), (-10**400, "-inf")):
        with pytest.raises(ValueError) as e:
            at.scaled_dot_product_attention(q, q, q, dropout_p=p)
        assert str(e.value) == f"sdpa: dropout_p: must be in [0, 1) but got {shown}"


def test_empty_calls_that_are_right_still_answer():
    q = torch.randn(2, 2, 0, 8)
    assert at.scaled_dot_product_attention(q, torch.randn(2, 2, 6, 8), torch.randn(2, 2, 6, 3),
                                           attn_mask=torch.ones(2, 1, 0, 6, dtype=torch.bool)).shape == (2, 2, 0, 3)
    assert at.scaled_dot_product_attention(q, torch.randn(2, 1, 6, 8), torch.randn(2, 1, 6, 3),
                                           enable_gqa=True, dropout_p=0.5).shape == (2, 2, 0, 3)


def test_no_keys_gives_zeros_and_zero_gradients_to_every_input():
    # A float mask (with -inf) and sinks that require grad get zero gradients, not None or NaN.
    q = rand(2, 2, 3, 4)
    k, v = rand(2, 2, 0, 4), rand(2, 2, 0, 5)
    bias = torch.full((3, 1), float("-inf"), dtype=torch.float64, requires_grad=True)
    sinks = torch.tensor(SINKS, dtype=torch.float64, requires_grad=True)
    out = at.scaled_dot_product_attention(q, k, v, bias, sinks=sinks)
    assert out.shape == (2, 2, 3, 5) and torch.equal(out, torch.zeros_like(out))
    out.sum().backward()
    for t in (q, bias, sinks):
        assert t.grad is not None and torch.equal(t.grad, torch.zeros_like(t)), t.grad


@pytest.mark.parametrize("q_shape, k_shape, v_shape", [
    ((2, 2, 3, 0), (2, 2, 4, 0), (2, 2, 4, 5)),  # head dim 0: the mean of the values
    ((2, 2, 3, 8), (2, 2, 0, 8), (2, 2, 0, 5)),  # no keys: zeros
    ((2, 0, 3, 8), (2, 0, 4, 8), (2, 0, 4, 5)),  # no heads: an empty result
])
def test_empty_calls_run_with_impl_decode(q_shape, k_shape, v_shape):
    # An empty K or V reaches the core's checks as a NumPy array with strides 0, which the decode
    # kernel's unit-stride rule took for "strided along the head dim": impl="decode" refused calls
    # it answers with data (and the head-dim-0 call, padded to one column, ran before _check_sdpa
    # saw it unpadded).
    torch.manual_seed(0)
    q, k, v = (torch.randn(s) for s in (q_shape, k_shape, v_shape))
    out = at.scaled_dot_product_attention(q, k, v, impl="decode")
    ref = textbook(q.double(), k.double(), v.double(), None, scale=1.0)
    assert out.shape == ref.shape and torch.allclose(out.double(), ref, atol=1e-6), (out, ref)
