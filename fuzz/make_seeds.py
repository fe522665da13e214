#!/usr/bin/python3
"""Writes the seed corpora of fuzz/corpus/ (small valid and invalid inputs per target).
Re-run after changing it; the seeds are checked in, so the fuzz runs need no Python.
regress-* files are inputs that found a bug: the ones written here are the examples of
issue 19 and fuzz_array's findings (in its current encoding); one found by the fuzzer is added
by hand and kept (never removed by this script)."""
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


# fuzz_array reads its input through FuzzedDataProvider (libFuzzer's header): each choice from
# the end of the input, array bytes from the front. Random bytes are almost never three float
# arrays of one rank (the random-* seeds this wrote never reached attn::sdpa), so the seeds are
# valid calls, written choice by choice in fuzz_array.cpp's order (make_array, then run).
class Choices:
    """What FuzzedDataProvider reads, written: input = front bytes + the choices reversed."""

    def __init__(self):
        self.front, self.back = bytearray(), bytearray()

    def int_in(self, lo, hi, value, size=8):  # ConsumeIntegralInRange<T>(lo, hi) == value
        span, n = hi - lo, 0
        while n < size and (span >> (8 * n)) > 0:
            n += 1
        self.back += (value - lo).to_bytes(n, "big")  # the first byte read is the most significant

    def pick(self, values, value):  # PickValueInArray
        self.int_in(0, len(values) - 1, values.index(value))

    def flag(self, value):  # ConsumeBool
        self.int_in(0, 255, int(value), 1)

    def data(self, b):  # ConsumeBytes: fuzz_array.cpp reads at most kMaxInputBytes and repeats them
        self.front += b[:1024]

    def any_int64(self, value):  # ConsumeIntegral<int64_t>() == value (mod 2^64)
        self.back += ((value + 2**63) % 2**64).to_bytes(8, "big")

    def dim(self, n):  # dim_value
        if n <= 9:
            self.int_in(0, 7, 7), self.int_in(0, 9, n)
        elif n >= 2**20 and n & (n - 1) == 0:
            self.int_in(0, 7, 1), self.int_in(20, 62, n.bit_length() - 1)
        elif n > 4097:
            self.int_in(0, 7, 0), self.any_int64(n)  # the harness keeps the low 63 bits
        elif n <= 130:
            self.int_in(0, 7, 2), self.int_in(10, 130, n)
        else:
            m, d = (n + 1) // 64, (n + 1) % 64 - 1
            assert 2 <= m <= 64 and -1 <= d <= 1, n
            self.int_in(0, 7, 3), self.int_in(2, 64, m), self.int_in(-1, 1, d)

    def stride(self, s, contiguous):  # stride_value
        if s == 0:
            self.int_in(0, 7, 0)
        elif s == contiguous:
            self.int_in(0, 7, 7)
        elif s == -contiguous:
            self.int_in(0, 7, 1)
        elif -64 <= s <= 64:
            self.int_in(0, 7, 2), self.int_in(-64, 64, s)
        else:
            self.int_in(0, 7, 3), self.any_int64(s)

    def raw(self, kind, itemsize, shape, strides=None, native=True, misalign=False, data=b""):  # make_array
        self.pick("fffibucVO", kind)
        self.pick([1, 2, 4, 8, 16, 3], itemsize)
        self.int_in(0, 3, int(native))
        if itemsize > 1:
            self.int_in(0, 3, 0 if misalign else 1)
        self.int_in(0, 5, len(shape))
        for n in shape:
            self.dim(n)
        contiguous = itemsize
        for i in reversed(range(len(shape))):
            self.stride(contiguous if strides is None else strides[i], min(contiguous, 2**63 - 1))
            contiguous *= max(shape[i], 1)
        self.data(data)

    def array(self, a):  # a numpy array, native, aligned and C-contiguous
        self.raw(a.dtype.kind, a.dtype.itemsize, a.shape, data=np.ascontiguousarray(a).tobytes())

    def bytes(self):
        return bytes(self.front) + bytes(reversed(self.back))


CAUSAL, IMPL = ["none", "top_left", "bottom_right"], ["automatic", "reference", "flash", "decode"]


def sdpa_call(q, k, v, mask=None, key_lengths=None, query_offset=None, causal="none", impl="automatic",
              window=None, dropout=None, lse=True, weights=False, backward=None):
    c = Choices()
    put_array = lambda a: c.raw(**a) if isinstance(a, dict) else c.array(a)  # a dict: Choices.raw's arguments
    for a in (q, k, v):
        put_array(a)
    c.flag(mask is not None)
    if mask is not None:
        put_array(mask)
    c.flag(key_lengths is not None)
    if key_lengths is not None:
        c.array(key_lengths)
    c.int_in(0, 2, 0 if query_offset is None else 1)
    if query_offset is not None:
        c.int_in(-20, 20, query_offset)
    c.pick(CAUSAL, causal)
    c.pick(IMPL, impl)
    c.flag(window is not None)
    if window is not None:
        c.int_in(-1, 12, window[0]), c.int_in(-1, 12, window[1]), c.flag(True)  # top-left
    c.flag(False)  # scale: the default
    c.flag(dropout is not None)
    if dropout is not None:
        c.pick([0.0, 0.5, 1.0, -0.1], dropout)
    c.flag(dropout is not None)  # a seed with dropout
    if dropout is not None:
        c.int_in(0, 2**64 - 1, 7)
    c.flag(lse), c.flag(weights)
    c.flag(backward is not None)
    if backward is not None:
        c.pick(IMPL[:3], backward)
        c.data(rng.standard_normal(q.shape[:-1] + v.shape[-1:]).astype(q.dtype if q.dtype == np.float64 else np.float32).tobytes())
    return c.bytes()


def normal(*shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


# Small calls of every dtype and option, then the sizes past 64 that the kernels block by.
put("fuzz_array", "call-f32-reference", sdpa_call(normal(1, 2, 5, 8), normal(1, 2, 7, 8), normal(1, 2, 7, 6), impl="reference"))
put("fuzz_array", "call-gqa-mask-causal-flash",
    sdpa_call(normal(2, 4, 9, 8), normal(2, 2, 7, 8), normal(2, 2, 7, 4), mask=rng.random((9, 7)) < 0.8,
              causal="bottom_right", impl="flash", backward="flash"))
put("fuzz_array", "call-f64-key-lengths",
    sdpa_call(normal(3, 1, 1, 8, dtype=np.float64), normal(3, 1, 9, 8, dtype=np.float64), normal(3, 1, 9, 8, dtype=np.float64),
              key_lengths=np.array([9, 4, 0]), backward="automatic"))
put("fuzz_array", "call-f16-window-dropout",
    sdpa_call(normal(2, 6, 4, dtype=np.float16), normal(2, 6, 4, dtype=np.float16), normal(2, 6, 4, dtype=np.float16),
              window=(2, 1), dropout=0.5, weights=True, backward="reference"))
put("fuzz_array", "call-additive-mask-offset",
    sdpa_call(normal(1, 3, 6, 5), normal(1, 3, 8, 5), normal(1, 3, 8, 5), mask=normal(1, 1, 6, 8), query_offset=2,
              causal="top_left", backward="automatic"))
put("fuzz_array", "call-flash-130x130", sdpa_call(normal(1, 1, 130, 7), normal(1, 1, 130, 7), normal(1, 1, 130, 7),
                                                 causal="top_left", impl="flash", backward="flash"))
put("fuzz_array", "call-backward-127x65", sdpa_call(normal(1, 127, 8), normal(1, 65, 8), normal(1, 65, 8), impl="flash",
                                                   backward="flash"))
put("fuzz_array", "call-flash-key-splits-9x1025", sdpa_call(normal(9, 8), normal(1025, 8), normal(1025, 8), impl="flash"))
# The slowest call the work limit lets through: the reference backward at 2^18 (89·89·33).
put("fuzz_array", "call-backward-reference-at-work-limit",
    sdpa_call(normal(89, 16), normal(89, 16), normal(89, 16), impl="reference", backward="reference"))
put("fuzz_array", "call-decode-4097-keys", sdpa_call(normal(1, 1, 1, 16), normal(1, 1, 4097, 16), normal(1, 1, 4097, 16),
                                                    key_lengths=np.array([4000]), impl="decode"))

# The bugs fuzz_array found, in the encoding above (their first files were written for the
# harness before sizes past 9 were drawn, which reads the same bytes differently).
# A key dim of size 1 with a huge stride: decode walked it (hung); b99807c.
put("fuzz_array", "regress-decode-huge-stride-1",
    sdpa_call(dict(kind="f", itemsize=2, shape=(1, 1, 1), strides=(-9175051799348903936, 3939431052873542571, 3146797518456335275),
                   native=False, data=bytes(2)),
              dict(kind="f", itemsize=2, shape=(1, 1, 1), strides=(0, 3146797518456335275, 3146797518456335104), data=bytes(2)),
              dict(kind="f", itemsize=2, shape=(1, 1, 1), strides=(2, -9223372036323062872, 2), data=bytes(2)),
              mask=dict(kind="f", itemsize=8, shape=(1, 1, 1), strides=(32, 3146797518456335145, 3146796781483568043), data=bytes(8)),
              lse=False))
put("fuzz_array", "regress-decode-huge-stride-2",
    sdpa_call(dict(kind="f", itemsize=4, shape=(5, 1, 1), strides=(4, 4, 4), native=False, misalign=True, data=bytes(21)),
              dict(kind="f", itemsize=2, shape=(1, 1, 1), strides=(0, 0, 2), data=bytes(2)),
              dict(kind="f", itemsize=2, shape=(1, 1, 9), strides=(0, -9223372036854775698, 2), data=bytes(18)),
              lse=False))
# A zero-element array with huge dims copied to C order (byte-swapped) overflowed its contiguous
# strides (issue 19 class 1): an attn::Error now, no crash.
put("fuzz_array", "regress-zero-huge-shape-copy",
    sdpa_call(dict(kind="f", itemsize=2, shape=(0, 2**40, 2**40, 9), native=False), normal(1, 1, 2, 4), normal(1, 1, 2, 4)))
