"""attn heatmap and attn demo's heatmap, from the outside.

PNGs are decoded with PIL, SVGs parsed with Python's XML parser and rendered with
rsvg-convert (librsvg). Cell positions come from `--verbose`; expected colours are viridis'
published endpoints #440154 (value 0) and #FDE725 (value 1), not the tool's own table.
"""
import os
import re
import shutil
import subprocess
import xml.etree.ElementTree as ET

import numpy as np
import pytest
from PIL import Image

ATTN = os.environ["ATTN_BIN"]
LOW = (0x44, 0x01, 0x54)    # viridis(0)
HIGH = (0xFD, 0xE7, 0x25)   # viridis(1)
TOKENS5 = ["一只", "蓝色", "怪兽", "走进", "森林"]


def run(*args, cwd=None):
    return subprocess.run([ATTN, *map(str, args)], capture_output=True, text=True, cwd=cwd, timeout=60)


def draw(tmp_path, w, out="w.png", *extra):
    path = tmp_path / "w.npy"
    np.save(path, w)
    r = run("heatmap", path, "--out", tmp_path / out, "--verbose", *extra)
    assert r.returncode == 0, r.stderr
    head = re.search(r": (\d+) x (\d+) px, (\d+) panel\(s\), blocks (\d+) x (\d+), vmax (\S+)", r.stderr)
    assert head, r.stderr
    panels = [dict(zip(("x", "y", "cw", "ch", "rows", "cols"), map(int, m)))
              for m in re.findall(r"panel \d+: x (\d+) y (\d+) cell (\d+) x (\d+) rows (\d+) cols (\d+)", r.stderr)]
    info = dict(width=int(head[1]), height=int(head[2]), block=(int(head[4]), int(head[5])), vmax=float(head[6]),
                panels=panels)
    assert len(panels) == int(head[3])
    return tmp_path / out, info


def near(a, b, tol=1):
    return all(abs(x - y) <= tol for x, y in zip(a[:3], b[:3]))


def is_grey(p):
    return p[0] == p[1] == p[2] and 100 < p[0] < 240


def cell_px(img, g, r, c, dx=2, dy=2):
    """A pixel near the top-left corner of a cell (clear of the value printed in its middle)."""
    return img.getpixel((g["x"] + c * g["cw"] + dx, g["y"] + r * g["ch"] + dy))[:3]


def identity(n, eps=1e-6):
    w = np.full((n, n), eps, np.float32)
    np.fill_diagonal(w, 1.0)
    return w


# ---------------------------------------------------------------------------- pictures

def test_png_decodes_to_the_reported_size_with_endpoint_colours(tmp_path):
    png, info = draw(tmp_path, identity(5), "w.png", "--tokens", ",".join(TOKENS5))
    img = Image.open(png)
    img.load()
    assert img.format == "PNG"
    assert img.size == (info["width"], info["height"])
    g = info["panels"][0]
    assert (g["rows"], g["cols"]) == (5, 5)
    img = img.convert("RGB")
    for r in range(5):
        for c in range(5):
            want = HIGH if r == c else LOW
            assert near(cell_px(img, g, r, c), want), (r, c, cell_px(img, g, r, c))



def test_weights_written_as_safetensors_are_drawn_by_name(tmp_path):
    # `attn sdpa --weights W.safetensors` writes tensor 'weights'; heatmap reads it by name,
    # as every tensor argument (it took only .npy: a review found it).
    r = np.random.default_rng(0)
    for n in "qkv":
        np.save(tmp_path / f"{n}.npy", r.standard_normal((1, 1, 5, 4)).astype(np.float32))
    res = run("sdpa", "--q", "q.npy", "--k", "k.npy", "--v", "v.npy", "--out", "o.npy", "--weights", "W.safetensors",
              cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    res = run("heatmap", "W.safetensors:weights", "--out", "s.png", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert Image.open(tmp_path / "s.png").size[0] > 0
    res = run("heatmap", "W.safetensors", "--out", "t.png", cwd=tmp_path)
    assert res.returncode == 2 and "name the tensor as 'W.safetensors:NAME'" in res.stderr, res.stderr
    assert not (tmp_path / "t.png").exists()


def test_a_very_long_title_is_shortened_not_an_error(tmp_path):
    # 3000 characters made the picture wider than cairo allows ("invalid value (typically too
    # big)"; a review found it): titles are cut with "…" as long tokens are.
    png, info = draw(tmp_path, identity(4), "t.png", "--title", "T" * 3000)
    assert Image.open(png).size == (info["width"], info["height"])
    assert info["width"] < 2000

def test_one_hot_column_others_masked_grey(tmp_path):
    w = np.zeros((2, 4, 6), np.float64)   # (H, Lq, Lk); head 1 looks only at key 3
    w[1, :, 3] = 1.0
    w[0, :, 0] = 1.0
    png, info = draw(tmp_path, w, "w.png", "--head", "1")
    img = Image.open(png).convert("RGB")
    g = info["panels"][0]
    for r in range(4):
        for c in range(6):
            p = cell_px(img, g, r, c)
            assert near(p, HIGH) if c == 3 else is_grey(p), (r, c, p)


def test_svg_is_well_formed_and_renders_at_the_png_size(tmp_path):
    w = identity(5)
    png, info_png = draw(tmp_path, w, "w.png", "--tokens", ",".join(TOKENS5))
    svg, info = draw(tmp_path, w, "w.svg", "--tokens", ",".join(TOKENS5))
    assert (info["width"], info["height"]) == (info_png["width"], info_png["height"])
    root = ET.parse(svg).getroot()
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    assert root.get("width") == f"{info['width']}px" and root.get("height") == f"{info['height']}px"
    rsvg = shutil.which("rsvg-convert")
    assert rsvg, "rsvg-convert (Debian librsvg2-bin) is a test dependency"
    rendered = tmp_path / "rendered.png"
    subprocess.run([rsvg, str(svg), "-o", str(rendered)], check=True, timeout=60)
    img = Image.open(rendered)
    assert img.size == (info["width"], info["height"])
    img = img.convert("RGB")
    g = info["panels"][0]
    for r in range(5):
        for c in range(5):
            assert near(cell_px(img, g, r, c), HIGH if r == c else LOW, tol=2), (r, c)


def test_all_heads_draws_one_panel_per_head_of_the_chosen_batch(tmp_path):
    B, H, L = 2, 3, 5
    w = np.full((B, H, L, L), 1e-7, np.float32)
    for h in range(H):
        w[0, h, :, 4] = 0.5          # batch 0: every head looks at key 4
        w[1, h, :, h] = 0.5          # batch 1: head h looks at key h
    _, info = draw(tmp_path, w, "w.png", "--all-heads", "--batch", 1)
    img = Image.open(tmp_path / "w.png").convert("RGB")
    assert len(info["panels"]) == H
    assert len({(g["x"], g["y"]) for g in info["panels"]}) == H
    for h, g in enumerate(info["panels"]):
        for c in range(L):
            assert near(cell_px(img, g, 2, c), HIGH if c == h else LOW), (h, c)


def test_batched_reads_a_3d_file_as_batch_entries(tmp_path):
    # `attn mha --weights` writes (B, Lq, Lk), averaged over heads: --batched draws batch entry b
    # (a 3-d file was read as (H, Lq, Lk): --batch 1 refused, --all-heads drew "heads").
    B, L = 3, 5
    w = np.full((B, L, L), 1e-7, np.float32)
    for b in range(B):
        w[b, :, b] = 0.5             # batch entry b looks at key b
    for b in range(B):
        _, info = draw(tmp_path, w, f"b{b}.png", "--batched", "--batch", b)
        img = Image.open(tmp_path / f"b{b}.png").convert("RGB")
        assert len(info["panels"]) == 1
        for c in range(L):
            assert near(cell_px(img, info["panels"][0], 2, c), HIGH if c == b else LOW), (b, c)


def test_mean_over_heads(tmp_path):
    H, L = 4, 5
    w = np.zeros((H, L, L), np.float32)
    for h in range(H):
        w[h, :, h] = 1.0             # the mean puts 1/4 on keys 0..3 and exactly 0 on key 4
    _, info = draw(tmp_path, w, "w.png", "--mean")
    assert info["vmax"] == pytest.approx(0.25)
    img = Image.open(tmp_path / "w.png").convert("RGB")
    g = info["panels"][0]
    for c in range(L):
        p = cell_px(img, g, 1, c)
        assert is_grey(p) if c == 4 else near(p, HIGH), (c, p)


def test_large_matrices_are_mean_pooled_and_say_so(tmp_path):
    L = 600   # > 256 → 3×3 blocks, 200 cells a side
    w = np.zeros((L, L), np.float32)
    w[0, 0] = 0.9                    # block (0,0): one 0.9 → mean 0.1
    w[3:6, 0:3] = 0.1                # block (1,0): mean 0.1, the same colour
    w[6:9, 6:9] = 0.9                # block (2,2): mean 0.9 = max → top colour
    _, info = draw(tmp_path, w)
    assert info["block"] == (3, 3)
    g = info["panels"][0]
    assert (g["rows"], g["cols"]) == (200, 200)
    img = Image.open(tmp_path / "w.png").convert("RGB")
    a, b = cell_px(img, g, 0, 0, 0, 0), cell_px(img, g, 1, 0, 0, 0)
    assert a == b and not is_grey(a)
    assert near(cell_px(img, g, 2, 2, 0, 0), HIGH)
    assert is_grey(cell_px(img, g, 50, 120, 0, 0))
    assert max(info["width"], info["height"]) < 1400


def test_tokens_file_allows_commas_and_shows_control_tokens(tmp_path):
    tf = tmp_path / "tokens.txt"
    tf.write_text("a,b\n\\n\nthe\r\n", encoding="utf-8")
    png, info = draw(tmp_path, identity(3), "w.png", "--tokens-file", tf)
    assert Image.open(png).size == (info["width"], info["height"])


@pytest.mark.parametrize("text, line", [("a\nb\n\nd\ne\n", 3), ("a\nb\nc\nd\ne\n\n", 6), ("\r\nb\nc\nd\ne", 1)])
def test_tokens_file_empty_line_is_an_error(tmp_path, text, line):
    # As an empty token of --tokens: an empty line was a blank label, and a second final
    # newline a sixth token.
    tf = tmp_path / "tokens.txt"
    tf.write_text(text, encoding="utf-8", newline="")
    assert f"--tokens-file: '{tf}': line {line} is empty" in error_case(tmp_path, W55, "--tokens-file", tf)


def test_cross_attention_with_query_tokens(tmp_path):
    w = np.full((2, 4), 0.25, np.float32)
    png, info = draw(tmp_path, w, "w.svg", "--tokens", "k0,k1,k2,k3", "--query-tokens", "一只,森林")
    g = info["panels"][0]
    assert (g["rows"], g["cols"]) == (2, 4)
    ET.parse(png)


def test_demo_draws_its_weights_next_to_the_printout(tmp_path):
    r = run("demo", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "Heatmap of A" in r.stdout and "attn-demo-heatmap.png" in r.stdout
    img = Image.open(tmp_path / "attn-demo-heatmap.png").convert("RGB")
    # A's first row is [1, 0, 0, 0, 0]: the first top-colour pixel in reading order is the
    # top-left corner of cell (0, 0) (the colour bar starts at the same height but further
    # right); its top edge and left edge, free of the printed value, give the cell's size.
    W, H = img.size
    px = img.load()
    x0, y0 = next((x, y) for y in range(H) for x in range(W) if near(px[x, y], HIGH, 0))
    x1 = x0
    while near(px[x1 + 1, y0], HIGH, 0):
        x1 += 1
    y1 = y0
    while near(px[x0, y1 + 1], HIGH, 0):
        y1 += 1
    cell = x1 - x0 + 1
    assert cell == y1 - y0 + 1 and cell >= 20
    for c in range(1, 5):
        assert is_grey(px[x0 + c * cell + 2, y0 + 2]), c
    below = px[x0 + 2, y0 + cell + 2]   # A[1, 0] = 0.43: a viridis colour, not masked
    assert not is_grey(below) and not near(below, HIGH, 10)


def test_demo_svg_and_bad_picture_paths(tmp_path):
    r = run("demo", "--heatmap", "a.svg", cwd=tmp_path)
    assert r.returncode == 0 and "./a.svg" in r.stdout
    assert ET.parse(tmp_path / "a.svg").getroot().tag == "{http://www.w3.org/2000/svg}svg"
    for bad, needle in (("x.gif", "--heatmap: expected a file name ending in .png or .svg"),
                        ("missing/x.png", "--heatmap: directory 'missing' does not exist")):
        r = run("demo", "--heatmap", bad, cwd=tmp_path)
        assert r.returncode == 2 and needle in r.stderr, r.stderr
        assert r.stdout == "", "a bad path must fail before the walk-through is printed"
    assert sorted(os.listdir(tmp_path)) == ["a.svg"]


# ---------------------------------------------------------------------------- errors

def error_case(tmp_path, w, *args, out="w.png"):
    """Runs a failing command in a fresh directory: exit 2, one error line, no file left."""
    d = tmp_path / "run"
    d.mkdir()
    if w is not None:
        np.save(d / "w.npy", w)
    before = sorted(os.listdir(d))
    r = run("heatmap", d / "w.npy", "--out", d / out, *args)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert r.stderr.startswith("attn: error: ")
    assert sorted(os.listdir(d)) == before, "a failed run left files behind"
    return r.stderr


W55 = identity(5)


@pytest.mark.parametrize("w, args, needle", [
    (np.ones(5, np.float32), [], "expected attention weights of shape (Lq, Lk), (H, Lq, Lk) or (B, H, Lq, Lk) but got (5,)"),
    (np.ones((1, 0, 5, 5), np.float32), [], "must not be empty"),
    (np.ones((5, 5), np.int32), [], "must be float16, bfloat16, float32 or float64 but the file holds int32"),
    (W55, ["--tokens", "a,b,c,d"], "--tokens: 4 tokens given but"),
    (W55, ["--tokens", "a,b,c,d"], "Lk = 5 keys (columns)"),
    (W55, ["--tokens", "a,,c,d,e"], "--tokens: token 2 is empty"),
    (W55, ["--query-tokens", "a,b,c,d,e,f"], "--query-tokens: 6 tokens given but"),
    (np.full((3, 7), 0.1, np.float32), ["--tokens", "a,b,c"], "give the query tokens with --query-tokens"),
    (np.ones((2, 5, 5), np.float32), ["--head", "2"], "--head: 2 is out of range"),
    (np.ones((2, 1, 5, 5), np.float32), ["--batch", "2"], "--batch: 2 is out of range"),
    (np.ones((2, 5, 5), np.float32), ["--batch", "1"], "a 3-d W of `attn mha --weights` is (B, Lq, Lk): add --batched"),
    (np.ones((2, 1, 5, 5), np.float32), ["--batched"], "--batched: only for 3-d weights"),
    (np.ones((1, 2, 5, 5), np.float32), ["--head", "-1"], "--head: -1 is out of range"),
    (np.array([[0.5, -0.5], [1.0, 0.0]], np.float32), [], "must be finite and >= 0, but element (0, 1) is -0.5"),
    (np.array([[0.5, np.nan], [1.0, 0.0]], np.float32), [], "element (0, 1) is nan"),
    (W55, ["--vmax", "0"], "--vmax: expected a number > 0 and < 1e300 but got 0"),
    (W55, ["--vmax", "1e300"], "--vmax: expected a number > 0 and < 1e300 but got 1e300"),  # as written
    (W55, ["--vmax", "-1e-10"], "but got -1e-10"),
    (W55, ["--head", "0", "--mean"], "excludes"),
    (np.full((257, 2, 2), 0.5, np.float32), ["--all-heads"],
     "--all-heads: at most 256 panels fit in one picture but"),
    # Checked before the mean: -1 and +1 averaged to a 0 drawn hatched as "masked".
    (np.array([[[-1., 1], [1, 1]], [[1., 1], [1, 1]]]), ["--mean"], "must be finite and >= 0, but element (0, 0, 0) is -1"),
    (None, [], "w.npy"),
])
def test_errors_are_clear_and_leave_no_file(tmp_path, w, args, needle):
    assert needle in error_case(tmp_path, w, *args)


def test_bad_output_names(tmp_path):
    assert "--out: expected a file name ending in .png or .svg but got" in error_case(tmp_path, W55, out="w.jpg")
    d = tmp_path / "nodir"
    np.save(tmp_path / "w.npy", W55)
    r = run("heatmap", tmp_path / "w.npy", "--out", d / "x.png")
    assert r.returncode == 2 and "does not exist or is not writable" in r.stderr
    assert not d.exists()


@pytest.mark.parametrize("flag", ["--tokens-file", "--query-tokens-file"])
def test_an_output_naming_a_tokens_file_is_refused(tmp_path, flag):
    """--out t.svg --tokens-file t.svg replaced the tokens with the picture, exit 0."""
    np.save(tmp_path / "w.npy", W55)
    tokens = tmp_path / "t.svg"
    tokens.write_text("a\nb\nc\nd\ne\n", encoding="utf-8")
    r = run("heatmap", tmp_path / "w.npy", flag, tokens, "--out", tokens)
    assert r.returncode == 2, r.stderr
    assert r.stderr == f"attn: error: --out: path '{tokens}' names the same file as the input {flag} ('{tokens}'), " \
                       "which it would replace\n"
    assert tokens.read_text(encoding="utf-8") == "a\nb\nc\nd\ne\n"
    assert sorted(os.listdir(tmp_path)) == ["t.svg", "w.npy"]


def test_failure_keeps_an_existing_picture(tmp_path):
    np.save(tmp_path / "w.npy", W55)
    out = tmp_path / "w.png"
    out.write_bytes(b"old picture")
    r = run("heatmap", tmp_path / "w.npy", "--out", out, "--tokens", "a,b")
    assert r.returncode == 2
    assert out.read_bytes() == b"old picture"


def test_single_query_row_is_pooled_along_keys_only_and_stays_visible(tmp_path):
    w = np.full((1, 1, 1, 2048), 1e-6, np.float32)   # one decoding step over a 2048-key cache
    w[..., 1000:1008] = 0.5                            # exactly key block 125 (8 keys per cell)
    _, info = draw(tmp_path, w)
    assert info["block"] == (1, 8)
    g = info["panels"][0]
    assert (g["rows"], g["cols"]) == (1, 256)
    assert g["ch"] >= 40, "a single row must not be drawn as a thin line"
    img = Image.open(tmp_path / "w.png").convert("RGB")
    for c in (0, 124, 125, 126, 255):
        assert near(cell_px(img, g, 0, c, 0, 2), HIGH if c == 125 else LOW), c


@pytest.mark.parametrize("w, args", [
    (np.full((3, 3), 5e-324), []),                                         # vmax / 5 underflows to 0
    (np.full((3, 3), 0.5), ["--vmax", "2e-323"]),                          # the same through --vmax
    (np.array([[np.finfo(float).max, 1.0], [0.5, np.finfo(float).max]]), []),  # vmax·(1 + 1e-9) = inf
])
def test_colour_bar_of_extreme_scales_is_drawn(tmp_path, w, args):
    # Both ran the tick loop for ever, growing memory (run() times out after 60 s).
    path, info = draw(tmp_path, w, "w.png", *args)
    assert Image.open(path).size == (info["width"], info["height"])


def test_very_long_token_is_shortened_not_drawn_across_the_picture(tmp_path):
    # A 700 000-character token overflowed Pango's int units: a 3352 px wide picture with the
    # label across the cells, no "…".
    w = identity(4)
    tokens = tmp_path / "t.txt"
    tokens.write_text("a\nb\nc\n" + "x" * 700000 + "\n")
    _, info = draw(tmp_path, w, "w.png", "--tokens-file", tokens)
    _, plain = draw(tmp_path, w, "p.png", "--tokens", "a,b,c,d")
    assert info["width"] < plain["width"] + 800, (info["width"], plain["width"])


def test_names_that_are_not_utf8(tmp_path):
    w = tmp_path / b"w\xff.npy".decode("utf-8", "surrogateescape")
    np.save(w, W55)
    r = run("heatmap", w, "--out", tmp_path / "a.png")  # the subtitle shows the name escaped
    assert r.returncode == 0, r.stderr
    r = subprocess.run([ATTN.encode(), b"heatmap", bytes(w), b"--out", bytes(tmp_path / "b.png"), b"--title", b"t\xff"],
                       capture_output=True, timeout=60)
    assert r.returncode == 2 and b"--title: expected UTF-8 text" in r.stderr, r.stderr
    assert not (tmp_path / "b.png").exists()


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_demo_whose_walkthrough_cannot_be_printed_draws_nothing(tmp_path):
    with open("/dev/full", "w") as full:
        r = subprocess.run([ATTN, "demo", "--heatmap", "d.png"], stdout=full, stderr=subprocess.PIPE, text=True,
                           cwd=tmp_path, timeout=60)
    assert r.returncode == 2 and "stdout: write failed" in r.stderr, r.stderr
    assert os.listdir(tmp_path) == []
