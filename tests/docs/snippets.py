#!/usr/bin/env python3
"""Docs are tests: every fenced block of the user-facing Markdown runs as written.

Blocks are found by their info string:
  sh / bash / shell   run with bash (set -euo pipefail) in a fresh directory holding the fixture
  python              run with the Python that has numpy and torch, the installed `attn` module importable
  cpp / c++           compiled against the installed prefix (find_package(attn)) and run in a fresh
                      directory; a block without `int main` is the body of main() (its #include lines
                      are hoisted); `#line` directives make compiler errors name the Markdown file
  cmake               the CMakeLists.txt lines of a consumer project `app` (main.cpp uses attn), built
                      against the installed prefix
  text, console, and other languages: shown, not run (diagrams, program output, pseudo-code)
A block without an info string is an error: say `text` for a diagram, or the language to have it run.

A block that deliberately does not run carries a marker, alone on the line just above its fence:
  <!-- snippet: skip (why) -->          not run (e.g. needs 4 MPI ranks or minutes)
  <!-- snippet: compile-only (why) -->  cpp: compiled and linked, not run

Every failure names the Markdown file and line of the block (and of the failing line where it
can). The fixture (small Q.npy, K.npy, V.npy, ...) is made by make_fixture() below; the docs say
how to make such files themselves.

  snippets.py --root SRC --build BUILD [--work DIR] [--python PY] [--launcher CMD] [--list] [FILE.md ...]
Exit status: 0 all passed, 1 a snippet failed, 2 usage error.
"""
import argparse
import dataclasses
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

RUN_LANGS = {"sh": "sh", "bash": "sh", "shell": "sh", "python": "python", "py": "python",
             "cpp": "cpp", "c++": "cpp", "cmake": "cmake"}
FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([^\s`]*)")
MARKER = re.compile(r"^\s*<!--\s*snippet:\s*(skip|compile-only)\s*(?:\((.+)\))?\s*-->\s*$")
TIMEOUT = 120  # seconds per snippet


@dataclasses.dataclass
class Snippet:
    path: str        # relative to the root
    line: int        # 1-based line of the first line of code (after the fence)
    lang: str        # sh, python, cpp, cmake, or the shown-only language
    code: str
    marker: str = ""  # skip / compile-only
    reason: str = ""

    @property
    def where(self):
        return f"{self.path}:{self.line - 1}"

    @property
    def ident(self):
        return re.sub(r"[^A-Za-z0-9]+", "_", f"{self.path}_{self.line}").strip("_")


class Failure(Exception):
    pass


def doc_files(root):
    """README.md, CHANGELOG.md, docs/**.md, examples/**/README.md, bench/**.md."""
    found = []
    for name in ("README.md", "CHANGELOG.md"):
        if os.path.exists(os.path.join(root, name)):
            found.append(name)
    for top, pick in (("docs", lambda f: f.endswith(".md")), ("bench", lambda f: f.endswith(".md")),
                      ("examples", lambda f: f == "README.md")):
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for f in sorted(files):
                if pick(f):
                    found.append(os.path.relpath(os.path.join(dirpath, f), root))
    return sorted(set(found))


def extract(root, rel):
    """All fenced blocks of one file; raises Failure for a block without an info string or a bad marker."""
    with open(os.path.join(root, rel), encoding="utf-8") as f:
        lines = f.read().split("\n")
    out, problems = [], []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, lang = m.group(1), m.group(2), m.group(3).lower()
        start = i
        body = []
        i += 1
        while i < len(lines) and not (lines[i].strip().startswith(fence[0] * len(fence))
                                      and lines[i].strip().strip(fence[0]) == ""):
            body.append(lines[i][len(indent):] if lines[i].startswith(indent) else lines[i])
            i += 1
        if i >= len(lines):
            problems.append(f"{rel}:{start + 1}: fenced block is never closed")
        i += 1
        marker = reason = ""
        if start > 0:
            mm = MARKER.match(lines[start - 1])
            if mm:
                marker, reason = mm.group(1), (mm.group(2) or "").strip()
                if not reason:
                    problems.append(f"{rel}:{start}: `snippet: {marker}` needs a reason in parentheses")
            elif "snippet:" in lines[start - 1]:
                problems.append(f"{rel}:{start}: unknown snippet marker {lines[start - 1].strip()!r} "
                                "(expected <!-- snippet: skip (why) --> or <!-- snippet: compile-only (why) -->)")
        if not lang:
            problems.append(f"{rel}:{start + 1}: fenced block without a language: write ```text for a diagram "
                            "or output, or ```sh / ```python / ```cpp / ```cmake to have it run")
        kind = RUN_LANGS.get(lang, lang)
        if marker == "compile-only" and kind != "cpp":
            problems.append(f"{rel}:{start}: `snippet: compile-only` is for cpp blocks, this one is {lang or 'untagged'}")
        out.append(Snippet(rel, start + 2, kind, "\n".join(body) + "\n", marker, reason))
    if problems:
        raise Failure("\n".join(problems))
    return out


def make_fixture(directory, python):
    """The inputs the docs' commands start from: Q.npy, K.npy, V.npy of (B, H, L, D) = (2, 2, 5, 8),
    as the README's CLI section makes them (five tokens: the heatmap page labels five)."""
    os.makedirs(directory, exist_ok=True)
    script = r"""
import numpy as np
r = np.random.default_rng(20)
for name in ("Q", "K", "V"):
    np.save(name + ".npy", r.standard_normal((2, 2, 5, 8)).astype(np.float32))
"""
    subprocess.run([python, "-c", script], cwd=directory, check=True)


def fresh_dir(work, snip, fixture):
    d = os.path.join(work, "run", snip.ident)
    shutil.rmtree(d, ignore_errors=True)
    shutil.copytree(fixture, d)
    return d


def run(cmd, cwd, env, timeout=TIMEOUT):
    try:
        p = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           timeout=timeout, stdin=subprocess.DEVNULL)
        return p.returncode, p.stdout.decode("utf-8", "replace")
    except subprocess.TimeoutExpired as e:
        return None, (e.stdout or b"").decode("utf-8", "replace") + f"\n(timed out after {timeout} s)"


def tail(text, n=40):
    lines = text.rstrip().split("\n")
    return "\n".join(("    " + l) for l in lines[-n:])


def run_sh(snip, work, fixture, env):
    d = fresh_dir(work, snip, fixture)
    # The ERR trap says which line of the block failed, as a line of the Markdown file.
    script = (f"set -euo pipefail\ntrap 'echo \"@@snippet-line $(( LINENO - 4 + {snip.line} ))\" >&2' ERR\n"
              f"cd {d}\n" + snip.code)
    path = os.path.join(work, "run", snip.ident + ".sh")
    with open(path, "w") as f:
        f.write(script)
    rc, out = run(["bash", path], d, env)
    if rc != 0:
        m = re.findall(r"@@snippet-line (\d+)", out)
        where = f"{snip.path}:{m[-1]}" if m else snip.where
        raise Failure(f"{where}: sh snippet (block at {snip.where}) failed with exit status {rc}:\n{tail(out)}")


def run_python(snip, work, fixture, env, python, launcher):
    d = fresh_dir(work, snip, fixture)
    path = os.path.join(work, "run", snip.ident + ".py")
    with open(path, "w") as f:
        f.write(snip.code)
    rc, out = run(launcher + [python, path], d, env)
    if rc != 0:
        m = re.findall(r'File "' + re.escape(path) + r'", line (\d+)', out)
        where = f"{snip.path}:{int(m[-1]) + snip.line - 1}" if m else snip.where
        out = out.replace(path, snip.path)
        raise Failure(f"{where}: python snippet (block at {snip.where}) failed with exit status {rc}:\n{tail(out)}")


def cpp_source(snip, root):
    """A whole program: as written when it has main(), else the block is main()'s body."""
    doc = os.path.join(root, snip.path)
    if re.search(r"\bint\s+main\s*\(", snip.code):
        return f'#line {snip.line} "{doc}"\n' + snip.code
    includes, body, first_body = [], [], None
    for n, l in enumerate(snip.code.split("\n")):
        if l.startswith("#include"):
            includes.append(f'#line {snip.line + n} "{doc}"\n{l}')
        else:
            if first_body is None:
                first_body = n
            body.append(l)
    return ("#include <attn/attn.hpp>\n#include <cstdio>\n" + "\n".join(includes) + "\n"
            "int main() {\n  try {\n"
            f'#line {snip.line + (first_body or 0)} "{doc}"\n' + "\n".join(body) + "\n"
            '#line 1 "snippet-wrapper"\n'
            "  } catch (const attn::Error& e) {\n"
            '    std::fprintf(stderr, "attn::Error: %s\\n", e.what());\n    return 1;\n  }\n  return 0;\n}\n')


def cmake_env(env):
    e = dict(env)
    e.pop("MAKEFLAGS", None)
    return e


def build_cpp(snips, work, root, prefix, env, generator):
    """One consumer project with one executable per block; returns {ident: exe} of those that built."""
    proj = os.path.join(work, "cpp")
    shutil.rmtree(proj, ignore_errors=True)
    os.makedirs(proj)
    lines = ["cmake_minimum_required(VERSION 3.20)", "project(doc_snippets LANGUAGES CXX)",
             "find_package(attn REQUIRED CONFIG)"]
    for s in snips:
        with open(os.path.join(proj, s.ident + ".cpp"), "w") as f:
            f.write(cpp_source(s, root))
        libs = ["attn::attn"]
        if "attn/heatmap.hpp" in s.code:
            libs.append("attn::viz")
        if "attn/ring.hpp" in s.code:
            libs.append("attn::dist")
        lines += [f"add_executable({s.ident} {s.ident}.cpp)", f"target_link_libraries({s.ident} PRIVATE {' '.join(libs)})"]
    with open(os.path.join(proj, "CMakeLists.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    b = os.path.join(proj, "build")
    rc, out = run(["cmake", "-S", proj, "-B", b, "-G", generator, "-DCMAKE_BUILD_TYPE=Release",
                   f"-DCMAKE_PREFIX_PATH={prefix}", "-DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF"], proj, cmake_env(env), 300)
    if rc != 0:
        raise Failure(f"configuring the C++ snippets against the installed attn failed:\n{tail(out)}")
    jobs = str(max(1, min(2, os.cpu_count() or 1)))
    rc, out = run(["cmake", "--build", b, "-j", jobs, "--", "-k", "0"] if generator == "Ninja"
                  else ["cmake", "--build", b, "-j", jobs, "--", "-k"], proj, cmake_env(env), 900)
    built, failures = {}, []
    for s in snips:
        exe = os.path.join(b, s.ident)
        if os.path.exists(exe):
            built[s.ident] = exe
        else:
            errs = [l for l in out.split("\n") if s.path in l and ("error" in l or "undefined reference" in l)]
            failures.append(f"{s.where}: cpp snippet does not compile or link against the installed attn:\n"
                            + tail("\n".join(errs) if errs else out, 25))
    return built, failures


def run_cmake_block(snip, work, prefix, env, generator):
    proj = os.path.join(work, "cmake", snip.ident)
    shutil.rmtree(proj, ignore_errors=True)
    os.makedirs(proj)
    with open(os.path.join(proj, "main.cpp"), "w") as f:
        f.write('#include <attn/version.hpp>\n#include <cstdio>\nint main() { std::printf("%s\\n", attn::kVersion); }\n')
    with open(os.path.join(proj, "CMakeLists.txt"), "w") as f:
        f.write("cmake_minimum_required(VERSION 3.20)\nproject(app LANGUAGES CXX)\nadd_executable(app main.cpp)\n"
                + snip.code)
    b = os.path.join(proj, "build")
    for cmd in (["cmake", "-S", proj, "-B", b, "-G", generator, f"-DCMAKE_PREFIX_PATH={prefix}",
                 "-DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF"], ["cmake", "--build", b], [os.path.join(b, "app")]):
        rc, out = run(cmd, proj, cmake_env(env), 300)
        if rc != 0:
            raise Failure(f"{snip.where}: cmake snippet failed at `{' '.join(cmd[:2])}`:\n{tail(out)}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", required=True, help="attn's source tree")
    ap.add_argument("--build", help="attn's build tree (installed into a temporary prefix)")
    ap.add_argument("--work", help="scratch directory (default: a temporary one, removed)")
    ap.add_argument("--python", default="/usr/bin/python3")
    # The sanitized build's module cannot load into a plain interpreter: ctest passes the
    # preloading wrapper (tests/CMakeLists.txt, ATTN_PYTHON_LAUNCHER). Only the python blocks get
    # it: sh blocks start no Python that imports attn, and their CLI keeps LeakSanitizer.
    ap.add_argument("--launcher", help="command that runs the python blocks' interpreter (it takes the command as arguments)")
    ap.add_argument("--generator", default="Ninja" if shutil.which("ninja") else "Unix Makefiles")
    ap.add_argument("--list", action="store_true", help="list the blocks and how each is tested, run nothing")
    ap.add_argument("files", nargs="*", help="Markdown files relative to --root (default: the docs)")
    a = ap.parse_args()

    files = a.files or doc_files(a.root)
    snips, problems = [], []
    for rel in files:
        try:
            snips += extract(a.root, rel)
        except Failure as e:
            problems.append(str(e))
    if a.list:
        for s in snips:
            how = {"sh": "run (bash)", "python": "run (python)", "cpp": "compiled + run", "cmake": "consumer build"}
            what = f"{s.marker} ({s.reason})" if s.marker == "skip" else how.get(s.lang, "shown only")
            if s.marker == "compile-only":
                what = f"compiled only ({s.reason})"
            print(f"{s.where}\t{s.lang}\t{what}")
        if problems:
            print("\n".join(problems), file=sys.stderr)
        return 1 if problems else 0
    if problems:
        print("\n".join(problems), file=sys.stderr)
        return 1

    runnable = [s for s in snips if s.lang in ("sh", "python", "cpp", "cmake") and s.marker != "skip"]
    if not runnable:
        for s in snips:
            if s.marker == "skip":
                print(f"skip  {s.where} ({s.lang}): {s.reason}")
        print("0 passed, 0 failed")
        return 0
    if not a.build and any(s.lang in ("cpp", "cmake") for s in runnable):
        print("cpp and cmake blocks are built against an install of attn: give --build", file=sys.stderr)
        return 1
    work = a.work or tempfile.mkdtemp(prefix="attn-docs-")
    os.makedirs(os.path.join(work, "run"), exist_ok=True)
    env = dict(os.environ)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    # A C++ block that uses MPI runs as a one-rank job (no mpirun); OpenMPI wants these as root.
    # Shell blocks do not get them: a doc that calls mpirun says what root needs.
    cpp_env = dict(env, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    prefix = os.path.join(work, "prefix")
    failures, passed = [], 0
    try:
        if a.build:
            rc, out = run(["cmake", "--install", a.build, "--prefix", prefix], work, cmake_env(env), 300)
            if rc != 0:
                raise Failure(f"cmake --install {a.build} failed:\n{tail(out)}")
            env["PATH"] = os.path.join(prefix, "bin") + os.pathsep + env.get("PATH", "")
            # The installed package: the directory that holds attn/__init__.py.
            pydirs = [dp for dp, dn, fn in os.walk(prefix)
                      if "attn" in dn and os.path.isfile(os.path.join(dp, "attn", "__init__.py"))]
            env["PYTHONPATH"] = os.pathsep.join(pydirs + [env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        fixture = os.path.join(work, "fixture")
        make_fixture(fixture, a.python)

        # A build without MPI installs no attn/ring.hpp and its `attn ring` only says so: the
        # ring snippets are then skipped, saying why, rather than failed.
        if a.build and not os.path.exists(os.path.join(prefix, "include", "attn", "ring.hpp")):
            for sn in runnable:
                if "mpirun" in sn.code or "attn/ring.hpp" in sn.code:
                    sn.marker, sn.reason = "skip", "this attn was built without MPI (ATTN_WITH_MPI=OFF)"
            runnable = [sn for sn in runnable if sn.marker != "skip"]

        cpp = [s for s in runnable if s.lang == "cpp"]
        built = {}
        if cpp:
            built, errs = build_cpp(cpp, work, a.root, prefix, env, a.generator)
            failures += errs
        for s in runnable:
            t0 = time.monotonic()
            try:
                if s.lang == "sh":
                    run_sh(s, work, fixture, env)
                elif s.lang == "python":
                    run_python(s, work, fixture, env, a.python, [a.launcher] if a.launcher else [])
                elif s.lang == "cmake":
                    run_cmake_block(s, work, prefix, env, a.generator)
                elif s.lang == "cpp":
                    if s.ident not in built:
                        continue  # its compile error is already in failures
                    if s.marker != "compile-only":
                        d = fresh_dir(work, s, fixture)
                        rc, out = run([built[s.ident]], d, dict(cpp_env, PATH=env["PATH"]))
                        if rc != 0:
                            raise Failure(f"{s.where}: cpp snippet ran but exited with status {rc}:\n{tail(out)}")
                passed += 1
                print(f"ok    {s.where} ({s.lang}{', ' + s.marker if s.marker else ''}, {time.monotonic() - t0:.1f} s)")
            except Failure as e:
                failures.append(str(e))
        for s in snips:
            if s.marker == "skip":
                print(f"skip  {s.where} ({s.lang}): {s.reason}")
    except Failure as e:
        failures.append(str(e))
    finally:
        if not a.work:
            shutil.rmtree(work, ignore_errors=True)
    for f in failures:
        print("FAIL  " + f, file=sys.stderr)
    skipped = sum(1 for s in snips if s.marker == "skip")
    print(f"{passed} passed, {len(failures)} failed, {skipped} skipped")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
