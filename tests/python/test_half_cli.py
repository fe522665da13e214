# float16 / bfloat16 through the CLI (issue 14): float16 .npy inputs, FILE.safetensors:NAME for
# tensor arguments, --out-dtype, .safetensors outputs; bad files and bad dtypes give one clear
# error naming the option and write nothing. Oracle: the float64 textbook on the rounded inputs.
import os
import subprocess

import numpy as np
import pytest

from half_reference import check, oracle, read_safetensors, rounded, values, write_safetensors

ATTN_BIN = os.environ.get("ATTN_BIN", "")
pytestmark = pytest.mark.skipif(not ATTN_BIN, reason="ATTN_BIN is not set (the CLI is not built)")


def run(*args, cwd):
    return subprocess.run([ATTN_BIN, "sdpa", *map(str, args)], capture_output=True, text=True, cwd=cwd, timeout=120)


def problem(seed, lq=6, lk=20, d=8):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((1, 2, lq, d)).astype(np.float32), rng.standard_normal((1, 2, lk, d)).astype(np.float32),
            rng.standard_normal((1, 2, lk, d)).astype(np.float32))


def fails(r, *fragments):
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    err = r.stderr.strip()
    assert err.startswith("attn: error: ") and err.count("\n") == 0, err
    for f in fragments:
        assert f in err, (f, err)


def test_float16_npy_inputs_default_out_float16(tmp_path):
    q32, k32, v32 = problem(1)
    arrays = [rounded(x, "float16") for x in (q32, k32, v32)]
    for name, (a, _) in zip("qkv", arrays):
        np.save(tmp_path / f"{name}.npy", a)
    r = run("--q", "q.npy", "--k", "k.npy", "--v", "v.npy", "--out", "o.npy", "--lse", "l.npy", "--impl", "reference",
            "--causal", "top-left", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    ref_out, ref_lse, _ = oracle(*(x for _, x in arrays), keep=np.tril(np.ones((6, 20), bool)))
    o = np.load(tmp_path / "o.npy")
    check(values(o, "float16"), ref_out, "float16")
    lse = np.load(tmp_path / "l.npy")
    assert lse.dtype == np.float32
    check(lse, ref_lse, "float32")


@pytest.mark.parametrize("out_dtype", ["float32", "float16", "bfloat16"])
def test_bfloat16_safetensors_round_trip(tmp_path, out_dtype):
    q32, k32, v32 = problem(2)
    arrays = {n: rounded(x, "bfloat16") for n, x in zip("qkv", (q32, k32, v32))}
    # Several tensors in one file, plus one that is not read (only the named one is).
    write_safetensors(tmp_path / "in.safetensors", {**{n: (a, "bfloat16") for n, (a, _) in arrays.items()},
                                                    "other": (np.zeros(3, np.float32), "float32")})
    r = run("--q", "in.safetensors:q", "--k", "in.safetensors:k", "--v", "in.safetensors:v", "--impl", "reference",
            "--out", "o.safetensors", "--out-dtype", out_dtype, "--weights", "w.safetensors", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    ref_out, _, ref_w = oracle(*(arrays[n][1] for n in "qkv"))
    o = read_safetensors(tmp_path / "o.safetensors")
    assert list(o) == ["out"] and o["out"][1] == out_dtype
    check(values(o["out"][0], out_dtype), ref_out, out_dtype)
    w = read_safetensors(tmp_path / "w.safetensors")
    assert list(w) == ["weights"] and w["weights"][1] == "float32"
    check(w["weights"][0], ref_w, "float32")
    # What attn wrote, attn reads back (a .safetensors output is a valid tensor argument).
    r = run("--q", "o.safetensors:out", "--k", "in.safetensors:k", "--v", "in.safetensors:v", "--impl", "reference",
            "--out", "o2.npy", "--out-dtype", "float32", cwd=tmp_path)
    assert r.returncode == 0, r.stderr


def test_float32_query_against_float16_cache_runs_auto(tmp_path):
    q32, k32, v32 = problem(3, lq=2, lk=200, d=32)
    (k, kr), (v, vr) = rounded(k32, "float16"), rounded(v32, "float16")
    np.save(tmp_path / "q.npy", q32)
    np.save(tmp_path / "k.npy", k)
    np.save(tmp_path / "v.npy", v)
    r = run("--q", "q.npy", "--k", "k.npy", "--v", "v.npy", "--out", "o.npy", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    o = np.load(tmp_path / "o.npy")
    check(values(o, "float32"), oracle(q32, kr, vr)[0], "float32")


def test_a_tensor_named_like_a_safetensors_file(tmp_path):
    # The name is everything after the first ".safetensors:", even "k.safetensors" (the whole
    # spec ending in .safetensors was taken for a file without a name).
    q32, k32, v32 = problem(5, lq=3, lk=4)
    np.save(tmp_path / "q.npy", q32)
    write_safetensors(tmp_path / "kv.safetensors", {"k.safetensors": (k32, "float32"), "v": (v32, "float32")})
    r = run("--q", "q.npy", "--k", "kv.safetensors:k.safetensors", "--v", "kv.safetensors:v", "--out", "o.npy",
            cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    check(np.load(tmp_path / "o.npy"), oracle(q32, k32, v32)[0], "float32")


def test_float64_query_writes_float32_by_default(tmp_path):
    # The CLI's contract since its first version (tests/torch): float64 inputs, float32 outputs.
    q32, k32, v32 = problem(4, lq=3, lk=4)
    for n, x in zip("qkv", (q32, k32, v32)):
        np.save(tmp_path / f"{n}.npy", x.astype(np.float64))
    r = run("--q", "q.npy", "--k", "k.npy", "--v", "v.npy", "--out", "o.npy", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    o = np.load(tmp_path / "o.npy")
    assert o.dtype == np.float32
    check(o, oracle(q32, k32, v32)[0], "float32")


def test_float64_out_on_request(tmp_path):
    # --out-dtype float64: a float64 Q's double result as the reference computed it (Python's sdpa
    # returns it; the CLI could only write float32, a parity audit), and a float32 Q's result widened.
    rng = np.random.default_rng(7)
    q, k, v = (rng.standard_normal(s) for s in ((1, 2, 3, 8), (1, 2, 4, 8), (1, 2, 4, 8)))  # not float32 values
    for n, x in zip("qkv", (q, k, v)):
        np.save(tmp_path / f"{n}64.npy", x)
        np.save(tmp_path / f"{n}32.npy", x.astype(np.float32))
    for p, out in (("64", "o64.npy"), ("32", "o32_64.npy")):
        r = run("--q", f"q{p}.npy", "--k", f"k{p}.npy", "--v", f"v{p}.npy", "--out", out, "--out-dtype", "float64",
                cwd=tmp_path)
        assert r.returncode == 0, r.stderr
    r = run("--q", "q32.npy", "--k", "k32.npy", "--v", "v32.npy", "--out", "o32.npy", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    o64, ref = np.load(tmp_path / "o64.npy"), oracle(q, k, v)[0]
    assert o64.dtype == np.float64
    assert np.abs(o64 - ref).max() <= 1e-13 * (1 + np.abs(ref).max())  # float32 would be ~1e-7 off
    o32_64 = np.load(tmp_path / "o32_64.npy")
    assert o32_64.dtype == np.float64 and np.array_equal(o32_64, np.load(tmp_path / "o32.npy").astype(np.float64))
    # float64 has no safetensors dtype here: refused before anything runs.
    fails(run("--q", "q64.npy", "--k", "k64.npy", "--v", "v64.npy", "--out", "o.safetensors", "--out-dtype", "float64",
              cwd=tmp_path), "--out: 'o.safetensors' would hold float64")
    assert not (tmp_path / "o.safetensors").exists()



def test_a_float16_mask_is_its_values(tmp_path):
    q32, k32, v32 = problem(6, lq=3, lk=5)
    m = np.random.default_rng(6).standard_normal((3, 5)).astype(np.float16)
    for n, x in zip("qkv", (q32, k32, v32)):
        np.save(tmp_path / f"{n}.npy", x)
    np.save(tmp_path / "m16.npy", m)
    np.save(tmp_path / "m32.npy", m.astype(np.float32))
    for mask, out in (("m16.npy", "o16.npy"), ("m32.npy", "o32.npy")):
        r = run("--q", "q.npy", "--k", "k.npy", "--v", "v.npy", "--mask", mask, "--out", out, cwd=tmp_path)
        assert r.returncode == 0, r.stderr
    assert np.array_equal(np.load(tmp_path / "o16.npy"), np.load(tmp_path / "o32.npy"))

@pytest.fixture
def files(tmp_path):
    q32, k32, v32 = problem(5, lq=3, lk=4)
    np.save(tmp_path / "q.npy", q32)
    np.save(tmp_path / "k.npy", k32)
    np.save(tmp_path / "v.npy", v32)
    write_safetensors(tmp_path / "kv.safetensors", {"k": (k32, "float32"), "v": (v32, "float32")})
    data = (tmp_path / "kv.safetensors").read_bytes()
    (tmp_path / "cut.safetensors").write_bytes(data[:-5])
    bad = data.replace(b'"F32"', b'"I32"', 1)
    (tmp_path / "i32.safetensors").write_bytes(bad)
    np.save(tmp_path / "maski.npy", np.zeros((3, 4), np.int32))
    np.save(tmp_path / "qi.npy", np.zeros((1, 2, 3, 8), np.int32))
    return tmp_path


BASE = ["--q", "q.npy", "--k", "k.npy", "--v", "v.npy"]


@pytest.mark.parametrize("args, fragments", [
    (["--q", "q.npy", "--k", "kv.safetensors:nope", "--v", "v.npy", "--out", "o.npy"],
     ["--k: 'kv.safetensors': has no tensor named 'nope' (it holds 2: 'k', 'v')"]),
    (["--q", "q.npy", "--k", "kv.safetensors", "--v", "v.npy", "--out", "o.npy"],
     ["--k: 'kv.safetensors' is a safetensors file: name the tensor as 'kv.safetensors:NAME' (it holds 2: 'k', 'v')"]),
    (["--q", "q.npy", "--k", "kv.safetensors:", "--v", "v.npy", "--out", "o.npy"], ["--k: ", "name after ':' is empty"]),
    (["--q", "q.npy", "--k", "kv.safetensors:k", "--v", "cut.safetensors:v", "--out", "o.npy"],
     ["--v: 'cut.safetensors': "]),
    (["--q", "q.npy", "--k", "i32.safetensors:k", "--v", "v.npy", "--out", "o.npy"],
     ["--k: 'i32.safetensors:k' must hold float32, float64, float16 or bfloat16 but holds int32"]),
    (["--q", "missing.safetensors:q", "--k", "k.npy", "--v", "v.npy", "--out", "o.npy"],
     ["--q: 'missing.safetensors:q': no file of that name, nor a file 'missing.safetensors' to read the tensor 'q'"]),
    (["--q", "qi.npy", "--k", "k.npy", "--v", "v.npy", "--out", "o.npy"],
     ["--q: 'qi.npy' must hold float32, float64, float16 or bfloat16 but holds int32"]),
    (BASE + ["--out", "o.npy", "--mask", "maski.npy"], ["--mask: 'maski.npy' must hold bool", "or a float dtype", "but holds int32"]),
    (BASE + ["--out", "o.npy", "--out-dtype", "bfloat16"], ["--out: 'o.npy' would hold bfloat16", ".safetensors"]),
    (BASE + ["--out", "o.npy", "--out-dtype", "float8"], ["--out-dtype: expected float16, bfloat16, float32 or float64 but got 'float8'"]),
    (BASE + ["--out", "o.safetensors", "--lse", "l.npy", "--key-lengths", "kv.safetensors:zz"], ["--key-lengths: "]),
])
def test_bad_inputs_write_nothing(files, args, fragments):
    before = sorted(os.listdir(files))
    fails(run(*args, cwd=files), *fragments)
    assert sorted(os.listdir(files)) == before  # not even a staging file


def test_mha_reads_safetensors_arguments_and_names_its_outputs(tmp_path):
    import torch
    torch.manual_seed(0)
    m = torch.nn.MultiheadAttention(16, 4, batch_first=True).eval()
    write_safetensors(tmp_path / "p.safetensors", {n: (t.detach().numpy(), "float32") for n, t in m.state_dict().items()})
    x = torch.randn(2, 5, 16)
    np.save(tmp_path / "x.npy", x.numpy())
    write_safetensors(tmp_path / "x.safetensors", {"x": (x.numpy(), "float32")})
    common = ["--params", "p.safetensors", "--num-heads", "4", "--batch-first"]
    for query, out in (("x.npy", "o.npy"), ("x.safetensors:x", "o.safetensors")):
        r = subprocess.run([ATTN_BIN, "mha", *common, "--query", query, "--out", out], capture_output=True, text=True,
                           cwd=tmp_path, timeout=120)
        assert r.returncode == 0, r.stderr
    o = read_safetensors(tmp_path / "o.safetensors")
    assert list(o) == ["out"] and o["out"][1] == "float32"
    np.testing.assert_array_equal(o["out"][0], np.load(tmp_path / "o.npy"))  # the same input, read two ways
    with torch.no_grad():
        ref = m.double()(x.double(), x.double(), x.double(), need_weights=False)[0].numpy()
    check(o["out"][0], ref, "float32")
    r = subprocess.run([ATTN_BIN, "mha", *common, "--query", "x.safetensors:y", "--out", "o2.npy"], capture_output=True,
                       text=True, cwd=tmp_path, timeout=120)
    fails(r, "--query: 'x.safetensors': has no tensor named 'y' (it holds 1: 'x')")
    assert not (tmp_path / "o2.npy").exists()


@pytest.mark.parametrize("out_dtype", [None, "float32", "float16"])
def test_gradients_follow_out_dtype(tmp_path, out_dtype):
    """--grad-out: dq/dk/dv in --out-dtype, by default each in its input's dtype (here dQ float16,
    dK and dV float32); float32 gradients equal the --out-dtype float32 run's bit for bit."""
    q32, k32, v32 = problem(4)
    np.save(tmp_path / "q.npy", rounded(q32, "float16")[0])
    np.save(tmp_path / "k.npy", k32)
    np.save(tmp_path / "v.npy", v32)
    np.save(tmp_path / "do.npy", np.random.default_rng(2).standard_normal((1, 2, 6, 8)).astype(np.float32))
    base = ["--q", "q.npy", "--k", "k.npy", "--v", "v.npy", "--grad-out", "do.npy", "--out-dtype"]
    outs = lambda tag: ["--out", f"o{tag}.npy", "--dq", f"dq{tag}.npy", "--dk", f"dk{tag}.npy", "--dv", f"dv{tag}.npy"]  # noqa: E731
    r32 = run(*base, "float32", *outs("32"), cwd=tmp_path)
    assert r32.returncode == 0, r32.stderr
    args = base[:-1] + (["--out-dtype", out_dtype] if out_dtype else [])
    r = run(*args, *outs("x"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    for g, own in (("dq", "float16"), ("dk", "float32"), ("dv", "float32")):
        want = out_dtype or own
        a, ref = np.load(tmp_path / f"{g}x.npy"), np.load(tmp_path / f"{g}32.npy")
        assert a.dtype == np.dtype(want), (g, a.dtype)
        assert np.abs(ref).max() > 0
        if out_dtype == "float32":
            np.testing.assert_array_equal(a, ref)
        else:
            # This run's backward reads its float16 O (D = rowsum(dO∘O) moves by the O rounding,
            # docs/conventions.md), then rounds each 16-bit gradient once: near the float32-O gradients.
            assert np.abs(a.astype(np.float64) - ref).max() <= 2.0 ** -7 * np.abs(ref).max(), g


def load_output(path):
    """A --dq/--dk/--dv file: (array, dtype name); a .safetensors one holds one tensor."""
    if path.suffix == ".safetensors":
        (a, dtype), = read_safetensors(path).values()
        return a, dtype
    a = np.load(path)
    return a, str(a.dtype)


@pytest.mark.parametrize("packed", [False, True])
def test_each_gradient_in_its_inputs_dtype(tmp_path, packed):
    """Without --out-dtype, dQ in Q's dtype, dK in K's, dV in V's (docs/conventions.md, "The
    gradients' dtypes"), the Python module's bits. A float16 Q with bfloat16 K/V: dV past float16's
    65504 stays finite in bfloat16 (in Q's float16 it was inf); a bfloat16 Q with float32 K and
    float64 V: float32 dK and float64 dV, not bfloat16's 8 bits."""
    import attn
    q32, k32, _ = problem(5, lq=8, lk=3, d=16)
    v32 = (1 + 0.01 * np.random.default_rng(6).standard_normal(k32.shape)).astype(np.float32)
    g32 = (3e4 * np.random.default_rng(7).uniform(0.5, 1.5, (1, 2, 8, 16))).astype(np.float32)
    pack = (lambda a: np.ascontiguousarray(a[0].transpose(1, 0, 2))) if packed else (lambda a: a)  # noqa: E731
    extra, kw = [], {}
    if packed:
        np.save(tmp_path / "cq.npy", np.array([0, 8], np.int64))
        np.save(tmp_path / "ck.npy", np.array([0, 3], np.int64))
        extra = ["--cu-seqlens-q", "cq.npy", "--cu-seqlens-k", "ck.npy"]
    np.save(tmp_path / "do.npy", pack(g32))
    for dtypes in (("float16", "bfloat16", "bfloat16"), ("bfloat16", "float32", "float64")):
        arrays = {n: pack(rounded(x, dt)[0]) for n, x, dt in zip("qkv", (q32, k32, v32), dtypes)}
        args, outs = [], {}
        for n, dt in zip("qkv", dtypes):
            if dt == "bfloat16":
                write_safetensors(tmp_path / f"{n}.safetensors", {n: (arrays[n], dt)})
                args += [f"--{n}", f"{n}.safetensors:{n}"]
                outs[f"d{n}"] = tmp_path / f"d{n}.safetensors"
            else:
                np.save(tmp_path / f"{n}.npy", arrays[n])
                args += [f"--{n}", f"{n}.npy"]
                outs[f"d{n}"] = tmp_path / f"d{n}.npy"
        r = run(*args, "--grad-out", "do.npy", "--out", "o.npy" if dtypes[0] == "float16" else "o.safetensors",
                *[x for g, path in outs.items() for x in (f"--{g}", path.name)], *extra, cwd=tmp_path)
        assert r.returncode == 0, (dtypes, r.stderr)
        q, k, v = arrays["q"], arrays["k"], arrays["v"]
        if packed:
            cq, ck = np.array([0, 8], np.int32), np.array([0, 3], np.int32)
            out, lse = attn.sdpa_varlen(q, k, v, cq, ck, return_lse=True, dtype="bfloat16")
            want = attn.sdpa_varlen_backward(q, k, v, cq, ck, out, lse, pack(g32), dtype="bfloat16")
        else:
            out, lse = attn.scaled_dot_product_attention(q, k, v, return_lse=True, dtype="bfloat16")
            want = attn.scaled_dot_product_attention_backward(q, k, v, out, lse, g32, dtype="bfloat16")
        for (g, path), dt, w in zip(outs.items(), dtypes, want):
            a, got_dtype = load_output(path)
            assert got_dtype == dt, (dtypes, g, got_dtype)
            np.testing.assert_array_equal(a, w, err_msg=f"{dtypes} {g}")
            assert np.all(np.isfinite(values(a, dt))), (dtypes, g)
        if dtypes[2] == "bfloat16":
            assert np.abs(values(load_output(outs["dv"])[0], "bfloat16")).max() > 65504
