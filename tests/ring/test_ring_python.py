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
