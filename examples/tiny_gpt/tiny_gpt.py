#!/usr/bin/python3
"""tiny_gpt — a small GPT in plain PyTorch whose attention is
attn.torch.scaled_dot_product_attention(is_causal=True), trained on the CPU to reverse a
token sequence (the task of examples/tiny_decoder).

Task: x_1 .. x_n SEP y_1 .. y_n with y = reverse(x). The model reads x_1 .. x_n SEP y_1 .. y_{n-1}
and is trained to predict y_1 .. y_n at positions n .. 2n-1: y_i is x_{n+1-i}, reachable only
through attention. Held-out accuracy: greedy decoding of sequences drawn by another generator
(seed + 1000) — random sequences, not checked against the training batches, which with --n 8 and
--vocab 10 cover a tiny share of the 10^8 possible ones.

  PYTHONPATH=build/python /usr/bin/python3 examples/tiny_gpt/tiny_gpt.py [--steps 300] [--threads 1]
      [--attention attn|torch] [--min-accuracy 0.95]
Exit status 0 when the held-out accuracy reaches --min-accuracy, 1 otherwise.
"""
import argparse
import math
import time

import torch
import torch.nn.functional as F
from torch import nn

import attn.torch


def torch_causal_attention(q, k, v):
    """torch 1.13's own attention (it has no F.scaled_dot_product_attention): the textbook."""
    lq, lk = q.size(-2), k.size(-2)
    s = (q @ k.transpose(-1, -2)) * (q.size(-1) ** -0.5)
    s = s.masked_fill(torch.ones(lq, lk, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return s.softmax(-1) @ v


def attn_causal_attention(q, k, v):
    return attn.torch.scaled_dot_product_attention(q, k, v, is_causal=True)


ATTENTION = {"attn": attn_causal_attention, "torch": torch_causal_attention}


class Block(nn.Module):
    """Pre-LayerNorm GPT-2 block: h += attn(LN(h)); h += MLP(LN(h))."""

    def __init__(self, d, heads, attention):
        super().__init__()
        self.heads, self.attention = heads, attention
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, h):
        b, t, d = h.shape
        # (B, T, 3, H, Dh) → three (B, H, T, Dh) views: attn reads them in place.
        q, k, v = self.qkv(self.ln1(h)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = self.attention(q, k, v)
        h = h + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return h + self.mlp(self.ln2(h))


class GPT(nn.Module):
    def __init__(self, vocab, length, d=64, heads=4, layers=2, attention="attn"):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Parameter(0.02 * torch.randn(length, d))
        self.blocks = nn.ModuleList(Block(d, heads, ATTENTION[attention]) for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab)

    def forward(self, tokens):
        h = self.tok(tokens) + self.pos[: tokens.size(1)]
        for block in self.blocks:
            h = block(h)
        return self.head(self.ln(h))


def batch(n_seq, n, vocab, gen):
    """(inputs (B, 2n), targets (B, n)): x SEP y_1..y_{n-1} and y = reverse(x); SEP = vocab."""
    x = torch.randint(0, vocab, (n_seq, n), generator=gen)
    y = x.flip(1)
    sep = torch.full((n_seq, 1), vocab)
    return torch.cat([x, sep, y[:, :-1]], 1), y


@torch.no_grad()
def accuracy(model, n, vocab, gen, n_seq=256):
    """Greedy decoding: each y_i from the model's own previous answers."""
    x, y = batch(n_seq, n, vocab, gen)
    seq = x[:, : n + 1]
    for _ in range(n):
        nxt = model(seq)[:, -1].argmax(-1, keepdim=True)
        seq = torch.cat([seq, nxt], 1)
    return (seq[:, n + 1:] == y).all(1).float().mean().item()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--n", type=int, default=8, help="sequence length to reverse")
    p.add_argument("--vocab", type=int, default=10)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--attention", choices=list(ATTENTION), default="attn")
    p.add_argument("--print-every", type=int, default=50)
    p.add_argument("--min-accuracy", type=float, default=0.95)
    a = p.parse_args()
    for name in ("steps", "n", "vocab", "batch", "threads", "print_every"):
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1 but got {getattr(a, name)}")
    if a.threads > 4096:  # attn's own range
        p.error(f"--threads must be from 1 to 4096 but got {a.threads}")
    if not (0 <= a.seed <= 2**63 - 1001):  # torch seeds are 64-bit; the held-out set uses seed + 1000
        p.error(f"--seed must be from 0 to {2**63 - 1001} but got {a.seed}")
    if not (math.isfinite(a.lr) and a.lr > 0):
        p.error(f"--lr must be a finite number > 0 but got {a.lr}")
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    gen = torch.Generator().manual_seed(a.seed)
    model = GPT(a.vocab + 1, 2 * a.n, attention=a.attention)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.01)
    t0 = time.perf_counter()
    for step in range(1, a.steps + 1):
        inputs, y = batch(a.batch, a.n, a.vocab, gen)
        logits = model(inputs)[:, a.n:]
        loss = F.cross_entropy(logits.reshape(-1, a.vocab + 1), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % a.print_every == 0 or step == 1:
            print(f"step {step:4d}  loss {loss.item():.4f}  (chance {math.log(a.vocab):.2f})", flush=True)
    acc = accuracy(model.eval(), a.n, a.vocab, torch.Generator().manual_seed(a.seed + 1000))
    print(f"held-out accuracy {acc:.3f} (whole sequences) after {a.steps} steps, "
          f"{time.perf_counter() - t0:.1f} s, attention: {a.attention}")
    return 0 if acc >= a.min_accuracy else 1


if __name__ == "__main__":
    raise SystemExit(main())
