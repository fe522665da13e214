"""The MHA layer with 16-bit weights and activations (issue 14) against torch 1.13.

Oracles: torch's nn.MultiheadAttention in float64 and in float32, both loaded with the
*same rounded* weights (the float16/bfloat16 values widened), fed the same rounded inputs.
attn widens the 16-bit operands exactly inside its projection GEMM and accumulates in
float32, so (docs/conventions.md, "16-bit MHA"):
  float32 output:  max|attn - torch64| <= 1e-5 * max|torch64|                (the float32 layer's bound)
                   max|attn - torch32| <= 2e-5 * max|torch64|                (both sides' float32 rounding)
  16-bit output:   |attn - torch64| <= 1e-5 * max|torch64| + u * |torch64|   (one more rounding, u = 2^-11 f16, 2^-8 bf16)
Through the Python module (float16 NumPy arrays, uint16 bfloat16 bits with dtype="bfloat16"),
attn.torch (torch bfloat16 tensors) and the CLI (safetensors bf16 weights and inputs).
"""
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import attn

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
from half_reference import read_safetensors, write_safetensors  # noqa: E402

ATTN_BIN = os.environ.get("ATTN_BIN", "")
U = {"float16": 2.0**-11, "bfloat16": 2.0**-8}
TORCH = {"float16": torch.float16, "bfloat16": torch.bfloat16}


def bits(t):
    """A torch tensor as the NumPy array attn reads: float16, or uint16 bfloat16 bits."""
    t = t.detach().contiguous()
    return t.view(torch.int16).numpy().view(np.uint16) if t.dtype == torch.bfloat16 else t.numpy()


def widened(a, dtype):
    """attn's 16-bit array as float64 (bfloat16 bits shifted into a float32)."""
    if dtype == "bfloat16":
        return (a.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return a.astype(np.float64)


def module(E, h, seed, kdim=None, vdim=None, batch_first=True):
    g = torch.Generator().manual_seed(seed)
    m = torch.nn.MultiheadAttention(E, h, kdim=kdim, vdim=vdim, batch_first=batch_first)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn(p.shape, generator=g) / np.sqrt(p.shape[-1]))
    return m.eval()


def rounded_module(m, dtype, kind):
    """A copy of m with every weight matrix rounded to dtype, in torch's `kind` (float32/float64);
    biases as they are (attn keeps them in float32)."""
    r = module(m.embed_dim, m.num_heads, 0, m.kdim if m.kdim != m.embed_dim else None,
               m.vdim if m.vdim != m.embed_dim else None, m.batch_first).to(kind)
    sd = {}
    for n, t in m.state_dict().items():
        sd[n] = (t.to(TORCH[dtype]) if t.dim() == 2 else t).to(kind)
    r.load_state_dict(sd)
    return r


def check(got, want64, want32, out_dtype, what):
    got = np.asarray(got, np.float64)
    assert got.shape == want64.shape and np.all(np.isfinite(got)), what
    scale = np.abs(want64).max()
    if out_dtype == "float32":
        assert np.abs(got - want64).max() <= 1e-5 * scale, f"{what}: vs torch float64"
        assert np.abs(got - want32).max() <= 2e-5 * scale, f"{what}: vs torch float32"
    else:
        excess = np.abs(got - want64) - (1e-5 * scale + U[out_dtype] * np.abs(want64))
        assert excess.max() <= 0, f"{what}: {out_dtype} output off by {excess.max():.3g} beyond one rounding"


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("cross", [False, True])
def test_module_16bit_weights_and_inputs(dtype, cross):
    E, h, B, Lq, Lk = 32, 4, 2, 9, 13 if cross else 9
    kd = vd = 12 if cross else None
    m = module(E, h, 5 + cross, kd, vd)
    ours = attn.MultiheadAttention(E, h, kdim=kd, vdim=vd, batch_first=True, dtype=dtype)
    sd = {n: bits(t.to(TORCH[dtype])) if t.dim() == 2 else t.numpy() for n, t in m.state_dict().items()}
    ours.load_state_dict(sd, dtype="bfloat16" if dtype == "bfloat16" else None)
    assert ours.param_dtype == dtype
    back = ours.state_dict()
    for n, a in sd.items():  # the 16-bit weights kept bit for bit, the biases float32
        np.testing.assert_array_equal(back[n], a, err_msg=n)
    g = torch.Generator().manual_seed(11)
    xq = torch.randn(B, Lq, E, generator=g).to(TORCH[dtype])
    xk = torch.randn(B, Lk, kd or E, generator=g).to(TORCH[dtype]) if cross else xq
    xv = torch.randn(B, Lk, vd or E, generator=g).to(TORCH[dtype]) if cross else xq
    r64, r32 = rounded_module(m, dtype, torch.float64), rounded_module(m, dtype, torch.float32)
    with torch.no_grad():
        want64 = r64(xq.double(), xk.double(), xv.double(), need_weights=False)[0].numpy()
        want32 = r32(xq.float(), xk.float(), xv.float(), need_weights=False)[0].double().numpy()
    kw = {"dtype": "bfloat16"} if dtype == "bfloat16" else {}
    q, k, v = bits(xq), bits(xk), bits(xv)
    args = (q, q, q) if not cross else (q, k, v)
    out, w = ours(*args, need_weights=True, **kw)
    assert out.dtype == (np.uint16 if dtype == "bfloat16" else np.float16) and w.dtype == np.float32
    check(widened(out, dtype), want64, want32, dtype, "default out")
    out32, _ = ours(*args, need_weights=False, out_dtype="float32", **kw)
    assert out32.dtype == np.float32
    check(out32, want64, want32, "float32", "out_dtype float32")
    # The 16-bit output is the float32 result of the same call rounded once (nearest even), bit
    # for bit (same options: need_weights may pick another attention kernel, other float32 bits).
    out_nw, _ = ours(*args, need_weights=False, **kw)
    np.testing.assert_array_equal(out_nw, bits(torch.from_numpy(out32).to(TORCH[dtype])))


def test_float32_layer_converts_on_request_and_training_refuses():
    m = module(16, 2, 3)
    ours = attn.MultiheadAttention(16, 2, batch_first=True, dtype=torch.bfloat16)
    ours.load_state_dict({n: t.numpy() for n, t in m.state_dict().items()})  # float32 arrays, rounded on load
    assert ours.param_dtype == "bfloat16"
    np.testing.assert_array_equal(ours.state_dict()["out_proj.weight"], bits(m.out_proj.weight.to(torch.bfloat16)))
    with pytest.raises(TypeError, match="dtype: parameters are float32, float16 or bfloat16 but got"):
        attn.MultiheadAttention(16, 2, dtype=np.float64)


def test_attn_torch_bfloat16_module():
    """attn.torch.MultiheadAttention on a model converted with .to(torch.bfloat16)."""
    import attn.torch as at
    m = module(16, 2, 4)
    ours = at.MultiheadAttention(16, 2, batch_first=True)
    ours.load_state_dict(m.state_dict())
    ours = ours.to(torch.bfloat16).eval()
    x = torch.randn(2, 7, 16, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    with torch.no_grad():
        out = ours(x, x, x, need_weights=False)[0]
        ref = m.to(torch.bfloat16)(x, x, x, need_weights=False)[0]  # torch's own bf16 layer
    assert out.dtype == torch.bfloat16
    # Both round every intermediate to bfloat16 (torch's bf16 F.linear): a few bf16 units.
    assert (out.double() - ref.double()).abs().max() <= 8 * 2.0**-8 * ref.double().abs().max()


@pytest.mark.skipif(not ATTN_BIN, reason="ATTN_BIN is not set (the CLI is not built)")
def test_cli_bf16_checkpoint_and_inputs(tmp_path):
    m = module(16, 4, 6)
    sd = m.state_dict()
    write_safetensors(tmp_path / "p.safetensors",
                      {n: (bits(t.to(torch.bfloat16)) if t.dim() == 2 else t.numpy(), "bfloat16" if t.dim() == 2 else "float32")
                       for n, t in sd.items()})
    x = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    write_safetensors(tmp_path / "x.safetensors", {"x": (bits(x), "bfloat16")})
    base = [ATTN_BIN, "mha", "--params", "p.safetensors", "--num-heads", "4", "--batch-first", "--query", "x.safetensors:x"]
    r = subprocess.run(base + ["--out", "o.safetensors"], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stderr
    r = subprocess.run(base + ["--out", "o32.npy", "--out-dtype", "float32"], capture_output=True, text=True, cwd=tmp_path,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    o = read_safetensors(tmp_path / "o.safetensors")["out"]
    assert o[1] == "bfloat16"
    r64, r32 = rounded_module(m, "bfloat16", torch.float64), rounded_module(m, "bfloat16", torch.float32)
    with torch.no_grad():
        want64 = r64(x.double(), x.double(), x.double(), need_weights=False)[0].numpy()
        want32 = r32(x.float(), x.float(), x.float(), need_weights=False)[0].double().numpy()
    check(widened(o[0], "bfloat16"), want64, want32, "bfloat16", "CLI bf16 out")
    check(np.load(tmp_path / "o32.npy"), want64, want32, "float32", "CLI float32 out")
    r = subprocess.run(base + ["--out", "o.npy", "--param-dtype", "float64"], capture_output=True, text=True,
                       cwd=tmp_path, timeout=120)
    assert r.returncode != 0 and "--param-dtype: expected float16, bfloat16 or float32 but got 'float64'" in r.stderr


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_intermediate_dtype_rounds_like_torch_16bit_layer(dtype, tmp_path):
    """intermediate_dtype= rounds Q, K, V and the attention output once, as torch's 16-bit layer
    stores them: within a few units of torch's own bfloat16 layer, and within the C++ test's bound
    (4u·max, tests/mha/test_mha.cpp) of torch float64 on the same rounded weights — where the
    float32 intermediates (the default) give the float32 layer's 1e-5."""
    E, h, B, L = 64, 4, 2, 33
    m = module(E, h, 12)
    ours = attn.MultiheadAttention(E, h, batch_first=True, dtype=dtype)
    ours.load_state_dict({n: bits(t.to(TORCH[dtype])) if t.dim() == 2 else t.numpy() for n, t in m.state_dict().items()},
                         dtype="bfloat16" if dtype == "bfloat16" else None)
    x = torch.randn(B, L, E, generator=torch.Generator().manual_seed(13)).to(TORCH[dtype])
    kw = {"dtype": "bfloat16"} if dtype == "bfloat16" else {}
    xb = bits(x)
    mid, _ = ours(xb, xb, xb, need_weights=False, out_dtype="float32", intermediate_dtype=dtype, **kw)
    default, _ = ours(xb, xb, xb, need_weights=False, out_dtype="float32", **kw)
    r64 = rounded_module(m, dtype, torch.float64)
    with torch.no_grad():
        want64 = r64(x.double(), x.double(), x.double(), need_weights=False)[0].numpy()
        # torch 1.13 has no float16 matmul on the CPU ("addmm_impl_cpu_ not implemented for 'Half'").
        torch16 = (rounded_module(m, dtype, torch.float32).to(TORCH[dtype])(x, x, x, need_weights=False)[0].double().numpy()
                   if dtype == "bfloat16" else None)
    scale = np.abs(want64).max()
    assert np.abs(default - want64).max() <= 1e-5 * scale
    err = np.abs(mid - want64).max()
    assert 1e-5 * scale < err <= 4 * U[dtype] * scale, f"intermediates {dtype}: {err / scale:.3g} of max|ref|"
    if torch16 is not None:  # torch 1.13 rounds its scores and softmax to bfloat16 too: a few units apart
        assert np.abs(mid - torch16).max() <= 8 * U[dtype] * scale
    for bad in ("float64", 3):  # a dtype problem is a TypeError, as every one of the module (module.cpp)
        with pytest.raises(TypeError, match="intermediate_dtype: expected \"float32\", \"float16\", \"bfloat16\" or None"):
            ours(xb, xb, xb, intermediate_dtype=bad, **kw)
    if ATTN_BIN:  # the CLI's --intermediate-dtype reaches the same layer: the same bits
        write_safetensors(tmp_path / "p.safetensors",
                          {n: (bits(t.to(TORCH[dtype])), dtype) if t.dim() == 2 else (t.numpy(), "float32")
                           for n, t in m.state_dict().items()})
        write_safetensors(tmp_path / "x.safetensors", {"x": (xb, dtype)})
        base = [ATTN_BIN, "mha", "--params", "p.safetensors", "--num-heads", str(h), "--batch-first",
                "--query", "x.safetensors:x", "--out", "o.npy", "--out-dtype", "float32"]
        r = subprocess.run(base + ["--intermediate-dtype", dtype], capture_output=True, text=True, cwd=tmp_path, timeout=120)
        assert r.returncode == 0, r.stderr
        np.testing.assert_array_equal(np.load(tmp_path / "o.npy"), mid)
        r = subprocess.run(base + ["--intermediate-dtype", "int8"], capture_output=True, text=True, cwd=tmp_path, timeout=120)
        assert r.returncode != 0 and "--intermediate-dtype: expected float16, bfloat16 or float32 but got 'int8'" in r.stderr


def rounded_once(a32, dtype):
    """A float32 array rounded to nearest even into dtype, as attn writes it (bfloat16: its bits)."""
    return bits(torch.from_numpy(np.ascontiguousarray(a32, np.float32)).to(TORCH[dtype])) if dtype in TORCH else a32


@pytest.mark.skipif(not ATTN_BIN, reason="ATTN_BIN is not set (the CLI is not built)")
def test_cli_training_gradients_in_their_tensors_dtypes(tmp_path):
    """attn mha --grads (docs/conventions.md, "The gradients' dtypes"): each gradient in its tensor's
    dtype when 16-bit, else float32 — a parameter's as the --params tensor, an input's as the file —
    the layer's float32 gradient rounded once (the --out-dtype float32 run's, bit for bit), within
    docs/mha-backward.md's bound of torch float64 plus that rounding. --out-dtype sets O and every
    gradient. They were all F32 (and --out-dtype with --grads an error). --param-dtype float32 makes
    every parameter's gradient float32 (the dtype the layer holds them in)."""
    E, h, B, Lq, Lk = 16, 4, 2, 5, 7
    m = module(E, h, 21)
    ckpt = {"in_proj_weight": "bfloat16", "in_proj_bias": "float16", "out_proj.weight": "float32",
            "out_proj.bias": "bfloat16"}
    sd = {n: t.to(TORCH.get(ckpt[n], torch.float32)) for n, t in m.state_dict().items()}
    write_safetensors(tmp_path / "p.safetensors", {n: (bits(t), ckpt[n]) for n, t in sd.items()})
    g = torch.Generator().manual_seed(22)
    xq = torch.randn(B, Lq, E, generator=g).to(torch.bfloat16)
    xk = torch.randn(B, Lk, E, generator=g).to(torch.float16)
    xv = torch.randn(B, Lk, E, generator=g).double()
    dy = torch.randn(B, Lq, E, generator=g)
    write_safetensors(tmp_path / "q.safetensors", {"q": (bits(xq), "bfloat16")})
    np.save(tmp_path / "k.npy", xk.numpy())
    np.save(tmp_path / "v.npy", xv.numpy())
    np.save(tmp_path / "dy.npy", dy.numpy())
    want = {**ckpt, "query": "bfloat16", "key": "float16", "value": "float32"}  # float64 value: float32

    # torch float64 autograd on the values the files hold.
    ref = module(E, h, 0).double()
    ref.load_state_dict({n: t.double() for n, t in sd.items()})
    inputs = [x.detach().double().requires_grad_() for x in (xq, xk, xv)]
    ref(*inputs, need_weights=False)[0].backward(dy.double())
    refs = {**{n: p.grad.numpy() for n, p in ref.named_parameters()},
            **{n: x.grad.numpy() for n, x in zip(("query", "key", "value"), inputs)}}

    def run(tag, *extra):
        r = subprocess.run([ATTN_BIN, "mha", "--params", "p.safetensors", "--num-heads", str(h), "--batch-first",
                            "--query", "q.safetensors:q", "--key", "k.npy", "--value", "v.npy", "--grad-out", "dy.npy",
                            "--out", f"o{tag}.safetensors", "--grads", f"g{tag}.safetensors", *extra],
                           capture_output=True, text=True, cwd=tmp_path, timeout=120)
        assert r.returncode == 0, r.stderr
        return (read_safetensors(tmp_path / f"g{tag}.safetensors"),
                read_safetensors(tmp_path / f"o{tag}.safetensors")["out"])

    grads, out = run("")
    grads32, out32 = run("32", "--out-dtype", "float32")
    assert set(grads) == set(want) and out[1] == "bfloat16" and out32[1] == "float32"
    np.testing.assert_array_equal(out[0], rounded_once(out32[0], "bfloat16"))
    for n, dt in want.items():
        (a, got), (a32, got32) = grads[n], grads32[n]
        assert (got, got32) == (dt, "float32"), n
        np.testing.assert_array_equal(a, rounded_once(a32, dt), err_msg=n)
        r = refs[n]
        e = 1e-4 * np.abs(r).max() + 1e-6  # docs/mha-backward.md: the float32 layer against torch float64
        assert np.abs(a32 - r).max() <= e, n
        assert np.all(np.abs(widened(a, dt) - r) <= e + U.get(dt, 0.0) * (np.abs(r) + e)), n
    grads16, out16 = run("16", "--out-dtype", "float16")
    assert out16[1] == "float16" and {n: t[1] for n, t in grads16.items()} == dict.fromkeys(want, "float16")
    # --param-dtype float32: the layer holds every parameter in float32 (torch: model.float() after
    # loading), so their gradients are float32 — the --out-dtype float32 run's bits — and the
    # inputs' keep their files' dtypes. They were in the checkpoint's dtypes, the option ignored.
    gradsp, outp = run("p", "--param-dtype", "float32")
    np.testing.assert_array_equal(outp[0], out[0])
    for n, dt in want.items():
        (a, got), param = gradsp[n], n in ckpt
        assert got == ("float32" if param else dt), n
        np.testing.assert_array_equal(a, grads32[n][0] if param else grads[n][0], err_msg=n)
    grads16p, _ = run("16p", "--param-dtype", "float32", "--out-dtype", "float16")  # --out-dtype still sets all
    assert {n: t[1] for n, t in grads16p.items()} == dict.fromkeys(want, "float16")
    # Self-attention: the query's gradient is the sum of its three uses, summed in float32 first.
    selves = []
    for extra in ([], ["--out-dtype", "float32"]):
        r = subprocess.run([ATTN_BIN, "mha", "--params", "p.safetensors", "--num-heads", str(h), "--batch-first",
                            "--query", "q.safetensors:q", "--grad-out", "dy.npy", "--out", "os.safetensors", "--grads",
                            "gs.safetensors", *extra], capture_output=True, text=True, cwd=tmp_path, timeout=120)
        assert r.returncode == 0, r.stderr
        selves.append(read_safetensors(tmp_path / "gs.safetensors")["query"])
    assert (selves[0][1], selves[1][1]) == ("bfloat16", "float32")
    np.testing.assert_array_equal(selves[0][0], rounded_once(selves[1][0], "bfloat16"))
