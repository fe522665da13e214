"""`attn mha --grad-out dO.npy --grads G.safetensors` (training) against torch 1.13 autograd.

For random configurations (the forward test's generator: self/cross attention, kdim/vdim,
fused KV, bias, batch_first/unbatched, bool/float attn_mask and key_padding_mask, causal,
add_bias_kv) torch's nn.MultiheadAttention runs in float64 on the same float32 weights and
inputs, output.backward(dO) gives the oracle gradients of every parameter and input. attn
computes in float32 (projections, flash/reference backward, GEMMs), so per gradient tensor
max|attn - torch| <= REL_TOL * max|torch| + ABS_TOL. REL_TOL = 1e-4 (measured worst: about
1e-6); ABS_TOL = 1e-6 only matters for gradients that are exactly 0 in exact arithmetic
(e.g. dQuery with one key: the softmax is constant), where float32 leaves rounding noise
of order eps32 * |terms| ~ 1e-8. Runtime: about 5 s.
Dropout has no torch oracle (different RNG); it is checked by finite differences in
tests/mha/test_mha_backward.cpp.
"""
import os
import struct
import subprocess
import sys

import numpy as np
import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_mha_torch import build_module, input_shape, make_case, random_masks, st_bytes, torch_masks  # noqa: E402

ATTN = os.environ.get("ATTN_BIN", "attn")
REL_TOL = 1e-4
ABS_TOL = 1e-6
N_CASES = 40


def read_safetensors(path):
    import json
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        assert e["dtype"] == "F32"
        a, b = e["data_offsets"]
        out[name] = np.frombuffer(raw[8 + n + a:8 + n + b], dtype=np.float32).reshape(e["shape"])
    return out


def case(seed):
    c = make_case(seed)
    c["param_dtype"] = "F32"
    c["need_weights"] = False
    c["per_head"] = False
    return c


CASES = [case(s) for s in range(500, 500 + N_CASES)]


def test_coverage():
    keys = lambda f: {f(c) for c in CASES}
    for f in (lambda c: c["cross"], lambda c: c["kdim"] != c["E"], lambda c: c["kv_same"], lambda c: c["bias"],
              lambda c: c["batch_first"], lambda c: c["unbatched"], lambda c: c["causal"], lambda c: c["bias_kv"]):
        assert keys(f) == {True, False}
    assert keys(lambda c: c["attn_mask"]) == {"none", "bool2", "bool3", "float2", "float3"}
    assert keys(lambda c: c["kpm"]) == {"none", "bool", "float"}


@pytest.mark.parametrize("c", CASES, ids=lambda c: f"s{c['seed']}")
def test_grads_vs_torch(c, tmp_path):
    rng = np.random.default_rng(c["seed"] + 7)
    gen = torch.Generator().manual_seed(c["seed"])
    m = build_module(c, gen)
    (tmp_path / "p.safetensors").write_bytes(st_bytes(dict(m.state_dict())))
    q = rng.standard_normal(input_shape(c, c["Lq"], c["E"])).astype(np.float32)
    np.save(tmp_path / "q.npy", q)
    args = ["--params", "p.safetensors", "--num-heads", str(c["h"]), "--query", "q.npy", "--out", "o.npy",
            "--grad-out", "dy.npy", "--grads", "g.safetensors"]
    names = {"query": q}
    if c["cross"]:
        k = rng.standard_normal(input_shape(c, c["Lk"], c["kdim"])).astype(np.float32)
        np.save(tmp_path / "k.npy", k)
        names["key"] = k
        if c["kv_same"]:
            args += ["--key", "k.npy", "--value", "k.npy"]
        else:
            v = rng.standard_normal(input_shape(c, c["Lk"], c["vdim"])).astype(np.float32)
            np.save(tmp_path / "v.npy", v)
            names["value"] = v
            args += ["--key", "k.npy", "--value", "v.npy"]
    if c["batch_first"]:
        args.append("--batch-first")
    am, kpm = random_masks(c, rng)
    if am is not None:
        np.save(tmp_path / "am.npy", am)
        args += ["--attn-mask", "am.npy"]
    if kpm is not None:
        np.save(tmp_path / "kpm.npy", kpm)
        args += ["--key-padding-mask", "kpm.npy"]
    if c["causal"]:
        args.append("--causal")
    dy = rng.standard_normal(input_shape(c, c["Lq"], c["E"])).astype(np.float32)
    np.save(tmp_path / "dy.npy", dy)
    r = subprocess.run([ATTN, "mha", *args], cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    ours = read_safetensors(tmp_path / "g.safetensors")

    # torch oracle in float64: leaf inputs; an input used twice accumulates both gradients.
    md = m.double().train()  # dropout is 0, train() only enables autograd-friendly paths
    leaves = {n: torch.from_numpy(a.astype(np.float64)).requires_grad_(True) for n, a in names.items()}
    tq = leaves["query"]
    tk = leaves.get("key", tq)
    tv = leaves.get("value", tk if c["kv_same"] else tq)
    t_am, t_kpm = torch_masks(c, am, kpm)
    out, _ = md(tq, tk, tv, key_padding_mask=t_kpm, attn_mask=t_am, need_weights=False)
    out.backward(torch.from_numpy(dy.astype(np.float64)))
    ref = {n: p.grad.numpy() for n, p in md.named_parameters()}
    ref.update({n: t.grad.numpy() for n, t in leaves.items()})

    o = np.load(tmp_path / "o.npy")
    assert np.abs(o - out.detach().numpy()).max() <= REL_TOL * np.abs(out.detach().numpy()).max()
    assert sorted(ours) == sorted(ref), f"gradient names {sorted(ours)} != torch's {sorted(ref)}"
    for n in ref:
        assert ours[n].shape == ref[n].shape, n
        assert np.all(np.isfinite(ours[n])), n
        scale = np.abs(ref[n]).max()
        diff = np.abs(ours[n] - ref[n]).max()
        print(f"{n}: max diff {diff:.2e}, rel {diff / max(scale, 1e-30):.2e}")
        assert diff <= REL_TOL * scale + ABS_TOL, \
            f"{n}: max|attn - torch| = {diff:.3e} > {REL_TOL} * max|torch| ({scale:.3e}) + {ABS_TOL}"


@pytest.mark.parametrize("lq, lk", [(3, 7), (6, 4)])
def test_grads_causal_bottom_right_vs_torch(tmp_path, lq, lk):
    # --grads with --causal bottom-right (query i sees keys 0..i + Lk - Lq) and Lq != Lk: the
    # random cases above are self-attention or top-left. The oracle is torch in float64 with the
    # boolean mask. With Lq > Lk the first Lq - Lk queries see no key: attn's attention output
    # there is 0 (the layer's output out_proj.bias) and their dy reaches out_proj.bias alone;
    # torch would give NaN, so its mask lets those rows see every key and its dy is 0 on them
    # (their share of every other gradient is 0 then), and their dy is added to dbias by hand.
    c = dict(E=8, h=2, kdim=5, vdim=3, bias=True, batch_first=False)
    m = build_module(c, torch.Generator().manual_seed(lq))
    (tmp_path / "p.safetensors").write_bytes(st_bytes(dict(m.state_dict())))
    rng = np.random.default_rng(lk)
    names = {"query": (lq, 8), "key": (lk, 5), "value": (lk, 3)}
    names = {n: rng.standard_normal((L, 2, f)).astype(np.float32) for n, (L, f) in names.items()}
    dy = rng.standard_normal((lq, 2, 8)).astype(np.float32)
    for n, a in [*names.items(), ("dy", dy)]:
        np.save(tmp_path / f"{n}.npy", a)
    r = subprocess.run([ATTN, "mha", "--params", "p.safetensors", "--num-heads", "2", "--query", "query.npy", "--key",
                        "key.npy", "--value", "value.npy", "--causal", "bottom-right", "--out", "o.npy", "--grad-out",
                        "dy.npy", "--grads", "g.safetensors"], cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    ours = read_safetensors(tmp_path / "g.safetensors")

    not_allowed = torch.arange(lk)[None, :] > torch.arange(lq)[:, None] + (lk - lq)
    dead = not_allowed.all(-1)
    assert bool(dead.any()) == (lq > lk)
    md = m.double().train()
    leaves = {n: torch.from_numpy(a.astype(np.float64)).requires_grad_(True) for n, a in names.items()}
    out, _ = md(leaves["query"], leaves["key"], leaves["value"], attn_mask=not_allowed & ~dead[:, None],
                need_weights=False)
    dy64 = torch.from_numpy(dy.astype(np.float64))
    out.backward(dy64.masked_fill(dead[:, None, None], 0.0))
    ref = {n: p.grad.numpy().copy() for n, p in md.named_parameters()}
    ref.update({n: t.grad.numpy() for n, t in leaves.items()})
    ref["out_proj.bias"] += dy64[dead].sum(dim=(0, 1)).numpy()
    want = out.detach().numpy().copy()
    want[dead.numpy()] = md.out_proj.bias.detach().numpy()

    assert np.abs(np.load(tmp_path / "o.npy") - want).max() <= REL_TOL * np.abs(want).max()
    assert sorted(ours) == sorted(ref), f"gradient names {sorted(ours)} != torch's {sorted(ref)}"
    for n in ref:
        assert ours[n].shape == ref[n].shape, n
        scale = np.abs(ref[n]).max()
        diff = np.abs(ours[n] - ref[n]).max()
        assert diff <= REL_TOL * scale + ABS_TOL, \
            f"{n}: max|attn - torch| = {diff:.3e} > {REL_TOL} * max|torch| ({scale:.3e}) + {ABS_TOL}"


def test_grads_argument_errors(tmp_path):
    c = case(500)
    gen = torch.Generator().manual_seed(0)
    m = build_module(c, gen)
    (tmp_path / "p.safetensors").write_bytes(st_bytes(dict(m.state_dict())))
    np.save(tmp_path / "q.npy", np.zeros(input_shape(c, 3, c["E"]), np.float32))
    base = ["mha", "--params", "p.safetensors", "--num-heads", str(c["h"]), "--query", "q.npy", "--out", "o.npy"]
    for extra, msg in ((["--grads", "g.safetensors"], "--grads"), (["--grad-out", "q.npy"], "--grad-out"),
                       (["--dropout-p", "0.1"], "--dropout-p")):
        r = subprocess.run([ATTN, *base, *extra], cwd=tmp_path, capture_output=True, text=True)
        assert r.returncode != 0 and msg in r.stderr, r.stderr
        assert not (tmp_path / "o.npy").exists()
    np.save(tmp_path / "bad.npy", np.zeros((2, 2), np.float32))
    r = subprocess.run([ATTN, *base, "--grad-out", "bad.npy", "--grads", "g.safetensors"], cwd=tmp_path,
                       capture_output=True, text=True)
    assert r.returncode == 2 and "MultiHeadAttention: --grad-out: expected a floating tensor shaped like the output" in r.stderr, r.stderr
    assert not (tmp_path / "o.npy").exists() and not (tmp_path / "g.safetensors").exists()
    # Several tensors have no .npy form; and --grads and --out are published together: a
    # failing --out leaves no gradients file (it was written first; a review found it).
    train = ["--grad-out", "q.npy", "--grads"]
    r = subprocess.run([ATTN, *base, *train, "g.npy"], cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode == 2 and "--grads: 'g.npy' would hold several tensors" in r.stderr, r.stderr
    full = [a if a != "o.npy" else "/dev/full" for a in base]
    r = subprocess.run([ATTN, *full, *train, "g.safetensors"], cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode == 2 and "write failed" in r.stderr, r.stderr
    assert not (tmp_path / "g.safetensors").exists()


def test_an_input_spelt_twice_is_one_tensor_with_the_summed_gradient(tmp_path):
    # --key q.npy --value ./q.npy is the query three times: the file holds 'query' only, with
    # the sum of the three uses (the paths were compared as strings: 'value' came out separately
    # and 'query' lacked its share; a review found it).
    c = case(501)
    gen = torch.Generator().manual_seed(1)
    m = build_module(c, gen)
    (tmp_path / "p.safetensors").write_bytes(st_bytes(dict(m.state_dict())))
    rng = np.random.default_rng(3)
    np.save(tmp_path / "q.npy", rng.standard_normal(input_shape(c, 4, c["E"])).astype(np.float32))
    np.save(tmp_path / "dy.npy", rng.standard_normal(input_shape(c, 4, c["E"])).astype(np.float32))
    base = ["mha", "--params", "p.safetensors", "--num-heads", str(c["h"]), "--query", "q.npy", "--grad-out", "dy.npy"]
    if c["batch_first"]:
        base.append("--batch-first")
    for extra, g in (([], "self.safetensors"), (["--key", "q.npy", "--value", "./q.npy"], "spelt.safetensors"),
                     (["--key", os.path.join(str(tmp_path), "q.npy"), "--value", "q.npy"], "abs.safetensors")):
        r = subprocess.run([ATTN, *base, *extra, "--grads", g, "--out", "o.npy"], cwd=tmp_path, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
    ref = read_safetensors(tmp_path / "self.safetensors")
    for g in ("spelt.safetensors", "abs.safetensors"):
        ours = read_safetensors(tmp_path / g)
        assert sorted(ours) == sorted(ref), g
        for n in ref:
            assert np.array_equal(ours[n], ref[n]), (g, n)
