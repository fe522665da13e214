"""`mpirun -np P attn ring` against attention computed here in float64 with numpy (an
independent oracle) and against `attn sdpa` on the same files; error handling across ranks.

Tolerance: |O - O_ref| <= 1e-5 (O is a convex combination of V rows with |V| <= 2, computed in
float32: rounding stays near 1e-7)."""
import os
import subprocess

import numpy as np
import pytest

ATTN = os.environ["ATTN_BIN"]
MPIEXEC = os.environ.get("ATTN_MPIEXEC", "mpirun")
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMP_NUM_THREADS="1",
           ATTN_NUM_THREADS="1")


def mpirun(np_, *args):
    cmd = [MPIEXEC, "-q", "--oversubscribe", "-np", str(np_), ATTN, "ring", *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=120)


def attention(q, k, v, causal=False, scale=None, key_lengths=None, window=None, query_offset=None):
    """q (B, Hq, Lq, Dk), k (B, Hkv, Lk, Dk), v (B, Hkv, Lk, Dv) → (B, Hq, Lq, Dv), float64.

    The masks as the docs state them: n_b valid keys (key_lengths, else Lk); query i's diagonal
    is d_b(i) = i + o_b with o_b = query_offset if given, else 0 (top-left) or n_b − Lq
    (bottom-right, per sequence); causal (True = "top-left", or "bottom-right") keeps j <= d_b(i),
    window = (left, right, align) keeps d_b(i) − left <= j <= d_b(i) + right (−1 = unbounded)."""
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    B, Hq, Lq, Dk = q.shape
    Hkv, Lk = k.shape[1], k.shape[2]
    k = np.repeat(k, Hq // Hkv, axis=1)
    v = np.repeat(v, Hq // Hkv, axis=1)
    s = q @ k.transpose(0, 1, 3, 2) * (1 / np.sqrt(Dk) if scale is None else scale)
    n = np.full(B, Lk) if key_lengths is None else np.asarray(key_lengths)
    i = np.arange(Lq)[None, :, None]
    j = np.arange(Lk)[None, None, :]

    def diagonal(align):  # (B, Lq, 1)
        if query_offset is not None:
            o = np.broadcast_to(np.asarray(query_offset), (B,))
        else:
            o = n - Lq if align == "bottom-right" else np.zeros(B, dtype=np.int64)
        return i + o[:, None, None]

    keep = j < n[:, None, None]
    if causal:
        keep = keep & (j <= diagonal("top-left" if causal is True else causal))
    if window is not None:
        left, right, align = window
        d = diagonal(align)
        if left >= 0:
            keep = keep & (j >= d - left)
        if right >= 0:
            keep = keep & (j <= d + right)
    s = np.where(keep[:, None], s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0)
    w = np.exp(s - m)
    den = w.sum(axis=-1, keepdims=True)
    return np.where(den > 0, (w / np.where(den > 0, den, 1)) @ v, 0.0)


def make(tmp_path, B, Hq, Hkv, Lq, Lk, Dk, Dv, seed=0, dtype=np.float32):
    rng = np.random.default_rng(seed)
    arrays = {"q": rng.uniform(-2, 2, (B, Hq, Lq, Dk)), "k": rng.uniform(-2, 2, (B, Hkv, Lk, Dk)),
              "v": rng.uniform(-2, 2, (B, Hkv, Lk, Dv))}
    paths = {}
    for name, a in arrays.items():
        paths[name] = tmp_path / f"{name}.npy"
        np.save(paths[name], a.astype(dtype))
    return {n: a.astype(dtype) for n, a in arrays.items()}, paths


CASES = [  # B, Hq, Hkv, Lq, Lk, Dk, Dv
    (1, 1, 1, 16, 16, 8, 8),
    (2, 4, 2, 37, 37, 12, 5),   # GQA, Dk != Dv, length not divisible by P
    (1, 3, 1, 50, 50, 7, 9),    # MQA
    (1, 2, 2, 23, 41, 6, 6),    # cross-attention, Lq != Lk
]


@pytest.mark.parametrize("np_", [1, 2, 3, 4])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", CASES, ids=lambda s: "x".join(map(str, s)))
def test_matches_float64_attention(tmp_path, np_, causal, shape):
    arrays, p = make(tmp_path, *shape)
    out = tmp_path / "o.npy"
    args = ["--q", p["q"], "--k", p["k"], "--v", p["v"], "--out", out] + (["--causal"] if causal else [])
    r = mpirun(np_, *args)
    assert r.returncode == 0, r.stderr
    o = np.load(out)
    assert o.dtype == np.float32 and o.shape == shape[:2] + (shape[3], shape[6])
    ref = attention(arrays["q"], arrays["k"], arrays["v"], causal=causal)
    err = np.abs(o - ref).max()
    assert err <= 1e-5, f"max |O - O_ref| = {err}"


@pytest.mark.parametrize("np_", [2, 3])
def test_equals_attn_sdpa_with_scale_key_lengths_and_contiguous_layout(tmp_path, np_):
    arrays, p = make(tmp_path, 3, 2, 1, 29, 29, 5, 4, seed=3)
    lengths = np.array([29, 11, 0], dtype=np.int64)
    np.save(tmp_path / "kl.npy", lengths)
    common = ["--q", p["q"], "--k", p["k"], "--v", p["v"], "--scale", "0.7", "--key-lengths", tmp_path / "kl.npy"]
    sd = subprocess.run([ATTN, "sdpa", *map(str, common), "--causal", "top-left", "--out", str(tmp_path / "s.npy")],
                        capture_output=True, text=True, env=ENV)
    assert sd.returncode == 0, sd.stderr
    ref = attention(arrays["q"], arrays["k"], arrays["v"], causal=True, scale=0.7, key_lengths=lengths)
    for layout in ["zigzag", "contiguous"]:
        out = tmp_path / f"o_{layout}.npy"
        r = mpirun(np_, *common, "--causal", "--layout", layout, "--out", out)
        assert r.returncode == 0, r.stderr
        o = np.load(out)
        assert np.abs(o - np.load(tmp_path / "s.npy")).max() <= 1e-5
        assert np.abs(o - ref).max() <= 1e-5
        assert np.all(o[2] == 0)  # a sequence with no valid key gives O = 0, never NaN


@pytest.mark.parametrize("np_", [1, 2, 4])
@pytest.mark.parametrize("layout", ["zigzag", "contiguous"])
def test_bottom_right_per_sequence_and_window(tmp_path, np_, layout):
    """Bottom-right with key lengths aligns each sequence to its own length (lengths below Lq
    leave rows with no key: O = 0), the window too; the same as `attn sdpa` on the same flags."""
    arrays, p = make(tmp_path, 3, 2, 1, 18, 30, 6, 5, seed=11)
    lengths = np.array([30, 7, 22], dtype=np.int64)
    np.save(tmp_path / "kl.npy", lengths)
    common = ["--q", p["q"], "--k", p["k"], "--v", p["v"], "--key-lengths", tmp_path / "kl.npy"]
    results = []
    for flags, ref_args in [
        (["--causal", "bottom-right"], dict(causal="bottom-right")),
        (["--causal", "bottom-right", "--window-left", "4", "--window-align", "bottom-right"],
         dict(causal="bottom-right", window=(4, -1, "bottom-right"))),
        (["--causal", "top-left", "--window-left", "3", "--window-right", "2", "--window-align", "bottom-right"],
         dict(causal=True, window=(3, 2, "bottom-right"))),
    ]:
        ref = attention(arrays["q"], arrays["k"], arrays["v"], key_lengths=lengths, **ref_args)
        sd = subprocess.run([ATTN, "sdpa", *map(str, common + flags), "--out", str(tmp_path / "s.npy")],
                            capture_output=True, text=True, env=ENV)
        assert sd.returncode == 0, sd.stderr
        out = tmp_path / "o.npy"
        r = mpirun(np_, *common, *flags, "--layout", layout, "--out", out)
        assert r.returncode == 0, r.stderr
        o = np.load(out)
        assert np.abs(o - ref).max() <= 1e-5, (flags, np.abs(o - ref).max())
        assert np.abs(o - np.load(tmp_path / "s.npy")).max() <= 1e-5, flags
        results.append(o)
    # Sequence 1 has 7 keys for 18 queries: under bottom-right its first 11 rows see none.
    assert np.all(results[0][1, :, :11] == 0) and np.all(np.any(results[0][1, :, 11:] != 0, axis=-1))


@pytest.mark.parametrize("np_", [1, 3])
def test_query_offset(tmp_path, np_):
    arrays, p = make(tmp_path, 2, 2, 2, 15, 26, 4, 4, seed=12)
    out = tmp_path / "o.npy"
    r = mpirun(np_, "--q", p["q"], "--k", p["k"], "--v", p["v"], "--out", out, "--causal", "--query-offset", "9",
               "--window-left", "5")
    assert r.returncode == 0, r.stderr
    ref = attention(arrays["q"], arrays["k"], arrays["v"], causal=True, window=(5, -1, "top-left"), query_offset=9)
    assert np.abs(np.load(out) - ref).max() <= 1e-5


@pytest.mark.parametrize("np_", [2, 3])
def test_query_offsets_per_sequence(tmp_path, np_):
    # `attn sdpa` and the ring's C++/Python API took per-sequence offsets; `attn ring` had no
    # --query-offsets (a parity audit).
    arrays, p = make(tmp_path, 2, 2, 2, 15, 26, 4, 4, seed=13)
    np.save(tmp_path / "qo.npy", np.array([9, -3], np.int64))
    out = tmp_path / "o.npy"
    r = mpirun(np_, "--q", p["q"], "--k", p["k"], "--v", p["v"], "--out", out, "--causal", "--query-offsets",
               tmp_path / "qo.npy", "--window-left", "5")
    assert r.returncode == 0, r.stderr
    ref = attention(arrays["q"], arrays["k"], arrays["v"], causal=True, window=(5, -1, "top-left"), query_offset=[9, -3])
    assert np.abs(np.load(out) - ref).max() <= 1e-5
    r = mpirun(np_, "--q", p["q"], "--k", p["k"], "--v", p["v"], "--out", out, "--query-offset", "2", "--query-offsets",
               tmp_path / "qo.npy")
    assert r.returncode == 2 and "--query-offset excludes --query-offsets" in r.stderr, r.stderr


def test_bad_causal_and_window_align(tmp_path):
    _, p = make(tmp_path, 1, 1, 1, 8, 8, 4, 4)
    out = tmp_path / "o.npy"
    base = ["--q", p["q"], "--k", p["k"], "--v", p["v"], "--out", out]
    r = mpirun(2, *base, "--causal", "sideways")
    assert r.returncode == 2 and len(error_lines(r)) == 1 and "sideways" in r.stderr, r.stderr
    r = mpirun(2, *base, "--window-align", "middle")
    assert r.returncode == 2 and error_lines(r) == [
        "attn: error: --window-align: expected top-left or bottom-right but got 'middle'"], r.stderr
    assert not out.exists()


@pytest.mark.parametrize("bad", [["--seed", "-1"], ["--scale", "nan"], ["--bogus"], ["--dropout", "1"]])
def test_option_errors_printed_once(tmp_path, bad):
    """Values the option parser refuses before MPI starts, and a dropout outside [0, 1): one
    line from rank 0, naming the option, whatever the number of ranks."""
    _, p = make(tmp_path, 1, 1, 1, 8, 8, 4, 4)
    out = tmp_path / "o.npy"
    r = mpirun(3, "--q", p["q"], "--k", p["k"], "--v", p["v"], "--out", out, *bad)
    assert r.returncode == 2, (r.returncode, r.stderr)
    errs = error_lines(r)
    assert len(errs) == 1 and bad[0] in errs[0], r.stderr
    assert not out.exists()


def test_library_errors_name_the_flag(tmp_path):
    """An error ring_attention raises names the flag the user gave (it said key_lengths, sinks, and
    Q, K, V where attn sdpa says --q, --k, --v: both commands share one list of names)."""
    _, p = make(tmp_path, 1, 2, 2, 8, 8, 4, 4)
    np.save(tmp_path / "kl.npy", np.array([9], np.int64))
    np.save(tmp_path / "sinks.npy", np.array([0.5, np.nan], np.float32))
    np.save(tmp_path / "q3.npy", np.zeros((1, 3, 8, 4), np.float32))
    out = tmp_path / "o.npy"
    for given, want in (({"--key-lengths": tmp_path / "kl.npy"}, "attn: error: ring_attention: --key-lengths: entry 0"),
                        ({"--sinks": tmp_path / "sinks.npy"}, "attn: error: ring_attention: --sinks: values must be finite"),
                        ({"--q": tmp_path / "q3.npy"}, "attn: error: ring_attention: --q: heads 3 must be a multiple of "
                                                       "K/V's heads 2")):
        options = {"--q": p["q"], "--k": p["k"], "--v": p["v"], "--out": out, **given}
        r = mpirun(2, *[word for pair in options.items() for word in pair])
        assert r.returncode == 2, (r.returncode, r.stderr)
        errs = error_lines(r)
        assert len(errs) == 1 and errs[0].startswith(want), r.stderr
        assert not out.exists()


def test_float64_slopes_and_sinks_are_rounded_as_sdpa_rounds_them(tmp_path):
    """--alibi-slopes/--sinks of a float64 file were refused ("dtype must be float32") where attn sdpa,
    attn mha and Python round them to float32: the ring's output must be attn sdpa's with the same
    float64 files, and a value beyond float32 is named as given."""
    _, p = make(tmp_path, 1, 2, 2, 12, 12, 8, 8)
    np.save(tmp_path / "s64.npy", np.array([0.1, 0.3]))
    common = ["--q", p["q"], "--k", p["k"], "--v", p["v"], "--causal", "--alibi-slopes", tmp_path / "s64.npy",
              "--sinks", tmp_path / "s64.npy"]
    r = mpirun(2, *common, "--out", tmp_path / "ring.npy")
    assert r.returncode == 0, r.stderr
    r = subprocess.run([ATTN, "sdpa", *map(str, common), "--out", str(tmp_path / "sdpa.npy")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    np.testing.assert_allclose(np.load(tmp_path / "ring.npy"), np.load(tmp_path / "sdpa.npy"), rtol=0, atol=2e-6)
    np.save(tmp_path / "huge.npy", np.array([0.5, 1e300]))
    r = mpirun(2, "--q", p["q"], "--k", p["k"], "--v", p["v"], "--sinks", tmp_path / "huge.npy", "--out", tmp_path / "x.npy")
    assert r.returncode != 0
    assert "--sinks[1] = 1e+300 does not fit float32" in r.stderr, r.stderr
    assert not (tmp_path / "x.npy").exists()


def test_float64_inputs_and_stats(tmp_path):
    arrays, p = make(tmp_path, 1, 2, 2, 40, 40, 8, 8, seed=5, dtype=np.float64)
    out = tmp_path / "o.npy"
    r = mpirun(4, "--q", p["q"], "--k", p["k"], "--v", p["v"], "--out", out, "--causal", "--stats")
    assert r.returncode == 0, r.stderr
    assert np.abs(np.load(out) - attention(arrays["q"], arrays["k"], arrays["v"], causal=True)).max() <= 1e-5
    lines = [l for l in r.stderr.splitlines() if l.startswith("ring: rank")]
    assert len(lines) == 4, r.stderr
    assert "compute max/min" in r.stderr


def error_lines(r):
    return [l for l in r.stderr.splitlines() if "error" in l]


@pytest.mark.parametrize("np_", [1, 2])
@pytest.mark.parametrize("extra,message", [
    (["--softcap", "-1"], "ring_attention: --softcap: must be 0 (off) or a finite float32 in "
                          "[1.1754944e-38, 3.4028235e38] but got -1"),
    (["--scale", "1e39"], "ring_attention: --scale: must be finite in float32 (|scale| <= 3.4028235e38) but got 1e39"),
    (["--window-left", "-3"], "ring_attention: --window-left/--window-right: left and right must be >= 0, or -1 for "
                              "unbounded, but got left=-3 right=-1"),
    (["--query-offset", str(2**61)], f"ring_attention: --query-offset: must be in [-2^60, 2^60] but got {2**61}"),
    (["--dropout", "1"], "ring_attention: --dropout: must be in [0, 1) but got 1"),
    # The library's seed rule and words (require_dropout), with the options for both arguments
    # and how a seed is given here.
    (["--dropout", "0.5"], "ring_attention: --seed: --dropout = 0.5 needs a seed (--seed N): the keep mask is a "
                           "function of it, so a training loop passes a new seed each step and the backward the "
                           "forward's (attn has no global generator)"),
])
def test_option_values_are_checked_before_any_input_is_read(tmp_path, np_, extra, message):
    """sdpa's check of the values that need no tensor, on every rank before rank 0 reads a file: the
    option is named, not the missing --q (which was named first, and a present one read first)."""
    missing, out = tmp_path / "nope.npy", tmp_path / "o.npy"
    r = mpirun(np_, "--q", missing, "--k", missing, "--v", missing, "--out", out, *extra)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert error_lines(r) == ["attn: error: " + message], r.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("np_", [1, 3])
def test_missing_input_fails_on_all_ranks_without_output(tmp_path, np_):
    _, p = make(tmp_path, 1, 1, 1, 8, 8, 4, 4)
    out = tmp_path / "o.npy"
    r = mpirun(np_, "--q", tmp_path / "nope.npy", "--k", p["k"], "--v", p["v"], "--out", out)
    assert r.returncode == 2, (r.returncode, r.stderr)
    errs = error_lines(r)
    assert len(errs) == 1 and errs[0].startswith("attn: error:") and "nope.npy" in errs[0], r.stderr
    assert not out.exists() and list(tmp_path.glob("o.npy*")) == []


@pytest.mark.parametrize("np_", [1, 4])
def test_shape_error_reported_once(tmp_path, np_):
    _, p = make(tmp_path, 1, 2, 2, 12, 12, 4, 4)
    np.save(tmp_path / "k5.npy", np.zeros((1, 2, 12, 5), np.float32))
    out = tmp_path / "o.npy"
    r = mpirun(np_, "--q", p["q"], "--k", tmp_path / "k5.npy", "--v", p["v"], "--out", out)
    assert r.returncode == 2
    errs = error_lines(r)
    # Named as the option (it said "K:", the library's argument), as attn sdpa names it.
    assert errs == ["attn: error: ring_attention: --k: head dim 5 does not match Q's head dim 4"], r.stderr
    assert not out.exists()


def test_v_length_mismatch_and_bad_layout(tmp_path):
    _, p = make(tmp_path, 1, 1, 1, 12, 12, 4, 4)
    np.save(tmp_path / "v9.npy", np.zeros((1, 1, 9, 4), np.float32))
    out = tmp_path / "o.npy"
    r = mpirun(2, "--q", p["q"], "--k", p["k"], "--v", tmp_path / "v9.npy", "--out", out)
    assert r.returncode == 2 and len(error_lines(r)) == 1 and "has length 9" in r.stderr, r.stderr
    r = mpirun(2, "--q", p["q"], "--k", p["k"], "--v", p["v"], "--out", out, "--layout", "striped")
    assert r.returncode == 2 and error_lines(r) == [
        "attn: error: --layout: expected zigzag or contiguous but got 'striped'"], r.stderr
    r = mpirun(2, "--q", p["q"], "--k", p["k"], "--v", p["v"], "--out", tmp_path / "no_dir" / "o.npy")
    assert r.returncode == 2 and len(error_lines(r)) == 1 and "not writable" in r.stderr, r.stderr
    assert not out.exists()


@pytest.mark.parametrize("np_", [1, 2, 3])
def test_float16_inputs_out_dtype_and_gradients_equal_attn_sdpa(tmp_path, np_):
    """float16 .npy Q/K/V/dO (K/V travel the ring in 16 bits): O and dQ/dK/dV come out in float16
    by default and in float32 with --out-dtype float32, within the float32 bound (+ one float16
    rounding) of `attn sdpa` on the same files with the same --out-dtype."""
    arrays, p = make(tmp_path, 2, 4, 2, 29, 29, 8, 8, seed=5, dtype=np.float16)
    rng = np.random.default_rng(6)
    np.save(tmp_path / "do.npy", rng.uniform(-1, 1, (2, 4, 29, 8)).astype(np.float16))
    common = ["--q", p["q"], "--k", p["k"], "--v", p["v"], "--causal", "top-left", "--grad-out", tmp_path / "do.npy"]
    for out_dtype in [None, "float32"]:
        extra = ["--out-dtype", out_dtype] if out_dtype else []
        names = {"out": "o", "dq": "dq", "dk": "dk", "dv": "dv"}
        ring = {n: tmp_path / f"r_{f}_{out_dtype}.npy" for n, f in names.items()}
        single = {n: tmp_path / f"s_{f}_{out_dtype}.npy" for n, f in names.items()}
        flags = lambda paths: sum([[f"--{n}", paths[n]] for n in names], [])  # noqa: E731
        sd = subprocess.run([ATTN, "sdpa", *map(str, common + extra + flags(single))], capture_output=True, text=True,
                            env=ENV)
        assert sd.returncode == 0, sd.stderr
        r = mpirun(np_, *common, *extra, *flags(ring))
        assert r.returncode == 0, r.stderr
        want = np.float32 if out_dtype else np.float16
        half_ulp = 0.0 if out_dtype else 2.0 ** -11
        for n in names:
            a, b = np.load(ring[n]), np.load(single[n])
            assert a.dtype == want and b.dtype == want, (n, a.dtype, b.dtype)
            a, b = a.astype(np.float64), b.astype(np.float64)
            # both within 1e-5-ish of the float32 result, each rounded once: two half-ulps apart at most;
            # float16 gradients come from each run's own float16 O, whose roundings may differ
            # (docs/conventions.md, "Backward with 16-bit tensors"): 2^-7 of the largest gradient.
            bound = 2e-5 * max(1.0, np.abs(b).max()) + 2 * half_ulp * np.abs(b)
            if n != "out" and half_ulp:
                bound = bound + 2.0 ** -7 * np.abs(b).max()
            assert np.all(np.abs(a - b) <= bound), (n, np.abs(a - b).max())
            assert np.abs(b).max() > 0.1  # not a comparison of zeros


@pytest.mark.parametrize("np_", [1, 2, 3])
def test_each_gradient_in_its_inputs_dtype(tmp_path, np_):
    """Without --out-dtype, dQ in Q's dtype, dK in K's, dV in V's, float64 read as float32
    (docs/conventions.md, "The gradients' dtypes"), near `attn sdpa` on the same files. A float16 Q
    with float32 K/V and a large dO: dV past float16's 65504 stays finite (in Q's float16 it was
    inf)."""
    rng = np.random.default_rng(8)
    shape_q, shape_kv = (1, 2, 13, 8), (1, 2, 13, 8)
    cases = [  # Q, K, V dtypes as stored, the dO scale, the gradients' dtypes
        (np.float16, np.float32, np.float32, 3e4, (np.float16, np.float32, np.float32)),
        (np.float32, np.float16, np.float64, 1.0, (np.float32, np.float16, np.float32)),
    ]
    for qd, kd, vd, do_scale, want in cases:
        q, k = rng.uniform(-1, 1, shape_q).astype(qd), rng.uniform(-1, 1, shape_kv).astype(kd)
        # V's rows nearly equal: dS = P∘(dP − D) small, so a large dO leaves dQ and dK within float16.
        # Values a float32 holds: the ring reads a float64 V as float32, attn sdpa as it is.
        v = (1 + 0.01 * rng.uniform(-1, 1, shape_kv)).astype(np.float32).astype(vd)
        do = (do_scale * rng.uniform(0.5, 1.5, shape_q)).astype(np.float32)
        for n, a in (("q", q), ("k", k), ("v", v), ("do", do)):
            np.save(tmp_path / f"{n}.npy", a)
        common = ["--q", tmp_path / "q.npy", "--k", tmp_path / "k.npy", "--v", tmp_path / "v.npy", "--causal",
                  "top-left", "--grad-out", tmp_path / "do.npy"]
        flags = lambda tag: sum([[f"--{n}", tmp_path / f"{tag}_{n}.npy"] for n in ("out", "dq", "dk", "dv")], [])  # noqa: E731
        sd = subprocess.run([ATTN, "sdpa", *map(str, common + flags("s"))], capture_output=True, text=True, env=ENV)
        assert sd.returncode == 0, sd.stderr
        r = mpirun(np_, *common, *flags("r"))
        assert r.returncode == 0, r.stderr
        o16 = qd == np.float16  # O in a 16-bit Q's dtype: each run's own rounding of it moves dQ, dK
        single = {n: np.load(tmp_path / f"s_{n}.npy").astype(np.float64) for n in ("dq", "dk", "dv")}
        budget = 2e-5 * max(np.abs(b).max() for b in single.values())  # of the call's largest gradient
        for n, dt in zip(("dq", "dk", "dv"), want):
            a, b = np.load(tmp_path / f"r_{n}.npy"), single[n]
            assert a.dtype == dt, (qd, kd, vd, n, a.dtype)
            a = a.astype(np.float64)
            assert np.all(np.isfinite(a)), (qd, kd, vd, n)
            half_ulp = 2.0 ** -11 if dt == np.float16 else 0.0
            bound = budget + 2 * half_ulp * np.abs(b)
            if o16 and n != "dv":
                bound = bound + 2.0 ** -7 * np.abs(b).max()
            assert np.all(np.abs(a - b) <= bound), (qd, kd, vd, n, np.abs(a - b).max())
        if do_scale > 1:
            assert np.abs(np.load(tmp_path / "r_dv.npy")).max() > 65504


def test_bfloat16_out_into_npy_is_refused_before_compute(tmp_path):
    _, p = make(tmp_path, 1, 1, 1, 8, 8, 4, 4)
    out = tmp_path / "o.npy"
    r = mpirun(2, "--q", p["q"], "--k", p["k"], "--v", p["v"], "--out", out, "--out-dtype", "bfloat16")
    assert r.returncode == 2 and "--out" in r.stderr and "bfloat16" in r.stderr, r.stderr
    # What a .npy output can be given here: no float64 (attn ring computes in float32).
    assert error_lines(r)[0].endswith("give a path ending in .safetensors, or --out-dtype float16 or float32"), r.stderr
    assert not out.exists()


@pytest.mark.parametrize("np_", [1, 2])
def test_a_bad_out_dtype_is_refused_before_anything_is_read(tmp_path, np_):
    """--q does not even exist: --out-dtype is named (it was parsed only after rank 0 had read
    Q, K and V)."""
    out = tmp_path / "o.npy"
    missing = tmp_path / "nope.npy"
    r = mpirun(np_, "--q", missing, "--k", missing, "--v", missing, "--out", out, "--out-dtype", "float8")
    assert r.returncode == 2 and error_lines(r) == [
        "attn: error: --out-dtype: expected float16, bfloat16 or float32 but got 'float8'"], r.stderr
    assert not out.exists()


def test_help_says_who_writes_each_output():
    """--out/--dq/--dk/--dv said "written by rank 0" though --shard-outputs makes each rank write
    its rows; --dsinks is rank 0's either way."""
    r = subprocess.run([ATTN, "ring", "--help"], capture_output=True, text=True, env=ENV, timeout=60)
    assert r.returncode == 0, r.stderr
    lines = {l.split()[0]: l for l in r.stdout.splitlines() if l.strip().startswith("--")}
    for flag in ("--out", "--dq", "--dk", "--dv"):
        assert "rank 0 writes it, or with --shard-outputs each rank its own rows" in lines[flag], lines[flag]
    assert "written by rank 0 (also with --shard-outputs" in lines["--dsinks"], lines["--dsinks"]


def mpmd(first, second):
    """Two ranks started with different command lines (mpirun's MPMD form A : B)."""
    cmd = [MPIEXEC, "-q", "--oversubscribe", "-np", "1", ATTN, "ring", *map(str, first), ":",
           "-np", "1", ATTN, "ring", *map(str, second)]
    return subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=60)


@pytest.mark.parametrize("extra, message", [
    (["--stats"], "--stats: rank 1 was called with --stats but rank 0 without it"),
    (["--alibi"], "--alibi: rank 1 was called with --alibi but rank 0 without it"),
    (["--shard-outputs"], "--shard-outputs: rank 1 was called with --shard-outputs but rank 0 without it"),
    (["--layout", "contiguous"], "--layout: rank 1 was called with --layout contiguous but rank 0 with --layout zigzag"),
    (["--grad-out", "do.npy", "--dq", "dq.npy", "--dk", "dk.npy", "--dv", "dv.npy"],
     "--grad-out: rank 1 was called with --grad-out but rank 0 without it"),
])
def test_ranks_called_with_different_collectives_say_so(tmp_path, extra, message):
    """Options that decide which collectives a rank runs (or, --layout, how many rows the scatter
    sends it): a rank called differently waited for ever in a collective the others never entered
    (--layout: MPI_ERR_TRUNCATE), and with --shard-outputs left its shard behind."""
    _, p = make(tmp_path, 2, 4, 2, 13, 13, 8, 8)
    np.save(tmp_path / "do.npy", np.zeros((2, 4, 13, 8), np.float32))
    base = ["--q", p["q"], "--k", p["k"], "--v", p["v"], "--out", tmp_path / "o.npy"]
    extra = [tmp_path / e if e.endswith(".npy") else e for e in extra]
    r = mpmd(base, base + extra)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert error_lines(r) == ["attn: error: " + message + " (every rank must pass the same options)"], r.stderr
    assert sorted(f.name for f in tmp_path.iterdir()) == ["do.npy", "k.npy", "q.npy", "v.npy"]


def test_shards_of_different_ranks_never_name_one_file(tmp_path):
    """--dsinks cx.rank1.npy is rank 1's shard of --out cx.npy: the last rename won and the run
    exited 0 with rank 1's O lost."""
    _, p = make(tmp_path, 1, 4, 2, 13, 13, 8, 8)
    np.save(tmp_path / "do.npy", np.zeros((1, 4, 13, 8), np.float32))
    np.save(tmp_path / "s.npy", np.array([0.5, -1, 2, 0], np.float32))
    r = mpirun(2, "--q", p["q"], "--k", p["k"], "--v", p["v"], "--out", tmp_path / "cx.npy", "--grad-out", tmp_path / "do.npy",
               "--dq", tmp_path / "dq.npy", "--dk", tmp_path / "dk.npy", "--dv", tmp_path / "dv.npy", "--sinks", tmp_path / "s.npy",
               "--dsinks", tmp_path / "cx.rank1.npy", "--shard-outputs")
    assert r.returncode == 2, (r.returncode, r.stderr)
    errs = error_lines(r)
    assert len(errs) == 1 and "cx.rank1.npy" in errs[0] and "--out (rank 1's shard)" in errs[0], r.stderr
    assert sorted(f.name for f in tmp_path.glob("*.npy")) == ["do.npy", "k.npy", "q.npy", "s.npy", "v.npy"]


def test_a_rank_that_cannot_write_its_shard_leaves_no_other_rank_s_shard(tmp_path):
    """--shard-outputs with rank 0's files limited to 4 KiB (`ulimit -f` on rank 0 alone): rank 0's
    8 KiB shard fails, and rank 1 had already renamed its shard into place, so the run exited 2
    with o.rank1.npy behind it. Every rank now stages its shards and publishes them only when all
    have (docs/errors.md: on an error no output file is created)."""
    if "libomp" in subprocess.run(["ldd", ATTN], capture_output=True, text=True).stdout:
        pytest.skip("libomp (a clang build) dies under ulimit -f at load, before attn runs")
    _, p = make(tmp_path, 1, 1, 1, 64, 64, 64, 64)  # each rank's O: 32 rows of 64 floats, 8 KiB
    limit_rank0 = 'if [ "${OMPI_COMM_WORLD_RANK:-$PMI_RANK}" = 0 ]; then ulimit -f 4; fi; exec "$0" "$@"'
    cmd = [MPIEXEC, "-q", "--oversubscribe", "-np", "2", "bash", "-c", limit_rank0, ATTN, "ring",
           "--q", p["q"], "--k", p["k"], "--v", p["v"], "--out", tmp_path / "o.npy", "--shard-outputs"]
    r = subprocess.run(list(map(str, cmd)), capture_output=True, text=True, env=ENV, timeout=120)
    assert r.returncode == 2, (r.returncode, r.stderr)
    errs = error_lines(r)
    assert len(errs) == 1 and "o.rank0.npy" in errs[0] and "File too large" in errs[0], r.stderr
    assert sorted(f.name for f in tmp_path.iterdir()) == ["k.npy", "q.npy", "v.npy"]
