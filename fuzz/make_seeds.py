#!/usr/bin/python3
"""Writes the seed corpora of fuzz/corpus/ (small valid and invalid inputs per target).
Re-run after changing it; the seeds are checked in, so the fuzz runs need no Python.
regress-* files are inputs that found a bug: the ones written here are the examples of
issue 19; one found by the fuzzer is added by hand and kept (never removed by this script)."""
import io, json, os, struct, sys
import numpy as np

here = os.path.dirname(os.path.abspath(__file__))


def put(target, name, data):
    d = os.path.join(here, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def npy(a, version=None):
    b = io.BytesIO()
    if version is None:
        np.save(b, a)
    else:
        np.lib.format.write_array(b, a, version=version)
    return b.getvalue()


# .npy: one valid file per dtype and rank, the format versions, and the usual corruptions.
rng = np.random.default_rng(0)
for dt in ["<f4", "<f8", "<f2", "|b1", "<i4", "<i8"]:
    put("fuzz_npy", f"valid-{dt[1:]}-2x3.npy", npy(rng.standard_normal((2, 3)).astype(dt)))
put("fuzz_npy", "valid-rank0.npy", npy(np.float32(1.5)))
put("fuzz_npy", "valid-rank4.npy", npy(np.zeros((1, 2, 1, 3), np.float32)))
put("fuzz_npy", "valid-empty.npy", npy(np.zeros((0, 4), np.float32)))
put("fuzz_npy", "valid-v2.npy", npy(np.ones((3,), np.float32), version=(2, 0)))
put("fuzz_npy", "valid-v3.npy", npy(np.ones((3,), np.float32), version=(3, 0)))
good = npy(np.ones((2, 2), np.float32))
put("fuzz_npy", "bad-truncated.npy", good[:-3])
put("fuzz_npy", "bad-magic.npy", b"\x93NUMPX" + good[6:])
put("fuzz_npy", "bad-version.npy", good[:6] + b"\x09\x00" + good[8:])
put("fuzz_npy", "bad-big-endian.npy", npy(np.ones((2,), ">f4")))
# Fortran order is read into C order (it was refused): a float and a bool array of rank 3.
put("fuzz_npy", "valid-fortran-f4-2x3x4.npy", npy(np.asfortranarray(rng.standard_normal((2, 3, 4)).astype(np.float32))))
put("fuzz_npy", "valid-fortran-b1-3x2x2.npy", npy(np.asfortranarray(rng.standard_normal((3, 2, 2)) > 0)))
put("fuzz_npy", "bad-rank5.npy", npy(np.ones((1, 1, 1, 1, 2), np.float32)))
hdr = "{'descr': '<f4', 'fortran_order': False, 'shape': (0, 1000000000000, 100000000000000), }"
put("fuzz_npy", "regress-zero-huge-shape.npy", b"\x93NUMPY\x01\x00" + struct.pack("<H", len(hdr) + 1) + hdr.encode() + b"\n")
hdr = "{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296, 16), }"
put("fuzz_npy", "bad-overflow-shape.npy", b"\x93NUMPY\x01\x00" + struct.pack("<H", len(hdr) + 1) + hdr.encode() + b"\n")
put("fuzz_npy", "bad-header-len.npy", good[:8] + b"\xff\xff" + good[10:])


# safetensors: valid files (F32/F16/BF16, metadata, empty), and the usual corruptions.
def st(entries, payload=b"", metadata=None, raw_header=None):
    h = dict(entries)
    if metadata is not None:
        h["__metadata__"] = metadata
    text = raw_header if raw_header is not None else json.dumps(h).encode()
    return struct.pack("<Q", len(text)) + text + payload


f32 = np.arange(6, dtype="<f4").tobytes()
put("fuzz_safetensors", "valid-f32.safetensors", st({"w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}}, f32))
put("fuzz_safetensors", "valid-f16-bf16-meta.safetensors",
    st({"a": {"dtype": "F16", "shape": [2], "data_offsets": [0, 4]},
        "b": {"dtype": "BF16", "shape": [1, 2], "data_offsets": [4, 8]}},
       np.ones(2, "<f2").tobytes() + b"\x80\x3f\x00\x40", metadata={"format": "pt"}))
put("fuzz_safetensors", "valid-empty.safetensors", st({}))
put("fuzz_safetensors", "valid-scalar-and-zero.safetensors",
    st({"s": {"dtype": "F32", "shape": [], "data_offsets": [0, 4]},
        "z": {"dtype": "F32", "shape": [0, 7], "data_offsets": [4, 4]}}, f32[:4]))
put("fuzz_safetensors", "bad-overlap.safetensors",
    st({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
        "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, f32[:12]))
put("fuzz_safetensors", "bad-hole.safetensors", st({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, f32[:8]))
put("fuzz_safetensors", "bad-dtype.safetensors", st({"a": {"dtype": "I64", "shape": [1], "data_offsets": [0, 8]}}, f32[:8]))
put("fuzz_safetensors", "regress-zero-huge-shape.safetensors",
    st({"a": {"dtype": "F32", "shape": [0, 10**12, 10**14], "data_offsets": [0, 0]}}))
put("fuzz_safetensors", "bad-overflow-shape.safetensors",
    st({"a": {"dtype": "F32", "shape": [2**32, 2**32, 16], "data_offsets": [0, 8]}}, f32[:8]))
put("fuzz_safetensors", "bad-json.safetensors", st({}, raw_header=b'{"a": {"dtype": "F32", "shape": [1,'))
put("fuzz_safetensors", "bad-header-len.safetensors", struct.pack("<Q", 2**63) + b"{}")
# What torch.save writes, given where safetensors is expected (named as such); a real header of
# 640 bytes, whose length starts with the same two bytes as a pickle.
put("fuzz_safetensors", "bad-torch-pickle.safetensors", b"\x80\x02}q\x00(X\x0e\x00\x00\x00in_proj_weightq\x01")
put("fuzz_safetensors", "bad-torch-zip.safetensors", b"PK\x03\x04\x00\x00\x08\x08\x00\x00" + bytes(20))
put("fuzz_safetensors", "valid-header-640.safetensors",
    st({}, f32[:4], raw_header=b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}'.ljust(640)))
put("fuzz_safetensors", "bad-duplicate.safetensors",
    st({}, f32[:8], raw_header=b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},'
                               b'"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}'))


# CLI: argument lists, NUL-separated (fuzz_cli_args.cpp). Options of every subcommand.
def cli(name, *args):
    put("fuzz_cli_args", name, b"\0".join(a.encode() for a in args))


cli("sdpa-full", "sdpa", "--q", "q.npy", "--k", "k.npy", "--v", "v.npy", "--out", "o.npy", "--causal", "bottom-right",
    "--scale", "0.125", "--window-left", "3", "--window-right", "0", "--window-align", "bottom-right",
    "--key-lengths", "n.npy", "--lse", "l.npy", "--weights", "w.npy", "--impl", "flash", "--verbose")
cli("sdpa-backward", "sdpa", "--q", "q.npy", "--k", "k.npy", "--v", "v.npy", "--out", "o.npy", "--grad-out", "g.npy",
    "--dq", "a.npy", "--dk", "b.npy", "--dv", "c.npy", "--dropout", "0.1", "--seed", "7", "--query-offset", "-2")
cli("sdpa-offsets-excl", "sdpa", "--q=q.npy", "--k", "k", "--v", "v", "--out", "o", "--query-offset", "1",
    "--query-offsets", "f.npy")
cli("sdpa-bad-numbers", "sdpa", "--q", "q", "--k", "k", "--v", "v", "--out", "o", "--scale", "", "--seed", "-1",
    "--window-left", "99999999999999999999")
cli("mha", "mha", "--params", "p.safetensors", "--num-heads", "4", "--query", "q.npy", "--out", "o.npy",
    "--batch-first", "--causal", "--weights", "w.npy", "--per-head-weights")
cli("mha-train", "mha", "--params", "p", "--num-heads", "99999999999999999999", "--query", "q", "--key", "k",
    "--value", "v", "--out", "o", "--grad-out", "g", "--grads", "G", "--dropout-p", "0.5", "--dropout-seed", "3")
cli("bench", "bench", "--shapes", "S1,S2", "--runs", "3", "--threads", "2", "--json", "b.json")
cli("demo", "demo")
cli("heatmap-help", "heatmap", "--help")
cli("ring", "ring", "--help")
cli("version", "--version")
cli("empty", "")


# fuzz_array reads its input through FuzzedDataProvider (choices from the end, array bytes
# from the front): random blobs of a few sizes are as good a start as any hand-made file.
blob = np.random.default_rng(1)
for n in (16, 64, 256, 1024, 4096):
    put("fuzz_array", f"random-{n}", blob.integers(0, 256, n, dtype=np.uint8).tobytes())
