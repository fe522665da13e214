"""One rank of test_ring_python.py's 16-bit case: float16 Q/K/V/dO through attn.dist (K/V travel
the ring in 16 bits), against single-process attn on the whole float16 arrays (float32 results).
Every rank checks its own rows and exits non-zero on a mismatch."""
import sys

import numpy as np
from mpi4py import MPI

import attn

comm = MPI.COMM_WORLD
P, rank = comm.Get_size(), comm.Get_rank()
B, Hq, Hkv, L, D = 2, 4, 2, 37, 8
rng = np.random.default_rng(11)  # the same global arrays on every rank
q, k, v, do = (rng.uniform(-2, 2, s).astype(np.float16)
               for s in ((B, Hq, L, D), (B, Hkv, L, D), (B, Hkv, L, D), (B, Hq, L, D)))
segs = attn.dist.rank_segments(L, P, rank, "zigzag")


def mine(a):
    return np.ascontiguousarray(np.concatenate([a[:, :, s:s + n] for s, n in segs], axis=2))


out, lse = attn.scaled_dot_product_attention(q, k, v, is_causal=True, return_lse=True, out_dtype="float32")
o16 = out.astype(np.float16)
grads = attn.scaled_dot_product_attention_backward(q, k, v, o16, lse, do, is_causal=True, out_dtype="float32")
o, l = attn.dist.ring_attention(mine(q), mine(k), mine(v), comm, is_causal=True)
assert o.dtype == np.float16 and l.dtype == np.float32, (o.dtype, l.dtype)
# The backward from the same float16 O and lse as the single-process one (a 16-bit O's rounding
# moves the gradients by more than float32's bound: docs/conventions.md).
ol, ll = mine(o16), mine(lse[..., None])[..., 0]
g = attn.dist.ring_attention_backward(mine(q), mine(k), mine(v), ol, ll, mine(do), comm, is_causal=True)
assert all(x.dtype == np.float16 for x in g)
g32 = attn.dist.ring_attention_backward(mine(q), mine(k), mine(v), ol, ll, mine(do), comm, is_causal=True,
                                        out_dtype="float32")
assert all(x.dtype == np.float32 for x in g32)
ok = True
for name, got, want, half in [("O", o, mine(out), True), ("lse", l, mine(lse[..., None])[..., 0], False),
                              ("dQ", g[0], mine(grads[0]), True), ("dK", g[1], mine(grads[1]), True),
                              ("dV", g[2], mine(grads[2]), True), ("dQ32", g32[0], mine(grads[0]), False)]:
    got, want = got.astype(np.float64), want.astype(np.float64)
    bound = 2e-5 * max(1.0, np.abs(want).max()) + (2.0 ** -11 * np.abs(want) if half else 0)
    if not np.all(np.abs(got - want) <= bound):
        print(f"rank {rank}: {name}: max err {np.abs(got - want).max():.3g}", file=sys.stderr)
        ok = False
    # 16-bit gradients are the float32 ones rounded once.
np.testing.assert_array_equal(g[0], g32[0].astype(np.float16))
sys.exit(0 if ok else 1)
