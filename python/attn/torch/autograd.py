"""The autograd Function of attn.torch.scaled_dot_product_attention.

forward keeps out, lse and the options (the dropout seed among them: attn regenerates the
dropout mask from it); backward calls attn's backward for dq, dk, dv, and dsinks when sinks
are given (softcap and ALiBi are options like any other: attn's backward applies them; ALiBi
slopes have no gradient, functional.py refuses slopes that require one). A float attn_mask that
requires grad gets dS = W∘(dO·Vᵀ) − P∘rowsum(dO∘O) summed to its shape, where P are the
softmax weights and W the dropped, rescaled ones that multiply V (both from attn's forward
with return_weights): that materializes (N, H, L, S), so it is done only when asked for.
"""
import torch
from torch.autograd.function import once_differentiable

from .. import _attn
from . import _convert

_HALF = {"torch.float16", "torch.bfloat16"}


def _mask_grad(q, k, v, float_mask, out, grad_out, opts):
    weights = _attn.scaled_dot_product_attention(q, k, v, attn_mask=float_mask, return_weights=True, **opts)[1]
    w = _convert.tensor(weights)
    if opts["dropout_p"] > 0:
        p = _convert.tensor(_attn.scaled_dot_product_attention(
            q, k, v, attn_mask=float_mask, return_weights=True, **dict(opts, dropout_p=0.0))[1])
    else:
        p = w
    value = _convert.tensor(v)
    if value.dim() >= 3 and value.size(-3) != w.size(-3):  # GQA: each KV head serves H/Hkv query heads
        value = value.repeat_interleave(w.size(-3) // value.size(-3), dim=-3)
    d_weights = grad_out @ value.transpose(-1, -2)
    row = (grad_out * out).sum(-1, keepdim=True)
    return w * d_weights - p * row


class SdpaFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, query, key, value, float_mask, sinks, bool_mask, opts, threads):
        q, k, v = _convert.array(query, "query"), _convert.array(key, "key"), _convert.array(value, "value")
        mask = _convert.array(float_mask, "attn_mask") if float_mask is not None else bool_mask
        if sinks is not None:  # an input of the Function (for its gradient), an option of attn
            opts = dict(opts, sinks=_convert.modifier_array(sinks, "sinks"))
        with _convert.Threads(threads):
            out, lse = _attn.scaled_dot_product_attention(q, k, v, attn_mask=mask, return_lse=True, **opts)
        ctx.save_for_backward(query, key, value, float_mask)
        ctx.sinks_dtype = None if sinks is None else sinks.dtype
        ctx.arrays = (out, lse, bool_mask)
        ctx.opts, ctx.threads = opts, threads
        return _convert.tensor(out)

    @staticmethod
    @once_differentiable  # attn has no double backward: create_graph=True through it is an error
    def backward(ctx, grad_out):
        query, key, value, float_mask = ctx.saved_tensors
        out, lse, bool_mask = ctx.arrays
        q, k, v = _convert.array(query, "query"), _convert.array(key, "key"), _convert.array(value, "value")
        mask = _convert.array(float_mask, "attn_mask") if float_mask is not None else bool_mask
        g = _convert.array(grad_out, "grad_out")
        with _convert.Threads(ctx.threads):
            # The gradients in q's dtype (the core's out_dtype is for out and dq/dk/dv alike),
            # then each in its input's dtype, as autograd requires.
            back_opts = {n: x for n, x in ctx.opts.items() if n != "out_dtype"}
            try:
                grads = _attn.scaled_dot_product_attention_backward(q, k, v, out, lse, g, attn_mask=mask, **back_opts)
            except TypeError as e:
                half = sorted({str(t.dtype) for t in (query, key, value, grad_out)} & _HALF)
                if half and "must be float32 or float64" in str(e):
                    raise TypeError(f"attn.torch: the gradients of {', '.join(half)} inputs need attn's 16-bit "
                                    f"backward, which this build's core does not have yet ({e}); compute in "
                                    "float32 for training") from None
                raise
            dq, dk, dv = (_convert.tensor(x).to(t.dtype) for x, t in zip(grads[:3], (query, key, value)))
            dsinks = None
            if ctx.needs_input_grad[4]:  # attn's dsinks has q's dtype; the gradient has the sinks'
                dsinks = _convert.tensor(grads[3]).to(ctx.sinks_dtype)
            dmask = None
            if ctx.needs_input_grad[3]:
                dmask = _mask_grad(q, k, v, mask, _convert.tensor(out), grad_out, ctx.opts)
                dmask = dmask.sum_to_size(float_mask.shape)
        return dq, dk, dv, dmask, dsinks, None, None, None
