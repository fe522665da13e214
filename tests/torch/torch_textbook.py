# The oracle of attn.torch's tests: attention written from its definition in float64 torch
# (differentiable, so torch's autograd gives the reference gradients), and the visibility
# rules of docs/conventions.md as explicit boolean (Lq, Lk) / (B, 1, Lq, Lk) masks.
import torch


def textbook(q, k, v, keep=None, bias=None, scale=None, softcap=None, alibi=None, sinks=None):
    """softmax(q·kᵀ·scale + bias, masked by keep (True = may attend))·v in float64; GQA by
    repeating KV heads. Callers keep at least one visible key per row (torch's softmax of an
    all -inf row is NaN where attn gives 0). The score modifiers of docs/conventions.md, in its
    order: softcap c·tanh(s/c), then alibi = slopes (H,) subtracting m_h·|i + Lk − Lq − j| (the
    bottom-right diagonal), then bias and keep; sinks (H,): one extra logit per head in the
    softmax's denominator (a column of σ_h whose weight multiplies no value)."""
    q, k, v = q.double(), k.double(), v.double()
    if q.dim() >= 3 and k.size(-3) != q.size(-3):
        k = k.repeat_interleave(q.size(-3) // k.size(-3), dim=-3)
        v = v.repeat_interleave(q.size(-3) // v.size(-3), dim=-3)
    s = q @ k.transpose(-1, -2) * (q.size(-1) ** -0.5 if scale is None else scale)
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    lq, lk = s.size(-2), s.size(-1)
    if alibi is not None:
        distance = (torch.arange(lq).unsqueeze(1) + (lk - lq) - torch.arange(lk).unsqueeze(0)).abs()
        s = s - alibi.double().view(-1, 1, 1) * distance
    if bias is not None:
        s = s + bias.double()
    if keep is not None:
        s = s.masked_fill(~keep, float("-inf"))
    if sinks is None:
        return s.softmax(-1) @ v
    sink_column = sinks.double().view(-1, 1, 1).expand(*s.shape[:-1], 1)
    return torch.cat((s, sink_column), -1).softmax(-1)[..., :lk] @ v


def window_keep(lq, lk, left, right, offset=0):
    """Query i sees keys d-left .. d+right with d = i + offset (None = unbounded)."""
    i = torch.arange(lq).unsqueeze(1) + offset
    j = torch.arange(lk).unsqueeze(0)
    keep = torch.ones(lq, lk, dtype=torch.bool)
    if left is not None:
        keep &= j >= i - left
    if right is not None:
        keep &= j <= i + right
    return keep


def causal_keep(lq, lk, bottom_right=False):
    return window_keep(lq, lk, None, 0, lk - lq if bottom_right else 0)


def lengths_keep(lengths, lq, lk):
    """(B, 1, Lq, Lk): sequence b sees keys 0 .. lengths[b]-1."""
    return (torch.arange(lk).view(1, 1, 1, lk) < lengths.view(-1, 1, 1, 1)).expand(-1, 1, lq, lk)
