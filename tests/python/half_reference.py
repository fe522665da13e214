# 16-bit inputs and outputs, made and read without attn: torch rounds float32 to float16 /
# bfloat16 (round to nearest even), the oracle is reference.textbook in float64 on the rounded
# values, and the bound is the float32 one plus one rounding of a 16-bit output.
import json
import struct

import numpy as np
import torch

from reference import ATOL, RTOL, textbook

# Half an ulp relative to |x|: the most one round-to-nearest into the format can move x.
HALF_ULP = {"float16": 2.0 ** -11, "bfloat16": 2.0 ** -8, "float32": 0.0, "float64": 0.0}


def rounded(x, dtype):
    """float32 array x rounded to `dtype`: (array as attn takes it, float64 values it holds).
    bfloat16 is a uint16 array of its bits (NumPy has none)."""
    t = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
    if dtype == "bfloat16":
        b = t.to(torch.bfloat16)
        return b.view(torch.int16).numpy().view(np.uint16).copy(), b.double().numpy()
    a = t.numpy().astype(dtype)
    return a, a.astype(np.float64)


def values(a, dtype):
    """What a result array holds, as float64 (a uint16 array is bfloat16 bits)."""
    if dtype == "bfloat16":
        assert a.dtype == np.uint16, a.dtype
        return torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16).double().numpy()
    assert a.dtype == np.dtype(dtype), (a.dtype, dtype)
    return a.astype(np.float64)


# bf16 compute's exp2 (docs/conventions.md, "bf16 compute"): its relative error ε moves lse
# by at most ε on top of the float32 bound.
EXP2_BF16_EPS = 1.05e-4


def check(ours, ref, out_dtype, extra=0.0):
    """|ours - ref| <= f32 bound (+ extra), plus one rounding into out_dtype of a value that close."""
    ours = np.asarray(ours, dtype=np.float64)
    assert ours.shape == ref.shape, (ours.shape, ref.shape)
    f32 = ATOL + RTOL * np.abs(ref) + extra
    bound = f32 + HALF_ULP[out_dtype] * (np.abs(ref) + f32)
    err = np.abs(ours - ref)
    assert np.all(np.isfinite(ours)), "non-finite output"
    assert np.all(err <= bound), f"max err {err.max():.3g}, worst excess {(err - bound).max():.3g}"


def check_lse(ours, ref, bf16_compute):
    """lse: float32, within the float32 bound, + ε when Q, K, V and out are all bfloat16 (a CPU
    with AVX-512 BF16 then runs bf16 compute; elsewhere the float32 bound holds anyway)."""
    assert np.asarray(ours).dtype == np.float32
    check(ours, ref, "float32", EXP2_BF16_EPS if bf16_compute else 0.0)


def oracle(q, k, v, **kw):
    """textbook on the float64 values the rounded inputs hold: out, lse, weights."""
    return textbook(q, k, v, **kw)


# safetensors written and read here from the format's description (not attn's code).
_ST = {"float32": ("F32", "<f4"), "float16": ("F16", "<f2"), "bfloat16": ("BF16", "<u2")}


def write_safetensors(path, tensors):
    """tensors: name → (array, dtype name); a bfloat16 array is uint16 bits."""
    header, blobs, off = {}, [], 0
    for name, (a, dtype) in tensors.items():
        code, np_dtype = _ST[dtype]
        raw = np.ascontiguousarray(a).astype(np_dtype).tobytes()
        header[name] = {"dtype": code, "shape": list(a.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    path.write_bytes(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def read_safetensors(path):
    """name → (array, dtype name)."""
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        dtype = {code: d for d, (code, _) in _ST.items()}[e["dtype"]]
        b, end = e["data_offsets"]
        a = np.frombuffer(data[8 + n + b:8 + n + end], dtype=_ST[dtype][1]).reshape(e["shape"])
        out[name] = (a.copy(), dtype)
    return out
