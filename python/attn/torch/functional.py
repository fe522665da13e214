"""attn.torch.scaled_dot_product_attention: torch 2.x's F.scaled_dot_product_attention on attn.

Differences from torch, all documented in its docstring: attn's extra keywords; a query row
that sees no key gives 0 (torch: NaN); is_causal may be combined with attn_mask (torch
refuses); inputs of rank 2 to 4.
"""
import re

import torch

from .. import _attn
from . import _convert
from .autograd import SdpaFunction

# The keywords this build's extension takes (its pybind11 signature), so that an unknown
# `**extras` keyword is a TypeError naming it rather than pybind11's dump of the signature.
_CORE_KEYWORDS = frozenset(re.findall(r"(\w+): ", _attn.scaled_dot_product_attention.__doc__.split("\n")[0]))
_OWN_KEYWORDS = frozenset({"query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale",
                           "return_lse", "return_weights", "dropout_seed", "dtype", "out_dtype"})
# Per-head float32 tensors of the core (a float64 tensor is rounded to float32).
_MODIFIER_TENSORS = frozenset({"alibi_slopes", "sinks"})


def _check_heads(query, key, value, enable_gqa):
    if not isinstance(enable_gqa, bool):
        raise TypeError(f"enable_gqa: expected a bool but got {enable_gqa!r}")
    if enable_gqa or query.dim() < 3 or key.dim() != query.dim() or value.dim() != query.dim():
        return  # attn's own shape checks name the rest
    hq, hk, hv = query.size(-3), key.size(-3), value.size(-3)
    if hk != hq or hv != hq:
        raise ValueError(f"key/value: expected {hq} heads like query (dim -3) but got key {tuple(key.shape)} and "
                         f"value {tuple(value.shape)}; pass enable_gqa=True for grouped-query attention")


def core_options(extras, causal_alignment, window, window_alignment, key_lengths, query_offset, impl):
    """attn's keywords (beyond torch's) as the extension takes them: tensors as arrays."""
    for name, x in extras.items():
        if name in _OWN_KEYWORDS or name not in _CORE_KEYWORDS:
            known = sorted(_CORE_KEYWORDS - _OWN_KEYWORDS) + ["threads", "enable_gqa", "out_dtype"]
            raise TypeError(f"scaled_dot_product_attention() got an unexpected keyword argument '{name}' "
                            f"(this build of attn takes {', '.join(known)})")
        if isinstance(x, torch.Tensor) and x.requires_grad and torch.is_grad_enabled():
            # sinks never get here (the autograd Function takes them); ALiBi slopes are fixed
            # by design: a silent None gradient would let an optimizer think it trains them.
            raise ValueError(f"{name}: attn gives no gradient for {name}; pass {name}.detach()")
    opts = {name: _convert.modifier_array(x, name) if name in _MODIFIER_TENSORS else _convert.maybe_array(x, name)
            for name, x in extras.items()}
    opts.update(causal_alignment=causal_alignment, window=window, window_alignment=window_alignment,
                key_lengths=_convert.maybe_array(key_lengths, "key_lengths"),
                query_offset=_convert.maybe_array(query_offset, "query_offset"), impl=impl)
    if "dtype" in _CORE_KEYWORDS:  # bfloat16 tensors arrive as uint16 arrays of their bits (_convert)
        opts["dtype"] = "bfloat16"
    return opts


def _empty_attention(query, key, value, out_dtype):
    """A call with an empty dimension (batch, heads, queries or keys), which the core refuses:
    torch's result — an empty output, or zeros when there are queries but no key (each row's
    weights over no keys sum nothing) — still connected to the inputs for autograd (zero
    gradients), as torch's own empty call is."""
    dtype = query.dtype if out_dtype is None else out_dtype
    out = query.new_zeros(query.shape[:-1] + value.shape[-1:], dtype=dtype)
    if torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value)):
        out = out + (query.sum() + key.sum() + value.sum()).to(dtype) * 0
    return out


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                 enable_gqa=False, *, causal_alignment="top-left", window=None,
                                 window_alignment="top-left", key_lengths=None, query_offset=None,
                                 dropout_seed=None, threads=None, impl="auto", out_dtype=None, **extras):
    """softmax(query·keyᵀ·scale + mask)·value with torch 2.x's signature and semantics, on the CPU.

    query (N, H, L, E), (H, L, E) or (L, E); key/value of the same rank with S keys. Any
    strides are read in place. float32, float64, float16 or bfloat16 (any mix the core takes);
    the result has query's dtype, or out_dtype= (torch.float32, torch.float16, torch.bfloat16).
    Gradients come back in each input's dtype; 16-bit gradients need a core whose backward
    takes 16-bit inputs (else its error, at backward time, names the dtype).
    attn_mask: bool (True = may attend) or float (added), broadcastable to (N, H, L, S); a
    float mask that requires grad gets its gradient. is_causal: top-left (torch's), or
    causal_alignment="bottom-right". enable_gqa=True: key/value may have fewer heads (H % Hkv == 0).
    dropout_p > 0 drops attention weights (like torch's functional, whether or not a module is
    training) with a seed drawn from torch's generator (reproducible under torch.manual_seed),
    or dropout_seed= when given.
    attn's keywords: window=(left, right), window_alignment, key_lengths (N,), query_offset,
    impl, threads (default torch.get_num_threads()), and any keyword this build's core takes:
    softcap=c; alibi_slopes (H,)/(N, H) or True (no gradient: slopes that require grad are a
    ValueError); sinks (H,) (with a gradient). The core keeps slopes and sinks in float32: a
    float64 tensor is rounded to float32 (a sink's gradient comes back in its dtype).
    A query row that sees no key gives 0 (torch gives NaN).
    """
    q, k, v = (_convert.array(t, n) for t, n in ((query, "query"), (key, "key"), (value, "value")))
    _check_heads(query, key, value, enable_gqa)
    if query.numel() == 0 or key.numel() == 0 or value.numel() == 0:
        return _empty_attention(query, key, value, out_dtype)
    _convert.check_real(dropout_p, "dropout_p", "a float in [0, 1)")
    mask = None if attn_mask is None else _convert.array(attn_mask, "attn_mask")
    # A sinks tensor is an input of the autograd Function (it has a gradient), not an option.
    sinks = extras.pop("sinks") if isinstance(extras.get("sinks"), torch.Tensor) else None
    opts = core_options(extras, causal_alignment, window, window_alignment, key_lengths, query_offset, impl)
    opts.update(is_causal=is_causal, scale=scale, dropout_p=dropout_p)
    if out_dtype is not None:
        opts["out_dtype"] = _convert.out_dtype_name(out_dtype, query)
    if dropout_p > 0:
        opts["dropout_seed"] = (int(torch.randint(0, 2**62, ()).item()) if dropout_seed is None else dropout_seed)
    float_mask = attn_mask is not None and attn_mask.is_floating_point()
    differentiable = [query, key, value] + ([attn_mask] if float_mask else []) + ([sinks] if sinks is not None else [])
    if torch.is_grad_enabled() and any(t.requires_grad for t in differentiable):
        return SdpaFunction.apply(query, key, value, attn_mask if float_mask else None, sinks,
                                  None if float_mask else mask, opts, threads)
    if sinks is not None:
        opts["sinks"] = _convert.modifier_array(sinks, "sinks")
    with _convert.Threads(threads):
        return _convert.tensor(_attn.scaled_dot_product_attention(q, k, v, attn_mask=mask, **opts))
