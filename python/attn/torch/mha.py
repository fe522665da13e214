"""attn.torch.MultiheadAttention and replace_attention.

MultiheadAttention *is* an nn.MultiheadAttention (a subclass adding no state): the same
constructor, parameters, buffers and state_dict, so weights load both ways and
replace_attention can swap the class of an existing module in place. Only forward differs:
the projections stay torch's (F.linear, autograd as usual) and the attention itself is
attn.torch.scaled_dot_product_attention on (N, H, L, Dh) views of the projections (read in
place: no copies), differentiable, with attention-weight dropout in training mode.
"""
import torch
import torch.nn.functional as F
from torch import nn

import attn as _core  # the package: its calls name themselves in a MemoryError

from . import _convert
from ._out_of_memory import allocating
from .functional import check_dropout, refuse_graph_transforms, scaled_dot_product_attention


_FORWARD = "attn.torch.MultiheadAttention.forward"  # the call its MemoryErrors name


def _mask_kind(m, name):
    if m is None:
        return None
    if not isinstance(m, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor or None but got {type(m).__name__}")
    if m.dtype == torch.bool or m.is_floating_point():
        return m
    if m.dtype == torch.uint8:  # torch's deprecated byte masks: nonzero = masked, like True
        return m.bool()
    raise TypeError(f"{name}: dtype must be bool or floating point but got {m.dtype}")


def _check_masks(attn_mask, key_padding_mask, batched, n, h, lq, lk):
    """torch's mask shapes for the user's tensors (before the unbatched unsqueeze and the column
    add_bias_kv / add_zero_attn append), so that an error names the shapes the caller gave."""
    if attn_mask is not None:
        shapes = [(lq, lk), (n * h, lq, lk)]
        if attn_mask.dim() not in (2, 3) or tuple(attn_mask.shape) != shapes[attn_mask.dim() - 2]:
            raise ValueError(f"attn_mask: expected shape {shapes[0]} or {shapes[1]} but got {tuple(attn_mask.shape)}")
    if key_padding_mask is not None:
        want = (n, lk) if batched else (lk,)
        if tuple(key_padding_mask.shape) != want:
            raise ValueError(f"key_padding_mask: expected shape {want} but got {tuple(key_padding_mask.shape)}")


def _combined_mask(attn_mask, key_padding_mask, n, h, lq, lk, dtype):
    """torch's MultiheadAttention masks (True = masked out), their shapes checked (_check_masks)
    → one sdpa mask (True = may attend, or added) broadcastable to (N, H, L, S). Unmaterialized
    when there is only one."""
    parts = []
    if attn_mask is not None:
        parts.append(attn_mask.view(1, 1, lq, lk) if attn_mask.dim() == 2 else attn_mask.view(n, h, lq, lk))
    if key_padding_mask is not None:
        parts.append(key_padding_mask.view(n, 1, 1, lk))
    if not parts:
        return None
    if all(p.dtype == torch.bool for p in parts):
        keep = ~parts[0]
        for p in parts[1:]:
            keep = keep & ~p
        return keep
    # An additive mask is summed in float32 for 16-bit activations: the sum of two 16-bit masks
    # would round, and a float32 mask given with bfloat16 inputs keeps its values (torch 1.13 adds
    # a float mask to the scores as given; a 16-bit mask widens exactly).
    if dtype in (torch.float16, torch.bfloat16):
        dtype = torch.float32
    total = None
    for p in parts:
        add = (torch.zeros((), dtype=dtype).masked_fill(p, float("-inf")) if p.dtype == torch.bool else p.to(dtype))
        total = add if total is None else total + add
    return total


class MultiheadAttention(nn.MultiheadAttention):
    """nn.MultiheadAttention (same constructor, parameters and forward) computed by attn.

    Differences: a query row whose keys are all masked gives 0 (torch 1.13: NaN); the returned
    attention weights (need_weights=True) carry no gradient. forward also takes torch 2.x's
    is_causal (a causal mask without materializing it; refused with add_bias_kv / add_zero_attn,
    whose appended key has no position), attn's `threads`, and attn's dropout_origin=(batch, head,
    row, key): this call's attention is a piece of a larger problem (a micro-batch, a block of rows)
    and drops, in training, what the whole drops with the same seed — scaled_dot_product_attention's
    keyword, passed on to it (its checks, in training and eval alike).
    """

    def __prepare_scriptable__(self):
        # torch.jit.script calls this first: say why, instead of a TorchScript compile error
        # about attn's Python source.
        raise RuntimeError("attn.torch.MultiheadAttention cannot be scripted by torch.jit (TorchScript cannot call "
                           "attn's kernels); script or export the model with torch's nn.MultiheadAttention")

    def forward(self, query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
                average_attn_weights=True, is_causal=False, threads=None, dropout_origin=None):
        refuse_graph_transforms()  # before the projections: a trace would otherwise record them
        for t, name in ((query, "query"), (key, "key"), (value, "value")):
            _convert.float_array(t, name)  # the device/type/dtype errors, named
        batched = query.dim() == 3
        if query.dim() not in (2, 3) or key.dim() != query.dim() or value.dim() != query.dim():
            raise ValueError(f"query/key/value: expected (L, N, E), (N, L, E) with batch_first or unbatched (L, E) "
                             f"but got {tuple(query.shape)}, {tuple(key.shape)}, {tuple(value.shape)}")
        # torch's checks, up front and on the shapes as given: a mismatch would otherwise be a
        # raw matmul/view error, or — key and value of equal size but different (S, N) — garbage.
        if query.size(-1) != self.embed_dim:
            raise ValueError(f"query: expected embedding dim {self.embed_dim} but got shape {tuple(query.shape)}")
        if key.size(-1) != self.kdim:
            raise ValueError(f"key: expected feature dim {self.kdim} (kdim) but got shape {tuple(key.shape)}")
        if value.size(-1) != self.vdim:
            raise ValueError(f"value: expected feature dim {self.vdim} (vdim) but got shape {tuple(value.shape)}")
        if key.shape[:-1] != value.shape[:-1]:
            raise ValueError(f"key/value: key shape {tuple(key.shape)} does not match value shape "
                             f"{tuple(value.shape)} (they must agree in all but the feature dim)")
        batch_dim = 0 if self.batch_first else 1
        if batched and key.size(batch_dim) != query.size(batch_dim):
            raise ValueError(f"key: expected query's batch size {query.size(batch_dim)} (dim {batch_dim}"
                             f"{', batch_first' if self.batch_first else ''}) but got key {tuple(key.shape)} "
                             f"for query {tuple(query.shape)}")
        appended = [name for name, on in (("add_bias_kv", self.bias_k is not None),
                                          ("add_zero_attn", self.add_zero_attn)) if on]
        if is_causal is True and appended:
            # The appended key has no position: a causal rule would hide it from all but the
            # last queries (docs/conventions.md: the C++ layer refuses this too).
            raise ValueError(f"is_causal: not supported together with {' and '.join(appended)} (the appended key "
                             "has no position); pass a causal attn_mask (L, S) and is_causal=False instead")
        key_padding_mask = _mask_kind(key_padding_mask, "key_padding_mask")
        attn_mask = _mask_kind(attn_mask, "attn_mask")
        n = query.size(batch_dim) if batched else 1
        seq_dim = 1 if batched and self.batch_first else 0
        lq, lk = query.size(seq_dim), key.size(seq_dim)
        _check_masks(attn_mask, key_padding_mask, batched, n, self.num_heads, lq, lk)
        # The module's dropout in training (torch ignores it in eval): attn's rule and words, with
        # torch's name for it and the layer's, as attn.MultiheadAttention(dropout=…) refuses it,
        # before the projections and the seed.
        p = self.dropout if self.training else 0.0
        check_dropout(p, "dropout", "MultiHeadAttention")
        # Self-attention (one input tensor) projects with one GEMM; asked here, before the views
        # below make query, key and value three new objects.
        one_input = query is key and key is value
        # Work batch-first, (N, L, E): views only.
        if not batched:
            query, key, value = query.unsqueeze(0), key.unsqueeze(0), value.unsqueeze(0)
            if key_padding_mask is not None:
                key_padding_mask = key_padding_mask.unsqueeze(0)
        elif not self.batch_first:
            query, key, value = query.transpose(0, 1), key.transpose(0, 1), value.transpose(0, 1)
        e = self.embed_dim
        h = self.num_heads
        dh = e // h
        with allocating(_FORWARD, "the input projections (query, key, value: N, L, E each)"):
            q, k, v = self._project(query, key, value, one_input)
        if self.bias_k is not None:
            k = torch.cat([k, self.bias_k.view(1, 1, e).expand(n, 1, e)], 1)
            v = torch.cat([v, self.bias_v.view(1, 1, e).expand(n, 1, e)], 1)
            attn_mask = None if attn_mask is None else F.pad(attn_mask, (0, 1))
            key_padding_mask = None if key_padding_mask is None else F.pad(key_padding_mask, (0, 1))
        if self.add_zero_attn:
            k = torch.cat([k, k.new_zeros(n, 1, e)], 1)
            v = torch.cat([v, v.new_zeros(n, 1, e)], 1)
            attn_mask = None if attn_mask is None else F.pad(attn_mask, (0, 1))
            key_padding_mask = None if key_padding_mask is None else F.pad(key_padding_mask, (0, 1))
        lk = k.size(1)
        # (N, L, H, Dh) → (N, H, L, Dh): a strided view attn reads in place.
        q = q.view(n, lq, h, dh).transpose(1, 2)
        k = k.view(n, lk, h, dh).transpose(1, 2)
        v = v.view(n, lk, h, dh).transpose(1, 2)
        mask = _combined_mask(attn_mask, key_padding_mask, n, h, lq, lk, q.dtype)
        seed = int(torch.randint(0, 2**62, ()).item()) if p > 0 else None
        out = scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p, is_causal=is_causal,
                                           dropout_seed=seed, threads=threads, dropout_origin=dropout_origin)
        with allocating(_FORWARD, "the output projection (N, Lq, E)"):
            out = F.linear(out.transpose(1, 2).reshape(n, lq, e), self.out_proj.weight, self.out_proj.bias)
        weights = None
        if need_weights and (q.numel() == 0 or k.numel() == 0):  # an empty batch or sequence: torch's zeros
            weights = q.new_zeros((n, h, lq, lk))
        elif need_weights:
            with torch.no_grad(), _convert.Threads(threads):
                arrays = [_convert.array(t, name) for t, name in ((q, "query"), (k, "key"), (v, "value"))]
                weights = _convert.tensor(_core.scaled_dot_product_attention(
                    *arrays, attn_mask=None if mask is None else _convert.array(mask, "attn_mask"), dropout_p=p,
                    is_causal=is_causal, dropout_seed=seed or 0, dropout_origin=dropout_origin, return_weights=True,
                    dtype="bfloat16")[1])  # bfloat16 q/k/v arrive as uint16 bits (_convert)
            weights = weights.to(q.dtype)  # torch returns the weights in the activations' dtype
        if weights is not None:  # (N, h, Lq, Lk), shaped as torch returns them
            if average_attn_weights:
                weights = weights.mean(1)
            if not batched:
                weights = weights.squeeze(0)
        if not batched:
            out = out.squeeze(0)
        elif not self.batch_first:
            out = out.transpose(0, 1)
        return out, weights

    def _project(self, query, key, value, one_input):
        e = self.embed_dim
        if self._qkv_same_embed_dim:
            w, b = self.in_proj_weight, self.in_proj_bias
            if one_input:  # self-attention: one GEMM, split as views
                return F.linear(query, w, b).chunk(3, dim=-1)
            ws = w.split(e)
            wq, wk, wv = ws
        else:
            wq, wk, wv = self.q_proj_weight, self.k_proj_weight, self.v_proj_weight
            b = self.in_proj_bias
        bq, bk, bv = (None, None, None) if b is None else b.split(e)
        return F.linear(query, wq, bq), F.linear(key, wk, bk), F.linear(value, wv, bv)


def replace_attention(model):
    """Makes every nn.MultiheadAttention inside `model` (itself included) an attn.torch.MultiheadAttention,
    in place, keeping its parameters, buffers and hooks; returns `model`.

    nn.TransformerEncoderLayer (torch 1.13) skips its self_attn's forward in eval mode through
    a fused native "fast path"; that path is switched off for the layers whose attention was
    replaced (their activation_relu_or_gelu flag, which only selects that path, is cleared).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model: expected a torch.nn.Module but got {type(model).__name__}")
    for module in model.modules():
        if type(module) is nn.MultiheadAttention:
            module.__class__ = MultiheadAttention
    for module in model.modules():  # after the swap: modules() lists a layer before its self_attn
        if isinstance(module, nn.TransformerEncoderLayer) and isinstance(module.self_attn, MultiheadAttention):
            module.activation_relu_or_gelu = 0
    return model
