# softcap=, alibi_slopes=, sinks= in Python (forward with every kernel, backward with dsinks)
# against torch 1.13 autograd of the textbook formula in float64 (written here from the issue's
# definition, not from attn's code):
#   s = scale·q·kᵀ;  s = c·tanh(s/c);  s −= m_h·|d_b(i) − j| (d_b bottom-right, or query_offset);
#   masked → −inf;  p = softmax over [s, σ_h] without σ's column;  out = p·v.
import numpy as np
import pytest
import torch

import attn
from reference import attn_cli, close, visible


def textbook(q, k, v, keep, softcap=None, slopes=None, sinks=None, diag=None):
    """Returns out, lse and the float64 leaf tensors (q, k, v, sinks) for autograd."""
    q, k, v = (torch.tensor(np.asarray(x, np.float64), requires_grad=True) for x in (q, k, v))
    sk = None if sinks is None else torch.tensor(np.asarray(sinks, np.float64), requires_grad=True)
    group = q.shape[1] // k.shape[1]
    kk, vv = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    s = q @ kk.transpose(-1, -2) / np.sqrt(q.shape[-1])
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    if slopes is not None:
        m = torch.tensor(np.broadcast_to(np.asarray(slopes, np.float64), (q.shape[0], q.shape[1])).copy())
        dist = torch.tensor(np.abs(diag[:, None, :, None] - np.arange(k.shape[2])[None, None, None, :]), dtype=torch.float64)
        s = s - m[:, :, None, None] * dist
    s = s.masked_fill(~torch.from_numpy(np.array(keep)), float("-inf"))
    if sk is not None:
        col = sk[None, :, None, None].expand(s.shape[0], s.shape[1], s.shape[2], 1)
        full = torch.cat([s, col], dim=-1)
        lse = torch.logsumexp(full, dim=-1)
        p = torch.exp(s - lse[..., None])
    else:
        lse = torch.logsumexp(s, dim=-1)
        p = torch.nan_to_num(torch.exp(s - lse[..., None]), nan=0.0)
    return p @ vv, lse, (q, k, v, sk)


def random_case(seed):
    rng = np.random.default_rng(500 + seed)
    b, hkv = int(rng.integers(1, 3)), int(rng.integers(1, 3))
    hq = hkv * int(rng.choice([1, 2]))
    lq = int(rng.choice([1, 3, 16, 40, 70]))
    lk = int(rng.choice([1, 9, 64, 90]))
    d = int(rng.choice([8, 16, 32]))
    q = rng.standard_normal((b, hq, lq, d)).astype(np.float32) * 2
    k = rng.standard_normal((b, hkv, lk, d)).astype(np.float32) * 2
    v = rng.standard_normal((b, hkv, lk, d)).astype(np.float32)
    kw, vis = {}, {}
    kl = None
    if rng.random() < 0.4:
        kl = rng.integers(0, lk + 1, size=b).astype(np.int64)
        kw["key_lengths"] = vis["key_lengths"] = kl
    r = rng.random()
    if r < 0.3:
        kw["is_causal"] = True
        kw["causal_alignment"] = vis["causal"] = str(rng.choice(["top-left", "bottom-right"]))
    elif r < 0.5:
        w = (int(rng.integers(0, 10)), int(rng.integers(-1, 4)))
        kw["window"] = vis["window"] = w
        kw["window_alignment"] = vis["window_alignment"] = "bottom-right"
    qo = None
    if rng.random() < 0.2:
        qo = int(rng.integers(-2, 5))
        kw["query_offset"] = vis["query_offset"] = qo
        kw.setdefault("is_causal", True)
        vis.setdefault("causal", "top-left")
    keep = visible(b, lq, lk, **vis)
    bool_mask = None
    if rng.random() < 0.3:
        bool_mask = rng.random((b, 1, lq, lk)) < 0.7
        kw["attn_mask"] = bool_mask
        keep = keep & bool_mask
    n = np.full(b, lk) if kl is None else kl
    diag = np.arange(lq)[None, :] + (np.full((b, 1), qo) if qo is not None else (n - lq)[:, None])
    mods = int(rng.integers(1, 8))
    mk, tk = {}, {"diag": diag}
    if mods & 1:
        mk["softcap"] = tk["softcap"] = float(rng.choice([0.8, 5.0, 30.0]))
    if mods & 2:
        if rng.random() < 0.5:
            mk["alibi_slopes"] = True
            tk["slopes"] = attn.alibi_slopes(hq)
        else:
            tk["slopes"] = mk["alibi_slopes"] = rng.uniform(0, 0.5, size=(b, hq)).astype(np.float32)
    if mods & 4:
        tk["sinks"] = mk["sinks"] = (rng.standard_normal(hq) * 2).astype(np.float32)
    return (q, k, v), keep, kw, mk, tk


@pytest.mark.parametrize("seed", range(40))
@pytest.mark.parametrize("impl", ["auto", "reference"])
def test_forward_and_gradients_match_torch_autograd(seed, impl):
    (q, k, v), keep, kw, mk, tk = random_case(seed)
    out_t, lse_t, leaves = textbook(q, k, v, keep, **tk)
    out, lse = attn.sdpa(q, k, v, **kw, **mk, return_lse=True, impl=impl)
    close(out, out_t.detach().numpy())
    close(lse, lse_t.detach().numpy())

    g = np.random.default_rng(seed).standard_normal(out.shape).astype(np.float32)
    (out_t * torch.from_numpy(g.astype(np.float64))).sum().backward()
    grads = attn.sdpa_backward(q, k, v, out, lse, g, **kw, **mk, impl="auto" if impl == "auto" else "reference")
    assert len(grads) == (4 if "sinks" in mk else 3)
    scale = max(float(np.abs(t.grad.numpy()).max()) for t in leaves if t is not None) + 1e-30
    for got, leaf in zip(grads, leaves):
        # fp32 gradients: the budget of tests/grad (2e-5 of the largest gradient)
        close(np.asarray(got) / scale, leaf.grad.numpy() / scale, atol=2e-5, rtol=0)


def test_sink_takes_all_mass_of_an_empty_row():
    q = np.ones((1, 2, 3, 8), np.float32)
    k = np.ones((1, 2, 4, 8), np.float32)
    v = np.ones((1, 2, 4, 8), np.float32)
    sinks = np.array([0.5, -1.0], np.float32)
    for impl in ("auto", "reference", "flash"):
        out, lse = attn.sdpa(q, k, v, key_lengths=np.array([0]), sinks=sinks, return_lse=True, impl=impl)
        assert np.all(out == 0), impl
        assert np.array_equal(lse, np.broadcast_to(sinks[None, :, None], (1, 2, 3))), impl


def test_bad_modifiers_are_value_errors():
    q = np.ones((1, 2, 3, 8), np.float32)
    with pytest.raises(Exception, match="softcap: must be 0 \\(off\\) or a finite float32"):
        attn.sdpa(q, q, q, softcap=-2.0)
    with pytest.raises(Exception, match="alibi_slopes: shape must be"):
        attn.sdpa(q, q, q, alibi_slopes=np.ones(3, np.float32))
    with pytest.raises(TypeError, match="sinks: dtype must be float32 but got int64"):
        attn.sdpa(q, q, q, sinks=np.ones(2, np.int64))


def test_slopes_and_sinks_as_lists_or_float64_are_rounded_to_float32():
    # alibi_slopes=[0.5] * 4 (a list: float64) was "TypeError: dtype must be float32" while
    # MultiheadAttention(alibi_slopes=list) and attn.torch took it: every entry point now rounds a
    # floating parameter vector to float32 once (a review found it).
    rng = np.random.default_rng(3)
    q = rng.standard_normal((2, 4, 5, 8)).astype(np.float32)
    slopes, sinks = [0.1, 0.5, 1 / 3, 2.0], [0.25, -1.0, 0.7, 2.0]  # 0.1, 1/3, 0.7: rounded
    want = attn.sdpa(q, q, q, alibi_slopes=np.array(slopes, np.float32), sinks=np.array(sinks, np.float32))
    for given_slopes, given_sinks in ((slopes, sinks), (np.array(slopes), np.array(sinks)),
                                      (np.array([slopes, slopes]), np.array(sinks, np.float64)[::-1][::-1])):
        got = attn.sdpa(q, q, q, alibi_slopes=given_slopes, sinks=given_sinks)
        np.testing.assert_array_equal(got, want)
    # A float16 vector is widened exactly.
    half = np.array([0.5, 0.25, 1.0, 2.0], np.float16)
    np.testing.assert_array_equal(attn.sdpa(q, q, q, sinks=half), attn.sdpa(q, q, q, sinks=half.astype(np.float32)))


# float32 rounds to nearest even: the largest finite float32 is 2^128 - 2^104, and a value from
# the midpoint to 2^128, 2^128 - 2^103, rounds to inf (the tie goes to the even 2^128).
F32_TO_INF = 2.0**128 - 2.0**103


def test_a_float64_parameter_beyond_float32_is_named_as_given():
    # Rounded to inf, it was refused as "alibi_slopes: values must be finite but entry 2 is inf":
    # a value the caller never gave. Every entry point that rounds slopes or sinks names it.
    q = np.zeros((2, 4, 3, 8), np.float32)
    packed, cu = np.zeros((6, 4, 8), np.float32), np.array([0, 3, 6], np.int32)
    fits = "does not fit float32 (it rounds to {}; float32's largest magnitude is 3.4028235e+38)"
    slopes = [0.5, 0.25, 1e300, 0.125]
    calls = [
        (lambda: attn.sdpa(q, q, q, alibi_slopes=slopes), "alibi_slopes[2] = 1e+300 " + fits.format("inf")),
        (lambda: attn.sdpa(q, q, q, sinks=[0.0, 0.0, -1e300, 0.0]), "sinks[2] = -1e+300 " + fits.format("-inf")),
        (lambda: attn.sdpa(q, q, q, alibi_slopes=[[0.5] * 4, [0.5, 0.5, 0.5, 1e39]]),
         "alibi_slopes[1, 3] = 1e+39 " + fits.format("inf")),
        (lambda: attn.sdpa_varlen(packed, packed, packed, cu, cu, alibi_slopes=slopes),
         "alibi_slopes[2] = 1e+300 " + fits.format("inf")),
        (lambda: attn.MultiheadAttention(8, 4, alibi_slopes=slopes), "alibi_slopes[2] = 1e+300 " + fits.format("inf")),
        # The boundary itself: the midpoint rounds to inf.
        (lambda: attn.sdpa(q, q, q, sinks=[0.0, 0.0, F32_TO_INF, 0.0]),
         "sinks[2] = 3.4028235677973366e+38 " + fits.format("inf")),
    ]
    for call, message in calls:
        with pytest.raises(ValueError) as e:
            call()
        assert str(e.value) == message
    # An inf as given is the core's to name, as it was.
    with pytest.raises(ValueError, match="^sdpa: sinks: values must be finite but entry 2 is inf$"):
        attn.sdpa(q, q, q, sinks=[0.0, 0.0, np.inf, 0.0])
    # Just below the midpoint rounds to the largest float32 and is taken.
    below = np.nextafter(F32_TO_INF, 0.0)
    largest = np.float32(np.finfo(np.float32).max)
    np.testing.assert_array_equal(attn.sdpa(q, q, q, sinks=[0.0, 0.0, below, 0.0]),
                                  attn.sdpa(q, q, q, sinks=np.array([0.0, 0.0, largest, 0.0], np.float32)))


def test_cli_flags_match_torch(tmp_path):
    """attn sdpa --softcap --alibi --sinks --grad-out … --dsinks against the torch textbook."""
    import os
    import subprocess
    bin_ = attn_cli()
    rng = np.random.default_rng(7)
    b, h, lq, lk, d = 2, 4, 9, 21, 16
    q = rng.standard_normal((b, h, lq, d)).astype(np.float32) * 2
    k = rng.standard_normal((b, h, lk, d)).astype(np.float32) * 2
    v = rng.standard_normal((b, h, lk, d)).astype(np.float32)
    g = rng.standard_normal((b, h, lq, d)).astype(np.float32)
    sinks = rng.standard_normal(h).astype(np.float32)
    for name, x in dict(q=q, k=k, v=v, g=g, s=sinks).items():
        np.save(tmp_path / f"{name}.npy", x)
    p = lambda n: str(tmp_path / n)  # noqa: E731
    r = subprocess.run([bin_, "sdpa", "--q", p("q.npy"), "--k", p("k.npy"), "--v", p("v.npy"), "--out", p("o.npy"),
                        "--lse", p("l.npy"), "--causal", "bottom-right", "--softcap", "3", "--alibi", "--sinks", p("s.npy"),
                        "--grad-out", p("g.npy"), "--dq", p("dq.npy"), "--dk", p("dk.npy"), "--dv", p("dv.npy"),
                        "--dsinks", p("ds.npy")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    keep = visible(b, lq, lk, causal="bottom-right")
    diag = np.arange(lq)[None, :] + np.full((b, 1), lk - lq)
    out_t, lse_t, leaves = textbook(q, k, v, keep, softcap=3.0, slopes=attn.alibi_slopes(h), sinks=sinks, diag=diag)
    close(np.load(p("o.npy")), out_t.detach().numpy())
    close(np.load(p("l.npy")), lse_t.detach().numpy())
    (out_t * torch.from_numpy(g.astype(np.float64))).sum().backward()
    scale = max(float(np.abs(t.grad.numpy()).max()) for t in leaves)
    for f, leaf in zip(("dq", "dk", "dv", "ds"), leaves):
        close(np.load(p(f + ".npy")) / scale, leaf.grad.numpy() / scale, atol=2e-5, rtol=0)
    bad = subprocess.run([bin_, "sdpa", "--q", p("q.npy"), "--k", p("k.npy"), "--v", p("v.npy"), "--out", p("o2.npy"),
                          "--softcap", "-1"], capture_output=True, text=True)
    assert bad.returncode == 2 and "softcap: must be 0 (off)" in bad.stderr, bad.stderr
    assert not os.path.exists(p("o2.npy"))


def test_cli_packed_sequences_alibi_sinks_dsinks(tmp_path):
    """attn sdpa --alibi --sinks --grad-out … --dsinks with --cu-seqlens-q/k: each sequence as sdpa
    and its backward give it alone, dsinks their sum over the sequences. --alibi built the slopes
    for 1 head on packed (T, H, D) input and failed for Hq > 1; --dsinks was refused ("sinks are
    not supported there", while --sinks ran)."""
    import subprocess
    bin_ = attn_cli()
    rng = np.random.default_rng(11)
    hq, hkv, d = 4, 2, 8
    cq, ck = np.array([0, 3, 4, 9]), np.array([0, 4, 10, 12])
    q = rng.standard_normal((cq[-1], hq, d)).astype(np.float32)
    k = rng.standard_normal((ck[-1], hkv, d)).astype(np.float32)
    v = rng.standard_normal((ck[-1], hkv, d)).astype(np.float32)
    g = rng.standard_normal((cq[-1], hq, d)).astype(np.float32)
    sinks = rng.standard_normal(hq).astype(np.float32)
    for name, x in dict(q=q, k=k, v=v, g=g, s=sinks, cq=cq, ck=ck).items():
        np.save(tmp_path / f"{name}.npy", x)
    p = lambda n: str(tmp_path / n)  # noqa: E731
    r = subprocess.run([bin_, "sdpa", "--q", p("q.npy"), "--k", p("k.npy"), "--v", p("v.npy"), "--out", p("o.npy"),
                        "--cu-seqlens-q", p("cq.npy"), "--cu-seqlens-k", p("ck.npy"), "--alibi", "--sinks", p("s.npy"),
                        "--causal", "bottom-right", "--grad-out", p("g.npy"), "--dq", p("dq.npy"), "--dk", p("dk.npy"),
                        "--dv", p("dv.npy"), "--dsinks", p("ds.npy")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    got = {n: np.load(p(n + ".npy")).astype(np.float64) for n in ("o", "dq", "dk", "dv", "ds")}
    heads = lambda x: x.transpose(1, 0, 2)[None]  # noqa: E731  (T, H, D) → (1, H, T, D)
    kw = dict(is_causal=True, causal_alignment="bottom-right", alibi_slopes=attn.alibi_slopes(hq), sinks=sinks,
              impl="reference")
    ds_sum = np.zeros(hq)
    for s in range(len(cq) - 1):
        qs, gs = (heads(x[cq[s]:cq[s + 1]]) for x in (q, g))
        ks, vs = (heads(x[ck[s]:ck[s + 1]]) for x in (k, v))
        out, lse = attn.sdpa(qs, ks, vs, return_lse=True, **kw)
        close(heads(got["o"][cq[s]:cq[s + 1]]), out.astype(np.float64))
        dq, dk, dv, ds = attn.sdpa_backward(qs, ks, vs, out, lse, gs, **kw)
        close(heads(got["dq"][cq[s]:cq[s + 1]]), dq.astype(np.float64))
        close(heads(got["dk"][ck[s]:ck[s + 1]]), dk.astype(np.float64))
        close(heads(got["dv"][ck[s]:ck[s + 1]]), dv.astype(np.float64))
        ds_sum += ds
    close(got["ds"], ds_sum)


def textbook_scores(q, k, keep, softcap=None, slopes=None, diag=None, **_):
    """The three ONNX stages, float64: scaled (mode 0), softcapped (1), masked (2)."""
    q, k = (torch.from_numpy(np.asarray(x, np.float64)) for x in (q, k))
    k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    scaled = q @ k.transpose(-1, -2) / np.sqrt(q.shape[-1])
    capped = softcap * torch.tanh(scaled / softcap) if softcap else scaled
    s = capped
    if slopes is not None:
        m = torch.tensor(np.broadcast_to(np.asarray(slopes, np.float64), (q.shape[0], q.shape[1])).copy())
        dist = torch.tensor(np.abs(diag[:, None, :, None] - np.arange(k.shape[2])[None, None, None, :]), dtype=torch.float64)
        s = s - m[:, :, None, None] * dist
    masked = s.masked_fill(~torch.from_numpy(np.array(keep)), float("-inf"))
    return {"scaled": scaled.numpy(), "softcapped": capped.numpy(), "masked": masked.numpy()}


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("stage", ["scaled", "softcapped", "masked"])
@pytest.mark.parametrize("impl", ["auto", "flash", "reference"])
def test_scores_output_at_each_stage(seed, stage, impl):
    (q, k, v), keep, kw, mk, tk = random_case(seed)
    want = textbook_scores(q, k, keep, **tk)[stage]
    out, lse, scores = attn.sdpa(q, k, v, **kw, **mk, return_lse=True, return_scores=stage, impl=impl)
    # |s| up to ~50 here: scores carry fp32 dot-product rounding, (D+2)·u·Σ|q·k|·scale <= 1e-5·|s|-ish
    close(scores, want, atol=1e-4, rtol=1e-5)
    if stage == "masked":
        assert np.array_equal(np.isneginf(scores), np.isneginf(want))
    out_t, lse_t, _ = textbook(q, k, v, keep, **tk)
    close(out, out_t.detach().numpy())


def test_scores_refused_with_dropout_and_bad_stage():
    q = np.ones((1, 2, 3, 8), np.float32)
    with pytest.raises(Exception, match="scores: not available together with dropout"):
        attn.sdpa(q, q, q, dropout_p=0.1, dropout_seed=1, return_scores="masked")
    with pytest.raises(ValueError, match="return_scores: expected"):
        attn.sdpa(q, q, q, return_scores="raw")
    with pytest.raises(TypeError, match="return_scores"):  # a wrong type, as for every keyword (was ValueError)
        attn.sdpa(q, q, q, return_scores=1)


@pytest.mark.parametrize("lq", [1, 3, 40])  # 2, 6 and 80 rows per KV head: decode, decode, flash
def test_decode_and_paged_attention_take_the_score_modifiers(lq):
    """decode_attention and paged_attention take softcap, alibi_slopes and sinks as
    scaled_dot_product_attention does (a serving step of a Gemma-2 or GPT-OSS style model); they
    were missing from the Python bindings. Each equals sdpa on the cached keys, bottom-right."""
    rng = np.random.default_rng(21)
    b, hq, hkv, d, n = 2, 4, 2, 16, 50
    k = rng.standard_normal((b, hkv, n, d)).astype(np.float32)
    v = rng.standard_normal((b, hkv, n, d)).astype(np.float32)
    q = rng.standard_normal((b, hq, lq, d)).astype(np.float32)
    sinks = rng.standard_normal(hq).astype(np.float32)
    kw = dict(softcap=3.0, alibi_slopes=True, sinks=sinks)
    want, want_lse = attn.sdpa(q, k, v, is_causal=True, causal_alignment="bottom-right", return_lse=True,
                               impl="reference", softcap=3.0, alibi_slopes=attn.alibi_slopes(hq), sinks=sinks)
    cache = attn.KVCache(b, hkv, d, n)
    cache.append(k, v)
    out, lse = attn.decode_attention(q, cache, return_lse=True, **kw)
    close(out, want.astype(np.float64))
    close(lse, want_lse.astype(np.float64))
    paged = attn.PagedKVCache(hkv, d, 16, page_size=8)
    seqs = [paged.add_sequence() for _ in range(b)]
    for i, s in enumerate(seqs):
        paged.append(s, k[i], v[i])
    out_p, lse_p = attn.paged_attention(q, paged, seqs, return_lse=True, **kw)
    close(out_p, want.astype(np.float64))
    close(lse_p, want_lse.astype(np.float64))
