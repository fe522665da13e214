"""The autograd Function of attn.torch.scaled_dot_product_attention.

forward keeps out, lse and the options (the dropout seed among them: attn regenerates the
dropout mask from it); backward calls attn's backward for dq, dk, dv, and dsinks when sinks
are given (softcap and ALiBi are options like any other: attn's backward applies them; ALiBi
slopes have no gradient, functional.py refuses slopes that require one). A float attn_mask that
requires grad gets dS = W∘(dO·Vᵀ) − P∘rowsum(dO∘O) summed to its shape, where P are the
softmax weights and W the dropped, rescaled ones that multiply V (both from attn's forward
with return_weights): that materializes (N, H, L, S), so it is done only when asked for.

Every tensor the backward reads — q, k, v, the mask (bool or float), the sinks and the returned
output — goes through ctx.save_for_backward: attn reads them in place, so a tensor changed in
place between forward and backward would silently give the gradients of another problem;
saved, it is torch's usual "modified by an inplace operation" error instead. (The option arrays
in ctx.opts are the Function's own copies: functional.py's _private.)
"""
import torch

import attn as _core  # the package: its calls name themselves in a MemoryError

from . import _convert

_HALF = {"torch.float16", "torch.bfloat16"}

_NO_DOUBLE_BACKWARD = (
    "attn.torch.scaled_dot_product_attention has no double backward: its gradients cannot be "
    "differentiated again (backward with create_graph=True: gradient penalties, Hessians, "
    "gradgradcheck). Compute those with torch's own attention, e.g. "
    "torch.softmax(q @ k.transpose(-1, -2) * scale + mask, -1) @ v")


def _mask_grad(q, k, v, float_mask, out, grad_out, opts):
    weights = _core.scaled_dot_product_attention(q, k, v, attn_mask=float_mask, return_weights=True, **opts)[1]
    w = _convert.tensor(weights)
    if opts["dropout_p"] > 0:
        p = _convert.tensor(_core.scaled_dot_product_attention(
            q, k, v, attn_mask=float_mask, return_weights=True, **dict(opts, dropout_p=0.0))[1])
    else:
        p = w
    value = _convert.tensor(v)
    if value.dim() >= 3 and value.size(-3) != w.size(-3):  # GQA: each KV head serves H/Hkv query heads
        value = value.repeat_interleave(w.size(-3) // value.size(-3), dim=-3)
    # dO, V and O may each be float16, bfloat16, float32 or float64 (out_dtype=, mixed inputs), and
    # torch's CPU matmul takes no float16 and no mixed dtypes: computed in float64 when any of them
    # (or the weights: a float64 query) is float64, else in float32 — the precision of attn's float32
    # backward, and half the memory of (N, H, L, S) in float64. The caller rounds the result once, to
    # the mask's dtype.
    ct = torch.float64 if torch.float64 in (grad_out.dtype, out.dtype, value.dtype, w.dtype) else torch.float32
    g, w_c = grad_out.to(ct), w.to(ct)
    d_weights = g @ value.to(ct).transpose(-1, -2)
    row = (g * out.to(ct)).sum(-1, keepdim=True)
    p_c = w_c if p is w else p.to(ct)
    return w_c * d_weights - p_c * row


def with_sinks(opts, sinks):
    """attn's options with the sinks tensor (an input of the Function, for its gradient) as the array it takes."""
    return opts if sinks is None else dict(opts, sinks=_convert.modifier_array(sinks, "sinks"))


class SdpaFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, query, key, value, attn_mask, sinks, opts, threads):
        q, k, v = _convert.array(query, "query"), _convert.array(key, "key"), _convert.array(value, "value")
        mask = None if attn_mask is None else _convert.array(attn_mask, "attn_mask")
        with _convert.Threads(threads):
            out, lse = _core.scaled_dot_product_attention(q, k, v, attn_mask=mask, return_lse=True,
                                                          **with_sinks(opts, sinks))
        result = _convert.tensor(out)
        # The output too (saving an output is allowed): backward reads its memory as attn's `out`,
        # so an in-place change of the result (out += b, relu_()) must be torch's error.
        ctx.save_for_backward(query, key, value, attn_mask, sinks, result)
        ctx.lse = lse  # attn's own array: nothing outside the Function can reach it
        ctx.opts, ctx.threads = opts, threads
        return result

    @staticmethod
    def backward(ctx, grad_out):
        # With create_graph=True torch runs backward with grad mode on and expects a
        # differentiable result; attn's backward is not (its gradients would be silently
        # treated as constants: a wrong gradient penalty, a zero Hessian).
        if torch.is_grad_enabled():
            raise RuntimeError(_NO_DOUBLE_BACKWARD)
        query, key, value, attn_mask, sinks, result = ctx.saved_tensors
        q, k, v = _convert.array(query, "query"), _convert.array(key, "key"), _convert.array(value, "value")
        mask = None if attn_mask is None else _convert.array(attn_mask, "attn_mask")
        out = _convert.array(result, "out")
        g = _convert.array(grad_out, "grad_out")
        opts = with_sinks(ctx.opts, sinks)
        with _convert.Threads(ctx.threads):
            # Without out_dtype the core gives each gradient its own input's dtype, as autograd
            # requires (docs/conventions.md, "The gradients' dtypes"), rounded once from its float32
            # (float64 with a float64 input) sums; all-bfloat16 keeps bf16 compute.
            back_opts = {n: x for n, x in opts.items() if n != "out_dtype"}
            try:
                grads = _core.scaled_dot_product_attention_backward(q, k, v, out, ctx.lse, g, attn_mask=mask,
                                                                    **back_opts)
            except TypeError as e:
                half = sorted({str(t.dtype) for t in (query, key, value, grad_out)} & _HALF)
                if half and "must be float32 or float64" in str(e):
                    raise TypeError(f"attn.torch: the gradients of {', '.join(half)} inputs need attn's 16-bit "
                                    f"backward, which this build's core does not have yet ({e}); compute in "
                                    "float32 for training") from None
                raise
            dq, dk, dv = (_convert.tensor(x) for x in grads[:3])
            dsinks = None
            if ctx.needs_input_grad[4]:  # attn's dsinks has q's dtype; the gradient has the sinks'
                dsinks = _convert.tensor(grads[3]).to(sinks.dtype)
            dmask = None
            if ctx.needs_input_grad[3]:  # a float mask that requires grad
                dmask = _mask_grad(q, k, v, mask, result, grad_out, opts).sum_to_size(attn_mask.shape).to(attn_mask.dtype)
        return dq, dk, dv, dmask, dsinks, None, None
