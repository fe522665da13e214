"""One problem, one answer: the per-sequence alignment rule through every entry point.

The problem is the one docs/conventions.md draws — a padded batch whose sequences end at their
own key lengths, Lq new queries, causal (and a window) aligned bottom-right *per sequence*:
query i of sequence b has its diagonal at d_b(i) = i + n_b − Lq — plus random ones. The same
Q, K, V go through
  * attn.scaled_dot_product_attention with impl reference, flash, decode and auto,
  * attn.decode_attention over an attn.KVCache that holds each sequence at its own length,
  * the CLI, `attn sdpa --key-lengths … --causal bottom-right` with each impl,
  * attn.MultiheadAttention.forward_incremental: Q, K, V are then the layer's own projections of
    per-sequence prompts and new tokens (the same problem, built by the layer),
and each answer is compared with the rule written from its definition (reference.visible) and
computed in float64 (reference.textbook).
"""
import subprocess

import numpy as np
import pytest

import attn
from reference import attn_cli, close, textbook, visible


IMPLS = ["reference", "flash", "decode", "auto"]


def oracle(q, k, v, lengths, window_left=None):
    lq, lk = q.shape[2], k.shape[2]
    keep = visible(q.shape[0], lq, lk, key_lengths=lengths, causal="bottom-right",
                   window=None if window_left is None else (window_left, None), window_alignment="bottom-right")
    out, lse, _ = textbook(q, k, v, keep=keep)
    return out, lse


def rand(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def cases():
    """(name, B, Hq, Hkv, Lq, Lk, D, lengths, window_left); the first is the drawn example."""
    out = [("drawn: Lq 3, lengths 5 and 7", 2, 2, 2, 3, 7, 8, [5, 7], None),
           ("drawn + window 2", 2, 2, 2, 3, 7, 8, [5, 7], 2)]
    rng = np.random.default_rng(2026)
    for n in range(8):
        B, Hkv = int(rng.integers(1, 4)), int(rng.integers(1, 3))
        Hq = Hkv * int(rng.integers(1, 3))
        Lq, Lk, D = int(rng.integers(1, 6)), int(rng.integers(6, 70)), int(rng.choice([4, 8, 16, 33]))
        lengths = [int(x) for x in rng.integers(Lq, Lk + 1, size=B)]
        lengths[-1] = Lk  # one sequence uses the whole K (the old whole-K rule agrees only there)
        out.append((f"random {n}", B, Hq, Hkv, Lq, Lk, D, lengths, [None, 3][n % 2]))
    return out


def old_rule(case):
    name, B, Hq, Hkv, Lq, Lk, D, lengths, window = case
    return visible(B, Lq, Lk, key_lengths=lengths, causal="bottom-right", query_offset=Lk - Lq,
                   window=None if window is None else (window, None))


def rules_differ(case):
    name, B, Hq, Hkv, Lq, Lk, D, lengths, window = case
    new = visible(B, Lq, Lk, key_lengths=lengths, causal="bottom-right",
                  window=None if window is None else (window, None), window_alignment="bottom-right")
    return bool((new != old_rule(case)).any())


def test_the_cases_tell_the_rules_apart():
    differ = [c[0] for c in cases() if rules_differ(c)]
    assert len(differ) >= len(cases()) - 3, differ


def problem(case):
    name, B, Hq, Hkv, Lq, Lk, D, lengths, window = case
    rng = np.random.default_rng(abs(hash(name)) % 2**32)
    return rand(rng, B, Hq, Lq, D), rand(rng, B, Hkv, Lk, D), rand(rng, B, Hkv, Lk, D), np.array(lengths, np.int64)


@pytest.mark.parametrize("case", cases(), ids=lambda c: c[0])
def test_every_entry_point_gives_the_rule(case, tmp_path):
    name, B, Hq, Hkv, Lq, Lk, D, lengths, window = case
    q, k, v, kl = problem(case)
    want_out, want_lse = oracle(q, k, v, kl, window)
    win = None if window is None else (window, None)

    # Where the old whole-K alignment (d = i + Lk − Lq, keys cut at n_b) sees other keys, the
    # answers must differ too, or the test could not tell the rules apart.
    if rules_differ(case):
        old_out = textbook(q, k, v, keep=old_rule(case))[0]
        assert not np.allclose(old_out, want_out, atol=1e-3)

    # 1. sdpa, every kernel
    for impl in IMPLS:
        out, lse = attn.scaled_dot_product_attention(q, k, v, is_causal=True, causal_alignment="bottom-right",
                                                     key_lengths=kl, window=win, window_alignment="bottom-right",
                                                     return_lse=True, impl=impl)
        close(out, want_out)
        close(lse, want_lse)

    # 2. decode_attention over a cache holding sequence b at length n_b
    cache = attn.KVCache(batch=B, kv_heads=Hkv, head_dim=D, capacity=Lk)
    for b, n in enumerate(lengths):
        cache.append(k[b, :, :n], v[b, :, :n], batch_index=b)
    assert list(cache.lengths) == list(lengths)
    out, lse = attn.decode_attention(q, cache, is_causal=True, window=win, return_lse=True)
    close(out, want_out)
    close(lse, want_lse)

    # 3. the CLI, every kernel
    cli = attn_cli()  # skips here without the CLI
    for a, x in (("q", q), ("k", k), ("v", v), ("kl", kl)):
        np.save(tmp_path / f"{a}.npy", x)
    for impl in IMPLS:
        cmd = [cli, "sdpa", "--q", tmp_path / "q.npy", "--k", tmp_path / "k.npy", "--v", tmp_path / "v.npy",
               "--key-lengths", tmp_path / "kl.npy", "--causal", "bottom-right", "--impl", impl,
               "--out", tmp_path / f"o_{impl}.npy", "--lse", tmp_path / f"l_{impl}.npy"]
        if window is not None:
            cmd += ["--window-left", str(window), "--window-align", "bottom-right"]
        r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        close(np.load(tmp_path / f"o_{impl}.npy"), want_out)
        close(np.load(tmp_path / f"l_{impl}.npy"), want_lse)


def test_rows_before_their_sequence_see_nothing(tmp_path):
    """key_lengths[b] < Lq: rows with d_b(i) < 0 see no key — output 0, lse −inf — on every sdpa
    kernel and the CLI (decode_attention refuses such a cache: append the new tokens first)."""
    rng = np.random.default_rng(7)
    q, k, v = rand(rng, 2, 2, 5, 8), rand(rng, 2, 1, 9, 8), rand(rng, 2, 1, 9, 8)
    kl = np.array([3, 9], np.int64)  # sequence 0: queries 0 and 1 come before its first key
    want_out, want_lse = oracle(q, k, v, kl)
    assert np.all(want_out[0, :, :2] == 0) and np.all(np.isneginf(want_lse[0, :, :2]))
    for impl in IMPLS:
        out, lse = attn.scaled_dot_product_attention(q, k, v, is_causal=True, causal_alignment="bottom-right",
                                                     key_lengths=kl, return_lse=True, impl=impl)
        close(out, want_out)
        close(lse, want_lse)
    cli = attn_cli()  # skips here without the CLI
    for a, x in (("q", q), ("k", k), ("v", v), ("kl", kl)):
        np.save(tmp_path / f"{a}.npy", x)
    r = subprocess.run([cli, "sdpa", "--q", str(tmp_path / "q.npy"), "--k", str(tmp_path / "k.npy"),
                        "--v", str(tmp_path / "v.npy"), "--key-lengths", str(tmp_path / "kl.npy"),
                        "--causal", "bottom-right", "--out", str(tmp_path / "o.npy"), "--lse", str(tmp_path / "l.npy")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    close(np.load(tmp_path / "o.npy"), want_out)
    close(np.load(tmp_path / "l.npy"), want_lse)


@pytest.mark.parametrize("prompts,T", [([2, 4], 3), ([1, 6, 3], 2), ([5], 4), ([0, 7], 1)])
def test_incremental_mha_is_the_same_problem(prompts, T):
    """The layer's own problem: sequence b holds prompts[b] tokens, then T new tokens arrive for
    every sequence; query t of sequence b sees its prompt and new tokens 0..t — bottom-right
    per sequence with n_b = prompts[b] + T. Checked against the projections and the rule in
    float64 (three float32 GEMMs of ≤ 32 terms and the attention: errors ~1e-6; a wrong
    alignment moves outputs by ~1e-1)."""
    E, H, B = 32, 4, len(prompts)
    D = E // H
    rng = np.random.default_rng(sum(prompts) * 10 + T)
    w_in, b_in = rand(rng, 3 * E, E) / np.sqrt(E), rand(rng, 3 * E)
    w_out, b_out = rand(rng, E, E) / np.sqrt(E), rand(rng, E)
    mha = attn.MultiheadAttention(E, H, batch_first=True)
    mha.load_state_dict({"in_proj_weight": w_in, "in_proj_bias": b_in,
                         "out_proj.weight": w_out, "out_proj.bias": b_out})

    def project(x, part):  # x (..., E) → (..., H, D) in float64
        w, bias = w_in[part * E:(part + 1) * E].astype(np.float64), b_in[part * E:(part + 1) * E].astype(np.float64)
        y = x.astype(np.float64) @ w.T + bias
        return y.reshape(*x.shape[:-1], H, D)

    cache = attn.KVCache(batch=B, kv_heads=H, head_dim=D, capacity=max(prompts) + T)
    x_prompt = [rand(rng, n, E) for n in prompts]
    for b, xp in enumerate(x_prompt):
        if len(xp):
            cache.append(project(xp, 1).transpose(1, 0, 2).astype(np.float32),
                         project(xp, 2).transpose(1, 0, 2).astype(np.float32), batch_index=b)
    x_new = rand(rng, B, T, E)
    got = mha.forward_incremental(x_new, cache)
    assert list(cache.lengths) == [n + T for n in prompts]

    # The same problem by hand: Q, K, V padded to the longest sequence, key_lengths n_b.
    Lk = max(prompts) + T
    q = project(x_new, 0).transpose(0, 2, 1, 3)  # (B, H, T, D)
    k = np.zeros((B, H, Lk, D))
    v = np.zeros((B, H, Lk, D))
    for b, n in enumerate(prompts):
        k[b, :, :n + T] = np.concatenate([project(x_prompt[b], 1), project(x_new[b], 1)]).transpose(1, 0, 2)
        v[b, :, :n + T] = np.concatenate([project(x_prompt[b], 2), project(x_new[b], 2)]).transpose(1, 0, 2)
    lengths = np.array([n + T for n in prompts])
    o, _ = oracle(q, k, v, lengths)
    want = o.transpose(0, 2, 1, 3).reshape(B, T, E) @ w_out.astype(np.float64).T + b_out
    close(got, want, atol=1e-5 * np.abs(want).max(), rtol=0.0)  # the MHA bound (docs/conventions.md)
