"""The error a float32 kernel (flash, decode) may make, per element, on top of the float32
rounding of its outputs — shared by the tests that run `attn sdpa` with the default kernel
choice on float32 inputs and compare with a float64 reference.

Per row: E = max over visible keys of (Dk+2)·u·|scale|·Σ_d|q·k| + 8u·(|S| + |bias|)
(u = 2^-24: the rounding of an fp32 dot product of Dk terms, its scaling and the bias add),
n = visible keys; then
    weights  a·(2E + (n+16)u) + 2^-125
    out      (2E + (n+16)u)·Σ_j a·|v|
    lse      E + (n+16)u
the same first-order bound as tests/kernels/test_flash.cpp.
"""
import numpy as np

U = 2.0 ** -24


def fp32_terms(q, k, v, scale, a, bias=None):
    """q (B, H, Lq, Dk), k (B, H, Lk, Dk), v (B, H, Lk, Dv): float64 arrays with K/V already
    repeated to the query heads; a: the reference weights (B, H, Lq, Lk), 0 where masked;
    bias: the additive mask broadcastable to a, or None → (out, lse, weights) bound arrays."""
    Dk = q.shape[-1]
    kt = np.swapaxes(k, -1, -2)
    dot_abs = np.matmul(np.abs(q), np.abs(kt))
    s_abs = np.abs(np.matmul(q, kt) * scale)
    if bias is not None:
        b = np.abs(np.asarray(bias, dtype=np.float64))
        s_abs = s_abs + np.where(np.isinf(b), 0.0, b)
    visible = a > 0
    per = (Dk + 2) * U * abs(scale) * dot_abs + 8 * U * s_abs
    E = np.where(visible, per, 0.0).max(axis=-1, keepdims=True)
    n = visible.sum(axis=-1, keepdims=True).astype(np.float64)
    rel = 2 * E + (n + 16) * U
    return rel * np.matmul(a, np.abs(v)), (E + (n + 16) * U)[..., 0], a * rel + 2.0 ** -125
