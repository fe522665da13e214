"""attn.dist from Python (mpi4py) under `mpirun -np P`, P = 1..4: O, dQ, dK, dV gathered from
ring_python_worker.py against torch autograd in float64 (<= 1e-5 relative per tensor, as
test_ring_backward_cli.py) and against `attn ring --grad-out` on the same files: the same
library on the same P and layout sums in the same order, so the two must be bit-identical."""
import os
import subprocess
import sys

import numpy as np
import pytest

from test_ring_backward_cli import torch_grads
from test_ring_cli import ENV, MPIEXEC, mpirun

HERE = os.path.dirname(os.path.abspath(__file__))
PYPATH = os.path.join(os.path.dirname(os.environ["ATTN_BIN"]), "..", "python")
pytest.importorskip("mpi4py")


@pytest.mark.parametrize("np_", [1, 2, 3, 4])
@pytest.mark.parametrize("causal", [0, 1])
def test_python_ring_matches_torch_and_cli(tmp_path, np_, causal):
    B, Hq, Hkv, L, Dk, Dv = 2, 4, 2, 37, 12, 5
    rng = np.random.default_rng(7)
    arrays = {"q": rng.uniform(-2, 2, (B, Hq, L, Dk)), "k": rng.uniform(-2, 2, (B, Hkv, L, Dk)),
              "v": rng.uniform(-2, 2, (B, Hkv, L, Dv)), "do": rng.uniform(-1, 1, (B, Hq, L, Dv))}
    arrays = {n: a.astype(np.float32) for n, a in arrays.items()}
    np.savez(tmp_path / "inputs.npz", **arrays)
    env = dict(ENV, PYTHONPATH=PYPATH)
    r = subprocess.run([MPIEXEC, "-q", "--oversubscribe", "-np", str(np_), sys.executable,
                        os.path.join(HERE, "ring_python_worker.py"), str(tmp_path), str(B), str(Hq), str(Hkv), str(L),
                        str(Dk), str(Dv), str(causal), "zigzag"], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    got = np.load(tmp_path / f"python_{np_}.npz")
    ref = torch_grads(arrays["q"], arrays["k"], arrays["v"], arrays["do"], causal=bool(causal))
    for name, g, want in zip(("dQ", "dK", "dV"), (got["dq"], got["dk"], got["dv"]), ref):
        err = np.abs(g - want).max() / np.abs(want).max()
        assert err <= 1e-5, f"{name}: {err:.2e}"
    # The CLI on the same inputs.
    for n in ("q", "k", "v", "do"):
        np.save(tmp_path / f"{n}.npy", arrays[n])
    files = {n: tmp_path / f"cli_{n}.npy" for n in ("o", "dq", "dk", "dv")}
    r = mpirun(np_, "--q", tmp_path / "q.npy", "--k", tmp_path / "k.npy", "--v", tmp_path / "v.npy", "--out", files["o"],
               "--grad-out", tmp_path / "do.npy", "--dq", files["dq"], "--dk", files["dk"], "--dv", files["dv"],
               *(["--causal"] if causal else []))
    assert r.returncode == 0, r.stderr
    for n in ("o", "dq", "dk", "dv"):
        assert np.array_equal(np.load(files[n]), got[n]), n


def textbook_grads(q, k, v, do, *, causal=False, alignment="top-left", key_lengths=None, window=None,
                   query_offset=None, softcap=None, alibi=None, sinks=None):
    """O, dQ, dK, dV (and dsinks) by torch autograd in float64 of the rule of
    docs/conventions.md: diagonal d_b(i) = i (top-left), i + n_b − Lq (bottom-right) or
    i + query_offset; s = scale·q·k → c·tanh(s/c) → − m_h·|d_br(i) − j| (ALiBi measured from the
    bottom-right diagonal, or query_offset) → causal j <= d, window d − left <= j <= d + right,
    key lengths j < n_b → softmax with the sink σ_h as one more logit without a value."""
    import torch
    q, k, v, do = (torch.tensor(x, dtype=torch.float64) for x in (q, k, v, do))
    leaves = [q, k, v]
    sk = None
    if sinks is not None:
        sk = torch.tensor(np.asarray(sinks, np.float32), dtype=torch.float64)
        leaves.append(sk)
    for t in leaves:
        t.requires_grad_(True)
    B, Hq, Lq, Dk = q.shape
    Hkv, Lk = k.shape[1], k.shape[2]
    kk, vv = (x.repeat_interleave(Hq // Hkv, dim=1) for x in (k, v))
    s = q @ kk.transpose(-1, -2) * Dk ** -0.5
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    i = torch.arange(Lq)[None, :, None]
    j = torch.arange(Lk)[None, None, :]
    n = torch.full((B,), Lk) if key_lengths is None else torch.tensor(key_lengths)
    br = i + (n - Lq)[:, None, None]  # (B, Lq, 1)
    if query_offset is not None:
        d = d_alibi = i + query_offset
    else:
        d = i if alignment == "top-left" else br
        d_alibi = br
    if alibi is not None:
        m = torch.tensor(np.asarray(alibi, np.float32), dtype=torch.float64)
        s = s - m.view(1, Hq, 1, 1) * (d_alibi - j).abs()[:, None].to(torch.float64)
    keep = (j < n[:, None, None]).expand(B, Lq, Lk)
    if causal:
        keep = keep & (j <= d)
    if window is not None:
        left, right = window
        if left >= 0:
            keep = keep & (j >= d - left)
        if right >= 0:
            keep = keep & (j <= d + right)
    s = s.masked_fill(~keep[:, None], float("-inf"))
    if sk is not None:
        col = sk.view(1, Hq, 1, 1).expand(B, Hq, Lq, 1)
        a = torch.softmax(torch.cat([s, col], dim=-1), dim=-1)[..., :-1]
    else:
        a = torch.softmax(s, dim=-1).nan_to_num(0.0)
    o = a @ vv
    o.backward(do)
    return [o.detach().numpy()] + [t.grad.numpy() for t in leaves[:3]] + ([sk.grad.numpy()] if sk is not None else [])


MOD_CASES = {
    "softcap-alibi-sinks-causal": dict(causal=1, kw={"softcap": 2.0, "alibi_slopes": True, "sinks": [0.5, -1.0, 2.0, 0.0]}),
    "bottom-right-lengths-sinks": dict(causal=1, kw={"causal_alignment": "bottom-right", "key_lengths": [37, 20],
                                                      "sinks": [1.0, 0.0, -0.5, 3.0], "alibi_slopes": [0.1, 0.2, 0.3, 0.4]}),
    "window-offset-softcap": dict(causal=0, kw={"window": [5, 3], "query_offset": 4, "softcap": 1.5}),
}


@pytest.mark.parametrize("np_", [1, 3])
@pytest.mark.parametrize("name", list(MOD_CASES))
def test_python_ring_modifier_keywords_match_torch(tmp_path, np_, name):
    import json
    case = MOD_CASES[name]
    B, Hq, Hkv, L, Dk, Dv = 2, 4, 2, 37, 12, 5
    rng = np.random.default_rng(11)
    arrays = {"q": rng.uniform(-2, 2, (B, Hq, L, Dk)), "k": rng.uniform(-2, 2, (B, Hkv, L, Dk)),
              "v": rng.uniform(-2, 2, (B, Hkv, L, Dv)), "do": rng.uniform(-1, 1, (B, Hq, L, Dv))}
    arrays = {n: a.astype(np.float32) for n, a in arrays.items()}
    np.savez(tmp_path / "inputs.npz", **arrays)
    kw = dict(case["kw"])
    (tmp_path / "kwargs.json").write_text(json.dumps(kw))
    env = dict(ENV, PYTHONPATH=PYPATH)
    r = subprocess.run([MPIEXEC, "-q", "--oversubscribe", "-np", str(np_), sys.executable,
                        os.path.join(HERE, "ring_python_worker.py"), str(tmp_path), str(B), str(Hq), str(Hkv), str(L),
                        str(Dk), str(Dv), str(case["causal"]), "zigzag"], capture_output=True, text=True, env=env,
                        timeout=120)
    assert r.returncode == 0, r.stderr
    got = np.load(tmp_path / f"python_{np_}.npz")
    alibi = kw.get("alibi_slopes")
    if alibi is True:  # attn.alibi_slopes(Hq), saved by the worker (this process has no attn)
        alibi = np.load(tmp_path / "alibi_slopes.npy")
    ref = textbook_grads(arrays["q"], arrays["k"], arrays["v"], arrays["do"], causal=bool(case["causal"]),
                         alignment=kw.get("causal_alignment", "top-left"), key_lengths=kw.get("key_lengths"),
                         window=kw.get("window"), query_offset=kw.get("query_offset"), softcap=kw.get("softcap"),
                         alibi=alibi, sinks=kw.get("sinks"))
    names = ["o", "dq", "dk", "dv"] + (["dsinks"] if "sinks" in kw else [])
    ours = [got[n] for n in names[:4]] + ([np.load(tmp_path / f"dsinks_{np_}.npy")] if "sinks" in kw else [])
    for n, g, want in zip(names, ours, ref):
        err = np.abs(g - want).max() / np.abs(want).max()
        assert err <= 1e-5, f"{n}: {err:.2e}"


# Keyword cases (json for the worker; "@name" = an array of inputs.npz): the masks on global
# positions, per-sequence arrays, and dropout.
KEYWORD_CASES = {
    "window bottom-right + key_lengths": dict(
        causal=1, layout="contiguous",
        keywords={"window": [5, 2], "window_alignment": "bottom-right", "key_lengths": "@key_lengths"}),
    "bottom-right causal + per-sequence query_offset + window": dict(
        causal=1, layout="zigzag",
        keywords={"causal_alignment": "bottom-right", "query_offset": "@offsets", "window": [6, None]}),
    # impl= and threads= (the CLI's --impl and --threads; a parity audit found them missing here).
    "impl flash, threads 1": dict(causal=1, layout="zigzag", keywords={"impl": "flash", "threads": 1}),
    "dropout 0.3 causal": dict(causal=1, layout="zigzag", keywords={"dropout_p": 0.3, "dropout_seed": 2**40 + 123}),
    "dropout 0.5 + query_offset 4 + key_lengths": dict(
        causal=1, layout="contiguous",
        keywords={"dropout_p": 0.5, "dropout_seed": 9, "query_offset": 4, "key_lengths": "@key_lengths"}),
}


@pytest.mark.parametrize("np_", [1, 2, 3, 4])
@pytest.mark.parametrize("case", sorted(KEYWORD_CASES))
def test_python_ring_keywords_match_sdpa(tmp_path, np_, case):
    """window, key_lengths, query_offset (int and (B,) array), causal_alignment and
    dropout_p/dropout_seed through attn.dist against single-process
    attn.scaled_dot_product_attention and its backward with the same keywords on the whole
    sequence (<= 1e-5 relative per tensor); with dropout, sdpa with another seed must be far
    from the ring (the comparison sees the mask)."""
    import json
    sys.path.insert(0, PYPATH)
    import attn
    spec = KEYWORD_CASES[case]
    B, Hq, Hkv, L, Dk, Dv = 2, 4, 2, 37, 8, 6
    rng = np.random.default_rng(11)
    arrays = {"q": rng.uniform(-2, 2, (B, Hq, L, Dk)), "k": rng.uniform(-2, 2, (B, Hkv, L, Dk)),
              "v": rng.uniform(-2, 2, (B, Hkv, L, Dv)), "do": rng.uniform(-1, 1, (B, Hq, L, Dv))}
    arrays = {n: a.astype(np.float32) for n, a in arrays.items()}
    arrays["key_lengths"] = np.array([37, 21], dtype=np.int64)
    arrays["offsets"] = np.array([3, -2], dtype=np.int32)
    np.savez(tmp_path / "inputs.npz", **arrays)
    env = dict(ENV, PYTHONPATH=PYPATH)
    r = subprocess.run([MPIEXEC, "-q", "--oversubscribe", "-np", str(np_), sys.executable,
                        os.path.join(HERE, "ring_python_worker.py"), str(tmp_path), str(B), str(Hq), str(Hkv), str(L),
                        str(Dk), str(Dv), str(spec["causal"]), spec["layout"], json.dumps(spec["keywords"])],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    got = np.load(tmp_path / f"python_{np_}.npz")
    kw = {n: arrays[x[1:]] if isinstance(x, str) and x.startswith("@") else x for n, x in spec["keywords"].items()}
    dropout_p = kw.pop("dropout_p", 0.0)

    def single(seed):
        o, lse = attn.scaled_dot_product_attention(arrays["q"], arrays["k"], arrays["v"], dropout_p=dropout_p,
                                                   is_causal=bool(spec["causal"]), return_lse=True,
                                                   **dict(kw, dropout_seed=seed))
        grads = attn.scaled_dot_product_attention_backward(arrays["q"], arrays["k"], arrays["v"], o, lse, arrays["do"],
                                                           dropout_p=dropout_p, is_causal=bool(spec["causal"]),
                                                           **dict(kw, dropout_seed=seed))
        return [o, *grads]

    seed = kw.pop("dropout_seed", 0)
    want = single(seed)
    for name, g, w in zip(("o", "dq", "dk", "dv"), (got["o"], got["dq"], got["dk"], got["dv"]), want):
        err = np.abs(g - w).max() / np.abs(w).max()
        assert err <= 1e-5, f"{name}: {err:.2e}"
    if dropout_p > 0:
        other = single(seed + 1)
        assert np.abs(got["o"] - other[0]).max() > 1e-2 * np.abs(want[0]).max()


@pytest.mark.parametrize("np_", [1, 2, 3, 4])
def test_python_ring_float16(np_):
    """float16 Q/K/V/dO through attn.dist (out and gradients float16 by default, float32 with
    out_dtype=): ring_python_half_worker.py checks every rank's rows against single-process attn."""
    env = dict(ENV, PYTHONPATH=PYPATH)
    r = subprocess.run([MPIEXEC, "-q", "--oversubscribe", "-np", str(np_), sys.executable,
                        os.path.join(HERE, "ring_python_half_worker.py")], capture_output=True, text=True, env=env,
                       timeout=120)
    assert r.returncode == 0, r.stderr



@pytest.mark.parametrize("np_", [1, 2, 3])
def test_python_ring_gives_each_gradient_its_inputs_dtype(np_):
    """Mixed dtypes through attn.dist's backward: dq in q's dtype, dk in k's, dv in v's (a large dv
    stays finite beside a float16 q): ring_python_mixed_worker.py checks every rank's rows against
    single-process attn."""
    env = dict(ENV, PYTHONPATH=PYPATH)
    r = subprocess.run([MPIEXEC, "-q", "--oversubscribe", "-np", str(np_), sys.executable,
                        os.path.join(HERE, "ring_python_mixed_worker.py")], capture_output=True, text=True, env=env,
                       timeout=120)
    assert r.returncode == 0, r.stderr


ONE_RANK_REFUSES = r"""
import json, sys
import numpy as np
import attn
from mpi4py import MPI
comm = MPI.COMM_WORLD
r = comm.Get_rank()
x = np.random.default_rng(r).standard_normal((1, 2, 4, 8)).astype(np.float32)
def message(call):
    try:
        call()
    except Exception as e:
        return type(e).__name__ + ": " + str(e)
    return "no error"
got = {"forward": message(lambda: attn.dist.ring_attention(x, x, x, comm, layout="zigzagg" if r == 1 else "zigzag"))}
o, lse = attn.dist.ring_attention(x, x, x, comm)
got["backward"] = message(lambda: attn.dist.ring_attention_backward(x, x, x, o, lse[0] if r == 1 else lse, o, comm))
# Every rank but 0 refuses: the others name the lowest, as the library's own agreement does.
got["several"] = message(lambda: attn.dist.ring_attention(x, x, x, comm, layout="zigzagg" if r >= 1 else "zigzag"))
with open(f"{sys.argv[1]}/rank{r}.json", "w") as f:  # one file per rank: stdout lines of ranks interleave
    json.dump(got, f)
"""


@pytest.mark.parametrize("np_", [2, 3])
def test_a_bad_argument_on_one_rank_is_an_error_on_every_rank(tmp_path, np_):
    """Rank 1 alone passes a bad layout (then a 2-D lse): it used to raise alone while the other
    ranks waited in the ring for ever. Now every rank raises: rank 1 its own error, the others one
    naming rank 1; the job ends, and the ranks can go on to the next call."""
    import json
    env = dict(ENV, PYTHONPATH=PYPATH)
    r = subprocess.run([MPIEXEC, "-q", "--oversubscribe", "-np", str(np_), sys.executable, "-c", ONE_RANK_REFUSES,
                        str(tmp_path)], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    for rank in range(np_):
        mine = json.loads((tmp_path / f"rank{rank}.json").read_text())
        if rank == 1:
            assert mine["forward"].startswith("ValueError: layout: expected zigzag or contiguous"), mine
            assert mine["backward"].startswith("ValueError: lse: expected (B, H, L_local)"), mine
        else:
            assert mine["forward"] == ("ValueError: ring_attention: rank 1 refused its arguments (its own error says "
                                       "which and why)"), mine
            assert mine["backward"].startswith("ValueError: ring_attention_backward: rank 1 refused its arguments"), mine
        if rank == 0:  # the one rank that did not refuse
            assert mine["several"].startswith("ValueError: ring_attention: rank 1 refused its arguments"), mine
        else:
            assert mine["several"].startswith("ValueError: layout: expected zigzag or contiguous"), mine


FLOAT64_REFUSED = r"""
import numpy as np
import attn
from mpi4py import MPI
comm = MPI.COMM_WORLD
x = np.random.default_rng(comm.Get_rank()).standard_normal((1, 2, 4, 8)).astype(np.float32)
o, lse = attn.dist.ring_attention(x, x, x, comm)
for name, call in (("forward", lambda: attn.dist.ring_attention(x, x, x, comm, out_dtype="float64")),
                   ("backward", lambda: attn.dist.ring_attention_backward(x, x, x, o, lse, o, comm, out_dtype="float64"))):
    try:
        call()
        print(name, "accepted")
    except Exception as e:
        print(name, type(e).__name__ + ": " + str(e))
"""


def test_out_dtype_float64_is_refused_saying_the_ring_computes_in_float32():
    """attn.scaled_dot_product_attention and its backward take out_dtype="float64"; the ring, which
    computes in float32, refuses it saying so (docs/conventions.md, "The CLI's output dtype")."""
    env = dict(ENV, PYTHONPATH=PYPATH)
    r = subprocess.run([MPIEXEC, "-q", "--oversubscribe", "-np", "1", sys.executable, "-c", FLOAT64_REFUSED],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert [x.split()[0] for x in lines] == ["forward", "backward"], r.stdout
    for line in lines:
        assert line.split(" ", 1)[1] == ('TypeError: out_dtype: expected "float32", "float16", "bfloat16" or None but '
                                         "got str 'float64': this call computes in float32, not float64"), line


DROPOUT_WITHOUT_A_SEED = r"""
import json, sys
import numpy as np
import attn
from mpi4py import MPI
comm = MPI.COMM_WORLD
x = np.random.default_rng(comm.Get_rank()).standard_normal((1, 2, 4, 8)).astype(np.float32)
o, lse = attn.dist.ring_attention(x, x, x, comm)
got = {}
for name, call in (("forward", lambda: attn.dist.ring_attention(x, x, x, comm, dropout_p=0.5)),
                   ("backward", lambda: attn.dist.ring_attention_backward(x, x, x, o, lse, o, comm, dropout_p=0.25))):
    try:
        call()
        got[name] = "accepted"
    except Exception as e:
        got[name] = type(e).__name__ + ": " + str(e)
with open(f"{sys.argv[1]}/rank{comm.Get_rank()}.json", "w") as f:  # one file per rank: stdout lines interleave
    json.dump(got, f)
"""


@pytest.mark.parametrize("np_", [1, 2])
def test_dropout_without_a_seed_says_how_python_passes_one(tmp_path, np_):
    """dropout_p > 0 without dropout_seed=: the library's rule and words, naming the call, with how
    Python passes a seed (the library's words had lost the binding's "an int in [0, 2**64)"); on
    every rank, each of which lacks it."""
    import json
    env = dict(ENV, PYTHONPATH=PYPATH)
    r = subprocess.run([MPIEXEC, "-q", "--oversubscribe", "-np", str(np_), sys.executable, "-c", DROPOUT_WITHOUT_A_SEED,
                        str(tmp_path)], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    why = (": the keep mask is a function of it, so a training loop passes a new seed each step and the backward the "
           "forward's (attn has no global generator)")
    want = {"forward": "ValueError: ring_attention: dropout_seed: dropout_p = 0.5 needs a seed (dropout_seed=N, an int "
                       "in [0, 2**64))" + why,
            "backward": "ValueError: ring_attention_backward: dropout_seed: dropout_p = 0.25 needs a seed "
                        "(dropout_seed=N, an int in [0, 2**64))" + why}
    for rank in range(np_):
        assert json.loads((tmp_path / f"rank{rank}.json").read_text()) == want, rank


BROADCAST_INPUTS = r"""
import numpy as np
import attn
from mpi4py import MPI
comm = MPI.COMM_WORLD
x = np.random.default_rng(comm.Get_rank()).standard_normal((1, 2, 5, 8)).astype(np.float32)
o, lse = attn.dist.ring_attention(x, x, x, comm, is_causal=True)
# out, lse and grad_out are the backward's inputs: broadcast views of them, and the same values copied.
views = (np.broadcast_to(o[:, :1, :1], o.shape), np.broadcast_to(lse[:, :, :1], lse.shape),
         np.broadcast_to(x[:1, :1, :1], x.shape))
got = attn.dist.ring_attention_backward(x, x, x, *views, comm, is_causal=True)
want = attn.dist.ring_attention_backward(x, x, x, *(np.ascontiguousarray(a) for a in views), comm, is_causal=True)
assert all(np.array_equal(a, b) for a, b in zip(got, want)), "broadcast inputs gave other gradients"
"""


@pytest.mark.parametrize("np_", [1, 2])
def test_ring_backward_reads_broadcast_out_lse_and_grad_out(np_):
    """out, lse and grad_out are the ring backward's inputs: broadcast views give the gradients of
    contiguous copies (they were refused as outputs: "out: dimension 1 has stride 0 but size 2;
    an output cannot be a broadcast view")."""
    env = dict(ENV, PYTHONPATH=PYPATH)
    r = subprocess.run([MPIEXEC, "-q", "--oversubscribe", "-np", str(np_), sys.executable, "-c", BROADCAST_INPUTS],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr


NULL_COMM = r"""
import numpy as np
from mpi4py import MPI
import attn.dist
q = np.ones((1, 1, 4, 8), np.float32)
lse = np.zeros((1, 1, 4), np.float32)
for call in (lambda c: attn.dist.ring_attention(q, q, q, c),
             lambda c: attn.dist.ring_attention_backward(q, q, q, q, lse, q, c)):
    for comm in (MPI.COMM_NULL, None):
        try:
            call(comm)
            print("accepted")
        except Exception as e:
            print(type(e).__name__ + ": " + str(e))
"""


def test_a_null_communicator_is_named_not_blamed_on_rank_0():
    # MPI_Comm_rank's and MPI_Allreduce's return codes were ignored: MPI_COMM_NULL read as
    # "rank 0 refused its arguments", an error no rank had.
    env = dict(ENV, PYTHONPATH=PYPATH)
    r = subprocess.run([sys.executable, "-c", NULL_COMM], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    # Both calls, before any MPI call on it (mpi4py's MPI_ERRORS_RETURN alone kept it from
    # aborting the job); None never reaches MPI.
    assert r.stdout.splitlines() == [
        "ValueError: comm: MPI.COMM_NULL is not a communicator (pass MPI.COMM_WORLD or one of its splits)",
        "TypeError: comm: expected an mpi4py communicator (e.g. MPI.COMM_WORLD)"] * 2, r.stdout
