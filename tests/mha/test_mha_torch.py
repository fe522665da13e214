"""`attn mha` against torch 1.13's nn.MultiheadAttention (eval mode), through the CLI.

The oracle is PyTorch's module run in float64 with the same weights (written to safetensors
by the small writer below, independent of attn's). attn computes in float32, so the error
budget is float32 rounding through two GEMMs and a softmax: max|attn - torch| <= 1e-4 *
max|torch| per output tensor (the issue's relative error). Runtime: about 30 s on 2 cores.
"""
import json
import os
import struct
import subprocess

import numpy as np
import pytest
import torch

ATTN = os.environ.get("ATTN_BIN", "attn")
REL_TOL = 1e-4
N_RANDOM = 120

torch.set_num_threads(1)


# ---------------------------------------------------------------- safetensors writer
def st_bytes(tensors, dtype="F32", header_override=None, pad=True):
    """safetensors image of {name: torch tensor}; dtype F32, F16 or BF16."""
    header, blobs, off = {}, [], 0
    for name, t in tensors.items():
        t = t.detach().contiguous()
        if dtype == "F32":
            b = t.to(torch.float32).numpy().tobytes()
        elif dtype == "F16":
            b = t.to(torch.float16).numpy().tobytes()
        elif dtype == "BF16":
            b = t.to(torch.bfloat16).view(torch.int16).numpy().tobytes()
        else:
            raise ValueError(dtype)
        header[name] = {"dtype": dtype, "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    if header_override is not None:
        header = header_override(header)
    text = json.dumps(header).encode() if not isinstance(header, bytes) else header
    if pad:
        text += b" " * ((8 - len(text) % 8) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(blobs)


def rounded(t, dtype):
    """The values attn sees after the file stores `t` as dtype."""
    return {"F32": t.float(), "F16": t.half().float(), "BF16": t.bfloat16().float()}[dtype].double()


# ---------------------------------------------------------------- running attn
def run_attn(tmp, args, expect_ok=True):
    r = subprocess.run([ATTN, "mha", *args], cwd=tmp, capture_output=True, text=True)
    if expect_ok:
        assert r.returncode == 0, f"attn mha {' '.join(args)}\nstderr: {r.stderr}"
    return r


def rel_err(ours, ref):
    ours, ref = np.asarray(ours, np.float64), np.asarray(ref, np.float64)
    assert ours.shape == ref.shape, f"shape {ours.shape} != torch's {ref.shape}"
    assert np.all(np.isfinite(ours)), "attn gave a non-finite value"
    scale = max(np.abs(ref).max(), 1e-30)
    return np.abs(ours - ref).max() / scale


# ---------------------------------------------------------------- random configurations
def make_case(seed):
    rng = np.random.default_rng(seed)
    c = {"seed": seed}
    h = int(rng.choice([1, 2, 3, 4]))
    c["h"] = h
    c["E"] = h * int(rng.choice([1, 2, 3, 4, 5, 8]))
    c["cross"] = bool(rng.random() < 0.5)
    odd_dims = c["cross"] and rng.random() < 0.4
    c["kdim"] = int(rng.integers(1, 11)) if odd_dims else c["E"]
    c["vdim"] = int(rng.integers(1, 11)) if odd_dims else c["E"]
    # key is value (one file → fused KV GEMM) only when the dims allow it
    c["kv_same"] = c["cross"] and not odd_dims and rng.random() < 0.4
    c["bias"] = bool(rng.random() < 0.7)
    c["unbatched"] = bool(rng.random() < 0.2)
    c["batch_first"] = bool(rng.random() < 0.5)
    c["B"] = 1 if c["unbatched"] else int(rng.integers(1, 4))
    c["Lq"] = int(rng.choice([1, 2, 3, 5, 7, 9, 16]))
    c["Lk"] = int(rng.choice([1, 2, 4, 6, 9, 13])) if c["cross"] else c["Lq"]
    c["attn_mask"] = str(rng.choice(["none", "none", "bool2", "bool3", "float2", "float3"]))
    c["kpm"] = str(rng.choice(["none", "none", "bool", "float"]))
    c["causal"] = bool(rng.random() < 0.25)
    c["need_weights"] = bool(rng.random() < 0.6)
    c["per_head"] = c["need_weights"] and bool(rng.random() < 0.5)
    c["param_dtype"] = str(rng.choice(["F32"] * 6 + ["F16", "BF16"]))
    c["input_dtype"] = str(rng.choice(["float32"] * 4 + ["float64"]))
    c["bias_kv"] = bool(rng.random() < 0.15)  # add_bias_kv: bias_k/bias_v in the file
    if c["bias_kv"]:
        c["causal"] = False  # attn refuses is_causal with appended keys (tested below)
    return c


def case_id(c):
    return (f"s{c['seed']}-E{c['E']}h{c['h']}-{'x' if c['cross'] else 'self'}-k{c['kdim']}v{c['vdim']}"
            f"-{'ub' if c['unbatched'] else ('bf' if c['batch_first'] else 'sf')}-am_{c['attn_mask']}-kpm_{c['kpm']}"
            f"{'-causal' if c['causal'] else ''}{'-w' if c['need_weights'] else ''}{'h' if c['per_head'] else ''}"
            f"{'-biaskv' if c['bias_kv'] else ''}")


def random_masks(c, rng):
    """PyTorch-convention masks; key 0 is never masked so no row is fully masked (torch
    gives NaN there; that case has its own test)."""
    B, h, Lq, Lk = c["B"], c["h"], c["Lq"], c["Lk"]
    lead = (h,) if c["unbatched"] else (B * h,)
    am = None
    if c["attn_mask"].startswith("bool"):
        shape = (Lq, Lk) if c["attn_mask"] == "bool2" else lead + (Lq, Lk)
        am = rng.random(shape) < 0.3
        am[..., 0] = False
    elif c["attn_mask"].startswith("float"):
        shape = (Lq, Lk) if c["attn_mask"] == "float2" else lead + (Lq, Lk)
        am = rng.normal(0, 1.5, shape).astype(np.float32)
        ninf = rng.random(shape) < 0.15
        ninf[..., 0] = False
        am[ninf] = -np.inf
    kpm = None
    kshape = (Lk,) if c["unbatched"] else (B, Lk)
    if c["kpm"] == "bool":
        kpm = rng.random(kshape) < 0.3
        kpm[..., 0] = False
    elif c["kpm"] == "float":
        kpm = rng.normal(0, 1.0, kshape).astype(np.float32)
        ninf = rng.random(kshape) < 0.2
        ninf[..., 0] = False
        kpm[ninf] = -np.inf
    return am, kpm


def torch_masks(c, am, kpm):
    """The same masks as torch 1.13 takes them. Causal becomes a bool mask; a float
    key_padding_mask is merged into a float (B·h, Lq, Lk) attn_mask (1.13 cannot combine a
    float key_padding_mask with an attn_mask; torch 2.x adds it, which is attn's rule)."""
    B, h, Lq, Lk = c["B"], c["h"], c["Lq"], c["Lk"]
    t_am = None if am is None else torch.from_numpy(am)
    if t_am is not None and t_am.dtype != torch.bool:
        t_am = t_am.double()
    if c["causal"]:
        cm = torch.triu(torch.ones(Lq, Lk, dtype=torch.bool), diagonal=1)
        if t_am is None:
            t_am = cm
        elif t_am.dtype == torch.bool:
            t_am = t_am | cm
        else:
            t_am = t_am.masked_fill(cm, float("-inf"))
    t_kpm = None if kpm is None else torch.from_numpy(kpm)
    if t_kpm is not None and t_kpm.dtype != torch.bool and t_am is not None:
        lead = h if c["unbatched"] else B * h
        base = t_am if t_am.dim() == 3 else t_am.expand(lead, Lq, Lk)
        if base.dtype == torch.bool:
            base = torch.zeros(base.shape, dtype=torch.float64).masked_fill(base, float("-inf"))
        kb = t_kpm.double().reshape(1, 1, Lk) if c["unbatched"] else t_kpm.double().repeat_interleave(h, 0).reshape(B * h, 1, Lk)
        # attn adds the two float32 masks in float32
        t_am = (base.float() + kb.float()).double()
        t_kpm = None
    elif t_kpm is not None and t_kpm.dtype != torch.bool:
        t_kpm = t_kpm.double()
    return t_am, t_kpm


def build_module(c, gen):
    kd = None if c["kdim"] == c["E"] else c["kdim"]
    vd = None if c["vdim"] == c["E"] else c["vdim"]
    m = torch.nn.MultiheadAttention(c["E"], c["h"], bias=c["bias"], kdim=kd, vdim=vd, batch_first=c["batch_first"],
                                    add_bias_kv=c.get("bias_kv", False))
    with torch.no_grad():
        for p in m.parameters():  # random biases too (torch initialises them to 0)
            p.copy_(torch.randn(p.shape, generator=gen) * (1.0 / np.sqrt(p.shape[-1])))
    return m.eval()


def input_shape(c, L, feat):
    if c["unbatched"]:
        return (L, feat)
    return (c["B"], L, feat) if c["batch_first"] else (L, c["B"], feat)


CASES = [make_case(s) for s in range(N_RANDOM)]


def test_case_coverage():
    """The random configurations cover everything the issue lists."""
    keys = lambda f: {f(c) for c in CASES}
    assert keys(lambda c: c["cross"]) == {True, False}
    assert keys(lambda c: c["kdim"] != c["E"]) == {True, False}
    assert keys(lambda c: c["kv_same"]) == {True, False}
    assert keys(lambda c: c["bias"]) == {True, False}
    assert keys(lambda c: c["batch_first"]) == {True, False}
    assert keys(lambda c: c["unbatched"]) == {True, False}
    assert keys(lambda c: c["attn_mask"]) == {"none", "bool2", "bool3", "float2", "float3"}
    assert keys(lambda c: c["kpm"]) == {"none", "bool", "float"}
    assert keys(lambda c: c["causal"]) == {True, False}
    assert keys(lambda c: (c["need_weights"], c["per_head"])) == {(False, False), (True, False), (True, True)}
    assert keys(lambda c: c["param_dtype"]) == {"F32", "F16", "BF16"}
    assert keys(lambda c: c["bias_kv"]) == {True, False}


@pytest.mark.parametrize("c", CASES, ids=case_id)
def test_random_vs_torch(c, tmp_path):
    rng = np.random.default_rng(1000 + c["seed"])
    gen = torch.Generator().manual_seed(c["seed"])
    m = build_module(c, gen)
    sd = m.state_dict()
    (tmp_path / "p.safetensors").write_bytes(st_bytes(sd, c["param_dtype"]))
    ref = build_module(c, gen).double()
    ref.load_state_dict({k: rounded(v, c["param_dtype"]) for k, v in sd.items()})

    q = rng.normal(0, 1, input_shape(c, c["Lq"], c["E"])).astype(c["input_dtype"])
    args = ["--params", "p.safetensors", "--num-heads", str(c["h"]), "--query", "q.npy", "--out", "o.npy"]
    np.save(tmp_path / "q.npy", q)
    if c["cross"]:
        k = rng.normal(0, 1, input_shape(c, c["Lk"], c["kdim"])).astype(c["input_dtype"])
        np.save(tmp_path / "k.npy", k)
        if c["kv_same"]:
            v = k
            args += ["--key", "k.npy", "--value", "k.npy"]
        else:
            v = rng.normal(0, 1, input_shape(c, c["Lk"], c["vdim"])).astype(c["input_dtype"])
            np.save(tmp_path / "v.npy", v)
            args += ["--key", "k.npy", "--value", "v.npy"]
    else:
        k = v = q
    am, kpm = random_masks(c, rng)
    if am is not None:
        np.save(tmp_path / "am.npy", am)
        args += ["--attn-mask", "am.npy"]
    if kpm is not None:
        np.save(tmp_path / "kpm.npy", kpm)
        args += ["--key-padding-mask", "kpm.npy"]
    if c["causal"]:
        args += ["--causal"]
    if c["batch_first"]:
        args += ["--batch-first"]
    if c["need_weights"]:
        args += ["--weights", "w.npy"]
        if c["per_head"]:
            args += ["--per-head-weights"]
    run_attn(tmp_path, args)

    t_am, t_kpm = torch_masks(c, am, kpm)
    f64 = lambda a: torch.from_numpy(np.asarray(a, np.float32).astype(np.float64))  # attn rounds inputs to float32
    with torch.no_grad():
        out, w = ref(f64(q), f64(k), f64(v), key_padding_mask=t_kpm, need_weights=True, attn_mask=t_am,
                     average_attn_weights=not c["per_head"])
    err = rel_err(np.load(tmp_path / "o.npy"), out.numpy())
    assert err <= REL_TOL, f"output relative error {err:.2e} > {REL_TOL}"
    if c["need_weights"]:
        werr = rel_err(np.load(tmp_path / "w.npy"), w.numpy())
        assert werr <= REL_TOL, f"weights relative error {werr:.2e} > {REL_TOL}"
    else:
        assert not (tmp_path / "w.npy").exists()


# ---------------------------------------------------------------- fully padded batch item
def test_fully_padded_item_gives_bias_not_nan(tmp_path):
    """Batch item 1 has every key padded: attn's attention output is 0 there (so the layer
    output is out_proj.bias, weights 0) where torch gives NaN; item 0 matches torch."""
    c = dict(E=8, h=2, kdim=8, vdim=8, bias=True, batch_first=True, B=2)
    m = build_module(c, torch.Generator().manual_seed(7))
    (tmp_path / "p.safetensors").write_bytes(st_bytes(m.state_dict()))
    ref = build_module(c, torch.Generator().manual_seed(0)).double()
    ref.load_state_dict({k: v.double() for k, v in m.state_dict().items()})
    x = np.random.default_rng(3).normal(size=(2, 5, 8)).astype(np.float32)
    kpm = np.zeros((2, 5), bool)
    kpm[1, :] = True
    kpm[0, 3:] = True
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "kpm.npy", kpm)
    run_attn(tmp_path, ["--params", "p.safetensors", "--num-heads", "2", "--query", "x.npy", "--out", "o.npy",
                        "--batch-first", "--key-padding-mask", "kpm.npy", "--weights", "w.npy"])
    o, w = np.load(tmp_path / "o.npy"), np.load(tmp_path / "w.npy")
    with torch.no_grad():
        t_out, t_w = ref(*(torch.from_numpy(x).double(),) * 3, key_padding_mask=torch.from_numpy(kpm))
    assert torch.isnan(t_out[1]).all(), "torch 1.13 was expected to give NaN here (docs say so)"
    assert rel_err(o[0], t_out[0].numpy()) <= REL_TOL
    assert rel_err(w[0], t_w[0].numpy()) <= REL_TOL
    np.testing.assert_array_equal(w[1], 0.0)
    bias = m.state_dict()["out_proj.bias"].numpy()
    np.testing.assert_allclose(o[1], np.broadcast_to(bias, (5, 8)), rtol=0, atol=0)


# ---------------------------------------------------------------- add_zero_attn
@pytest.mark.parametrize("bias_kv", [False, True])
def test_add_zero_attn_flag_matches_torch(tmp_path, bias_kv):
    """add_zero_attn has no state_dict tensor: --add-zero-attn says so, and the output and
    weights are torch's module's (without the flag the zero key was silently left out)."""
    gen = torch.Generator().manual_seed(11)
    m = torch.nn.MultiheadAttention(8, 2, add_zero_attn=True, add_bias_kv=bias_kv)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
    m = m.eval().double()
    (tmp_path / "p.safetensors").write_bytes(st_bytes({k: v.float() for k, v in m.state_dict().items()}))
    x = np.random.default_rng(12).normal(size=(5, 2, 8)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    base = ["--params", "p.safetensors", "--num-heads", "2", "--query", "x.npy", "--weights", "w.npy"]
    run_attn(tmp_path, base + ["--out", "o.npy", "--add-zero-attn"])
    with torch.no_grad():
        t_out, t_w = m(*(torch.from_numpy(x).double(),) * 3)
    assert rel_err(np.load(tmp_path / "o.npy"), t_out.numpy()) <= REL_TOL
    assert rel_err(np.load(tmp_path / "w.npy"), t_w.numpy()) <= REL_TOL
    run_attn(tmp_path, base + ["--out", "o2.npy"])  # the flag matters: without it, another result
    assert rel_err(np.load(tmp_path / "o2.npy"), t_out.numpy()) > 100 * REL_TOL


# ---------------------------------------------------------------- one layer of a whole model
def encoder_layer():
    """A float64 nn.TransformerEncoderLayer (E = 8, 2 heads) with weights of a fixed seed."""
    gen = torch.Generator().manual_seed(21)
    enc = torch.nn.TransformerEncoderLayer(8, 2, 16).eval().double()
    with torch.no_grad():
        for p in enc.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64) * 0.5)
    return enc


def test_params_prefix_reads_only_that_layer(tmp_path):
    """A tensor outside the prefix of a dtype attn has no type for (a quantized layer's U8) made
    --params FILE:PREFIX fail, although it is no tensor of the layer: the whole file was read."""
    enc = encoder_layer()
    state = {k: v.float() for k, v in enc.state_dict().items()}
    state["quant.qweight"] = torch.zeros(4)  # 16 bytes, declared as 16 U8 below

    def as_u8(header):
        header["quant.qweight"].update(dtype="U8", shape=[16])
        return header

    (tmp_path / "m.safetensors").write_bytes(st_bytes(state, header_override=as_u8))
    x = np.random.default_rng(22).normal(size=(5, 2, 8)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    run_attn(tmp_path, ["--params", "m.safetensors:self_attn.", "--num-heads", "2", "--query", "x.npy", "--out", "o.npy"])
    with torch.no_grad():
        want = enc.self_attn(*(torch.from_numpy(x).double(),) * 3)[0]
    assert rel_err(np.load(tmp_path / "o.npy"), want.numpy()) <= REL_TOL
    err = run_attn(tmp_path, ["--params", "m.safetensors:quant.", "--num-heads", "2", "--query", "x.npy", "--out", "q.npy"],
                   expect_ok=False).stderr  # read, it is refused
    assert err == "attn: error: --params: 'm.safetensors': tensor 'quant.qweight': dtype U8 is not supported (F32, F16, " \
                  "BF16, F64, I64, I32 or BOOL)\n", err  # no "read the others by name": the layer needs it
    assert not (tmp_path / "q.npy").exists()


def test_params_prefix_selects_a_layer_of_a_model(tmp_path):
    """A whole model's state_dict prefixes each layer's names: --params FILE:PREFIX takes one
    layer's (it was refused as "missing tensor 'out_proj.weight'", with no way to select one);
    without the prefix the message shows it; a prefix nothing has lists what the file holds."""
    enc = encoder_layer()
    (tmp_path / "enc.safetensors").write_bytes(st_bytes({k: v.float() for k, v in enc.state_dict().items()}))
    x = np.random.default_rng(22).normal(size=(5, 2, 8)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    base = ["--num-heads", "2", "--query", "x.npy", "--out", "o.npy"]
    run_attn(tmp_path, ["--params", "enc.safetensors:self_attn.", *base])
    with torch.no_grad():
        want = enc.self_attn(*(torch.from_numpy(x).double(),) * 3)[0]
    assert rel_err(np.load(tmp_path / "o.npy"), want.numpy()) <= REL_TOL
    (tmp_path / "o.npy").unlink()
    err = run_attn(tmp_path, ["--params", "enc.safetensors", *base], expect_ok=False).stderr
    assert "holds 1 attention layer whose names carry a prefix ('self_attn.out_proj.weight'): select one with " \
           "--params enc.safetensors:self_attn." in err, err
    err = run_attn(tmp_path, ["--params", "enc.safetensors:self_attn", *base], expect_ok=False).stderr
    assert "end the prefix with '.' (--params enc.safetensors:self_attn.)" in err, err
    err = run_attn(tmp_path, ["--params", "enc.safetensors:layers.0.", *base], expect_ok=False).stderr
    assert "has no tensor whose name starts with 'layers.0.' (it holds 12: 'self_attn.in_proj_weight'" in err, err
    # FILE:NAME names one tensor for every other option: here a tensor's whole name said
    # "missing tensor 'out_proj.weight' ... it holds 1: ''".
    err = run_attn(tmp_path, ["--params", "enc.safetensors:self_attn.out_proj.weight", *base], expect_ok=False).stderr
    assert "--params: 'self_attn.out_proj.weight' is a tensor of 'enc.safetensors', not a layer: after ':' give the prefix " \
           "its layer's tensors share (--params enc.safetensors:self_attn.)" in err, err
    assert not (tmp_path / "o.npy").exists()


# ---------------------------------------------------------------- weight file errors
def base_sd(kdim=None, bias=True):
    return build_module(dict(E=8, h=2, kdim=kdim or 8, vdim=kdim or 8, bias=bias, batch_first=False),
                        torch.Generator().manual_seed(1)).state_dict()


def run_with_params(tmp_path, blob, heads=2):
    (tmp_path / "p.safetensors").write_bytes(blob)
    np.save(tmp_path / "x.npy", np.ones((3, 1, 8), np.float32))
    r = run_attn(tmp_path, ["--params", "p.safetensors", "--num-heads", str(heads), "--query", "x.npy",
                            "--out", "o.npy"], expect_ok=False)
    assert r.returncode == 2, f"expected exit 2, got {r.returncode}; stderr: {r.stderr}"
    assert r.stderr.startswith("attn: error: "), r.stderr
    assert not (tmp_path / "o.npy").exists(), "no output may be written on an error"
    return r.stderr


# The file the user gave, --params, where the layer says state_dict mid-sentence (it said
# "MultiHeadAttention: state_dict does not fit", a name the CLI user never gave).
DOES_NOT_FIT = ("attn: error: MultiHeadAttention: --params does not fit (E=8, heads=2, kv heads=2, kdim=8, vdim=8, "
                "bias=true): ")


def test_missing_tensor_named(tmp_path):
    sd = base_sd()
    del sd["in_proj_bias"]
    err = run_with_params(tmp_path, st_bytes(sd))
    assert err == DOES_NOT_FIT + "missing tensor 'in_proj_bias' (expected shape (24,))\n", err


def test_extra_tensor_named(tmp_path):
    sd = base_sd()
    sd["encoder.layer.0.weight"] = torch.zeros(3, 2)
    err = run_with_params(tmp_path, st_bytes(sd))
    assert err == DOES_NOT_FIT + "unexpected tensor 'encoder.layer.0.weight' with shape (3, 2)\n", err


def test_kv_heads_not_dividing_names_the_option(tmp_path):
    # 6 key/value outputs are 3 heads of 2, which do not divide --num-heads 4 (it said num_heads).
    sd = base_sd()
    sd["in_proj_weight"] = torch.zeros(8 + 2 * 6, 8)
    sd["in_proj_bias"] = torch.zeros(8 + 2 * 6)
    err = run_with_params(tmp_path, st_bytes(sd), heads=4)
    assert err == ("attn: error: MultiHeadAttention: --params: tensor 'in_proj_weight' of shape (20, 8) gives key/value "
                   "projections of 6 outputs, which is not a number of heads of size 2 dividing --num-heads 4 (expected 8 "
                   "outputs, or fewer heads for grouped-query attention)\n"), err


def test_misshaped_tensor_named(tmp_path):
    sd = base_sd()
    sd["out_proj.bias"] = torch.zeros(7)
    err = run_with_params(tmp_path, st_bytes(sd))
    assert "tensor 'out_proj.bias': expected shape (8,) but got (7,)" in err


def test_misshaped_in_proj_named(tmp_path):
    sd = base_sd()
    sd["in_proj_weight"] = torch.zeros(24, 7)
    err = run_with_params(tmp_path, st_bytes(sd))
    assert "'in_proj_weight'" in err and "(24, 8)" in err and "(24, 7)" in err


def test_bias_k_without_bias_v_named(tmp_path):
    sd = base_sd()
    sd["bias_k"] = torch.zeros(1, 1, 8)
    err = run_with_params(tmp_path, st_bytes(sd))
    assert "missing tensor 'bias_v' (expected shape (1, 1, 8))" in err


# An appended key (bias_k/bias_v in the file, --add-zero-attn) has no position: refused with
# --causal and ALiBi, in the CLI's words — the layer's add_bias_kv, add_zero_attn and attn_mask
# are the file's tensors and the options (they were named so mid-sentence).
NO_POSITION_CAUSAL = ("attn: error: MultiHeadAttention: --causal: not supported together with bias_k/bias_v (in --params) "
                      "/ --add-zero-attn (the appended key has no position); pass a causal --attn-mask (Lq, Lk) instead\n")
NO_POSITION_ALIBI = ("attn: error: MultiHeadAttention: --alibi: not with bias_k/bias_v (in --params) or --add-zero-attn "
                     "(their appended key has no position to measure a distance from)\n")


@pytest.mark.parametrize("bias_kv,extra,message", [
    (True, ["--causal"], NO_POSITION_CAUSAL), (False, ["--causal", "--add-zero-attn"], NO_POSITION_CAUSAL),
    (True, ["--alibi"], NO_POSITION_ALIBI), (False, ["--alibi", "--add-zero-attn"], NO_POSITION_ALIBI),
])
def test_causal_and_alibi_with_an_appended_key_refused(tmp_path, bias_kv, extra, message):
    sd = base_sd()
    if bias_kv:
        sd["bias_k"] = torch.zeros(1, 1, 8)
        sd["bias_v"] = torch.zeros(1, 1, 8)
    (tmp_path / "p.safetensors").write_bytes(st_bytes(sd))
    np.save(tmp_path / "x.npy", np.ones((3, 1, 8), np.float32))
    r = run_attn(tmp_path, ["--params", "p.safetensors", "--num-heads", "2", "--query", "x.npy", "--out", "o.npy", *extra],
                 expect_ok=False)
    assert r.returncode == 2 and r.stderr == message, r.stderr
    assert not (tmp_path / "o.npy").exists()


def test_causal_takes_the_forms_of_attn_sdpa(tmp_path):
    # attn mha's --causal was a flag: `--causal top-left` and `--causal none`, the forms attn sdpa
    # and attn ring take, failed with "The following argument was not expected" (a parity audit).
    m = build_module(dict(E=8, h=2, kdim=8, vdim=8, bias=True, batch_first=False), torch.Generator().manual_seed(1))
    (tmp_path / "p.safetensors").write_bytes(st_bytes(m.state_dict()))
    x = torch.randn(5, 1, 8, generator=torch.Generator().manual_seed(3))
    np.save(tmp_path / "x.npy", x.numpy())
    base = ["--params", "p.safetensors", "--num-heads", "2", "--query", "x.npy", "--out"]
    for out, extra in (("bare.npy", ["--causal"]), ("top.npy", ["--causal", "top-left"]),
                       ("none.npy", ["--causal", "none"]), ("plain.npy", [])):
        run_attn(tmp_path, [*base, out, *extra])
    load = lambda name: np.load(tmp_path / name)
    assert np.array_equal(load("bare.npy"), load("top.npy"))
    assert np.array_equal(load("none.npy"), load("plain.npy"))
    causal_mask = torch.triu(torch.ones(5, 5, dtype=torch.bool), diagonal=1)  # True = not allowed
    with torch.no_grad():
        x64 = x.double()
        ref = m.double()(x64, x64, x64, attn_mask=causal_mask, need_weights=False)[0].numpy()
    assert rel_err(load("top.npy"), ref) <= REL_TOL
    assert rel_err(load("none.npy"), ref) > 100 * REL_TOL  # the mask changed the result
    # Self-attention (Lq = Lk): bottom-right is top-left.
    run_attn(tmp_path, [*base, "br.npy", "--causal", "bottom-right"])
    assert np.array_equal(load("br.npy"), load("top.npy"))


@pytest.mark.parametrize("lq, lk", [(3, 7), (6, 4)])
def test_causal_alignments_with_unequal_lengths(tmp_path, lq, lk):
    # Cross-attention with Lq != Lk: top-left is torch's is_causal (query i sees keys 0..i),
    # bottom-right sees keys 0..i + Lk - Lq (the queries are the last Lq of Lk positions: a cache's
    # new tokens). Against torch in float64 with the boolean mask of each (True = not allowed).
    # bottom-right was refused ("the layer's causal mask is nn.MultiheadAttention's is_causal").
    m = build_module(dict(E=8, h=2, kdim=8, vdim=8, bias=True, batch_first=False), torch.Generator().manual_seed(2))
    (tmp_path / "p.safetensors").write_bytes(st_bytes(m.state_dict()))
    g = torch.Generator().manual_seed(4)
    q, kv = torch.randn(lq, 2, 8, generator=g), torch.randn(lk, 2, 8, generator=g)
    np.save(tmp_path / "q.npy", q.numpy())
    np.save(tmp_path / "kv.npy", kv.numpy())
    for alignment, shift in (("top-left", 0), ("bottom-right", lk - lq)):
        run_attn(tmp_path, ["--params", "p.safetensors", "--num-heads", "2", "--query", "q.npy", "--key", "kv.npy",
                            "--value", "kv.npy", "--out", f"{alignment}.npy", "--weights", f"w-{alignment}.npy",
                            "--causal", alignment])
        not_allowed = torch.arange(lk)[None, :] > torch.arange(lq)[:, None] + shift
        with torch.no_grad():
            ref, ref_w = m.double()(q.double(), kv.double(), kv.double(), attn_mask=not_allowed)
        ref, ref_w = ref.numpy(), torch.nan_to_num(ref_w).numpy()  # a row with no key: torch NaN, attn 0
        dead = not_allowed.all(-1).numpy()
        ref[dead] = m.out_proj.bias.detach().double().numpy()  # attn: output 0 → out_proj.bias
        assert rel_err(np.load(tmp_path / f"{alignment}.npy"), ref) <= REL_TOL, alignment
        assert rel_err(np.load(tmp_path / f"w-{alignment}.npy"), ref_w) <= REL_TOL, alignment
    assert not np.allclose(np.load(tmp_path / "top-left.npy"), np.load(tmp_path / "bottom-right.npy"))


def test_heads_not_dividing(tmp_path):
    # The option the user gave, --num-heads, not the library's num_heads (which the message named
    # after embed_dim, where the CLI's renaming of "op: argument: " did not reach it).
    err = run_with_params(tmp_path, st_bytes(base_sd()), heads=3)
    assert err == "attn: error: MultiHeadAttention: --num-heads: must divide embed_dim 8 (from out_proj.weight) but got 3\n"


def _bad(name, mutate, expect):
    return pytest.param(mutate, expect, id=name)


def header_of(blob):
    n = struct.unpack("<Q", blob[:8])[0]
    return json.loads(blob[8:8 + n]), blob[8 + n:]


def rebuild(header, data, raw_header=None):
    text = raw_header if raw_header is not None else json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + data


def set_field(name, field, value):
    def f(blob):
        h, d = header_of(blob)
        h[name][field] = value
        return rebuild(h, d)
    return f


MALFORMED = [
    _bad("empty-file", lambda b: b"", "too short"),
    _bad("short-length", lambda b: b[:5], "too short"),
    _bad("header-past-eof", lambda b: struct.pack("<Q", len(b)) + b[8:], "runs past the end of the file"),
    _bad("header-huge", lambda b: struct.pack("<Q", 2**63) + b[8:], "runs past the end of the file"),
    _bad("bad-json", lambda b: rebuild(None, header_of(b)[1], b'{"in_proj_weight": {"dtype": "F32",'), "not valid JSON"),
    _bad("json-not-object", lambda b: rebuild(None, b"", b"[1, 2, 3]"), "must be a JSON object"),
    _bad("nul-padding", lambda b: rebuild(None, header_of(b)[1], json.dumps(header_of(b)[0]).encode() + b"\0\0"),
         "not valid JSON"),
    _bad("duplicate-name", lambda b: rebuild(None, header_of(b)[1], (lambda h: (
        '{"out_proj.bias": ' + json.dumps(h["out_proj.bias"]) + ", " + json.dumps(h)[1:]).encode())(header_of(b)[0])),
         "more than once"),
    _bad("unknown-dtype", set_field("out_proj.bias", "dtype", "F33"), "unknown dtype 'F33'"),
    _bad("unsupported-dtype", set_field("out_proj.bias", "dtype", "U32"), "dtype U32 is not supported"),
    _bad("dtype-not-string", set_field("out_proj.bias", "dtype", 4), "dtype must be a string"),
    _bad("shape-negative", set_field("out_proj.bias", "shape", [-8]), "must be >= 0"),
    _bad("shape-float", set_field("out_proj.bias", "shape", [8.0]), "non-negative integer"),
    _bad("shape-rank5", set_field("out_proj.bias", "shape", [1, 1, 1, 1, 8]), "rank 5 is not supported"),
    _bad("shape-bytes-mismatch", set_field("out_proj.bias", "shape", [4]), "needs 16 bytes"),
    _bad("shape-overflow", set_field("out_proj.bias", "shape", [2**62, 2**62]), "more bytes than"),
    _bad("offsets-reversed", lambda b: (lambda h, d: rebuild(h, d, None))(*(lambda h, d: (
        h.__setitem__("out_proj.bias", dict(h["out_proj.bias"], data_offsets=h["out_proj.bias"]["data_offsets"][::-1])) or h, d))(
        *header_of(b))), "end before they begin"),
    _bad("offsets-past-data", lambda b: (lambda h, d: rebuild(h, d[:-4]))(*header_of(b)), "past the end of the data"),
    _bad("offsets-overlap", lambda b: (lambda h, d: (
        [h[k].__setitem__("data_offsets", [h[k]["data_offsets"][0] - 4, h[k]["data_offsets"][1] - 4]) for k in ["out_proj.bias"]],
        rebuild(h, d))[1])(*header_of(b)), "overlap"),
    _bad("hole-in-data", lambda b: (lambda h, d: rebuild(h, d + b"\0" * 4))(*header_of(b)), "belong to no tensor"),
    _bad("offsets-missing", lambda b: (lambda h, d: (h["out_proj.bias"].pop("data_offsets"), rebuild(h, d))[1])(*header_of(b)),
         "missing field 'data_offsets'"),
    _bad("offsets-one-number", set_field("out_proj.bias", "data_offsets", [0]), "data_offsets must be [begin, end]"),
    _bad("extra-field", set_field("out_proj.bias", "stride", [1]), "unexpected field 'stride'"),
    _bad("entry-not-object", lambda b: (lambda h, d: (h.__setitem__("out_proj.bias", [1]), rebuild(h, d))[1])(*header_of(b)),
         "must be a JSON object"),
    _bad("metadata-not-strings", lambda b: (lambda h, d: (h.__setitem__("__metadata__", {"a": 1}), rebuild(h, d))[1])(
        *header_of(b)), "__metadata__['a'] must be a string"),
]


@pytest.mark.parametrize("mutate,expect", MALFORMED)
def test_malformed_safetensors(tmp_path, mutate, expect):
    err = run_with_params(tmp_path, mutate(st_bytes(base_sd())))
    assert "p.safetensors" in err and expect in err, err


def test_metadata_and_f16_weights_accepted(tmp_path):
    """A well-formed file with __metadata__ (as safetensors' own writer adds) loads."""
    sd = base_sd()
    blob = st_bytes(sd, "F16", header_override=lambda h: dict(h, __metadata__={"format": "pt"}))
    (tmp_path / "p.safetensors").write_bytes(blob)
    np.save(tmp_path / "x.npy", np.ones((3, 1, 8), np.float32))
    run_attn(tmp_path, ["--params", "p.safetensors", "--num-heads", "2", "--query", "x.npy", "--out", "o.npy"])


def test_cli_impl_picks_the_kernel(tmp_path):
    """attn mha --impl, as MhaForwardOptions::impl and the Python forward(impl=) (a parity audit):
    every kernel gives torch's output."""
    sd = base_sd()
    (tmp_path / "p.safetensors").write_bytes(st_bytes(sd))
    x = np.random.default_rng(31).normal(size=(5, 2, 8)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    m = torch.nn.MultiheadAttention(8, 2).eval()
    m.load_state_dict(sd)
    with torch.no_grad():
        want = m(*(torch.from_numpy(x),) * 3)[0].numpy()
    for impl in ("auto", "reference", "flash", "decode"):
        run_attn(tmp_path, ["--params", "p.safetensors", "--num-heads", "2", "--query", "x.npy", "--out", f"o_{impl}.npy",
                            "--impl", impl])
        assert rel_err(np.load(tmp_path / f"o_{impl}.npy"), want) <= REL_TOL, impl


# ---------------------------------------------------------------- CLI argument errors
@pytest.mark.parametrize("extra,expect", [
    (["--key", "x.npy"], "--key: given without --value"),
    (["--per-head-weights"], "--per-head-weights: needs --weights"),
    (["--impl", "fastest"], "--impl: expected one of auto, reference, flash, decode but got 'fastest'"),
    (["--attn-mask", "bad_am.npy"], "MultiHeadAttention: --attn-mask: expected shape (Lq, Lk) = (3, 3)"),
    (["--key-padding-mask", "bad_kpm.npy"], "MultiHeadAttention: --key-padding-mask: expected shape (B, Lk) = (1, 3)"),
    (["--attn-mask", "int_am.npy"], "MultiHeadAttention: --attn-mask: dtype must be bool"),
    (["--query", "x7.npy"], "query: expected (L, B, E) with E = embed_dim = 8 but got shape (3, 1, 7)"),
    # A kernel that cannot run the layer's call is named by the attention call the layer makes,
    # with the option that chose it (it said "impl", the library's field).
    (["--query", "x40.npy", "--impl", "decode"],
     "attn: error: sdpa: --impl: the decode kernel cannot run this call: Lq = 40 > 16 (decode is for a few new queries)\n"),
    (["--impl", "decode", "--grad-out", "x.npy", "--grads", "g.safetensors"],
     "attn: error: sdpa_backward: --impl: decode is a forward-only kernel; use auto, reference or flash\n"),
], ids=["key-without-value", "per-head-without-weights", "impl-unknown", "attn-mask-shape", "kpm-shape", "attn-mask-int",
        "layout-mismatch", "impl-decode-too-many-queries", "impl-decode-training"])
def test_cli_argument_errors(tmp_path, extra, expect):
    (tmp_path / "p.safetensors").write_bytes(st_bytes(base_sd()))
    np.save(tmp_path / "x.npy", np.ones((3, 1, 8), np.float32))
    np.save(tmp_path / "bad_am.npy", np.zeros((3, 4), bool))
    np.save(tmp_path / "bad_kpm.npy", np.zeros((1, 4), bool))
    np.save(tmp_path / "int_am.npy", np.zeros((3, 3), np.int32))
    np.save(tmp_path / "x7.npy", np.ones((3, 1, 7), np.float32))
    np.save(tmp_path / "x40.npy", np.ones((40, 1, 8), np.float32))
    query = [] if "--query" in extra else ["--query", "x.npy"]
    r = run_attn(tmp_path, ["--params", "p.safetensors", "--num-heads", "2", *query, "--out", "o.npy", *extra],
                 expect_ok=False)
    assert r.returncode == 2 and r.stderr.startswith("attn: error: ") and expect in r.stderr, r.stderr
    assert not (tmp_path / "o.npy").exists()
