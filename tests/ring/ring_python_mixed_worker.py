"""One rank of test_ring_python.py's mixed-dtype case: attn.dist.ring_attention_backward gives dq in
q's dtype, dk in k's, dv in v's (docs/conventions.md, "The gradients' dtypes"), out_dtype= all
three, near single-process attn's backward from the same O and lse. A float16 q with float32 k/v
and a large dO: dv past float16's 65504 stays finite (in q's float16 it was inf). Every rank
checks its own rows and exits non-zero on a mismatch."""
import sys

import numpy as np
from mpi4py import MPI

import attn

comm = MPI.COMM_WORLD
P, rank = comm.Get_size(), comm.Get_rank()
B, Hq, Hkv, L, D = 1, 4, 2, 23, 8
segs = attn.dist.rank_segments(L, P, rank, "zigzag")


def mine(a):
    return np.ascontiguousarray(np.concatenate([a[:, :, s:s + n] for s, n in segs], axis=2))


def bf16_bits(x):
    """float32 → bfloat16 bits, rounded to nearest even (finite x)."""
    u = np.ascontiguousarray(x, np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def as_float64(a):
    return (a.astype(np.uint32) << 16).view(np.float32).astype(np.float64) if a.dtype == np.uint16 else a.astype(np.float64)


def make(dtype, values):
    """float32 values as `dtype` (bfloat16: its bits)."""
    return bf16_bits(values) if dtype == "bfloat16" else values.astype(dtype)


HALF_ULP = {np.dtype(np.float16): 2.0 ** -11, np.dtype(np.uint16): 2.0 ** -8, np.dtype(np.float32): 0.0}
ok = True
rng = np.random.default_rng(17)  # the same global arrays on every rank
for q_dtype, k_dtype, v_dtype, do_scale in [("float16", "float32", "float32", 3e4), ("bfloat16", "float32", "float16", 1.0)]:
    q = make(q_dtype, rng.uniform(-1, 1, (B, Hq, L, D)).astype(np.float32))
    k = make(k_dtype, rng.uniform(-1, 1, (B, Hkv, L, D)).astype(np.float32))
    # V's rows nearly equal: dS = P∘(dP − D) small, so a large dO leaves dq and dk within float16.
    v = make(v_dtype, (1 + 0.01 * rng.uniform(-1, 1, (B, Hkv, L, D))).astype(np.float32))
    do = (do_scale * rng.uniform(0.5, 1.5, (B, Hq, L, D))).astype(np.float32)
    out, lse = attn.scaled_dot_product_attention(q, k, v, is_causal=True, return_lse=True, dtype="bfloat16")
    want = attn.scaled_dot_product_attention_backward(q, k, v, out, lse, do, is_causal=True, dtype="bfloat16")
    args = (mine(q), mine(k), mine(v), mine(out), mine(lse[..., None])[..., 0], mine(do), comm)
    got = attn.dist.ring_attention_backward(*args, is_causal=True, dtype="bfloat16")
    got32 = attn.dist.ring_attention_backward(*args, is_causal=True, dtype="bfloat16", out_dtype="float32")
    for name, g, g32, w, x in zip(("dq", "dk", "dv"), got, got32, want, (q, k, v)):
        if g.dtype != x.dtype or g32.dtype != np.float32:
            print(f"rank {rank}: {q_dtype}/{k_dtype}/{v_dtype} {name}: {g.dtype}, {g32.dtype} "
                  f"(want {x.dtype}, float32)", file=sys.stderr)
            ok = False
            continue
        g, w = as_float64(g), as_float64(mine(w))
        # Both the float32 gradient rounded once into the input's dtype, summed in other orders.
        bound = 2e-5 * np.abs(w).max() + 2 * HALF_ULP[x.dtype] * np.abs(w)
        if not (np.all(np.isfinite(g)) and np.all(np.abs(g - w) <= bound)):
            print(f"rank {rank}: {q_dtype}/{k_dtype}/{v_dtype} {name}: max err {np.abs(g - w).max():.3g}", file=sys.stderr)
            ok = False
    if do_scale > 1 and ok:
        ok = bool(np.abs(as_float64(want[2])).max() > 65504)  # the case it is about
sys.exit(0 if ok else 1)
