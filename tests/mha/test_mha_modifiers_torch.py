"""MultiheadAttention with score modifiers (sinks, ALiBi, softcap) against a textbook torch MHA.

The oracle is written here from the formulas of docs/conventions.md "Score modifiers", in
float64 torch 1.13 (torch's nn.MultiheadAttention has none of them):
    s = (q·kᵀ)/√d_h;  s = c·tanh(s/c);  s −= m_h·|i + Lk − Lq − j|;  causal/masks → −inf
    p = softmax over [s_0 … s_{Lk−1}, σ_h] with the sink's column dropped (it has no value)
The layer runs three ways:
  * forward: the Python attn.MultiheadAttention (sinks=True, softcap=, alibi_slopes=);
  * training: `attn mha --grad-out --grads` (the state_dict with a `sinks` tensor, --softcap,
    --alibi/--alibi-slopes) against torch autograd of the textbook layer, every gradient
    including ∂loss/∂sinks;
  * forward_incremental: a KV cache fed in pieces equals the causal textbook forward.
attn computes in float32: max|attn − torch| ≤ REL_TOL·max|torch| per tensor (REL_TOL 1e-4 as
the plain MHA tests; what is left is float32 rounding, ~1e-6).
"""
import os
import struct
import subprocess
import sys
import json

import numpy as np
import pytest
import torch

import attn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_mha_torch import st_bytes  # noqa: E402

ATTN = os.environ.get("ATTN_BIN", "attn")
REL_TOL = 1e-4
torch.set_num_threads(1)


def textbook(p, x, h, *, sinks=None, softcap=0.0, alibi=None, causal=False, key_mask=None):
    """Textbook MHA on x (L, B, E) (self-attention), params p in torch's names, float64.
    key_mask (B, L) bool True = padding."""
    L, B, E = x.shape
    dh = E // h
    w, b = p["in_proj_weight"], p["in_proj_bias"]
    qkv = x @ w.T + b                                          # (L, B, 3E)
    q, k, v = (qkv[..., i * E:(i + 1) * E].reshape(L, B, h, dh).permute(1, 2, 0, 3) for i in range(3))
    s = q @ k.transpose(-1, -2) / dh ** 0.5                    # (B, h, L, L)
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    i = torch.arange(L, dtype=torch.float64)[:, None]
    j = torch.arange(L, dtype=torch.float64)[None, :]
    if alibi is not None:
        s = s - alibi.view(1, h, 1, 1) * (i - j).abs()         # Lq = Lk: d(i) = i
    neg = torch.tensor(float("-inf"), dtype=torch.float64)
    if causal:
        s = torch.where(j > i, neg, s)
    if key_mask is not None:
        s = torch.where(key_mask[:, None, None, :], neg, s)
    if sinks is not None:
        col = sinks.view(1, h, 1, 1).expand(B, h, L, 1)
        a = torch.softmax(torch.cat([s, col], dim=-1), dim=-1)[..., :-1]
    else:
        a = torch.softmax(s, dim=-1)
    o = (a @ v).permute(2, 0, 1, 3).reshape(L, B, E)
    return o @ p["out_proj.weight"].T + p["out_proj.bias"]


def random_params(E, h, seed, with_sinks=True):
    g = torch.Generator().manual_seed(seed)
    p = {
        "in_proj_weight": torch.randn(3 * E, E, generator=g) / E ** 0.5,
        "in_proj_bias": torch.randn(3 * E, generator=g) * 0.1,
        "out_proj.weight": torch.randn(E, E, generator=g) / E ** 0.5,
        "out_proj.bias": torch.randn(E, generator=g) * 0.1,
    }
    if with_sinks:
        p["sinks"] = torch.randn(h, generator=g) * 2.0  # large enough to take real mass
    return {n: t.float().double() for n, t in p.items()}


def rel_err(ours, ref):
    ours = np.asarray(ours, np.float64)
    ref = ref.detach().numpy() if torch.is_tensor(ref) else np.asarray(ref, np.float64)
    assert ours.shape == ref.shape, f"shape {ours.shape} != torch's {ref.shape}"
    assert np.all(np.isfinite(ours)), "attn gave a non-finite value"
    return np.abs(ours - ref).max() / max(np.abs(ref).max(), 1e-30)


def read_safetensors(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, e in header.items():
        if name != "__metadata__":
            a, b = e["data_offsets"]
            out[name] = np.frombuffer(raw[8 + n + a:8 + n + b], dtype=np.float32).reshape(e["shape"])
    return out


# (E, h, L, B, sinks, softcap, alibi: None | "standard" | "given", causal, padded)
CASES = [
    (16, 2, 7, 2, True, 0.0, None, False, False),
    (16, 4, 9, 1, True, 0.0, None, True, False),
    (24, 3, 6, 2, False, 0.0, "standard", False, False),   # 3 heads: non-power-of-two slopes
    (16, 2, 8, 2, False, 0.0, "given", True, False),
    (16, 4, 5, 2, False, 2.0, None, False, False),
    (32, 4, 11, 2, True, 1.5, "standard", True, False),
    (16, 2, 7, 3, True, 3.0, "given", False, True),         # a key padding mask too
]


def case_id(c):
    E, h, L, B, sk, cap, al, causal, padded = c
    return f"E{E}h{h}L{L}B{B}" + ("-sinks" if sk else "") + (f"-cap{cap}" if cap else "") + \
        (f"-alibi_{al}" if al else "") + ("-causal" if causal else "") + ("-pad" if padded else "")


def make_inputs(c, seed):
    E, h, L, B, sk, cap, al, causal, padded = c
    p = random_params(E, h, seed, sk)
    g = torch.Generator().manual_seed(seed + 1)
    x = (torch.randn(L, B, E, generator=g) * 2.0).float().double()  # scores of a few units
    slopes = None
    if al == "standard":
        slopes = torch.from_numpy(np.asarray(attn.alibi_slopes(h), np.float64))
    elif al == "given":
        slopes = (torch.rand(h, generator=g) * 0.5).float().double()
    key_mask = None
    if padded:
        key_mask = torch.zeros(B, L, dtype=torch.bool)
        key_mask[0, -2:] = True
        key_mask[-1, :] = True  # every key padded: with sinks the output is out_proj.bias
    return p, x, slopes, key_mask


@pytest.mark.parametrize("c", CASES, ids=case_id)
def test_forward_python(c):
    E, h, L, B, sk, cap, al, causal, padded = c
    p, x, slopes, key_mask = make_inputs(c, 10)
    layer = attn.MultiheadAttention(E, h, sinks=sk, softcap=cap,
                                    alibi_slopes=None if slopes is None else
                                    (True if al == "standard" else slopes.numpy().astype(np.float32)))
    layer.load_state_dict({n: t.float().numpy() for n, t in p.items()})
    y, _ = layer(x.float().numpy(), x.float().numpy(), x.float().numpy(), need_weights=False, is_causal=causal,
                 key_padding_mask=None if key_mask is None else key_mask.numpy())
    ref = textbook(p, x, h, sinks=p.get("sinks"), softcap=cap, alibi=slopes, causal=causal, key_mask=key_mask)
    assert rel_err(y, ref) <= REL_TOL


def test_modifiers_change_the_output():
    """The oracle comparison above must be able to fail: each modifier moves the output."""
    E, h, L, B = 16, 2, 6, 1
    p, x, _, _ = make_inputs((E, h, L, B, True, 0.0, None, False, False), 3)
    plain = textbook(p, x, h)
    for kw in ({"sinks": p["sinks"]}, {"softcap": 1.0}, {"alibi": torch.full((h,), 0.5, dtype=torch.float64)}):
        assert (textbook(p, x, h, **kw) - plain).abs().max() > 1e-3, kw


@pytest.mark.parametrize("c", CASES, ids=case_id)
def test_gradients_cli(c, tmp_path):
    E, h, L, B, sk, cap, al, causal, padded = c
    p, x, slopes, key_mask = make_inputs(c, 20)
    g = torch.Generator().manual_seed(99)
    dy = torch.randn(L, B, E, generator=g).float().double()
    (tmp_path / "p.safetensors").write_bytes(st_bytes({n: t.float() for n, t in p.items()}))
    np.save(tmp_path / "x.npy", x.float().numpy())
    np.save(tmp_path / "dy.npy", dy.float().numpy())
    args = ["mha", "--params", "p.safetensors", "--num-heads", str(h), "--query", "x.npy", "--out", "y.npy",
            "--grad-out", "dy.npy", "--grads", "g.safetensors"]
    if causal:
        args.append("--causal")
    if cap:
        args += ["--softcap", str(cap)]
    if al == "standard":
        args.append("--alibi")
    elif al == "given":
        np.save(tmp_path / "slopes.npy", slopes.float().numpy())
        args += ["--alibi-slopes", "slopes.npy"]
    if key_mask is not None:
        np.save(tmp_path / "kpm.npy", key_mask.numpy())
        args += ["--key-padding-mask", "kpm.npy"]
    r = subprocess.run([ATTN, *args], cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    grads = read_safetensors(tmp_path / "g.safetensors")

    leaves = {n: t.clone().requires_grad_(True) for n, t in p.items()}
    xq = x.clone().requires_grad_(True)
    y = textbook(leaves, xq, h, sinks=leaves.get("sinks"), softcap=cap, alibi=slopes, causal=causal, key_mask=key_mask)
    y.backward(dy)
    assert rel_err(np.load(tmp_path / "y.npy"), y) <= REL_TOL
    assert set(grads) == set(p) | {"query"}
    for n, t in leaves.items():
        assert rel_err(grads[n], t.grad) <= REL_TOL, n
    assert rel_err(grads["query"], xq.grad) <= REL_TOL
    if sk:
        assert np.abs(grads["sinks"]).max() > 1e-4  # the sink gradient is really exercised


@pytest.mark.parametrize("sk,cap,al", [(True, 0.0, None), (True, 2.0, "standard"), (False, 0.0, "standard")])
def test_incremental_equals_causal_forward(sk, cap, al):
    E, h, L, B = 16, 4, 9, 2
    p, x, _, _ = make_inputs((E, h, L, B, sk, cap, al, True, False), 30)
    slopes = torch.from_numpy(np.asarray(attn.alibi_slopes(h), np.float64)) if al else None
    layer = attn.MultiheadAttention(E, h, sinks=sk, softcap=cap, alibi_slopes=True if al else None)
    layer.load_state_dict({n: t.float().numpy() for n, t in p.items()})
    cache = attn.KVCache(B, h, E // h, 16)
    xs = x.float().numpy()
    pieces = [layer.forward_incremental(xs[a:b], cache) for a, b in ((0, 4), (4, 5), (5, 9))]
    ref = textbook(p, x, h, sinks=p.get("sinks"), softcap=cap, alibi=slopes, causal=True)
    assert rel_err(np.concatenate(pieces, axis=0), ref) <= REL_TOL


def test_state_dict_names_and_errors(tmp_path):
    layer = attn.MultiheadAttention(8, 2, sinks=True)
    assert list(layer.state_dict())[-1] == "sinks" and layer.state_dict()["sinks"].shape == (2,)
    plain = {n: v for n, v in layer.state_dict().items() if n != "sinks"}
    with pytest.raises(Exception, match="missing tensor 'sinks'"):
        layer.load_state_dict(plain)
    with pytest.raises(Exception, match="unexpected tensor 'sinks'.*without sinks"):
        attn.MultiheadAttention(8, 2).load_state_dict(layer.state_dict())
    with pytest.raises(Exception, match="alibi_slopes: expected one slope per head \\(2\\) but got 3"):
        attn.MultiheadAttention(8, 2, alibi_slopes=np.ones(3, np.float32))
    # sdpa's rules and words for the modifiers the layer shares with it (softcap, the slopes' values).
    with pytest.raises(ValueError, match="^MultiHeadAttention: alibi_slopes: values must be finite but entry 1 is nan$"):
        attn.MultiheadAttention(8, 2, alibi_slopes=np.array([1.0, np.nan], np.float32))
    with pytest.raises(ValueError, match=r"^MultiHeadAttention: softcap: must be 0 \(off\) or a finite float32 in "
                                         r"\[1.1754944e-38, 3.4028235e38\] but got -1$"):
        attn.MultiheadAttention(8, 2, softcap=-1.0)
    with pytest.raises(Exception, match="add_bias_kv"):
        attn.MultiheadAttention(8, 2, add_bias_kv=True, alibi_slopes=True)
    # A non-finite sink is refused when it is loaded (it used to fail only at the next forward),
    # and the layer keeps the sinks it had.
    before = layer.state_dict()["sinks"].copy()
    bad = layer.state_dict()
    bad["sinks"] = np.array([0.0, np.inf], np.float32)
    with pytest.raises(ValueError, match="state_dict: tensor 'sinks': values must be finite but entry 1 is inf"):
        layer.load_state_dict(bad)
    assert np.array_equal(layer.state_dict()["sinks"], before)
    x = np.ones((3, 1, 8), np.float32)
    assert np.isfinite(layer(x, x, x)[0]).all()


def test_cli_float64_slopes_beyond_float32_are_named_as_given(tmp_path):
    # --alibi-slopes of a float64 file are rounded to float32 by the library's one rule: 1e300 was
    # "--alibi-slopes: values must be finite but entry 1 is inf", a value the file does not hold.
    attn.save_safetensors(tmp_path / "p.safetensors", attn.MultiheadAttention(8, 2).state_dict())
    np.save(tmp_path / "x.npy", np.ones((3, 1, 8), np.float32))
    np.save(tmp_path / "slopes.npy", np.array([0.5, 1e300]))
    r = subprocess.run([ATTN, "mha", "--params", "p.safetensors", "--num-heads", "2", "--query", "x.npy", "--out",
                        "y.npy", "--alibi-slopes", "slopes.npy"], cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode == 2
    assert r.stderr == ("attn: error: --alibi-slopes[1] = 1e+300 does not fit float32 (it rounds to inf; float32's "
                        "largest magnitude is 3.4028235e+38)\n")
    assert not (tmp_path / "y.npy").exists()


def test_cli_names_params_for_the_layers_tensors(tmp_path):
    # The layer's errors about its tensors named from_state_dict's argument, "state_dict:", where
    # the user gave --params.
    state = attn.MultiheadAttention(8, 2, sinks=True).state_dict()
    state["sinks"] = np.array([0.0, np.inf], np.float32)
    attn.save_safetensors(tmp_path / "p.safetensors", state)
    np.save(tmp_path / "x.npy", np.ones((3, 1, 8), np.float32))
    r = subprocess.run([ATTN, "mha", "--params", "p.safetensors", "--num-heads", "2", "--query", "x.npy", "--out",
                        "y.npy"], cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode == 2
    assert r.stderr == ("attn: error: MultiHeadAttention: --params: tensor 'sinks': values must be finite but entry 1 "
                        "is inf\n")
    assert not (tmp_path / "y.npy").exists()


def test_cli_sdpa_rounds_float64_slopes_and_sinks_as_mha_does(tmp_path):
    # attn sdpa --alibi-slopes/--sinks refused a float64 file ("dtype must be float32") where attn mha
    # and Python round it: now one rule. 0.1 is not a float32, so the float64 run must give exactly
    # the bits of the run on the float32-rounded values, and 1e300 is named as given.
    rng = np.random.default_rng(3)
    for name in ("q", "k", "v"):
        np.save(tmp_path / f"{name}.npy", rng.standard_normal((1, 2, 5, 8)).astype(np.float32))
    np.save(tmp_path / "s64.npy", np.array([0.1, 0.3]))
    np.save(tmp_path / "s32.npy", np.array([0.1, 0.3]).astype(np.float32))
    base = [ATTN, "sdpa", "--q", "q.npy", "--k", "k.npy", "--v", "v.npy", "--causal"]
    outs = {}
    for tag in ("64", "32"):
        r = subprocess.run(base + ["--alibi-slopes", f"s{tag}.npy", "--sinks", f"s{tag}.npy", "--out", f"o{tag}.npy"],
                           cwd=tmp_path, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        outs[tag] = np.load(tmp_path / f"o{tag}.npy")
    assert np.array_equal(outs["64"], outs["32"])
    np.save(tmp_path / "huge.npy", np.array([0.5, -1e300]))
    for flag in ("--alibi-slopes", "--sinks"):
        r = subprocess.run(base + [flag, "huge.npy", "--out", "y.npy"], cwd=tmp_path, capture_output=True, text=True)
        assert r.returncode == 2
        assert r.stderr == (f"attn: error: {flag}[1] = -1e+300 does not fit float32 (it rounds to -inf; float32's "
                            "largest magnitude is 3.4028235e+38)\n")
        assert not (tmp_path / "y.npy").exists()
