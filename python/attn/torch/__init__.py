"""attn for PyTorch: torch tensors in and out, autograd, and a drop-in nn.MultiheadAttention.

  scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                               scale=None, enable_gqa=False, *, <attn's keywords>)
      torch 2.x's F.scaled_dot_product_attention (torch 1.13 has none) on the CPU, differentiable.
  MultiheadAttention      nn.MultiheadAttention with attn computing the attention.
  replace_attention(model) swaps every nn.MultiheadAttention inside `model` for it, in place.
"""
from .functional import scaled_dot_product_attention  # noqa: F401
from .mha import MultiheadAttention, replace_attention  # noqa: F401

sdpa = scaled_dot_product_attention
