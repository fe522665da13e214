"""The docs-snippet runner itself (tests/docs/snippets.py): it must fail, and say where.

Runs the runner on small Markdown files written here; only sh and python blocks, so no attn
install is needed (no --build)."""
import os
import subprocess
import sys

import pytest

RUNNER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "snippets.py")


def run_on(tmp_path, text, *extra):
    (tmp_path / "docs").mkdir(exist_ok=True)
    (tmp_path / "docs" / "page.md").write_text(text, encoding="utf-8")
    p = subprocess.run([sys.executable, RUNNER, "--root", str(tmp_path), *extra, "docs/page.md"],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)
    return p.returncode, p.stdout, p.stderr


def test_passing_blocks_pass(tmp_path):
    rc, out, err = run_on(tmp_path, "# t\n\n```sh\necho hi > x.txt\ncat x.txt\n```\n\n```python\nprint(1 + 1)\n```\n"
                                    "\n```text\nnot run\n```\n")
    assert rc == 0, err
    assert "2 passed, 0 failed" in out


def test_failing_sh_names_file_and_failing_line(tmp_path):
    # the failing command is on line 6 of the file
    rc, out, err = run_on(tmp_path, "# t\n\nsome text\n\n```sh\ntrue\nfalse\necho never\n```\n")
    # lines: 1 '# t', 2 '', 3 'some text', 4 '', 5 '```sh', 6 'true', 7 'false'
    assert rc == 1
    assert "docs/page.md:7: sh snippet (block at docs/page.md:5)" in err, err


def test_fixture_files_are_there(tmp_path):
    # The fixture the docs rely on: Q.npy etc. in the snippet's working directory.
    rc, out, err = run_on(tmp_path, "```python\nimport numpy as np\nassert np.load('Q.npy').shape[2] == 5\n```\n")
    assert rc == 0, err


def test_failing_python_names_the_line(tmp_path):
    rc, out, err = run_on(tmp_path, "x\n\n```python\na = 1\nraise ValueError(a + 2)\n```\n")
    assert rc == 1
    assert "docs/page.md:5: python snippet (block at docs/page.md:3) failed with exit status 1" in err, err
    assert "ValueError: 3" in err


def test_untagged_block_is_refused(tmp_path):
    rc, out, err = run_on(tmp_path, "x\n\n```\nattn sdpa --q Q.npy\n```\n")
    assert rc == 1
    assert "docs/page.md:3: fenced block without a language" in err, err


def test_skip_needs_a_reason_and_is_honoured(tmp_path):
    rc, out, err = run_on(tmp_path, "<!-- snippet: skip -->\n```sh\nfalse\n```\n")
    assert rc == 1 and "needs a reason" in err, err
    rc, out, err = run_on(tmp_path, "<!-- snippet: skip (needs 4 ranks) -->\n```sh\nfalse\n```\n")
    assert rc == 0, err
    assert "skip  docs/page.md:2 (sh): needs 4 ranks" in out


def test_unknown_marker_is_refused(tmp_path):
    rc, out, err = run_on(tmp_path, "<!-- snippet: skp (typo) -->\n```sh\ntrue\n```\n")
    assert rc == 1 and "unknown snippet marker" in err, err


@pytest.mark.parametrize("lang", ["cpp", "cmake"])
def test_compiled_blocks_need_a_build(tmp_path, lang):
    # Without --build there is no install to compile against: that is an error, not a pass.
    rc, out, err = run_on(tmp_path, f"```{lang}\nint x = 1;\n```\n")
    assert rc == 1, out


def test_launcher_runs_the_python_blocks_only(tmp_path):
    # The sanitized build passes a wrapper that preloads ASan (--launcher): python blocks must run
    # under it, sh blocks not (their attn CLI keeps LeakSanitizer, which the preload turns off).
    launcher = tmp_path / "launcher.sh"
    launcher.write_text('#!/bin/sh\nATTN_SNIPPET_LAUNCHED=1 exec "$@"\n')
    launcher.chmod(0o755)
    rc, out, err = run_on(tmp_path, "```python\nimport os\nassert os.environ.get('ATTN_SNIPPET_LAUNCHED') == '1'\n```\n\n"
                                    "```sh\ntest -z \"${ATTN_SNIPPET_LAUNCHED:-}\"\n```\n", "--launcher", str(launcher))
    assert rc == 0, err
    assert "2 passed, 0 failed" in out
