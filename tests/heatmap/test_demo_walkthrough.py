"""attn demo's printed walk-through, read as a learner reads it: every matrix's column labels
stand over their numbers, and each step follows from the printed steps before it by the
tutorial's formulas (S = Q·Kᵀ/√d_k, −inf above the diagonal, A = softmax(S), O = A·V),
recomputed here with NumPy from the printed, 3-decimal values."""
import os
import re
import subprocess
import unicodedata

import numpy as np

ATTN = os.environ["ATTN_BIN"]


def width(text):
    """Terminal columns: CJK characters take two."""
    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


def ends(line, pattern):
    """The terminal column just past each match of `pattern` in `line`."""
    return [width(line[:m.end()]) for m in re.finditer(pattern, line)]


def matrices(stdout):
    """{title: (header line, row lines, values)} of each printed matrix."""
    lines = stdout.splitlines()
    out = {}
    for n, line in enumerate(lines):
        m = re.match(r"(\S.*?)  shape \((\d+), (\d+)\)$", line)
        if not m:
            continue
        rows, cols = int(m[2]), int(m[3])
        header, body = lines[n + 1], lines[n + 2:n + 2 + rows]
        values = np.array([[float(x) for x in row.split()[1:]] for row in body])
        assert values.shape == (rows, cols), (m[1], body)
        out[m[1].split("  ")[0]] = (header, body, values)
    return out


def demo():
    r = subprocess.run([ATTN, "demo", "--no-heatmap"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return matrices(r.stdout)


def test_every_column_label_stands_over_its_numbers():
    printed = demo()
    assert len(printed) == 9
    for title, (header, body, values) in printed.items():
        labels = ends(header, r"\S+")
        assert len(labels) == values.shape[1], (title, header)
        for row in body:
            numbers = ends(row, r"-?(?:\d+\.\d+|inf)")
            assert numbers == labels, f"{title}: header {header!r} over row {row!r}"


def test_each_step_follows_from_the_printed_ones():
    p = demo()
    q, k, v = (p[f"{n} = X·W_{n}"][2] for n in "QKV")
    s, mask, masked, a, o = (p[t][2] for t in ("S = Q·Kᵀ/√d_k", "causal mask", "masked S", "A = softmax(masked S)",
                                               "O = A·V"))
    # 3-decimal inputs: each product term is off by at most ~(|q| + |k|)·5e-4
    assert np.abs(s - q @ k.T / np.sqrt(q.shape[1])).max() < 0.01
    future = np.triu(np.ones_like(s, dtype=bool), 1)
    assert np.array_equal(mask, (~future).astype(float))
    assert np.all(masked[future] == -np.inf) and np.abs(masked[~future] - s[~future]).max() <= 1e-3
    e = np.exp(masked - masked.max(axis=1, keepdims=True))
    assert np.abs(a - e / e.sum(axis=1, keepdims=True)).max() < 2e-3
    assert np.all(a[future] == 0) and np.abs(a.sum(axis=1) - 1).max() < 3e-3
    assert np.abs(o - a @ v).max() < 0.01
