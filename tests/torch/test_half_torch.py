# attn.torch with torch.float16 / torch.bfloat16 tensors (issue 14): forward in and out in the
# tensor dtypes, out_dtype=, strided bfloat16 read in place, autograd where the core's backward
# takes 16-bit inputs. Oracle: torch_textbook in float64 on the rounded inputs; bound: the
# float32 one plus one rounding into a 16-bit output.
import pytest
import torch

import attn
import attn.torch as at
from torch_textbook import causal_keep, textbook

ATOL, RTOL = 2e-5, 2e-5
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


def waits(e):
    msg = str(e)
    if "declined" in msg or "float32 or float64" in msg or "16-bit backward" in msg:
        pytest.skip(f"waits for the 16-bit kernels (half_fwd/half_bwd): {msg[:200]}")
    raise e


@pytest.mark.parametrize("qd", [torch.float32] + HALF)
@pytest.mark.parametrize("kvd", [torch.float32] + HALF)
def test_forward_in_and_out(qd, kvd):
    q, k, v = inputs([qd, kvd, kvd])
    ref = textbook(q, k, v, keep=causal_keep(5, 21, True))
    try:
        out = at.scaled_dot_product_attention(q, k, v, is_causal=True, causal_alignment="bottom-right",
                                              enable_gqa=True, impl="reference")
    except (ValueError, TypeError) as e:
        waits(e)
    check(out, ref, qd)
    try:
        out = at.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    except (ValueError, TypeError) as e:
        waits(e)
    check(out, textbook(q, k, v), qd)


@pytest.mark.parametrize("out_dtype", [torch.float32] + HALF)
def test_out_dtype(out_dtype):
    q, k, v = inputs([torch.bfloat16] * 3, lq=3, lk=4)
    out = at.scaled_dot_product_attention(q, k, v, enable_gqa=True, impl="reference", out_dtype=out_dtype)
    check(out, textbook(q, k, v), out_dtype)


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
    try:
        out = at.scaled_dot_product_attention(q, k, v, enable_gqa=True, impl="reference")
        grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(2)).to(dtype)
        out.backward(grad)
    except (ValueError, TypeError) as e:
        waits(e)
    refs = [t.detach().double().requires_grad_() for t in (q, k, v)]
    textbook(*refs).backward(grad.double())
    for t, r in zip((q, k, v), refs):
        # The gradient in the input's dtype: fp32 math rounded once into it.
        check(t.grad, r.grad, dtype)
