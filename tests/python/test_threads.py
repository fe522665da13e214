"""attn's one thread setting from Python: attn.set_num_threads / get_num_threads and the
threads= keyword of every compute call (docs/environment.md)."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import attn
from tsan import UNDER_TSAN


def test_set_and_get():
    before = attn.get_num_threads()
    assert before >= 1
    try:
        attn.set_num_threads(1)
        assert attn.get_num_threads() == 1
        attn.set_num_threads(3)
        assert attn.get_num_threads() == 3
    finally:
        attn.set_num_threads(0)
    assert attn.get_num_threads() == before
    with pytest.raises(ValueError, match="set_num_threads"):
        attn.set_num_threads(-1)


def qkv(seed=0, shape=(1, 4, 200, 32)):
    r = np.random.default_rng(seed)
    return [r.standard_normal(shape).astype(np.float32) for _ in range(3)]


def test_threads_keyword_gives_the_same_bits():
    q, k, v = qkv()
    o0, lse0 = attn.scaled_dot_product_attention(q, k, v, is_causal=True, return_lse=True)
    o1, lse1 = attn.scaled_dot_product_attention(q, k, v, is_causal=True, return_lse=True, threads=1)
    assert np.array_equal(o0, o1) and np.array_equal(lse0, lse1)
    g = np.ones_like(o0)
    d0 = attn.scaled_dot_product_attention_backward(q, k, v, o0, lse0, g, is_causal=True)
    d1 = attn.scaled_dot_product_attention_backward(q, k, v, o0, lse0, g, is_causal=True, threads=1)
    for a, b in zip(d0, d1):
        assert np.array_equal(a, b)


@pytest.mark.parametrize("bad, exc", [(-1, ValueError), (5000, ValueError), ("2", TypeError)])
def test_threads_keyword_is_checked(bad, exc):
    q, k, v = qkv(shape=(1, 1, 4, 8))
    with pytest.raises(exc, match="threads"):
        attn.scaled_dot_product_attention(q, k, v, threads=bad)
    cache = attn.KVCache(batch=1, kv_heads=1, head_dim=8, capacity=8)
    cache.append(k, v)
    with pytest.raises(exc, match="threads"):
        attn.decode_attention(q[:, :, :1], cache, threads=bad)
    x, cu = q[0].transpose(1, 0, 2), np.array([0, 1, 4])  # sdpa_varlen took no threads= before
    with pytest.raises(exc, match="threads"):
        attn.sdpa_varlen(x, x, x, cu, cu, threads=bad)
    o, lse = attn.sdpa_varlen(x, x, x, cu, cu, return_lse=True)
    with pytest.raises(exc, match="threads"):
        attn.sdpa_varlen_backward(x, x, x, cu, cu, o, lse, o, threads=bad)


# In a fresh process (numpy's and attn's OpenBLAS pools held at 1 by OPENBLAS_NUM_THREADS), the
# threads= keyword alone decides whether a second thread ever starts: /proc/self/task counts them.
CHILD = textwrap.dedent("""
    import os, sys, numpy as np, attn
    n = int(sys.argv[1])
    if sys.argv[2:] == ["0"]:  # attn's setting n, and threads=0 (None: that setting) on every call
        attn.set_num_threads(n)
        n = 0
    tasks = lambda: len(os.listdir("/proc/self/task"))
    r = np.random.default_rng(0)
    q, k, v = (r.standard_normal((2, 4, 256, 64)).astype(np.float32) for _ in range(3))
    o, lse = attn.scaled_dot_product_attention(q, k, v, is_causal=True, return_lse=True, threads=n)
    attn.scaled_dot_product_attention_backward(q, k, v, o, lse, np.ones_like(o), is_causal=True, threads=n)
    cache = attn.KVCache(batch=2, kv_heads=4, head_dim=64, capacity=512)
    cache.append(k, v)
    attn.decode_attention(q[:, :, :1], cache, threads=n)
    xv = q[0].transpose(1, 0, 2).copy()
    ov, lv = attn.sdpa_varlen(xv, xv, xv, np.array([0, 100, 256]), np.array([0, 100, 256]), return_lse=True, threads=n)
    attn.sdpa_varlen_backward(xv, xv, xv, np.array([0, 100, 256]), np.array([0, 100, 256]), ov, lv, ov, threads=n)
    # Sequences the decode kernel and the reference take (one query each, float64): they ran on
    # OpenMP's default count whatever threads= said.
    kd = r.standard_normal((2000, 4, 64)).astype(np.float32)
    cq, ck = np.array([0, 1, 2]), np.array([0, 1000, 2000])
    attn.sdpa_varlen(xv[:2], kd, kd, cq, ck, threads=n)
    attn.sdpa_varlen(xv[:2].astype(np.float64), kd[:40].astype(np.float64), kd[:40].astype(np.float64), cq,
                     np.array([0, 20, 40]), threads=n)
    mha = attn.MultiheadAttention(256, 4, batch_first=True)
    x = r.standard_normal((2, 128, 256)).astype(np.float32)
    mha(x, x, x, need_weights=False, threads=n)
    print(tasks())
""")


@pytest.mark.skipif(not os.path.isdir("/proc/self/task") or (os.cpu_count() or 1) < 2, reason="needs /proc and 2 CPUs")
@pytest.mark.skipif(UNDER_TSAN, reason="TSan's runtime starts a thread of its own (tsan.py)")
@pytest.mark.parametrize("n, keyword", [(1, "n"), (2, "n"), (1, "0"), (2, "0")])
def test_threads_keyword_reaches_every_kernel(n, keyword):
    # keyword "0": threads=0 is threads=None, attn's setting (docs/environment.md), on every call.
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    env.pop("ATTN_NUM_THREADS", None)
    env.pop("OMP_NUM_THREADS", None)
    p = subprocess.run([sys.executable, "-c", CHILD, str(n), keyword], capture_output=True, text=True, env=env,
                       timeout=300)
    assert p.returncode == 0, p.stderr
    assert int(p.stdout.strip()) == n, p.stdout


@pytest.mark.parametrize("value, warned", [("two", True), ("0", True), ("5000", True), ("3\n", True),
                                           ("", False), ("3", False)])
def test_malformed_env_is_ignored_with_one_warning(value, warned):
    # A malformed ATTN_NUM_THREADS is ignored as libgomp ignores a malformed OMP_NUM_THREADS,
    # and said once on stderr (control bytes escaped); empty is unset.
    env = dict(os.environ, ATTN_NUM_THREADS=value, OMP_NUM_THREADS="2")
    child = "import attn; print(attn.get_num_threads()); print(attn.get_num_threads())"
    p = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    expected = "3" if value == "3" else "2"
    assert p.stdout.split() == [expected, expected]
    lines = [line for line in p.stderr.splitlines() if "ATTN_NUM_THREADS" in line]
    if warned:
        shown = value.replace("\n", "\\x0a")
        assert lines == [f"attn: warning: ignoring ATTN_NUM_THREADS='{shown}': expected an integer from 1 to 4096"]
    else:
        assert lines == []
