"""`attn bench` on tiny shapes: every number in its JSON is checked against what it must be
(the FLOP formula written out here from the shape, the statistics of the recorded samples,
the ratios between rows) — never against a timing."""
import json
import math
import os
import statistics
import subprocess
import sys

import pytest

ATTN = os.environ["ATTN_BIN"]
SOURCE = os.environ.get("ATTN_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
MD_SCRIPT = os.path.join(SOURCE, "scripts", "bench-to-markdown.py")


def run(*args, check=True):
    p = subprocess.run([ATTN, "bench", *args], capture_output=True, text=True, timeout=240)
    if check:
        assert p.returncode == 0, "attn bench %s failed (%d):\n%s\n%s" % (args, p.returncode, p.stdout, p.stderr)
    return p


def torch_installed():
    return subprocess.run([sys.executable, "-c", "import torch"], capture_output=True).returncode == 0


def cpu_flags():
    """/proc/cpuinfo's flags, less what ATTN_CPU_HIDE takes away (the library reads it too:
    docs/environment.md), so these expectations follow the CPU attn believes it runs on."""
    with open("/proc/cpuinfo") as f:
        flags = set(next((l.split(":", 1)[1].split() for l in f if l.startswith("flags")), []))
    hidden = {"avx512": {"avx512f", "avx512vl", "avx512bw", "avx512dq", "avx512_bf16", "amx_bf16"},
              "avx512_bf16": {"avx512_bf16", "amx_bf16"}, "amx_bf16": {"amx_bf16"}, "avx2": {"avx2", "fma", "f16c"}}
    for item in filter(None, os.environ.get("ATTN_CPU_HIDE", "").split(",")):
        flags -= hidden[item]
    return flags


def cpu_has_avx2_fma():
    flags = cpu_flags()
    return "avx2" in flags and "fma" in flags


def cpu_has_avx512():
    """What attn's avx512 row needs (as /proc/cpuinfo lists it; the kernel shows the flags
    only when it saves the ZMM state)."""
    flags = cpu_flags()
    return cpu_has_avx2_fma() and all(x in flags for x in ("avx512f", "avx512vl", "avx512bw", "avx512dq", "f16c"))


def cpu_has_amx_bf16():
    # (the library also needs the OS's grant of the tile state, which Linux gives on request)
    flags = cpu_flags()
    return cpu_has_avx512() and "avx512_bf16" in flags and "amx_bf16" in flags and "amx_tile" in flags


def cpu_has_flag(name):
    return name in cpu_flags()


def close(a, b, rel=1e-9):
    return abs(a - b) <= rel * max(abs(a), abs(b))


# A custom shape with everything awkward at once: GQA (4 query heads on 2 KV heads),
# Dk != Dv, Lq != Lk, bottom-right causal, odd lengths.
B, HQ, HKV, LQ, LK, DK, DV = 2, 4, 2, 33, 47, 16, 8


@pytest.fixture(scope="module")
def custom_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "bench.json"
    p = run("--quick", "--runs", "3", "--impl", "reference,flash",
            "--shape-custom", "%d,%d,%d,%d,%d,%d:%d,bottom-right" % (B, HQ, HKV, LQ, LK, DK, DV), "--json", str(out))
    with open(out) as f:
        return json.load(f), p.stdout, out


def test_header_fields(custom_run):
    d, stdout, _ = custom_run
    assert d["schema"] == "attn-bench/1"
    for key in ["date", "command", "machine", "build", "config", "torch", "ceilings", "cases"]:
        assert key in d, key
    assert "bench" in d["command"] and "--shape-custom" in d["command"]
    assert d["machine"]["cpu_model"] and d["machine"]["logical_cpus"] >= 1
    for key in ["compiler", "build_type", "cxx_flags", "commit", "sanitized"]:
        assert key in d["build"], key
    assert d["build"]["commit"] != ""
    assert d["config"]["quick"] is True and d["config"]["runs"] == 3
    assert d["config"]["impls"] == ["reference", "flash"]
    for line in ["command", "commit", "machine", "FMA peak", "AVX-512", "read BW"]:
        assert line in stdout, line


def test_ceilings(custom_run):
    d, _, _ = custom_run
    c = d["ceilings"]
    threads = d["config"]["threads"]
    assert c["threads_for_percentages"] == threads
    fma1, fman = c["fma_peak_gflops"]
    assert fma1["threads"] == 1 and fman["threads"] == threads
    if cpu_has_avx2_fma():
        for x in (fma1, fman):
            assert x["measured"] and x["best"] > 0 and x["best"] >= x["median"] > 0
    else:
        assert not fma1["measured"] and "AVX2" in fma1["note"]
    # Every trial's CPU share is a share, 0 to 1: a busy trial measured 1.02 (getrusage's
    # granularity), which the JSON reported as such (a parity audit; bench/machine.hpp cpu_share).
    for name, pair in c.items():
        if isinstance(pair, list):
            for x in pair:
                assert all(0 <= s <= 1 for s in x["cpu_shares"]), (name, x["cpu_shares"])
    # The AVX-512 ceiling: measured where the CPU has the avx512 row, else says what it lacks.
    w1, wn = c["fma512_peak_gflops"]
    if cpu_has_avx512():
        for x in (w1, wn):
            assert x["measured"] and x["best"] >= x["median"] > 0
    else:
        assert not w1["measured"] and "lacks" in w1["note"] and "avx512" in w1["note"]
    # The bf16 dot-product ceiling (vdpbf16ps): measured where the CPU has avx512_bf16, else
    # the note says what the CPU lacks.
    b1, bn = c["bf16_dot_peak_gflops"]
    if cpu_has_avx512() and cpu_has_flag("avx512_bf16"):
        for x in (b1, bn):
            assert x["measured"] and x["best"] >= x["median"] > 0
    else:  # without the avx512 row at all the note names its features (bench/peaks.cpp), as on Zen 3
        missing = "avx512_bf16" if cpu_has_avx512() else "avx512f"
        assert not b1["measured"] and "lacks" in b1["note"] and missing in b1["note"], b1["note"]
    # The AMX bf16 ceiling (tdpbf16ps): measured where the CPU has amx_bf16 (and the avx512 row).
    a1, an = c["amx_bf16_peak_gflops"]
    if cpu_has_amx_bf16():
        for x in (a1, an):
            assert x["measured"] and x["best"] >= x["median"] > 0
    else:
        assert not a1["measured"] and "lacks" in a1["note"], a1["note"]
    for x in c["read_bandwidth_gbs"]:
        assert x["measured"] and x["best"] >= x["median"] > 0


def test_custom_case_arithmetic(custom_run):
    d, _, _ = custom_run
    cases = [c for c in d["cases"] if c["id"] == "custom"]
    assert len(cases) == 1
    c = cases[0]
    assert c["status"] == "ok"
    assert c["params"] == {"B": B, "Hq": HQ, "Hkv": HKV, "Lq": LQ, "Lk": LK, "Dk": DK, "Dv": DV,
                           "causal": "bottom-right", "dtype": "float32", "kv_dtype": "float32"}
    # 2*(Dk + Dv) per visible (query, key) pair: bottom-right, query i sees keys 0 .. i + LK - LQ
    # (1023 pairs per head; "causal counts half" said 775.5).
    pairs = sum(min(LK, max(0, i + LK - LQ + 1)) for i in range(LQ))
    flop = 2 * (DK + DV) * B * HQ * pairs
    assert c["flop"] == flop
    assert c["io_bytes"] == 4 * (B * HQ * LQ * DK + B * HKV * LK * DK + B * HKV * LK * DV + B * HQ * LQ * DV)
    rows = {r["impl"]: r for r in c["rows"]}
    assert set(rows) >= {"reference", "flash", "torch"}
    # %peak is of the widest FMA peak measured (AVX-512 where the CPU has it), %avx2 of the AVX2 one.
    peak2 = d["ceilings"]["fma_peak_gflops"][1]
    peak512 = d["ceilings"]["fma512_peak_gflops"][1]
    peak = peak512 if peak512["measured"] else peak2
    for r in c["rows"]:
        if r["status"] != "ok":
            assert r["note"], "a row that did not run must say why"
            continue
        s = r["samples_s"]
        assert 1 <= r["runs"] == len(s) <= 3
        assert all(x > 0 for x in s)
        assert close(r["median_s"], statistics.median(s)) and close(r["min_s"], min(s))
        assert r["flop"] == flop
        assert close(r["gflops"], flop / r["median_s"] / 1e9)
        assert close(r["gflops_best"], flop / r["min_s"] / 1e9)
        if peak["measured"]:
            assert close(r["pct_peak"], 100 * r["gflops"] / peak["best"])
        if peak2["measured"]:
            assert close(r["pct_peak_avx2"], 100 * r["gflops"] / peak2["best"])
        assert r["peak_rss_bytes"] > 0
        assert 0 <= r["cpu_share"] <= 1  # as the peaks' trials (test_ceilings)
        check_steal(r)
        if peak["measured"] and peak["per_cpu_best"] > 0 and r["cpu_share"] > 0:
            expect = 100 * r["gflops"] / r["cpu_share"] / peak["per_cpu_best"]
            assert close(r["pct_peak_cpu_adjusted"], expect)
    ref = rows["reference"]
    assert ref["status"] == "ok" and ref["kernel"] == "reference"
    # flash is either built (and then agrees with the reference) or says why it did not run.
    fl = rows["flash"]
    if fl["status"] == "ok":
        # A sanity bound for the bench's own comparison, not flash's accuracy test (that lives
        # with the kernel): outputs are averages of values in [-1, 1), D = 16, so fp32 rounding
        # stays near 1e-6; 1e-4 catches a wrong mask or head map, and NaN (null) fails.
        assert fl["max_abs_diff_vs_reference"] is not None and fl["max_abs_diff_vs_reference"] <= 1e-4
    else:
        assert fl["status"] == "error" and "flash" in fl["note"]
    t = rows["torch"]
    if torch_installed():
        assert t["status"] == "ok", t["note"]
        assert t["speedup_vs_torch"] is None
        assert close(ref["speedup_vs_torch"], t["median_s"] / ref["median_s"])
    else:
        assert t["status"] == "unavailable" and "torch" in t["note"]


def check_steal(row):
    """The machine's steal time during a row's timed calls, as a share of all its CPUs' time: -1
    where the kernel does not report it (or the calls took under 0.1 s), else a share; the row's
    note says so from 2 % (a VM's host took the vCPUs: the row's CPU share cannot show it)."""
    st = row["steal_share"]
    assert st == -1 or 0 <= st <= 1.05, st
    assert ("host steal" in row["note"]) == (st >= 0.02), (st, row["note"])


def test_decode_rows_state_the_bandwidth_share_and_steal(tmp_path):
    """S7's decode rows (timed by bench/decode/, not the harness): the cold row's note is whole
    (it was cut at 63 characters: "... each step (media"), the steal share is measured there too."""
    out = tmp_path / "s7.json"
    run("--quick", "--shapes", "S7", "--no-torch", "--runs", "2", "--json", str(out))
    rows = [r for c in json.load(open(out))["cases"] if c["status"] == "ok" for r in c["rows"] if r["status"] == "ok"]
    assert {r["impl"] for r in rows} == {"decode", "decode steady"}
    for r in rows:
        if r["impl"] == "decode":
            assert "of the bandwidth sampled just before each step (median)" in r["note"], r["note"]
        check_steal(r)


def test_registry_lists_every_shape_and_marks_unbuilt_ones(tmp_path):
    lst = tmp_path / "list.json"
    run("--list", "--json", str(lst))
    with open(lst) as f:
        entries = json.load(f)["cases"]
    ids = {e["id"] for e in entries}
    assert ids >= {"S1", "S2", "S3", "S4", "S5", "S6", "S7", "S8"}
    # Decode (S5, S7) and the MHA layer (S6) are built in.
    for i in ("S5", "S6", "S7"):
        assert all(e["available"] for e in entries if e["id"] == i), i
    unbuilt = sorted({e["id"] for e in entries if not e["available"]})
    for e in entries:
        assert e["available"] or e["note"].startswith("not available in this build")
    if not unbuilt:
        pytest.skip("every shape id is built")
    out = tmp_path / "unbuilt.json"
    # Runs only the unbuilt entries of those ids; built ones of the same id would run too,
    # so pick ids with no built entry.
    only_unbuilt = [i for i in unbuilt if all(not e["available"] for e in entries if e["id"] == i)]
    if not only_unbuilt:
        pytest.skip("no id is entirely unbuilt")
    run("--quick", "--no-torch", "--shapes", ",".join(only_unbuilt), "--json", str(out))
    with open(out) as f:
        d = json.load(f)
    assert sorted({c["id"] for c in d["cases"]}) == only_unbuilt
    for c in d["cases"]:
        assert c["status"] == "unavailable" and c["note"].startswith("not available in this build")
        assert c["rows"] == []


@pytest.mark.parametrize("args, message", [
    (["--shapes", "S99"], "--shapes"),
    (["--shape-custom", "1,2,3"], "--shape-custom"),
    (["--shape-custom", ""], "--shape-custom: an empty value"),  # was ": an empty value" (a hidden option)
    (["--shape-custom", "1,3,2,4,4,8,0"], "multiple of Hkv"),
    (["--shape-custom", "1,2,2,4,4,8,sideways"], "causal"),
    # The counts wrapped in int64 (undefined; 0 in a release build, so the shape passed the "too
    # big for this machine" check) and the run failed only after measuring the peaks.
    (["--shape-custom", "4294967296,4294967296,4294967296,1,1,1,0"], "--shape-custom: Q, K, V and O of"),
    (["--shape-custom", "4294967296,4294967296,1,1,1,1,0"], "than a 64-bit byte count can size"),
    (["--shapes", "all,S1"], "--shapes: 'all' stands alone"),  # said "unknown shape id 'all' ... (or all)"
    (["--shapes", "S1,"], "--shapes: item 2 of 'S1,' is empty"),  # accepted, silently
    (["--shapes", ",S1"], "--shapes: item 1 of ',S1' is empty"),
    (["--max-seconds", "0"], "--max-seconds: expected a positive number of seconds but got 0"),
    (["--runs", "0"], "--runs"),
    (["--impl", "fastest"], "--impl: expected one of auto, reference, flash, decode"),
    (["--json", "/nonexistent-dir/x.json"], "--json"),
])
def test_argument_errors(args, message):
    p = run(*args, check=False)
    assert p.returncode == 2
    assert p.stderr.startswith("attn: error:") and message in p.stderr
    assert "FMA peak" not in p.stdout  # rejected before measuring anything


@pytest.mark.parametrize("name, value, message", [
    ("ATTN_ISA", "avx1024", "ATTN_ISA: expected one of auto, avx512, avx2, portable (or its old name generic) "
                            "but got 'avx1024'"),
    ("ATTN_CPU_HIDE", "avx3", "ATTN_CPU_HIDE: expected a comma-separated list of"),
])
def test_a_misspelt_isa_variable_is_refused_before_the_peaks(name, value, message):
    """ATTN_ISA was first read at the first shape's kernel: a typo cost a minute of peaks first."""
    p = subprocess.run([ATTN, "bench", "--shapes", "S1", "--impl", "flash", "--no-torch"], capture_output=True,
                       text=True, timeout=60, env={**os.environ, name: value})
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert p.stderr.startswith("attn: error: " + message), p.stderr
    assert "measuring" not in p.stderr, p.stderr


def test_a_failing_json_write_names_the_option():
    """The path is checked before measuring, but a full disk shows only when the JSON is written:
    that error was `attn: error: /dev/full: write failed (…)`, naming no option."""
    p = run("--list", "--json", "/dev/full", check=False)
    assert p.returncode == 2
    assert p.stderr == "attn: error: --json: '/dev/full': write failed (No space left on device)\n"


@pytest.mark.parametrize("flag", ["--torch-script", "--python"])
def test_json_naming_a_file_the_torch_rows_read_is_refused(tmp_path, flag):
    """--json over --torch-script (or --python) replaced the script with the results, exit 0."""
    given = tmp_path / "given"
    given.write_text("print('kept')\n")
    p = run("--quick", "--shape-custom", "1,1,1,8,8,4,0", flag, str(given), "--json", str(given), check=False)
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert p.stderr == f"attn: error: --json: path '{given}' names the same file as the input {flag} ('{given}'), " \
                       "which it would replace\n", p.stderr
    assert given.read_text() == "print('kept')\n"
    assert "FMA peak" not in p.stdout  # refused before measuring anything
    assert sorted(os.listdir(tmp_path)) == ["given"]


def test_json_is_compared_with_the_python_that_path_runs(tmp_path):
    """A bare --python NAME runs the NAME that PATH gives the shell; --json was compared with a file
    NAME in the current directory instead: --json over the interpreter that runs was accepted
    (and replaced it), --json over an unrelated ./NAME was refused."""
    bin_dir, cwd = tmp_path / "bin", tmp_path / "work"
    bin_dir.mkdir()
    cwd.mkdir()
    interpreter = bin_dir / "fakepython"
    interpreter.write_text("#!/bin/sh\nexit 1\n")
    interpreter.chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}")

    def bench(json_path):
        return subprocess.run([ATTN, "bench", "--quick", "--impl", "reference", "--shape-custom", "1,1,1,8,8,4,0",
                               "--python", "fakepython", "--json", str(json_path)],
                              capture_output=True, text=True, timeout=240, cwd=cwd, env=env)

    p = bench(interpreter)
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert p.stderr == f"attn: error: --json: path '{interpreter}' names the same file as the input --python " \
                       f"('{interpreter}'), which it would replace\n", p.stderr
    assert interpreter.read_text() == "#!/bin/sh\nexit 1\n"
    # ./fakepython is not what runs: --json may replace it.
    (cwd / "fakepython").write_text("not the interpreter\n")
    p = bench("fakepython")
    assert p.returncode == 0, (p.returncode, p.stderr)
    with open(cwd / "fakepython") as f:
        assert "torch is not installed for fakepython" in json.load(f)["torch"]["note"]
    assert interpreter.read_text() == "#!/bin/sh\nexit 1\n"


def test_markdown_section_is_refreshed_not_duplicated(custom_run, tmp_path):
    _, _, json_path = custom_run
    md = tmp_path / "BENCHMARKS.md"
    md.write_text("# Benchmarks\n\nMethod text that must survive.\n")
    py = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
    refused = subprocess.run([py, MD_SCRIPT, str(json_path), str(md)], capture_output=True, text=True)
    assert refused.returncode != 0 and "--quick" in refused.stderr
    for _ in range(2):
        p = subprocess.run([py, MD_SCRIPT, str(json_path), str(md), "--section", "test run", "--allow-quick"],
                           capture_output=True, text=True)
        assert p.returncode == 0, p.stderr
    text = md.read_text()
    assert "Method text that must survive." in text
    assert text.count("<!-- attn-bench:begin test run -->") == 1
    assert text.count("<!-- attn-bench:end test run -->") == 1
    assert "--shape-custom" in text and "FMA peak" in text
    assert "| custom |" in text


def test_markdown_never_loses_hand_written_text(custom_run, tmp_path):
    """A begin marker without its end: the run appended a second section, and the next run's
    replacement swallowed everything between the orphan and the new end (hand-written analysis
    lost, exit 0). Unbalanced markers are refused now; the file keeps its mode and its link;
    bad inputs are one line, not a traceback (a hostile-use review)."""
    _, _, json_path = custom_run
    py = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable

    def script(*args):
        return subprocess.run([py, MD_SCRIPT, *map(str, args), "--allow-quick"], capture_output=True, text=True)

    md = tmp_path / "b.md"
    broken = "# B\n\n<!-- attn-bench:begin T -->\nold\n## Method\nHAND-WRITTEN ANALYSIS\n"
    md.write_text(broken)
    for _ in range(2):
        p = script(json_path, md, "--section", "T")
        assert p.returncode == 1 and "markers of section 'T' are unbalanced (1 begin, 0 end)" in p.stderr, p.stderr
        assert "Traceback" not in p.stderr
    assert md.read_text() == broken
    good = tmp_path / "good.md"
    good.write_text("# B\n")
    os.chmod(good, 0o640)
    os.symlink("good.md", tmp_path / "link.md")
    p = script(json_path, tmp_path / "link.md", "--section", "T")
    assert p.returncode == 0, p.stderr
    assert os.path.islink(tmp_path / "link.md") and "attn-bench:end T" in good.read_text()
    assert (os.stat(good).st_mode & 0o777) == 0o640
    bad = tmp_path / "bad.json"
    for content, fragment in (("[1, 2]", "expected schema attn-bench/1"), ("{", "not an attn bench JSON file"),
                              ('{"schema": "attn-bench/1", "config": {"quick": true, "threads": "2"}, "machine": {}, "cases": []}',
                               "config.threads must be a positive integer")):
        bad.write_text(content)
        p = script(bad, good)
        assert p.returncode == 1 and fragment in p.stderr and "Traceback" not in p.stderr, p.stderr
    for section in ("", "a -- b", "two\nlines"):
        p = script(json_path, good, "--section", section)
        assert p.returncode == 1 and "--section" in p.stderr and "Traceback" not in p.stderr, p.stderr
    assert sorted(os.listdir(tmp_path)) == ["b.md", "bad.json", "good.md", "link.md"]  # no temporary file left


def test_missing_torch_is_said_not_faked(tmp_path):
    out = tmp_path / "nt.json"
    p = run("--quick", "--impl", "reference", "--python", str(tmp_path / "no-such-python"),
            "--shape-custom", "1,1,1,8,8,4,0", "--json", str(out))
    with open(out) as f:
        d = json.load(f)
    # A --python that names no interpreter is said to be that (it was "torch is not installed").
    missing = "no-such-python is not a Python interpreter this machine can run (--python)"
    assert d["torch"]["version"] is None and missing in d["torch"]["note"]
    rows = {r["impl"]: r for r in d["cases"][0]["rows"]}
    assert rows["torch"]["status"] == "unavailable" and missing in rows["torch"]["note"]
    assert rows["torch"]["runs"] == 0 and rows["reference"]["speedup_vs_torch"] is None
    assert missing in p.stdout
    # A program that runs but cannot import torch (/bin/false fails the import): "not installed" still.
    out2 = tmp_path / "nt2.json"
    run("--quick", "--impl", "reference", "--python", "/bin/false", "--shape-custom", "1,1,1,8,8,4,0", "--json", str(out2))
    with open(out2) as f:
        assert "torch is not installed for /bin/false" in json.load(f)["torch"]["note"]


def test_training_step_variant_of_s1(tmp_path):
    # S1 forward+backward: attn's forward (with lse) + sdpa_backward per timed call, counted
    # as (1 + 2.5) x the forward FLOPs of bench-shapes.md; the reference is over its budget
    # here and must say so. Full S1 size (a few hundred ms per call on 2 cores).
    out = tmp_path / "s1.json"
    run("--quick", "--no-torch", "--impl", "flash,reference", "--shapes", "S1", "--json", str(out))
    with open(out) as f:
        d = json.load(f)
    steps = [c for c in d["cases"] if c["id"] == "S1" and c["variant"] == "forward+backward"]
    assert len(steps) == 1
    c = steps[0]
    assert c["status"] == "ok"
    fwd = 4 * 1 * 16 * 1024 * 1024 * 64
    assert c["flop"] == 3.5 * fwd
    rows = {r["impl"]: r for r in c["rows"]}
    fl = rows["flash"]
    assert fl["status"] == "ok", fl["note"]
    assert fl["kernel"].startswith("flash/") and "flash-backward/" in fl["kernel"]
    assert fl["flop"] == 3.5 * fwd
    assert close(fl["gflops"], 3.5 * fwd / fl["median_s"] / 1e9)
    assert rows["reference"]["status"] == "skipped" and "--reference-max-gflop" in rows["reference"]["note"]


def test_score_modifier_rows_are_ratios_to_their_plain_row(tmp_path):
    # S1 forward+backward has a "flash+softcap" row beside "flash" (issue 13's S1 target 1.2):
    # its ratio is this row's median over the plain row's, its min/min likewise, and the
    # report prints both with the target.
    out = tmp_path / "s1.json"
    p = run("--quick", "--no-torch", "--impl", "flash", "--shapes", "S1", "--json", str(out))
    with open(out) as f:
        d = json.load(f)
    c = next(c for c in d["cases"] if c["id"] == "S1" and c["variant"] == "forward+backward")
    rows = {r["impl"]: r for r in c["rows"]}
    plain, cap = rows["flash"], rows["flash+softcap"]
    assert cap["status"] == "ok", cap["note"]
    assert cap["ratio_to"] == "flash" and cap["ratio_target"] == 1.2
    assert close(cap["ratio_median"], cap["median_s"] / plain["median_s"])
    assert close(cap["ratio_min"], cap["min_s"] / plain["min_s"])
    assert "the flash row" in p.stdout and "target <= 1.20x" in p.stdout
    assert "ratio_to" not in plain
    # A row whose kernel computed in bf16 (…_bf16) is a share of the bf16 dot peak, not of the
    # float32 FMA peak (it read 128 %); the float32 rows keep the FMA peak.
    widest = d["ceilings"]["fma512_peak_gflops" if cpu_has_avx512() else "fma_peak_gflops"][1]["best"]
    bf16_peak = d["ceilings"]["bf16_dot_peak_gflops"][1]["best"]
    amx_peak = d["ceilings"]["amx_bf16_peak_gflops"][1]["best"]
    bf16_rows = 0
    for r in c["rows"]:
        if r["status"] != "ok" or r["flop"] <= 0:
            continue
        if r["kernel"].endswith("_amx_bf16"):  # on AMX tiles: a share of the AMX peak
            bf16_rows += 1
            assert close(r["pct_peak"], 100 * r["gflops"] / amx_peak), r
            assert r["pct_peak_avx2"] == 0 and "AMX bf16 peak" in r["note"], r
        elif r["kernel"].endswith("_bf16"):
            bf16_rows += 1
            assert close(r["pct_peak"], 100 * r["gflops"] / bf16_peak), r
            assert r["pct_peak_avx2"] == 0 and "bf16 dot peak" in r["note"], r
        else:
            assert close(r["pct_peak"], 100 * r["gflops"] / widest), r
    # S1's "flash, all bfloat16" training row computes in bf16 where the CPU can.
    overridden = os.environ.get("ATTN_ISA") or "avx512_bf16" in os.environ.get("ATTN_CPU_HIDE", "")
    if not overridden:
        assert bf16_rows == (1 if cpu_has_avx512() and cpu_has_flag("avx512_bf16") else 0), [r["kernel"] for r in c["rows"]]
    fwd = next(c for c in d["cases"] if c["id"] == "S1" and c["variant"] == "")
    assert [r["impl"] for r in fwd["rows"]] == ["flash", "torch"]  # S1 forward: no modifier rows


def test_only_bench_loads_openblas(tmp_path):
    # OpenBLAS starts its thread pool when it loads; only `attn bench`'s S6 comparison rows use
    # it, so they load it at run time and no other command maps it (LD_DEBUG=files lists every
    # object the dynamic loader opens, dlopen's included).
    import numpy as np
    x = np.random.default_rng(0).standard_normal((1, 1, 8, 4)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    env = dict(os.environ, LD_DEBUG="files")
    p = subprocess.run([ATTN, "sdpa", "--q", str(tmp_path / "x.npy"), "--k", str(tmp_path / "x.npy"), "--v",
                        str(tmp_path / "x.npy"), "--out", str(tmp_path / "o.npy")],
                       capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode == 0, p.stderr
    assert "libc.so.6" in p.stderr  # LD_DEBUG is honoured: the loader names what it opens
    assert "openblas" not in p.stderr.lower()
    assert os.path.exists(tmp_path / "o.npy")


def test_openblas_rows_run_where_openblas_loads(tmp_path):
    # The rows load OpenBLAS at run time and skip, saying why, where it cannot be loaded: where
    # it can (the build machine has it: find_package(BLAS)), a skip would be a broken loader.
    import ctypes
    try:
        ctypes.CDLL("libopenblas.so.0")
    except OSError as e:
        pytest.skip(f"libopenblas.so.0 cannot be loaded here: {e}")
    out = tmp_path / "s6.json"
    run("--shapes", "S6", "--quick", "--no-torch", "--threads", "1", "--json", str(out))
    rows = {r["impl"]: r for c in json.loads(out.read_text())["cases"] if c.get("variant") == "parts" for r in c["rows"]}
    for name in ("qkv_blas", "square_blas"):
        assert rows[name]["status"] == "ok", rows[name]
        assert rows[name]["median_s"] > 0


def test_scaling_pairs_the_one_thread_calls_with_the_rows_own(tmp_path):
    """--scaling: a harness-timed attn row alternates its calls with 1-thread ones (the note and
    one_thread_paired say so, the efficiency is T1 / (threads · T) of the two medians); the
    reference is not repeated; the decode steps (their own timing loop) take a later 1-thread pass."""
    out = tmp_path / "scaling.json"
    run("--quick", "--no-torch", "--threads", "2", "--scaling", "--impl", "flash,reference",
        "--shape-custom", "1,2,1,16,24,8:8,0", "--json", str(out))
    rows = {r["impl"]: r for c in json.load(open(out))["cases"] if c["id"] == "custom" for r in c["rows"]}
    fl = rows["flash"]
    assert fl["status"] == "ok", fl["note"]
    assert fl["one_thread_paired"] is True
    assert "calls alternated" in fl["note"], fl["note"]
    assert close(fl["scaling_efficiency"], fl["one_thread_median_ms"] / 1e3 / (2 * fl["median_s"]), rel=1e-6)
    assert "scaling_efficiency" not in rows["reference"] and "one_thread_paired" not in rows["reference"]

    out7 = tmp_path / "s7.json"
    run("--quick", "--no-torch", "--threads", "2", "--scaling", "--shapes", "S7", "--runs", "2", "--json", str(out7))
    decode = [r for c in json.load(open(out7))["cases"] if c["status"] == "ok" for r in c["rows"] if r["status"] == "ok"]
    assert decode
    for r in decode:
        assert r["one_thread_paired"] is False and "a later pass" in r["note"], r["note"]
        assert close(r["scaling_efficiency"], r["one_thread_median_ms"] / 1e3 / (2 * r["median_s"]), rel=1e-6)
