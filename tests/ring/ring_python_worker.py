"""Run under mpirun by test_ring_python.py: attn.dist.ring_attention and its backward from
Python with an mpi4py communicator. Every rank builds the same global arrays (seed), takes its
rows (attn.dist.rank_segments), runs the ring; rank 0 gathers O, dQ, dK, dV into OUTDIR.

usage: ring_python_worker.py OUTDIR B Hq Hkv L Dk Dv causal(0|1) layout [KEYWORDS_JSON]
More keywords for both calls come from two places:
- OUTDIR/kwargs.json, when there (lists become float32 arrays, key_lengths int64); with "sinks"
  the backward's dsinks is saved too (rank 0's; every rank's must be equal, which is checked here);
- KEYWORDS_JSON (window, key_lengths, query_offset, dropout_p, ...): a string value "@name"
  stands for the array `name` of inputs.npz."""
import json
import os
import sys

import numpy as np
from mpi4py import MPI

import attn

outdir, B, Hq, Hkv, L, Dk, Dv, causal, layout = sys.argv[1], *map(int, sys.argv[2:9]), sys.argv[9]
comm = MPI.COMM_WORLD
P, rank = comm.Get_size(), comm.Get_rank()
glob = np.load(f"{outdir}/inputs.npz")
segs = attn.dist.rank_segments(L, P, rank, layout)


def mine(a):
    return np.ascontiguousarray(np.concatenate([a[:, :, s:s + n] for s, n in segs], axis=2))


q, k, v, do = (mine(glob[n]) for n in ("q", "k", "v", "do"))
kw = json.loads(sys.argv[10]) if len(sys.argv) > 10 else {}
kw = {n: glob[x[1:]] if isinstance(x, str) and x.startswith("@") else x for n, x in kw.items()}
if os.path.exists(f"{outdir}/kwargs.json"):
    for name, val in json.load(open(f"{outdir}/kwargs.json")).items():
        if name == "key_lengths":
            val = np.asarray(val, np.int64)
        elif name in ("alibi_slopes", "sinks") and val is not True:
            val = np.asarray(val, np.float32)
        kw[name] = val
if kw.get("alibi_slopes") is True and rank == 0:  # the standard slopes, for the test's oracle
    np.save(f"{outdir}/alibi_slopes.npy", attn.alibi_slopes(Hq))
o, lse = attn.dist.ring_attention(q, k, v, comm, is_causal=bool(causal), layout=layout, **kw)
grads = attn.dist.ring_attention_backward(q, k, v, o, lse, do, comm, is_causal=bool(causal), layout=layout, **kw)
dq, dk, dv = grads[:3]
if "sinks" in kw:
    assert len(grads) == 4
    every = comm.allgather(grads[3])
    assert all(np.array_equal(every[0], d) for d in every), "dsinks differs between ranks"
    if rank == 0:
        np.save(f"{outdir}/dsinks_{P}.npy", grads[3])
else:
    assert len(grads) == 3
parts = comm.gather((segs, o, dq, dk, dv), root=0)
if rank == 0:
    full = {"o": np.zeros((B, Hq, L, Dv), np.float32), "dq": np.zeros((B, Hq, L, Dk), np.float32),
            "dk": np.zeros((B, Hkv, L, Dk), np.float32), "dv": np.zeros((B, Hkv, L, Dv), np.float32)}
    for segs_r, *arrays in parts:
        for name, a in zip(("o", "dq", "dk", "dv"), arrays):
            at = 0
            for s, n in segs_r:
                full[name][:, :, s:s + n] = a[:, :, at:at + n]
                at += n
    np.savez(f"{outdir}/python_{P}.npz", **full)
