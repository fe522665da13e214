# The oracles of the Python tests: textbook attention in float64 torch, the visibility rule
# of docs/conventions.md written from its definition, and the tolerance check.
import os

import numpy as np
import pytest
import torch


def attn_cli():
    """The attn binary for a test's CLI part (ctest sets ATTN_BIN). Skipped — after the test's
    library parts passed — in a build without the CLI (-DATTN_BUILD_TOOLS=OFF: ATTN_BIN empty);
    a set ATTN_BIN must name the binary."""
    path = os.environ.get("ATTN_BIN", "")
    if not path:
        pytest.skip("the CLI is not built (ATTN_BIN is empty)")
    assert os.path.exists(path), f"ATTN_BIN must name the attn binary, got {path!r}"
    return path

# float32 kernels against the float64 oracle: |err| <= ATOL + RTOL·|ref|, the bound of
# docs/conventions.md ("16-bit inputs and outputs": 1e-5·(1 + |ref|) for unit-scale inputs).
# The float32 output of a softmax-weighted sum of O(1) values carries ~1e-7·sqrt(Lk) rounding.
ATOL, RTOL = 1e-5, 1e-5


def textbook(q, k, v, keep=None, bias=None, scale=None):
    """softmax(q·kᵀ·scale + bias) masked by keep (True = may attend) · v, in float64 torch.
    q (B, H, Lq, D), k/v (B, Hkv, Lk, ·); GQA by repeating KV heads. Rows without a visible key
    give 0 (attn's convention). Returns out, lse, weights."""
    q, k, v = (torch.from_numpy(np.asarray(x, dtype=np.float64)) for x in (q, k, v))
    group = q.shape[-3] // k.shape[-3]
    k = k.repeat_interleave(group, dim=-3)
    v = v.repeat_interleave(group, dim=-3)
    s = q @ k.transpose(-1, -2) * (scale if scale is not None else 1.0 / np.sqrt(q.shape[-1]))
    if bias is not None:
        s = s + torch.from_numpy(np.asarray(bias, dtype=np.float64))
    if keep is not None:
        s = s.masked_fill(~torch.from_numpy(np.array(keep)), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    w = torch.exp(s - lse.unsqueeze(-1))
    w = torch.nan_to_num(w, nan=0.0)
    return (w @ v).numpy(), lse.numpy(), w.numpy()


def close(ours, ref, atol=ATOL, rtol=RTOL):
    ours = np.asarray(ours, dtype=np.float64)
    assert ours.shape == ref.shape
    # Non-finite entries (an empty row's lse of −inf) must be the reference's exactly: +inf or
    # NaN in place of −inf is a wrong result, not a rounding.
    fin = np.isfinite(ref)
    assert np.array_equal(ours[~fin], ref[~fin], equal_nan=True), \
        f"non-finite entries differ: ours {ours[~fin][:8]} vs ref {ref[~fin][:8]}"
    err = np.abs(ours[fin] - ref[fin])
    bound = atol + rtol * np.abs(ref[fin])
    assert np.all(err <= bound), f"max err {err.max()} (worst excess {(err - bound).max()})"


def close_grads(pairs):
    """(ours, ref) gradient pairs of one backward call: |err| <= 2e-5 × the largest reference
    gradient of the call, the float32 backward's bound (docs/conventions.md, "Backward with
    16-bit tensors"). A gradient of a tensor no key or query reaches is exactly 0."""
    pairs = [(np.asarray(o, dtype=np.float64), np.asarray(r, dtype=np.float64)) for o, r in pairs]
    big = max(float(np.abs(r).max(initial=0.0)) for _, r in pairs)
    for ours, ref in pairs:
        close(ours, ref, atol=2e-5 * big, rtol=0.0)


def philox4x32_10(ctr, key):
    """ctr: 4 uint64 arrays holding uint32 values; key: 2 python ints. Vectorised."""
    M0, M1, W0, W1 = 0xD2511F53, 0xCD9E8D57, 0x9E3779B9, 0xBB67AE85
    mask = np.uint64(0xFFFFFFFF)
    c0, c1, c2, c3 = (np.asarray(c, dtype=np.uint64) for c in ctr)
    k0, k1 = np.uint64(key[0]), np.uint64(key[1])
    for r in range(10):
        if r:
            k0 = (k0 + np.uint64(W0)) & mask
            k1 = (k1 + np.uint64(W1)) & mask
        p0 = np.uint64(M0) * c0
        p1 = np.uint64(M1) * c2
        c0, c1, c2, c3 = ((p1 >> np.uint64(32)) ^ c1 ^ k0), (p1 & mask), ((p0 >> np.uint64(32)) ^ c3 ^ k1), (p0 & mask)
    return c0, c1, c2, c3


def dropout_factor(p, seed, B, H, Lq, Lk, origin=(0, 0, 0, 0)):
    """(B, H, Lq, Lk) float64: 0 or 1/(1-p), from the keying documented in src/core/dropout.hpp.
    origin = (batch, head, row, key): the call's place in a larger problem (dropout_origin), whose
    indices key the counter."""
    b, h, i, j = np.meshgrid(*(np.arange(n, dtype=np.int64) + o for n, o in zip((B, H, Lq, Lk), origin)),
                             indexing="ij")
    outs = philox4x32_10([j // 4, i, h, b], (seed & 0xFFFFFFFF, seed >> 32))
    r = np.choose(j % 4, outs)
    threshold = min(int(np.rint(p * 2.0**32)), 0xFFFFFFFF)
    return np.where(r >= threshold, 1.0 / (1.0 - p), 0.0)


def causal_keep(lq, lk, bottom_right):
    off = lk - lq if bottom_right else 0
    return np.arange(lk)[None, :] <= np.arange(lq)[:, None] + off


def visible(b, lq, lk, key_lengths=None, causal=None, window=None, window_alignment="top-left",
            query_offset=None):
    """keep (B, 1, Lq, Lk), True = query i of sequence b may see key j, from the definition
    (docs/conventions.md, "Alignment"): n_b = key_lengths[b] (else Lk); the
    diagonal is d_b(i) = i + offset_b with offset_b = query_offset (an int or one per sequence)
    when given, else 0 (top-left) or n_b − Lq (bottom-right). Keys j < n_b are visible; causal
    keeps j <= d_b(i); window (left, right) keeps d_b(i) − left <= j <= d_b(i) + right, −1 or
    None = unbounded on that side."""
    n = np.full(b, lk) if key_lengths is None else np.asarray(key_lengths, dtype=np.int64)
    i = np.arange(lq)[None, :, None]
    j = np.arange(lk)[None, None, :]

    def diagonal(alignment):
        if query_offset is not None:
            off = np.broadcast_to(np.asarray(query_offset, dtype=np.int64), (b,))
        else:
            off = np.zeros(b, np.int64) if alignment == "top-left" else n - lq
        return i + off[:, None, None]

    keep = j < n[:, None, None]
    if causal is not None:
        keep = keep & (j <= diagonal(causal))
    if window is not None:
        left, right = (-1 if x is None else x for x in window)
        d = diagonal(window_alignment)
        if left >= 0:
            keep = keep & (j >= d - left)
        if right >= 0:
            keep = keep & (j <= d + right)
    return keep[:, None]
