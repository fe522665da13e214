"""The CLI as a newcomer meets it: what it says when a word, an option or a file is wrong, what
its help says about defaults, --threads everywhere it computes, and `attn bench --quick`
leaving out the minutes-long shape. Every error is one line `attn: error: …`, exit status 2."""
import json
import os
import re
import subprocess

import pytest

ATTN = os.environ["ATTN_BIN"]
COMMANDS = ["bench", "sdpa", "mha", "ring", "demo", "heatmap"]


def attn(*args, cwd=None):
    return subprocess.run([ATTN, *args], capture_output=True, text=True, timeout=120, cwd=cwd)


def one_error_line(p):
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    lines = p.stderr.strip().split("\n")
    assert len(lines) == 1 and lines[0].startswith("attn: error: "), p.stderr
    return lines[0]


def test_unknown_command_is_named_with_the_choices():
    line = one_error_line(attn("bogus"))
    assert "unknown subcommand 'bogus'" in line
    for c in COMMANDS:
        assert c in line


def test_unknown_option_before_the_command_is_named():
    # It said only "A subcommand is required" (CLI11's), not naming --bogus; --help and
    # --version stay CLI11's.
    line = one_error_line(attn("--bogus"))
    assert "unknown option '--bogus' before the subcommand" in line and "sdpa" in line
    assert attn("--version").returncode == 0 and attn("--help").returncode == 0


def test_no_command_lists_the_choices():
    line = one_error_line(attn())
    assert "a subcommand is required" in line and "sdpa" in line


def test_unknown_option_is_named():
    line = one_error_line(attn("sdpa", "--q", "Q.npy", "--k", "K.npy", "--v", "V.npy", "--out", "O.npy", "--bogus", "1"))
    assert "--bogus" in line
    # Before any missing required option (CLI11 said "--q is required" / "--params is required").
    for command in ("sdpa", "mha", "ring", "heatmap"):
        line = one_error_line(attn(command, "--bogus=3"))
        assert f"unknown option '--bogus' of attn {command}" in line, line


def test_unknown_short_option_is_named(tmp_path):
    # `-q Q.npy` (one dash) said "--q is required", and a trailing "-x" CLI11's "The following
    # argument was not expected"; only -h is a short option.
    for args, name in ((("-q", "Q.npy", "--k", "K.npy", "--v", "V.npy", "--out", "O.npy"), "-q"),
                       (("--q", "Q.npy", "--k", "K.npy", "--v", "V.npy", "--out", "O.npy", "-x"), "-x"),
                       (("-qQ.npy",), "-qQ.npy"),
                       (("--q", "Q.npy", "-threads=2"), "-threads")):
        line = one_error_line(attn("sdpa", *args, cwd=tmp_path))
        assert line == f"attn: error: unknown option '{name}' of attn sdpa (attn sdpa --help lists them)", line
    assert attn("sdpa", "-h").returncode == 0
    # A negative number is a value, not an option: the library's range check names it.
    line = one_error_line(attn("sdpa", "--q", "Q.npy", "--k", "K.npy", "--v", "V.npy", "--out", "O.npy",
                               "--window-left", "-2", cwd=tmp_path))
    assert "--window-left/--window-right: left and right must be >= 0" in line, line
    assert os.listdir(tmp_path) == []



def test_option_values_that_look_like_options_are_values(tmp_path):
    # A value starting with "--" (a BPE token, a title) is the option's value, as CLI11 reads it;
    # the unknown-option scan took it for an option (a review found it).
    import numpy as np
    np.save(tmp_path / "w.npy", np.full((3, 3), 1 / 3, np.float32))
    r = attn("heatmap", "w.npy", "--out", "w.svg", "--title", "--my title", "--tokens", "--,a,b", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "w.svg").stat().st_size > 0
    line = one_error_line(attn("heatmap", "w.npy", "--out", "x.svg", "--title", "t", "--bogus", cwd=tmp_path))
    assert "unknown option '--bogus' of attn heatmap" in line, line


def test_an_option_is_never_taken_as_the_value_before_it(tmp_path):
    # `attn demo --heatmap --threads 1` drew nothing: --heatmap took "--threads" as its file and
    # CLI11 then said "The following argument was not expected: 1" (a review found it).
    line = one_error_line(attn("demo", "--heatmap", "--threads", "1", cwd=tmp_path))
    assert line == ("attn: error: --heatmap: expected a value but the next word is the option --threads "
                    "(give a value that starts with '-' as --heatmap=VALUE)"), line
    line = one_error_line(attn("sdpa", "--q", "Q.npy", "--k", "K.npy", "--v", "V.npy", "--out", "--causal", cwd=tmp_path))
    assert "--out: expected a value but the next word is the option --causal" in line, line
    # --causal's value is optional: the option after it is an option, as before.
    line = one_error_line(attn("sdpa", "--q", "Q.npy", "--k", "K.npy", "--v", "V.npy", "--out", "O.npy",
                               "--causal", "--threads", "x", cwd=tmp_path))
    assert "--threads" in line and "--causal" not in line, line
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("args", [
    ("demo", "--heatmap", "--help"),  # said "--heatmap: expected a value but the next word is the option --help"
    ("demo", "--tokens", "-h"),
    ("sdpa", "--q", "--help"),
    ("sdpa", "--q", "Q.npy", "--bogus", "--help"),  # help first, as CLI11 gives it before requirements
    ("heatmap", "W.npy", "--out", "-h", "--title", "t"),
    ("mha", "--params", "--help", "--num-heads", "2"),
])
def test_help_anywhere_prints_the_commands_help(tmp_path, args):
    help_text = attn(args[0], "--help", cwd=tmp_path)
    assert help_text.returncode == 0
    assert f" {args[0]} [OPTIONS]" in help_text.stdout
    r = attn(*args, cwd=tmp_path)
    assert (r.returncode, r.stdout, r.stderr) == (0, help_text.stdout, ""), r.stderr
    assert os.listdir(tmp_path) == []


def test_help_as_an_attached_value_or_after_double_dash_is_a_value(tmp_path):
    line = one_error_line(attn("demo", "--heatmap=--help", cwd=tmp_path))
    assert line == "attn: error: --heatmap: expected a file name ending in .png or .svg but got '--help'", line
    line = one_error_line(attn("heatmap", "--out", "w.svg", "--", "--help", cwd=tmp_path))
    assert "--help" in line and "Usage" not in line, line
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("args", [("--causal=",), ("--scale=", "0.5"), ("--out=",)])
def test_an_empty_attached_value_is_refused(tmp_path, args):
    # `--causal=` ran as top-left and `--scale= 0.5` took 0.5 for the scale, while `--causal ""`
    # and `--scale ""` were errors: CLI11 reads an empty "=" value as no value.
    base = ["sdpa", "--q", "Q.npy", "--k", "K.npy", "--v", "V.npy"] + ([] if args[0] == "--out=" else ["--out", "O.npy"])
    line = one_error_line(attn(*base, *args, cwd=tmp_path))
    name = args[0][:-1]
    assert line == f"attn: error: {name}: an empty value is not allowed (give a value, or leave the option out)", line
    assert os.listdir(tmp_path) == []


def test_an_option_given_twice_is_named_with_its_count(tmp_path):
    # CLI11 said "--q: At Most 1 required but received 2", which reads as if a value were missing.
    line = one_error_line(attn("sdpa", "--q", "a.npy", "--q=b.npy", "--q", "c.npy", "--k", "K.npy", cwd=tmp_path))
    assert line == "attn: error: --q: given 3 times; give it once", line
    line = one_error_line(attn("bench", "--shapes", "S1", "--shapes", "S2", cwd=tmp_path))
    assert "--shapes: given 2 times" in line, line
    # Flags may repeat, as before; an option of many values is not counted.
    r = attn("heatmap", "W.npy", "--out", "w.svg", "--verbose", "--verbose", cwd=tmp_path)
    assert "given 2 times" not in r.stderr, r.stderr
    assert os.listdir(tmp_path) == []


def test_heatmap_without_a_file_says_what_to_give(tmp_path):
    line = one_error_line(attn("heatmap", cwd=tmp_path))
    assert "W.npy" in line and "weights is required" not in line
    line = one_error_line(attn("heatmap", "W.npy", cwd=tmp_path))
    assert "--out" in line
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("p", ["1", "1.5", "-0.1"])
def test_dropout_p_range_in_attns_words(tmp_path, p):
    line = one_error_line(attn("mha", "--params", "P.safetensors", "--num-heads", "2", "--query", "Q.npy",
                               "--out", "O.npy", "--grad-out", "dO.npy", "--grads", "G.safetensors",
                               "--dropout-p", p, cwd=tmp_path))
    assert line == f"attn: error: MultiHeadAttention: --dropout-p: must be in [0, 1) but got {float(p):g}"


def test_torch_flag_help_does_not_say_off():
    out = attn("bench", "--help").stdout
    assert "{false}" not in out, out
    # "--torch" then its description (on the same line or wrapped onto the next) says it is on.
    assert re.search(r"^\s*--torch\b[^\n]*\n?[^\n]*\(the default\)", out, re.M), out
    assert re.search(r"^\s*--no-torch\b", out, re.M), out


def test_ring_impl_help_says_what_auto_runs():
    out = attn("ring", "--help").stdout
    assert "decode" in out and "auto" in out


@pytest.mark.parametrize("cmd", ["sdpa", "mha", "ring", "demo", "bench"])
def test_every_compute_command_takes_threads(cmd):
    assert "--threads" in attn(cmd, "--help").stdout


def test_threads_out_of_range_is_one_line(tmp_path):
    line = one_error_line(attn("sdpa", "--q", "Q.npy", "--k", "K.npy", "--v", "V.npy", "--out", "O.npy",
                               "--threads", "5000", cwd=tmp_path))
    assert "--threads" in line and "got 5000" in line


def test_threads_zero_is_the_default(tmp_path):
    # docs/environment.md: 0 is "not given" wherever a thread count is taken (attn bench's too).
    np = pytest.importorskip("numpy")
    np.save(tmp_path / "Q.npy", np.ones((1, 2, 4, 8), np.float32))
    p = attn("sdpa", "--q", "Q.npy", "--k", "Q.npy", "--v", "Q.npy", "--out", "O.npy", "--threads", "0", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert np.allclose(np.load(tmp_path / "O.npy"), 1.0)


@pytest.mark.parametrize("cmd", ["sdpa", "mha", "ring", "demo", "bench"])
def test_threads_above_4096_is_refused_by_every_command(cmd, tmp_path):
    # One range for every command, attn's (attn::set_num_threads, ATTN_NUM_THREADS): 1 to 4096, 0 the
    # default; attn bench checked it in code of its own (a parity audit).
    line = one_error_line(attn(cmd, "--threads", "4097", cwd=tmp_path))
    assert line == "attn: error: --threads: expected a thread count from 1 to 4096 (0: the default) but got 4097", line
    assert os.listdir(tmp_path) == []


def bench_list(tmp_path, *args):
    out = tmp_path / "list.json"
    p = attn("bench", "--no-torch", "--list", "--json", str(out), *args)
    assert p.returncode == 0, p.stderr
    with open(out) as f:
        return {(e["id"], e["variant"]): e["selected"] for e in json.load(f)["cases"]}, p.stderr


def test_bench_quick_leaves_out_the_32k_shape(tmp_path):
    quick, note = bench_list(tmp_path, "--quick")
    assert not any(sel for (i, _), sel in quick.items() if i == "S8"), quick
    assert quick[("S1", "")] and "S8" in note
    full, _ = bench_list(tmp_path)
    assert all(full.values()), full
    # Named, it runs even with --quick.
    named, _ = bench_list(tmp_path, "--quick", "--shapes", "S8")
    assert named[("S8", "")] and not named[("S1", "")]


@pytest.mark.parametrize("command", ["sdpa", "heatmap", "demo"])
def test_readme_synopsis_names_every_option(command):
    # The README's CLI synopsis shows these three commands whole (mha, ring and bench point to
    # --help): an option their --help lists but the synopsis omits is one a reader cannot find.
    readme = open(os.path.join(os.environ.get("ATTN_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", "..")),
                               "README.md"), encoding="utf-8").read()
    block = readme[readme.index("## The CLI"):]
    block = block[block.index("```text"):block.index("```", block.index("```text") + 7)]
    synopsis = block[block.index("attn " + command):]
    synopsis = synopsis[:re.search(r"\nattn ", synopsis).start()]
    help_text = attn(command, "--help").stdout
    options = set(re.findall(r"^\s+(--[a-z0-9-]+)", help_text, re.M)) - {"--help"}
    assert options, help_text
    missing = sorted(o for o in options if not re.search(re.escape(o) + r"(?![a-z0-9-])", synopsis))
    assert missing == [], missing


def test_one_spelling_of_causal_and_dropout_works_in_every_command(tmp_path):
    # `attn ring --causal` alone meant top-left while `attn sdpa --causal` wanted a value; attn mha
    # spells dropout --dropout-p/--dropout-seed, sdpa and ring --dropout/--seed (a parity audit).
    import numpy as np
    rng = np.random.default_rng(5)
    for name, shape in (("q", (1, 2, 5, 4)), ("k", (1, 2, 7, 4)), ("v", (1, 2, 7, 3))):
        np.save(tmp_path / f"{name}.npy", rng.standard_normal(shape).astype(np.float32))
    base = ["sdpa", "--q", "q.npy", "--k", "k.npy", "--v", "v.npy", "--out"]
    for out, extra in (("bare.npy", ["--causal"]), ("top.npy", ["--causal", "top-left"]), ("none.npy", []),
                       ("d1.npy", ["--dropout", "0.3", "--seed", "4"]), ("d2.npy", ["--dropout-p", "0.3", "--dropout-seed", "4"])):
        r = attn(*base, out, *extra, cwd=tmp_path)
        assert r.returncode == 0, r.stderr
    assert np.array_equal(np.load(tmp_path / "bare.npy"), np.load(tmp_path / "top.npy"))
    assert not np.array_equal(np.load(tmp_path / "bare.npy"), np.load(tmp_path / "none.npy"))
    assert np.array_equal(np.load(tmp_path / "d1.npy"), np.load(tmp_path / "d2.npy"))


@pytest.mark.parametrize("command, forms", [("sdpa", "[none|top-left|bottom-right]"),
                                            ("ring", "[none|top-left|bottom-right]"),
                                            ("mha", "[none|top-left|bottom-right]")])
def test_causal_help_lists_the_forms_the_command_takes(command, forms):
    # Each lists what it takes (attn mha once refused bottom-right, and its --help offered it).
    line = next(l for l in attn(command, "--help").stdout.splitlines() if l.strip().startswith("--causal"))
    assert line.split()[:2] == ["--causal", forms], line


def test_library_errors_name_the_flag_not_the_field(tmp_path):
    # sdpa said "window:", "impl:", "scores:" (SdpaOptions' fields) where the user gave
    # --window-left, --impl, --scores (a parity audit).
    import numpy as np
    rng = np.random.default_rng(6)
    for name, shape in (("q", (1, 2, 5, 4)), ("k", (1, 2, 7, 4)), ("v", (1, 2, 7, 4))):
        np.save(tmp_path / f"{name}.npy", rng.standard_normal(shape).astype(np.float32))
    base = ["sdpa", "--q", "q.npy", "--k", "k.npy", "--v", "v.npy", "--out", "o.npy"]
    for extra, want in ((["--window-left", "-2"], "sdpa: --window-left/--window-right: left and right must be"),
                        (["--impl", "decode", "--grad-out", "q.npy", "--dq", "a.npy", "--dk", "b.npy", "--dv", "c.npy"],
                         "sdpa_backward: --impl: decode is a forward-only kernel"),
                        (["--scores", "s.npy", "--dropout", "0.5", "--seed", "1"], "sdpa: --scores: not available together with dropout")):
        line = one_error_line(attn(*base, *extra, cwd=tmp_path))
        assert line.startswith("attn: error: " + want), line
    assert sorted(os.listdir(tmp_path)) == ["k.npy", "q.npy", "v.npy"]


def test_scale_help_is_one_text_with_the_rule():
    # attn sdpa and attn ring declare --scale in one place (tools/attn/scale_option.cpp), with the
    # library's rule: 0 or a normal float32 (a subnormal scale is refused since it holds fewer bits).
    lines = []
    for command in ("sdpa", "ring"):
        p = attn(command, "--help")
        assert p.returncode == 0, p.stderr
        lines += [line.strip() for line in p.stdout.splitlines() if line.strip().startswith("--scale ")]
    assert len(lines) == 2 and lines[0] == lines[1], lines
    assert "a normal float32 (2^-126 ≈ 1.1754944e-38 <= |scale| <= 3.4028235e38 there)" in lines[0], lines[0]


def test_mha_key_and_value_help_says_they_come_together(tmp_path):
    # --value's help said "default: the query", but `--key K.npy` alone is an error (a review found
    # it): each says the other is needed, and that neither means self-attention.
    out = attn("mha", "--help").stdout
    for name, other in (("--key", "--value"), ("--value", "--key")):
        text = re.search(rf"^\s*{name} TEXT\s+(.*(?:\n\s{{20,}}\S.*)*)", out, re.M).group(1)
        assert f"with {other}" in text and "Neither" in text and "default: the query" not in text, text
        line = one_error_line(attn("mha", "--params", "P.safetensors", "--num-heads", "2", "--query", "Q.npy",
                                   "--out", "O.npy", name, "K.npy", cwd=tmp_path))
        assert f"{name}: given without {other}" in line, line
    assert os.listdir(tmp_path) == []
