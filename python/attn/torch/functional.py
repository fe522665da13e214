"""attn.torch.scaled_dot_product_attention: torch 2.x's F.scaled_dot_product_attention on attn.

Differences from torch, all documented in its docstring: attn's extra keywords; a query row
that sees no key gives 0 (as torch >= 2.5; torch 1.13: NaN); is_causal may be combined with
attn_mask (torch refuses); inputs of rank 2 to 4.
"""
import copy
import math

import numpy as np
import torch

import attn as _core  # the package: its calls name themselves in a MemoryError

from .. import _concise_errors
from . import _convert
from .autograd import SdpaFunction, with_sinks

# The keywords this build's extension takes (its pybind11 signature), so that an unknown
# `**extras` keyword is a TypeError naming it rather than pybind11's dump of the signature.
_CORE_KEYWORDS = frozenset(_concise_errors.parameters(_core.scaled_dot_product_attention.__doc__)[3])
# Keywords of the core that **extras may not pass: torch's (named parameters here), those
# attn.torch sets itself, and return_scores (the score matrix: a second result, which torch's
# one-tensor API has no place for, and no gradient), an unexpected keyword like any other.
_OWN_KEYWORDS = frozenset({"query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale",
                           "return_lse", "return_weights", "return_scores", "dropout_seed", "dtype", "out_dtype"})
# The keywords beyond torch 2.x's that are named parameters of this function (the unknown-keyword
# error lists them with the core's extras, each once).
_NAMED_KEYWORDS = frozenset({"causal_alignment", "window", "window_alignment", "key_lengths", "query_offset",
                             "dropout_seed", "threads", "impl", "out_dtype"})
# Per-head float32 tensors of the core (a float64 tensor is rounded to float32).
_MODIFIER_TENSORS = frozenset({"alibi_slopes", "sinks"})


def _check_heads(query, key, value, enable_gqa):
    # enable_gqa by the binding's rule for every bool keyword (is_causal's: NumPy's bool_ too).
    if _core._bool_arg(enable_gqa, "enable_gqa") or query.dim() < 3 or key.dim() != query.dim() or value.dim() != query.dim():
        return  # attn's own shape checks name the rest
    hq, hk, hv = query.size(-3), key.size(-3), value.size(-3)
    if hk != hq or hv != hq:
        raise ValueError(f"key/value: expected {hq} heads like query (dim -3) but got key {tuple(key.shape)} and "
                         f"value {tuple(value.shape)}; pass enable_gqa=True for grouped-query attention")


def check_dropout(p, name="dropout_p", op="sdpa"):
    """A dropout probability: a real number (TypeError naming `name`), by attn's rule for its range
    and in its words, as attn.scaled_dot_product_attention refuses it ("sdpa: dropout_p: must be in
    [0, 1) but got 1.5"); before a seed is drawn from torch's generator."""
    _convert.check_real(p, name, "a float in [0, 1)")
    try:
        value = float(p)
    except OverflowError:  # an int past float's range: out of [0, 1) all the same
        value = math.inf if p > 0 else -math.inf
    _core._require_dropout_p(op, value, name)


def _private(x):
    """An option array (or list) the backward reads again, as a copy of its own. key_lengths,
    query_offset and alibi_slopes are (N,) / (N, H) / (H,): copying them costs nothing, whereas
    the user's tensor may be refilled (the next micro-batch's lengths) before backward runs,
    which would silently give the gradients of another problem."""
    return copy.deepcopy(x) if isinstance(x, (np.ndarray, list)) else x


def core_options(extras, causal_alignment, window, window_alignment, key_lengths, query_offset, impl):
    """attn's keywords (beyond torch's) as the extension takes them: tensors as arrays."""
    for name, x in extras.items():
        if name in _OWN_KEYWORDS or name not in _CORE_KEYWORDS:
            known = sorted((_CORE_KEYWORDS - _OWN_KEYWORDS) | _NAMED_KEYWORDS | {"enable_gqa"})  # a set: once each
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


def _empty_attention(query, key, value, out_dtype, differentiable):
    """A call with an empty dimension (batch, heads, queries or keys), which the core refuses:
    torch's result — an empty output, or zeros when there are queries but no key (each row's
    weights over no keys sum nothing) — still connected to the differentiable inputs for autograd
    (zero gradients), as torch's own empty call is."""
    dtype = query.dtype if out_dtype is None else out_dtype
    out = query.new_zeros(query.shape[:-1] + value.shape[-1:], dtype=dtype)
    if torch.is_grad_enabled() and any(t.requires_grad for t in differentiable):
        # The sum of an empty slice is 0 whatever the tensor holds (t.sum() * 0 is NaN for a
        # -inf mask entry), and its gradient is zeros of t's shape.
        for t in differentiable:
            if t.requires_grad:
                out = out + t.reshape(-1)[:0].sum().to(dtype)
    return out


def _pad_head_dim(query, key, scale):
    """q and k with a head dim of 0 but queries and keys present: every score is the empty sum 0,
    so each query's weights are uniform over its visible keys (torch: the mean of those values).
    The core refuses a head dim of 0; one zero column in q and k keeps every score 0 and lets the
    core apply the masks (autograd slices the column away again). The default scale 1/√0 would
    be inf (and 0·inf NaN): any finite scale gives the same zero scores."""
    pad = lambda t: torch.cat((t, t.new_zeros(t.shape[:-1] + (1,))), -1)  # noqa: E731
    return pad(query), pad(key), 1.0 if scale is None else scale


def refuse_graph_transforms():
    """attn's kernels are opaque to torch.jit's tracer and to functorch's transforms: a trace under
    no_grad froze the first input's result into the graph (a new input got the old output), and
    vmap/grad failed with "Cannot access data pointer of Tensor that doesn't have storage".
    Both are refused with what to do instead."""
    if torch.jit.is_tracing():
        raise RuntimeError("attn.torch cannot be traced by torch.jit (its kernels are opaque to the tracer: "
                           "the trace would replay the traced input's result); trace or export the model with "
                           "torch's own attention")
    active = getattr(torch._C, "_are_functorch_transforms_active", None)
    if active is not None and active():
        raise RuntimeError("attn.torch does not support functorch transforms (vmap, grad, jacrev): its kernels "
                           "read the tensors' memory, which a transform's wrapped tensors do not have; use "
                           "torch.autograd (loss.backward(), torch.autograd.grad) or torch's attention inside the transform")


def refuse_forward_ad(named_tensors):
    """Forward-mode AD (torch.autograd.forward_ad) has no rule for attn's kernels: a dual input
    that did not also require grad went the no-autograd way, whose array conversion dropped its
    tangent, and the output's tangent was None — downstream results looked fine and carried no
    derivative. Refused, naming the input and what works instead. `named_tensors`: (name,
    tensor or None) pairs; only dense tensors can be dual (others get their own error later)."""
    forward_ad = torch.autograd.forward_ad
    # No dual level entered: nothing can be dual. The level is torch's private counter; should it
    # be gone, every tensor is checked (fail closed: unpack_dual is public).
    if getattr(forward_ad, "_current_level", 0) < 0:
        return
    for name, t in named_tensors:
        if isinstance(t, torch.Tensor) and t.layout == torch.strided and forward_ad.unpack_dual(t).tangent is not None:
            raise RuntimeError(f"attn.torch does not support forward-mode AD (torch.autograd.forward_ad): {name} "
                               "is a dual tensor and its tangent would be lost; use reverse mode "
                               "(loss.backward(), torch.autograd.grad) or torch's attention for jvp")


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                 enable_gqa=False, *, causal_alignment="top-left", window=None,
                                 window_alignment="top-left", key_lengths=None, query_offset=None,
                                 dropout_seed=None, threads=None, impl="auto", out_dtype=None, **extras):
    """softmax(query·keyᵀ·scale + mask)·value with torch 2.x's signature and semantics, on the CPU.

    query (N, H, L, E), (H, L, E) or (L, E); key/value of the same rank with S keys. Any
    strides are read in place. float32, float64, float16 or bfloat16 (any mix the core takes);
    the result has query's dtype, or out_dtype= (torch.float32, torch.float64, torch.float16, torch.bfloat16).
    Gradients come back in each input's dtype; 16-bit gradients need a core whose backward
    takes 16-bit inputs (else its error, at backward time, names the dtype).
    attn_mask: bool (True = may attend) or float (added), broadcastable to (N, H, L, S), of
    rank <= query's (as torch); a float mask that requires grad gets its gradient. is_causal: top-left (torch's), or
    causal_alignment="bottom-right". enable_gqa=True: key/value may have fewer heads (H % Hkv == 0).
    dropout_p > 0 drops attention weights (like torch's functional, whether or not a module is
    training) with a seed drawn from torch's generator (reproducible under torch.manual_seed),
    or dropout_seed= when given.
    attn's keywords: window=(left, right), window_alignment, key_lengths (N,), query_offset,
    impl, threads (default torch.get_num_threads()), and any keyword this build's core takes
    (but return_scores, which returns a second result):
    softcap=c; alibi_slopes (H,)/(N, H) or True (no gradient: slopes that require grad are a
    ValueError); sinks (H,) (with a gradient). The core keeps slopes and sinks in float32: a
    float64 tensor is rounded to float32 (a sink's gradient comes back in its dtype).
    dropout_origin=(batch, head, row, key): the call is a piece of a larger problem and drops what
    the whole drops with the same seed (the core's rule and checks; the backward takes it too).
    A query row that sees no key gives 0 (as torch >= 2.5; torch 1.13 gives NaN). A head dim E of 0 makes every q·k 0:
    the mean of the visible values (without ALiBi or sinks). Other empty inputs give an empty
    result, or zeros when there are no keys, after every check that a call with data gets.
    No double backward (create_graph=True is a RuntimeError); a tensor the backward reads (q, k,
    v, attn_mask, sinks, the result) changed in place before backward is torch's in-place error.
    """
    refuse_graph_transforms()
    refuse_forward_ad((("query", query), ("key", key), ("value", value), ("attn_mask", attn_mask),
                       ("sinks", extras.get("sinks")), ("alibi_slopes", extras.get("alibi_slopes"))))
    for t, name in ((query, "query"), (key, "key"), (value, "value")):
        _convert.float_array(t, name)  # type, device and dtype errors, named
    dropout_p, scale = _convert.number(dropout_p), _convert.number(scale)
    _check_heads(query, key, value, enable_gqa)
    check_dropout(dropout_p)
    # Which dtypes a mask may have (bool: True = may attend; floating: added) is the core's rule:
    # its call refuses any other in its words, as for a NumPy mask of that dtype.
    mask = None if attn_mask is None else _convert.array(attn_mask, "attn_mask")
    # A sinks tensor is an input of the autograd Function (it has a gradient), not an option.
    sinks = extras.pop("sinks") if isinstance(extras.get("sinks"), torch.Tensor) else None
    opts = core_options(extras, causal_alignment, window, window_alignment, key_lengths, query_offset, impl)
    differentiable = [t for t in (query, key, value, attn_mask, sinks) if t is not None]
    opts.update(is_causal=is_causal, scale=scale, dropout_p=dropout_p)
    if out_dtype is not None:
        opts["out_dtype"] = _convert.out_dtype_name(out_dtype, query)
    if dropout_p > 0:
        opts["dropout_seed"] = (int(torch.randint(0, 2**62, ()).item()) if dropout_seed is None else dropout_seed)
    if query.numel() == 0 or key.numel() == 0 or value.numel() == 0:
        # The core has nothing to compute (and refuses size-0 dims), but its checks of the shapes,
        # the mask, every option (window, softcap, dropout_origin, ...) and threads are any call's,
        # word for word: one rule set, the core's.
        with _convert.Threads(threads):
            _core._check_sdpa(*(_convert.array(t, n) for t, n in ((query, "query"), (key, "key"), (value, "value"))),
                              attn_mask=mask, **with_sinks(opts, sinks))
        if not (query.size(-1) == 0 and query.shape[:-1].numel() and key.shape[:-1].numel() and value.numel()):
            return _empty_attention(query, key, value, out_dtype, differentiable)
        query, key, opts["scale"] = _pad_head_dim(query, key, scale)
    q, k, v = (_convert.array(t, n) for t, n in ((query, "query"), (key, "key"), (value, "value")))
    if torch.is_grad_enabled() and any(t.requires_grad for t in differentiable):
        # The backward reads the option arrays again: copies (_private); the tensors it reads
        # (q, k, v, attn_mask, sinks, out) are saved by the Function, under torch's version check.
        opts = {name: _private(x) for name, x in opts.items()}
        return SdpaFunction.apply(query, key, value, attn_mask, sinks, opts, threads)
    with _convert.Threads(threads):
        return _convert.tensor(_core.scaled_dot_product_attention(q, k, v, attn_mask=mask, **with_sinks(opts, sinks)))
