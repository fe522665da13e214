# attn.torch with torch.float16 / torch.bfloat16 tensors (issue 14): forward in and out in the
# tensor dtypes, out_dtype=, strided bfloat16 read in place, autograd where the core's backward
# takes 16-bit inputs. Oracle: torch_textbook in float64 on the rounded inputs; bound: the
# float32 one plus one rounding into a 16-bit output.
import pytest
import torch

import attn
import attn.torch as at
from torch_textbook import causal_keep, textbook

ATOL, RTOL = 1e-5, 1e-5  # docs/conventions.md, "16-bit inputs and outputs"
HALF_ULP = {torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8, torch.float32: 0.0, torch.float64: 0.0}
HALF = [torch.float16, torch.bfloat16]


def check(ours, ref, dtype):
    assert ours.dtype == dtype, (ours.dtype, dtype)
    ours = ours.double()
    f32 = ATOL + RTOL * ref.abs()
    bound = f32 + HALF_ULP[dtype] * (ref.abs() + f32)
    err = (ours - ref).abs()
    assert torch.isfinite(ours).all()
    assert (err <= bound).all(), f"max err {err.max():.3g}, worst excess {(err - bound).max():.3g}"


def inputs(dtypes, lq=5, lk=21, d=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    shapes = [(2, 4, lq, d), (2, 2, lk, d), (2, 2, lk, d)]
    return [torch.randn(*s, generator=g).to(dt) for s, dt in zip(shapes, dtypes)]


@pytest.mark.parametrize("qd", [torch.float32] + HALF)
@pytest.mark.parametrize("kvd", [torch.float32] + HALF)
def test_forward_in_and_out(qd, kvd):
    q, k, v = inputs([qd, kvd, kvd])
    ref = textbook(q, k, v, keep=causal_keep(5, 21, True))
    out = at.scaled_dot_product_attention(q, k, v, is_causal=True, causal_alignment="bottom-right",
                                          enable_gqa=True, impl="reference")
    check(out, ref, qd)
    out = at.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    check(out, textbook(q, k, v), qd)


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.float64] + HALF)
def test_out_dtype(out_dtype):
    q, k, v = inputs([torch.bfloat16] * 3, lq=3, lk=4)
    out = at.scaled_dot_product_attention(q, k, v, enable_gqa=True, impl="reference", out_dtype=out_dtype)
    check(out, textbook(q, k, v), out_dtype)


def test_float64_out_keeps_the_references_double_result_and_trains():
    # out_dtype=torch.float64 (the core's "float64", docs/conventions.md "The CLI's output dtype"):
    # the reference on float32 inputs computes in double, so out has the float64 inputs' result;
    # the gradients still come back in the inputs' dtypes.
    q, k, v = (t.requires_grad_() for t in inputs([torch.float32] * 3, lq=3, lk=4))
    out = at.scaled_dot_product_attention(q, k, v, enable_gqa=True, impl="reference", out_dtype=torch.float64)
    ref = textbook(*(t.detach().double().requires_grad_() for t in (q, k, v)))
    assert out.dtype == torch.float64 and (out - ref).abs().max() <= 1e-12 * ref.abs().max()
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    out.backward(grad)
    refs = [t.detach().double().requires_grad_() for t in (q, k, v)]
    textbook(*refs).backward(grad)
    for t, r in zip((q, k, v), refs):
        check(t.grad, r.grad, torch.float32)


def test_bad_out_dtype():
    q, k, v = inputs([torch.float32] * 3, lq=2, lk=3)
    with pytest.raises(TypeError, match="out_dtype: expected torch.float32"):
        at.scaled_dot_product_attention(q, k, v, enable_gqa=True, out_dtype=torch.int8)
    with pytest.raises(TypeError, match="out_dtype: expected"):
        at.scaled_dot_product_attention(q, k, v, enable_gqa=True, out_dtype="float16")


def test_strided_bfloat16_is_read_in_place():
    g = torch.Generator().manual_seed(1)
    qkv = torch.randn(2, 9, 3, 4, 8, generator=g).to(torch.bfloat16)  # (N, L, 3, H, Dh)
    q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))      # (N, H, L, Dh) views
    before = attn._input_copies()
    out = at.scaled_dot_product_attention(q, k, v, impl="reference")
    assert attn._input_copies() == before
    check(out, textbook(q, k, v), torch.bfloat16)


@pytest.mark.parametrize("dtype", HALF)
def test_autograd(dtype):
    q, k, v = (t.requires_grad_() for t in inputs([dtype] * 3, lq=4, lk=6))
    out = at.scaled_dot_product_attention(q, k, v, enable_gqa=True, impl="reference")
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(2)).to(dtype)
    out.backward(grad)
    refs = [t.detach().double().requires_grad_() for t in (q, k, v)]
    textbook(*refs).backward(grad.double())
    for t, r in zip((q, k, v), refs):
        # The gradient in the input's dtype: fp32 math rounded once into it.
        check(t.grad, r.grad, dtype)


@pytest.mark.parametrize("qd, kvd", [(torch.bfloat16, torch.float32), (torch.float16, torch.float32),
                                     (torch.float32, torch.bfloat16), (torch.float16, torch.bfloat16),
                                     (torch.bfloat16, torch.float16), (torch.float32, torch.float64),
                                     (torch.bfloat16, torch.float64)])
def test_autograd_mixed_dtypes_round_each_gradient_once(qd, kvd):
    # Each gradient is the float32 one (float64 when an input is) rounded once into its own input's
    # dtype, whatever q's dtype (out and dO float32 here, so the only 16-bit terms are the inputs and
    # that rounding).
    q, k, v = (t.requires_grad_() for t in inputs([qd, kvd, kvd], lq=4, lk=6))
    out = at.scaled_dot_product_attention(q, k, v, enable_gqa=True, out_dtype=torch.float32)
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(2))
    out.backward(grad)
    refs = [t.detach().double().requires_grad_() for t in (q, k, v)]
    textbook(*refs).backward(grad.double())
    for t, r in zip((q, k, v), refs):
        check(t.grad, r.grad, t.dtype)
        if t.dtype == torch.float64:  # the reference backward's double, not a float32 rounding
            assert (t.grad - r.grad).abs().max() <= 1e-12 * r.grad.abs().max()


def test_autograd_bfloat16_value_gradient_beyond_float16_range():
    # float16 q, bfloat16 k/v: dV of key 0 is Σ_i dO_i = 4 · 60000, past float16's 65504 but a
    # bfloat16 (239616); through q's float16 it was inf.
    q = torch.zeros(1, 1, 4, 8, dtype=torch.float16, requires_grad=True)
    k = torch.zeros(1, 1, 4, 8, dtype=torch.bfloat16, requires_grad=True)
    v = torch.ones(1, 1, 4, 8, dtype=torch.bfloat16, requires_grad=True)
    keep = torch.zeros(4, 4, dtype=torch.bool)
    keep[:, 0] = True  # every query sees key 0 alone
    out = at.scaled_dot_product_attention(q, k, v, attn_mask=keep)
    out.backward(torch.full_like(out, 60000.0))
    assert v.grad.dtype == torch.bfloat16
    assert (v.grad[0, 0, 0] == torch.tensor(240000.0).to(torch.bfloat16)).all(), v.grad[0, 0, 0]
    assert (v.grad[0, 0, 1:] == 0).all()


@pytest.mark.parametrize("mask_kind", ["float32", "bfloat16", "bool", "float32+padding"])
def test_multihead_attention_bfloat16_with_masks(mask_kind):
    """bf16 activations and weights with a float (float32 or bf16) or bool attn_mask, as torch 1.13's
    nn.MultiheadAttention takes them: the additive mask reaches attn in float32 (attn refuses 16-bit
    masks), the weights come back in bf16. Oracle: the same module in float64 on the bf16 values;
    bound: bf16 projections (torch's) dominate, a few bf16 ulps of the output's scale. The masks move
    the output by far more than the bound (checked), so a dropped or mis-cast mask fails."""
    torch.manual_seed(3)
    e, h, n, lq = 32, 4, 2, 9
    ours = at.MultiheadAttention(e, h, batch_first=True).to(torch.bfloat16).eval()
    ref = torch.nn.MultiheadAttention(e, h, batch_first=True).double().eval()
    ref.load_state_dict({k: v.double() for k, v in ours.state_dict().items()})
    x = torch.randn(n, lq, e).to(torch.bfloat16)
    float_mask = torch.randn(lq, lq) * 4.0
    float_mask[0, 1:] = float("-inf")  # a row that sees one key
    padding = None
    if mask_kind == "bool":
        mask = torch.rand(lq, lq) > 0.6
        mask.fill_diagonal_(False)
    else:
        mask = float_mask.to(torch.bfloat16) if mask_kind == "bfloat16" else float_mask
        if mask_kind == "float32+padding":
            padding = torch.zeros(n, lq, dtype=torch.bool)
            padding[1, 5:] = True
    out, w = ours(x, x, x, attn_mask=mask, key_padding_mask=padding)
    ref_mask = mask if mask.dtype == torch.bool else mask.double()
    ref_out, ref_w = ref(x.double(), x.double(), x.double(), attn_mask=ref_mask, key_padding_mask=padding)
    unmasked, _ = ref(x.double(), x.double(), x.double())
    assert out.dtype == torch.bfloat16 and w.dtype == torch.bfloat16
    scale = ref_out.abs().max().item()
    err = (out.double() - ref_out).abs().max().item()
    assert err <= 2.0 ** -5 * scale, (err, scale)
    assert (w.double() - ref_w).abs().max().item() <= 2.0 ** -6
    assert (unmasked - ref_out).abs().max().item() > 8 * 2.0 ** -5 * scale  # the mask matters


@pytest.mark.parametrize("dtypes, out_dtype", [
    ((torch.float16,) * 3, None),
    ((torch.bfloat16,) * 3, torch.float32),
    ((torch.float32,) * 3, torch.bfloat16),
    ((torch.float32, torch.float32, torch.float64), None),
    ((torch.float32, torch.float16, torch.float16), None),
])
def test_float_mask_gradient_with_any_dtypes(dtypes, out_dtype):
    # The mask's gradient is computed in float32 (float64 when a tensor is) and rounded once to the mask's dtype: with 16-bit,
    # mixed or out_dtype= tensors it raised torch's "expected scalar type …" or "bmm not
    # implemented for 'Half'" (an exploratory test found it).
    q, k, v = (t.requires_grad_() for t in inputs(list(dtypes), lq=4, lk=6))
    mask = torch.randn(4, 6, generator=torch.Generator().manual_seed(3), requires_grad=True)
    kw = {} if out_dtype is None else {"out_dtype": out_dtype}
    out = at.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True, **kw)
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(4))
    out.float().backward(grad)
    assert mask.grad is not None and mask.grad.dtype == mask.dtype
    m64 = mask.detach().double().requires_grad_()
    textbook(q.detach(), k.detach(), v.detach(), bias=m64).backward(grad.double())
    # 16-bit tensors (or a 16-bit out, which the mask gradient reads) round the terms: 1 % of
    # the largest entry; float32/float64 everything: the float32 bound.
    half = any(t in HALF for t in dtypes) or out_dtype in HALF
    tol = (1e-2 if half else 1e-5) * float(m64.grad.abs().max())
    err = float((mask.grad.double() - m64.grad).abs().max())
    assert err <= tol, (err, tol)


@pytest.mark.parametrize("dtype", HALF)
def test_sixteen_bit_sinks_and_slopes(dtype):
    # A model moved to 16 bits (.to(torch.bfloat16), .half()) holds its sinks and ALiBi slopes in 16
    # bits: they are widened, exactly, to the core's float32 (they were refused: float16 as "dtype
    # must be float32", bfloat16 with a message about uint16 bits).
    sinks = torch.tensor([0.5, -1.0, 2.0, 0.25]).to(dtype).requires_grad_()
    slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625]).to(dtype)
    q, k, v = inputs([dtype] * 3)
    out = at.scaled_dot_product_attention(q, k, v, enable_gqa=True, sinks=sinks, alibi_slopes=slopes)
    check(out, textbook(q, k, v, sinks=sinks.detach().double(), alibi=slopes.double()), dtype)
    # The sinks' gradient has their dtype: the float32 backward's bound (float32 activations, so
    # that O is not rounded to 16 bits: conventions.md) plus one rounding into that dtype.
    q, k, v = (t.requires_grad_() for t in inputs([torch.float32] * 3))
    out = at.scaled_dot_product_attention(q, k, v, enable_gqa=True, sinks=sinks, alibi_slopes=slopes)
    ref_sinks = sinks.detach().double().requires_grad_()
    ref = textbook(q.detach(), k.detach(), v.detach(), sinks=ref_sinks, alibi=slopes.double())
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(5))
    out.backward(grad)
    ref.backward(grad.double())
    assert sinks.grad is not None and sinks.grad.dtype == dtype
    bound = 2e-5 * float(ref_sinks.grad.abs().max()) + HALF_ULP[dtype] * ref_sinks.grad.abs()
    assert ((sinks.grad.double() - ref_sinks.grad).abs() <= bound).all(), (sinks.grad, ref_sinks.grad)
