"""Train a small causal attention model with its sequence split over MPI ranks (attn.dist) and
check that its loss curve matches the same model trained in one process with torch alone.

    OMP_NUM_THREADS=1 ATTN_NUM_THREADS=1 mpirun --oversubscribe -np 4 \\
        env PYTHONPATH=build/python /usr/bin/python3 examples/ring_train/ring_train.py [--steps 30] [--length 512]

The model: token + position embeddings, one causal multi-head self-attention layer with a
residual, a linear head predicting the next token of a synthetic sequence with long-range
structure (x[t] depends on x[t-1] and x[t-7]). Every rank holds its rows of the sequence
(zigzag layout) and a full copy of the parameters; the attention is attn.dist.ring_attention
wrapped in a torch.autograd.Function whose backward is attn.dist.ring_attention_backward; the
loss and the parameter gradients are summed over ranks (MPI Allreduce), so every rank takes the
same optimizer step. Rank 0 also trains the single-process model (torch's own attention on the
whole sequence, same initial parameters) and prints both loss curves; the exit status is 1 if
they differ by more than 1e-4 relative at any step (float32 on both sides).
"""
import argparse
import sys

import numpy as np
import torch
from mpi4py import MPI

import attn


class RingAttention(torch.autograd.Function):
    """Causal attention over the ranks of comm: q, k, v are this rank's rows (B, H, n, D)."""

    @staticmethod
    def forward(ctx, q, k, v, comm, layout):
        q, k, v = (t.detach().contiguous() for t in (q, k, v))
        o, lse = attn.dist.ring_attention(q.numpy(), k.numpy(), v.numpy(), comm, is_causal=True, layout=layout)
        o, lse = torch.from_numpy(o), torch.from_numpy(lse)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.comm, ctx.layout = comm, layout
        return o

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = attn.dist.ring_attention_backward(q.numpy(), k.numpy(), v.numpy(), o.numpy(), lse.numpy(),
                                                       grad_out.contiguous().numpy(), ctx.comm, is_causal=True,
                                                       layout=ctx.layout)
        return torch.from_numpy(dq), torch.from_numpy(dk), torch.from_numpy(dv), None, None


class Model(torch.nn.Module):
    def __init__(self, vocab, length, dim, heads):
        super().__init__()
        self.heads = heads
        self.tok = torch.nn.Embedding(vocab, dim)
        self.pos = torch.nn.Embedding(length, dim)
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.proj = torch.nn.Linear(dim, dim)
        self.head = torch.nn.Linear(dim, vocab)

    def forward(self, tokens, positions, attention):
        h = self.tok(tokens) + self.pos(positions)  # (n, dim)
        n, dim = h.shape
        q, k, v = (t.reshape(n, self.heads, dim // self.heads).transpose(0, 1)[None] for t in self.qkv(h).chunk(3, -1))
        o = attention(q, k, v)[0].transpose(0, 1).reshape(n, dim)
        return self.head(h + self.proj(o))


def torch_causal_attention(q, k, v):
    s = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5
    n = s.shape[-1]
    s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(s, -1) @ v


def sequence(length, vocab, seed=0):
    rng = np.random.default_rng(seed)
    x = list(rng.integers(0, vocab, 7))
    while len(x) < length:
        x.append((x[-1] + 2 * x[-7] + (rng.random() < 0.05)) % vocab)
    return torch.tensor(x[:length])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--length", type=int, default=512)
    ap.add_argument("--dim", type=int, default=32)
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=16)
    ap.add_argument("--layout", default="zigzag", choices=["zigzag", "contiguous"])
    a = ap.parse_args()
    # Every rank checks the same arguments, so every rank stops alike (argparse's exit 2).
    for name, least in (("steps", 1), ("length", 1), ("dim", 1), ("heads", 1), ("vocab", 2)):
        if getattr(a, name) < least:
            ap.error(f"--{name}: expected an integer >= {least} but got {getattr(a, name)}")
    if a.dim % a.heads != 0:
        ap.error(f"--dim: {a.dim} must be a multiple of --heads {a.heads}")
    torch.set_num_threads(1)
    comm = MPI.COMM_WORLD
    P, rank = comm.Get_size(), comm.Get_rank()

    L = a.length
    x = sequence(L + 1, a.vocab)  # inputs x[0..L), targets x[1..L]
    torch.manual_seed(0)  # the same initial parameters on every rank and in the single-process model
    model = Model(a.vocab, L, a.dim, a.heads)
    state0 = {k: v.clone() for k, v in model.state_dict().items()}
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)

    rows = torch.cat([torch.arange(s, s + n) for s, n in attn.dist.rank_segments(L, P, rank, a.layout)])
    ring = lambda q, k, v: RingAttention.apply(q, k, v, comm, a.layout)  # noqa: E731
    losses = []
    for _ in range(a.steps):
        opt.zero_grad()
        logits = model(x[rows], rows, ring)
        local = torch.nn.functional.cross_entropy(logits, x[rows + 1], reduction="sum") / L
        local.backward()
        # The global loss and gradients are sums over ranks.
        losses.append(comm.allreduce(local.item(), op=MPI.SUM))
        for p in model.parameters():
            g = p.grad.numpy()
            comm.Allreduce(MPI.IN_PLACE, g, op=MPI.SUM)
        opt.step()

    if rank != 0:
        return 0
    ref_model = Model(a.vocab, L, a.dim, a.heads)
    ref_model.load_state_dict(state0)
    ref_opt = torch.optim.Adam(ref_model.parameters(), lr=1e-2)
    everything = torch.arange(L)
    worst = 0.0
    print(f"step  ring loss (P = {P})  single-process loss  relative difference")
    for step in range(a.steps):
        ref_opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(ref_model(x[:L], everything, torch_causal_attention), x[1:L + 1],
                                                 reduction="sum") / L
        loss.backward()
        ref_opt.step()
        diff = abs(losses[step] - loss.item()) / max(abs(loss.item()), 1e-30)
        worst = max(worst, diff) if diff == diff else float("nan")  # a NaN loss is a mismatch, not skipped
        print(f"{step:4d}  {losses[step]:.6f}           {loss.item():.6f}             {diff:.1e}")
    # worst stays NaN once a step's difference was NaN (max() would drop it).
    print(f"max relative difference {worst:.1e} (bound 1e-4): {'match' if worst <= 1e-4 else 'MISMATCH'}")
    return 0 if worst <= 1e-4 else 1


if __name__ == "__main__":
    sys.exit(main())
