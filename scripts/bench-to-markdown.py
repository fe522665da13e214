#!/usr/bin/python3
"""Writes the results of `attn bench --json FILE` into BENCHMARKS.md.

    bench-to-markdown.py RESULTS.json [BENCHMARKS.md] [--section NAME] [--allow-quick]

The section (default: "<CPU model>, <threads> threads") lies between two marker comments;
it is replaced when it exists and appended otherwise, so `make bench` refreshes its numbers
and the rest of the file (method, analysis) stays as written. Each section states the
machine, commit, date and exact command, the ceilings measured in the same run, every row,
and the targets of the issues checked against the measured numbers.
"""
import argparse
import json
import os
import re
import sys
import tempfile

# (shape id, variant, what is checked, check(case, row, cases) -> (value text, met?)); the impl is
# the fastest attn kernel of the case; `cases` maps (id, variant) to every case of the run, for
# targets that compare two cases. Features add their targets here with their bench entries.
MIB = 1024.0 * 1024.0


def cell(text):
    """Free text as one table cell: no column separator, no line break (None: empty)."""
    return "" if text is None else " ".join(str(text).replace("|", "/").split())


def _pct_peak(min_pct):
    def check(case, row, cases):
        text = "%.1f%% of peak" % row["pct_peak"]
        if row.get("pct_peak_cpu_adjusted") and row.get("cpu_share"):
            # On a shared machine the raw figure is depressed; the estimate says by how much.
            text += " (cpu share %.0f%%; est. %.1f%% with the CPUs free)" % (
                100 * row["cpu_share"], row["pct_peak_cpu_adjusted"])
        return text, row["pct_peak"] >= min_pct
    return check


def _speedup(min_x):
    def check(case, row, cases):
        s = row.get("speedup_vs_torch")
        if s is None:
            return "no torch row", None
        return "%.2fx torch" % s, s >= min_x
    return check


def _rss(case, row, cases):
    lim = case.get("rss_limit_bytes")
    if lim is None or row.get("peak_rss_bytes", -1) < 0:
        return "not measured", None
    return "%.0f MiB (limit %.0f MiB)" % (row["peak_rss_bytes"] / MIB, lim / MIB), row["peak_rss_bytes"] <= lim


def _rss_vs(ref_variant, max_ratio):
    """Peak RSS of this case's fastest attn row against the same shape's `ref_variant` case."""
    def check(case, row, cases):
        ref = cases.get((case["id"], ref_variant))
        ref_row = best_attn_row(ref) if ref is not None and ref["status"] == "ok" else None
        if ref_row is None or row.get("peak_rss_bytes", -1) < 0 or ref_row.get("peak_rss_bytes", -1) < 0:
            return "not measured", None
        ratio = row["peak_rss_bytes"] / ref_row["peak_rss_bytes"]
        return "%.0f MiB vs %.0f MiB = %.2fx" % (row["peak_rss_bytes"] / MIB, ref_row["peak_rss_bytes"] / MIB, ratio), \
            ratio <= max_ratio
    return check


TARGETS = [
    ("S2", "", "≥ 70% of the measured FMA peak", _pct_peak(70.0)),
    ("S3", "", "≥ 70% of the measured FMA peak", _pct_peak(70.0)),
    ("S1", "", "≥ 6x faster than torch hand-written", _speedup(6.0)),
    ("S2", "", "≥ 6x faster than torch hand-written", _speedup(6.0)),
    ("S3", "", "≥ 6x faster than torch hand-written", _speedup(6.0)),
    ("S4", "", "≥ 6x faster than torch hand-written", _speedup(6.0)),
    ("S8", "", "peak RSS ≤ 1.25 x bytes(Q,K,V,O) + 100 MiB", _rss),
    ("S8", "Q/out bfloat16, K/V bfloat16", "all-bf16 peak RSS ≤ 0.6 x the fp32 row's", _rss_vs("", 0.6)),
]


def fmt(x, spec, none="–"):
    return none if x is None else spec % x


def ceiling(c, unit):
    if not c.get("measured"):
        return "not measured (%s)" % c.get("note", "")
    text = "**%.1f %s** on %d thread%s (median of trials %.1f" % (
        c["best"], unit, c["threads"], "" if c["threads"] == 1 else "s", c["median"])
    if c.get("cpu_shares"):
        text += "; the trials got up to %.0f%% of the CPUs, est. %.1f with the CPUs alone" % (
            100 * min(1.0, max(c["cpu_shares"])), c.get("per_cpu_best") or 0.0)
    return text + ")"


def best_attn_row(case):
    rows = [r for r in case.get("rows", []) if r["status"] == "ok" and not r["impl"].startswith("torch")
            and r["impl"] != "reference" and r["runs"] > 0]
    return min(rows, key=lambda r: r["median_s"]) if rows else None


def section_body(d):
    m, b, cfg = d["machine"], d["build"], d["config"]
    out = []
    out.append("- **Date**: %s  " % d["date"])
    out.append("- **Commit**: `%s` (attn %s)  " % (b["commit"], b["attn_version"]))
    out.append("- **Command**: `%s`  " % d["command"])
    out.append("- **Machine**: %s — %d logical CPUs, %d cores; CPU features %s; %.1f GiB RAM  " % (
        m["cpu_model"], m["logical_cpus"], m["physical_cores"], m["isa"], m["mem_total_bytes"] / MIB / 1024))
    out.append("- **Build**: %s, %s, `%s`; ISA files `%s` (chosen at run time)%s  " % (
        b["compiler"], b["build_type"], b["cxx_flags"], b["isa_flags"], ", **sanitizers on**" if b["sanitized"] else ""))
    out.append("- **Threads**: %d; **runs**: 1 warm-up + up to %d timed calls per row (stopping after %g s), median and min%s  " % (
        cfg["threads"], cfg["runs"], cfg["max_seconds"], "; **--quick: not meaningful numbers**" if cfg["quick"] else ""))
    out.append("- **Load average** (1/5/15 min; other work on the machine): %s at the start, %s at the end  " % (
        m.get("loadavg_start", "?"), m.get("loadavg_end", "?")))
    t = d["torch"]
    out.append("- **PyTorch**: %s  " % ("torch %s, hand-written `softmax(q@k^T*scale + mask)@v`, same thread count" % t["version"]
                                        if t["version"] else t["note"]))
    fma, bw = d["ceilings"]["fma_peak_gflops"], d["ceilings"]["read_bandwidth_gbs"]
    out.append("- **FMA peak** (measured in this run, best of %d trials): %s; %s  " % (
        fma[1].get("repeats", 0), ceiling(fma[0], "GFLOP/s"), ceiling(fma[1], "GFLOP/s")))
    out.append("  %s  " % fma[1].get("method", ""))
    # The wider ceilings exist only on CPUs that have the ISA; "% peak" is of the widest FMA
    # peak measured (the ISA attn's kernels run on there), as `attn bench` computes it.
    for key, name in (("fma512_peak_gflops", "AVX-512 FMA peak"), ("bf16_dot_peak_gflops", "bf16 dot-product peak"),
                      ("amx_bf16_peak_gflops", "AMX bf16 peak")):
        wide = d["ceilings"].get(key)
        if wide and wide[1].get("measured"):
            out.append("- **%s** (measured in this run, best of %d trials): %s; %s  " % (
                name, wide[1].get("repeats", 0), ceiling(wide[0], "GFLOP/s"), ceiling(wide[1], "GFLOP/s")))
            out.append("  %s  " % wide[1].get("method", ""))
    out.append("- **Read bandwidth** (measured in this run, best of %d trials): %s; %s  " % (
        bw[1].get("repeats", 0), ceiling(bw[0], "GB/s"), ceiling(bw[1], "GB/s")))
    out.append("  %s" % bw[1].get("method", ""))
    out.append("")
    out.append("GFLOP/s = the formula's FLOP / median time (forward 4·B·H·Lq·Lk·D; causal: 2·(Dk+Dv) per visible pair, about half); "
               "%% peak = of the widest FMA peak on %d threads above (AVX-512 where measured), of the bf16 dot-product peak for a "
               "kernel *_bf16 (bf16 compute), of the AMX bf16 peak for a kernel *_amx_bf16; vs torch = torch median / this median (torch in float32 for every row); "
               "cpu %% = CPU time of the timed calls / (wall time × threads): well below 100 means other processes "
               "took the CPUs; adj %% peak = an estimate of %% peak had the CPUs been free: "
               "(GFLOP/s / cpu share) / (FMA peak / its trial's cpu share)." % cfg["threads"])
    out.append("")
    out.append("| id | shape | impl | kernel | runs | median ms | min ms | GFLOP/s | % peak | GB/s | % BW | peak RSS MiB | vs torch | cpu % | adj % peak | max abs diff vs ref | note |")
    out.append("|---|---|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|")
    for c in d["cases"]:
        cid = c["id"] + (" (%s)" % c["variant"] if c["variant"] else "")
        if c["status"] != "ok":
            out.append("| %s | %s | | | | | | | | | | | | | | | %s |" % (cid, c["shape"], cell(c["note"])))
            continue
        for n, r in enumerate(c["rows"]):
            # id and shape on the first row of each shape only
            first = (cid, c["shape"]) if n == 0 else ("", "")
            if r["status"] != "ok":
                out.append("| %s | %s | %s | | | | | | | | | | | | | | %s: %s |" % (
                    first + (r["impl"], r["status"], cell(r["note"]))))
                continue
            kernel = "" if r["impl"].startswith("torch") else r["kernel"]
            out.append("| %s | %s | %s | %s | %d | %.2f | %.2f | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
                first[0], first[1], r["impl"], kernel, r["runs"], r["median_s"] * 1e3, r["min_s"] * 1e3,
                fmt(r["gflops"] if r["flop"] > 0 else None, "%.1f"),
                fmt(r["pct_peak"] if r["flop"] > 0 and r["pct_peak"] > 0 else None, "%.1f"),
                fmt(r["gbs"] if r["bytes"] > 0 else None, "%.1f"),
                fmt(r["pct_bw"] if r["bytes"] > 0 and r["pct_bw"] > 0 else None, "%.0f"),
                fmt(r["peak_rss_bytes"] / MIB if r["peak_rss_bytes"] >= 0 else None, "%.0f"),
                fmt(r.get("speedup_vs_torch"), "%.2f"),
                fmt(100 * r["cpu_share"] if r.get("cpu_share") else None, "%.0f"),
                fmt(r.get("pct_peak_cpu_adjusted") or None, "%.1f"),
                fmt(r.get("max_abs_diff_vs_reference"), "%.1e"),
                cell(r["note"])))
    out.append("")
    lines = []
    cases = {(c["id"], c["variant"]): c for c in d["cases"]}
    for cid, variant, what, check in TARGETS:
        c = cases.get((cid, variant))
        if c is None:
            continue
        row = best_attn_row(c) if c["status"] == "ok" else None
        if row is None:
            lines.append("| %s | %s | no attn kernel measured | not measured |" % (cid, what))
            continue
        value, met = check(c, row, cases)
        lines.append("| %s | %s | %s: %s | %s |" % (cid, what, row["impl"], value,
                                                    "not measured" if met is None else ("met" if met else "**missed**")))
    if lines:
        out.append("Targets (checked on the fastest attn kernel of each shape, reference excluded; the verdict "
                   "uses the measured numbers, the CPU-share estimate is shown beside them for loaded runs):")
        out.append("")
        out.append("| id | target | measured | |")
        out.append("|---|---|---|---|")
        out.extend(lines)
        out.append("")
    return "\n".join(out)


class Refused(Exception):
    """A reason not to write, said as one line (never a traceback)."""


def load_results(path):
    try:
        with open(path, encoding="utf-8") as f:
            d = json.load(f)
    except OSError as e:
        raise Refused("%s: cannot read (%s)" % (path, e.strerror or e))
    except (UnicodeDecodeError, ValueError) as e:
        raise Refused("%s: not an attn bench JSON file (%s)" % (path, e))
    if not isinstance(d, dict) or d.get("schema") != "attn-bench/1":
        raise Refused("%s: expected schema attn-bench/1 but got %r" % (path, d.get("schema") if isinstance(d, dict) else type(d).__name__))
    for key, kind in (("config", dict), ("machine", dict), ("cases", list)):
        if not isinstance(d.get(key), kind):
            raise Refused("%s: '%s' must be a JSON %s" % (path, key, "object" if kind is dict else "array"))
    if not isinstance(d["config"].get("quick"), bool):
        raise Refused("%s: config.quick must be true or false" % path)
    threads = d["config"].get("threads")
    if not isinstance(threads, int) or isinstance(threads, bool) or threads < 1:
        raise Refused("%s: config.threads must be a positive integer but is %r" % (path, threads))
    return d


def checked_name(name, what):
    # The name goes into a heading and into two HTML comments: one line of printable text that
    # cannot end a comment ("--" would; HTML5 also ends one at "--!>").
    if not name.strip():
        raise Refused("%s is empty" % what)
    if "--" in name or any(not ch.isprintable() for ch in name):
        raise Refused("%s must be one line of printable text without '--' but is %r" % (what, name))
    return name


def write_atomically(path, text):
    """Replaces the file `path` names (through a symbolic link: the file it points to), keeping
    its permission bits; a failure leaves the old file and no temporary file."""
    target = os.path.realpath(path)
    mode = os.stat(target).st_mode & 0o7777 if os.path.exists(target) else None
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(target), prefix=".bench-md-")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, mode if mode is not None else 0o666 & ~current_umask())
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def current_umask():
    mask = os.umask(0)
    os.umask(mask)
    return mask


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results")
    ap.add_argument("markdown", nargs="?", default="BENCHMARKS.md")
    ap.add_argument("--section", help="section name (default: '<CPU model>, <threads> threads')")
    ap.add_argument("--allow-quick", action="store_true", help="accept a --quick run (for tests)")
    a = ap.parse_args()
    d = load_results(a.results)
    if d["config"]["quick"] and not a.allow_quick:
        raise Refused("%s comes from a --quick run, whose numbers mean nothing; not writing it "
                      "(--allow-quick to override)" % a.results)
    if a.section is not None:
        name = checked_name(a.section, "--section")
    else:
        model = d["machine"].get("cpu_model")
        if not isinstance(model, str) or not model.strip():
            raise Refused("%s: machine.cpu_model is missing or empty; give --section" % a.results)
        name = checked_name("%s, %d threads" % (model, d["config"]["threads"]),
                            "the default section name (from the CPU model; give --section)")
    begin, end = "<!-- attn-bench:begin %s -->" % name, "<!-- attn-bench:end %s -->" % name
    try:
        block = "%s\n## %s\n\n%s\n%s" % (begin, name, section_body(d), end)
    except (LookupError, TypeError, ValueError, AttributeError, ArithmeticError) as e:
        raise Refused("%s: a case or row lacks a field or has the wrong type (%s: %s)" % (a.results, type(e).__name__, e))
    try:
        with open(a.markdown, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        text = "# attn benchmarks\n"
    except (OSError, UnicodeDecodeError) as e:
        raise Refused("%s: cannot read (%s)" % (a.markdown, getattr(e, "strerror", None) or e))
    # Exactly one begin and one end, in that order, or none of either: anything else would make
    # the replacement swallow what lies between (hand-written text) or leave a stale copy.
    nb, ne = text.count(begin), text.count(end)
    if (nb, ne) == (1, 1) and text.index(begin) < text.index(end):
        text = text[:text.index(begin)] + block + text[text.index(end) + len(end):]
    elif (nb, ne) == (0, 0):
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    else:
        raise Refused("%s: the markers of section '%s' are unbalanced (%d begin, %d end%s); mend them by hand, "
                      "nothing was written" % (a.markdown, name, nb, ne, ", end before begin" if (nb, ne) == (1, 1) else ""))
    try:
        write_atomically(a.markdown, text)
    except (OSError, UnicodeEncodeError) as e:
        raise Refused("%s: cannot write (%s)" % (a.markdown, getattr(e, "strerror", None) or e))
    print("bench-to-markdown: section '%s' written to %s" % (name, a.markdown))


if __name__ == "__main__":
    try:
        main()
    except Refused as e:
        sys.exit("bench-to-markdown: %s" % e)
