"""The attn CLI's contract, which other tools depend on:
  - `attn --help`, `attn --version`, `attn sdpa --help` exit 0;
  - on any error: exactly one stderr line `attn: error: …`, nothing on stdout, exit status 2,
    and no output file created (nor a temporary file left beside it);
  - outputs are float32 .npy files that replace existing files only on success.
"""
import os
import re

import numpy as np
import pytest

from cli_util import listing, run_attn

B, HQ, HKV, LQ, LK, DK, DV = 2, 4, 2, 5, 7, 8, 6


@pytest.fixture
def work(tmp_path):
    """A directory with valid q/k/v (float32) and a few extra inputs; returns its path."""
    rng = np.random.default_rng(7)
    np.save(tmp_path / "q.npy", rng.standard_normal((B, HQ, LQ, DK)).astype(np.float32))
    np.save(tmp_path / "k.npy", rng.standard_normal((B, HKV, LK, DK)).astype(np.float32))
    np.save(tmp_path / "v.npy", rng.standard_normal((B, HKV, LK, DV)).astype(np.float32))
    return tmp_path


def sdpa_args(d, **override):
    """Valid `sdpa` arguments for the files in d; override={'q': path, ...}; value None drops the flag."""
    flags = {"q": d / "q.npy", "k": d / "k.npy", "v": d / "v.npy", "out": d / "o.npy"}
    flags.update(override)
    args = ["sdpa"]
    for name, value in flags.items():
        if value is not None:
            args += ["--" + name.replace("_", "-"), value]
    return args


def expect_error(d, args, *fragments, cwd=None):
    """Runs attn; expects exit 2, one stderr line `attn: error: ` containing each fragment,
    empty stdout and no new file in d. Returns the message."""
    before = listing(d)
    r = run_attn(*args, cwd=cwd)
    lines = r.stderr.splitlines()
    assert r.returncode == 2, f"exit {r.returncode}, stderr: {r.stderr!r}"
    assert len(lines) == 1 and r.stderr.endswith("\n"), f"expected exactly one stderr line, got {r.stderr!r}"
    assert lines[0].startswith("attn: error: "), lines[0]
    assert r.stdout == "", f"stdout on error: {r.stdout!r}"
    for f in fragments:
        assert f in lines[0], f"{f!r} not in {lines[0]!r}"
    assert listing(d) == before, f"files appeared: {sorted(set(listing(d)) - set(before))}"
    return lines[0]


# ---- help and version --------------------------------------------------------------------------

def test_help_version_and_sdpa_help():
    r = run_attn("--help")
    assert r.returncode == 0 and "sdpa" in r.stdout and r.stderr == ""
    r = run_attn("--version")
    assert r.returncode == 0 and re.fullmatch(r"attn \d+\.\d+\.\d+\n", r.stdout), repr(r.stdout)
    r = run_attn("sdpa", "--help")
    assert r.returncode == 0
    for flag in ("--q", "--k", "--v", "--out", "--mask", "--causal", "--scale", "--weights", "--lse", "--impl",
                 "--key-lengths", "--query-offset", "--query-offsets", "--window-align"):
        assert flag in r.stdout, flag


def test_success_writes_only_the_requested_float32_outputs(work):
    r = run_attn(*sdpa_args(work, weights=work / "w.npy", lse=work / "l.npy"))
    assert r.returncode == 0 and r.stderr == "" and r.stdout == ""
    assert listing(work) == ["k.npy", "l.npy", "o.npy", "q.npy", "v.npy", "w.npy"]
    assert np.load(work / "o.npy").dtype == np.float32 and np.load(work / "o.npy").shape == (B, HQ, LQ, DV)
    assert np.load(work / "w.npy").shape == (B, HQ, LQ, LK)
    assert np.load(work / "l.npy").shape == (B, HQ, LQ)
    assert np.allclose(np.load(work / "w.npy").sum(-1), 1.0, atol=1e-6)


def test_relative_paths_from_the_working_directory(work):
    r = run_attn("sdpa", "--q", "q.npy", "--k", "k.npy", "--v", "v.npy", "--out", "o.npy", cwd=work)
    assert r.returncode == 0, r.stderr
    assert "o.npy" in listing(work)


# ---- every error: one line, exit 2, nothing written -------------------------------------------

def test_missing_input_file(work):
    expect_error(work, sdpa_args(work, k=work / "nope.npy"), "nope.npy", "cannot open for reading")


def test_missing_required_flag(work):
    expect_error(work, sdpa_args(work, q=None), "--q")


def test_no_subcommand_and_unknown_option(work):
    expect_error(work, [], "subcommand")
    expect_error(work, sdpa_args(work) + ["--frobnicate", "1"], "--frobnicate")


# float16 is an input dtype since issue 14 (tests/python/test_half_cli.py); these are not.
@pytest.mark.parametrize("dtype", [np.int32, np.bool_, np.int64])
def test_bad_input_dtype(work, dtype):
    np.save(work / "qi.npy", np.ones((B, HQ, LQ, DK), dtype=dtype))
    expect_error(work, sdpa_args(work, q=work / "qi.npy"), "--q", "qi.npy", "float32, float64, float16 or bfloat16",
                 np.dtype(dtype).name if dtype is not np.bool_ else "bool")


def test_bad_mask_dtype(work):
    np.save(work / "m.npy", np.ones((LQ, LK), dtype=np.int32))
    expect_error(work, sdpa_args(work, mask=work / "m.npy"), "--mask", "int32")


def test_bad_key_lengths(work):
    np.save(work / "kl.npy", np.array([3, 9], dtype=np.int32))
    expect_error(work, sdpa_args(work, key_lengths=work / "kl.npy"), "sdpa: --key-lengths: ", "entry 1 must be in [0, Lk=7] but got 9")
    np.save(work / "kf.npy", np.array([3, 4], dtype=np.float32))
    expect_error(work, sdpa_args(work, key_lengths=work / "kf.npy"), "sdpa: --key-lengths: ", "int32 or int64", "float32")


def test_bad_query_offsets(work):
    # The library names the function (sdpa) and its argument, which the CLI says as its flag.
    np.save(work / "qf.npy", np.array([1, 2], dtype=np.float32))
    msg = expect_error(work, sdpa_args(work, query_offsets=work / "qf.npy", causal="top-left"), "sdpa: --query-offsets: ",
                       "int32 or int64", "float32")
    assert msg.startswith("attn: error: sdpa: "), msg
    np.save(work / "q3.npy", np.array([1, 2, 3], dtype=np.int64))
    expect_error(work, sdpa_args(work, query_offsets=work / "q3.npy", causal="top-left"), "sdpa: --query-offsets: ", "(B,)")
    expect_error(work, sdpa_args(work, query_offset=2 ** 61), "sdpa: --query-offset: ", "2^60")
    np.save(work / "qo.npy", np.array([1, 2], dtype=np.int32))
    expect_error(work, sdpa_args(work, query_offset=1, query_offsets=work / "qo.npy"), "--query-offset")


@pytest.mark.parametrize("offset", [{"query_offset": 3}, {"query_offsets": "qo.npy"}])
def test_a_query_offset_needs_something_it_places(work, offset):
    # --query-offsets QO.npy with no causal mask, window or ALiBi ran and changed nothing, while
    # --seed without --dropout is refused (a review found it). Each of the three gives it a use.
    np.save(work / "qo.npy", np.array([3, 3], dtype=np.int64))  # neither 0 nor ALiBi's Lk - Lq = 2
    given = {k: (work / v if k == "query_offsets" else v) for k, v in offset.items()}
    flag = "--" + next(iter(offset)).replace("_", "-")
    msg = expect_error(work, sdpa_args(work, **given))
    assert msg == (f"attn: error: {flag}: only with --causal, --window-left/--window-right or --alibi/--alibi-slopes "
                   "(it places the diagonal they measure from; without them it changes nothing)"), msg
    outs = {}
    for name, extra in (("causal", ["--causal"]), ("window", ["--window-left", "1"]), ("alibi", ["--alibi"])):
        got = {}
        for tag, offset_args in (("", given), ("0", {})):
            r = run_attn(*sdpa_args(work, **offset_args, out=work / f"{name}{tag}.npy", lse=work / f"l{name}{tag}.npy"), *extra)
            assert r.returncode == 0, r.stderr
            got[tag] = (np.load(work / f"{name}{tag}.npy"), np.load(work / f"l{name}{tag}.npy"))
        # It placed the diagonal: the result differs from the default alignment's.
        assert not all(np.array_equal(a, b) for a, b in zip(got[""], got["0"])), name


@pytest.mark.parametrize("which,shape,fragment", [
    ("k", (B, HKV, LK, DK + 1), "sdpa: --k: head dim 9 does not match Q's head dim 8"),
    ("v", (B, HKV, LK - 1, DV), "sdpa: --v: length 6 does not match K's length 7"),
    ("k", (B, 3, LK, DK), "sdpa: --q: heads 4 must be a multiple of K/V's heads 3"),
    ("q", (HQ, LQ, DK), "sdpa: --q: expected a rank-4 tensor (B, Hq, Lq, Dk) but got shape (4, 5, 8)"),
    ("v", (B + 1, HKV, LK, DV), "sdpa: --v: batch 3 does not match Q's batch 2"),
    ("q", (B, HQ, 0, DK), "sdpa: --q: length must be >= 1 but got 0"),
])
def test_shape_mismatch(work, which, shape, fragment):
    np.save(work / "bad.npy", np.zeros(shape, dtype=np.float32))
    if which == "k":  # keep V consistent with K where only K is meant to be wrong
        np.save(work / "v2.npy", np.zeros((B, shape[1], LK, DV), dtype=np.float32))
        expect_error(work, sdpa_args(work, k=work / "bad.npy", v=work / "v2.npy"), fragment)
    else:
        expect_error(work, sdpa_args(work, **{which: work / "bad.npy"}), fragment)


def test_mask_that_does_not_broadcast(work):
    np.save(work / "m.npy", np.ones((LQ, LK + 1), dtype=np.bool_))
    expect_error(work, sdpa_args(work, mask=work / "m.npy"), "sdpa: --mask: ", "cannot be broadcast to (2, 4, 5, 7)")


@pytest.mark.parametrize("value", ["diagonal", "top_left", "TOP-LEFT", ""])
def test_bad_causal(work, value):
    expect_error(work, sdpa_args(work, causal=value), "causal")


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e400", "abc"])
def test_bad_scale(work, value):
    expect_error(work, sdpa_args(work, scale=value), "scale")


def test_bad_impl_and_window(work):
    expect_error(work, sdpa_args(work, impl="fastest"), "impl", "'fastest'")
    expect_error(work, sdpa_args(work, window_align="middle"), "--window-align", "'middle'")
    expect_error(work, sdpa_args(work, window_left="-3"), "window", "left=-3")


@pytest.mark.parametrize("content", [
    b"",
    b"not a numpy file at all",
    b"\x93NUMPY\x01\x00\x46\x00{'descr': '<f4', 'fortran_order': False, 'shape': (2, 4, 5, 8), }",
    b"\x93NUMPY\x01\x00\x10\x00{'descr': '<f4',}\n",
    b"\x93NUMPY\x01\x00\x40\x00{'descr': '>f4', 'fortran_order': False, 'shape': (1,), }           \n" + b"\0" * 4,
])
def test_malformed_npy(work, content):
    (work / "bad.npy").write_bytes(content)
    expect_error(work, sdpa_args(work, q=work / "bad.npy"), "bad.npy")


def test_fortran_order_input(work):
    """np.save of a Fortran-ordered array (np.asfortranarray, or a transposed view) is read as the
    array it holds: the same bits out as from C-order files."""
    for name in ("q", "k", "v"):
        np.save(work / f"{name}f.npy", np.asfortranarray(np.load(work / f"{name}.npy")))
    np.save(work / "kt.npy", np.load(work / "k.npy").T.copy().T)  # a C copy of the transpose, saved transposed
    assert np.isfortran(np.load(work / "qf.npy")) and np.isfortran(np.load(work / "kt.npy"))
    assert run_attn(*sdpa_args(work)).returncode == 0
    assert run_attn(*sdpa_args(work, q=work / "qf.npy", k=work / "kt.npy", v=work / "vf.npy",
                               out=work / "of.npy")).returncode == 0
    assert np.array_equal(np.load(work / "o.npy"), np.load(work / "of.npy"))


def test_output_directory_missing(work):
    for flag in ("out", "weights", "lse"):
        expect_error(work, sdpa_args(work, **{flag: work / "no" / "such" / "x.npy"}), "--" + flag, "does not exist")


def test_output_under_a_file_or_where_files_cannot_be_made(work):
    """Every such error names the option: a path through a regular file, and /proc (writable to
    access() as root, yet it refuses new files: the error came from the write, without the option)."""
    (work / "afile").write_bytes(b"x")
    for flag in ("out", "weights", "lse"):
        expect_error(work, sdpa_args(work, **{flag: work / "afile" / "x.npy"}), "--" + flag, "is not a directory")
    if os.path.isdir("/proc"):
        for flag in ("weights", "lse"):
            expect_error(work, sdpa_args(work, **{flag: "/proc/attn-test-x.npy"}), f"attn: error: --{flag}: ")


def test_output_path_is_a_directory(work):
    (work / "adir").mkdir()
    for flag in ("out", "weights", "lse"):
        expect_error(work, sdpa_args(work, **{flag: work / "adir"}), "--" + flag, "adir")
    assert listing(work / "adir") == []


@pytest.mark.parametrize("a,b", [("o.npy", "o.npy"), ("o.npy", "./o.npy"), ("o.npy", "sub/../o.npy")])
def test_same_output_path_twice(work, a, b):
    (work / "sub").mkdir()
    before = listing(work)
    r = run_attn("sdpa", "--q", "q.npy", "--k", "k.npy", "--v", "v.npy", "--out", a, "--lse", b, cwd=work)
    assert r.returncode == 2, f"exit {r.returncode}: {r.stderr!r}"
    assert len(r.stderr.splitlines()) == 1 and r.stderr.startswith("attn: error: --lse: "), r.stderr
    assert "--out" in r.stderr
    assert listing(work) == before
    expect_error(work, sdpa_args(work, weights=work / "o.npy"), "--weights", "--out")


def test_an_input_given_as_output_is_rejected_or_left_intact(work):
    """--out q.npy: either refused (nothing written) or q.npy is replaced only after reading it."""
    q = np.load(work / "q.npy")
    r = run_attn(*sdpa_args(work, out=work / "q.npy"))
    if r.returncode == 0:
        assert np.load(work / "q.npy").shape == (B, HQ, LQ, DV)
    else:
        assert r.returncode == 2 and r.stderr.startswith("attn: error: ")
        assert np.array_equal(np.load(work / "q.npy"), q)


def test_failure_keeps_an_existing_output_unchanged(work):
    (work / "o.npy").write_bytes(b"previous result")
    np.save(work / "kbad.npy", np.zeros((B, HKV, LK, DK + 1), dtype=np.float32))
    expect_error(work, sdpa_args(work, k=work / "kbad.npy"), "head dim")
    assert (work / "o.npy").read_bytes() == b"previous result"


def test_a_late_failing_output_leaves_no_earlier_output(work):
    """--weights names a path that cannot be written (a directory): --out must not appear either."""
    (work / "w_dir").mkdir()
    expect_error(work, sdpa_args(work, weights=work / "w_dir"), "--weights")
    assert not os.path.exists(work / "o.npy")


def test_a_failing_write_leaves_no_output_and_no_temporary(tmp_path):
    """The file system refuses the large --weights file (RLIMIT_FSIZE = 64 KiB, as a full disk
    would): exit 2 with one error line, and neither the small --out nor any temporary remains."""
    import resource
    import signal
    import subprocess

    from cli_util import attn_bin

    rng = np.random.default_rng(3)
    np.save(tmp_path / "q.npy", rng.standard_normal((2, 4, 300, 8)).astype(np.float32))
    np.save(tmp_path / "k.npy", rng.standard_normal((2, 2, 300, 8)).astype(np.float32))
    np.save(tmp_path / "v.npy", rng.standard_normal((2, 2, 300, 2)).astype(np.float32))
    before = listing(tmp_path)

    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # get EFBIG from write() instead of a signal
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, resource.RLIM_INFINITY))

    r = subprocess.run([attn_bin(), *map(str, sdpa_args(tmp_path, weights=tmp_path / "w.npy"))],
                       capture_output=True, text=True, preexec_fn=limit, timeout=120)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert len(r.stderr.splitlines()) == 1 and r.stderr.startswith("attn: error: "), r.stderr
    assert "w.npy" in r.stderr and "write failed" in r.stderr, r.stderr
    assert listing(tmp_path) == before


# ---- ATTN_CPU_HIDE: run as an older CPU would ------------------------------------------------

def ran_line(r):
    lines = [l for l in r.stderr.splitlines() if l.startswith("ran: ")]
    assert r.returncode == 0 and len(lines) == 1, r.stderr
    return lines[0]


@pytest.mark.parametrize("hide, forbidden, expected", [
    ("avx512", "avx512 path", None),               # the avx2 row where the CPU has AVX2, else portable
    ("avx512_bf16,avx2", "avx2 path", "portable path"),
])
def test_cpu_hide_takes_rows_away_and_keeps_the_result(work, monkeypatch, hide, forbidden, expected):
    base = run_attn(*sdpa_args(work), "--verbose")
    o_base = np.load(work / "o.npy")
    monkeypatch.setenv("ATTN_CPU_HIDE", hide)
    line = ran_line(run_attn(*sdpa_args(work, out=work / "o_hidden.npy"), "--verbose"))
    assert forbidden not in line, line
    if expected:
        assert expected in line, line
    ran_line(base)
    np.testing.assert_allclose(np.load(work / "o_hidden.npy"), o_base, rtol=1e-5, atol=1e-6)


def test_cpu_hide_unknown_item_is_an_error(work, monkeypatch):
    monkeypatch.setenv("ATTN_CPU_HIDE", "avx512,sse9")
    expect_error(work, sdpa_args(work), "ATTN_CPU_HIDE", "avx512, avx512_bf16, amx_bf16, avx2", "'sse9'")
