"""Sizes from user input and the Python layer under threads (hardening, classes 1 and 6).

- A KVCache size whose bytes cannot be counted in 64 bits is a ValueError before anything is
  allocated; a countable one the system refuses is a MemoryError naming the buffer and bytes.
  Either way the cache is unchanged and keeps working.
- KVCache.keys()/values() never show what lies beyond a sequence's length (stale rows of a
  truncated sequence, uninitialised rows after growth): those positions are 0.
- MultiheadAttention.state_dict() takes the lock load_state_dict takes: never a torn copy.
"""
import sys
import threading
import time

import numpy as np
import pytest

import attn
from tsan import UNDER_TSAN

BIG = 2**62


@pytest.mark.parametrize(
    "kw",
    [
        dict(batch=1, kv_heads=1, head_dim=64, capacity=BIG),
        dict(batch=1, kv_heads=1, head_dim=64, capacity=BIG, grow=True),
        dict(batch=1, kv_heads=1, head_dim=64, capacity=2**57, dtype="bfloat16"),
        dict(batch=2**40, kv_heads=2**40, head_dim=1, capacity=1),
        dict(batch=1, kv_heads=1, head_dim=1, capacity=2**30, value_dim=2**40),
        dict(batch=1, kv_heads=1, head_dim=64, capacity=4, grow=True, max_capacity=BIG),
    ],
)
def test_uncountable_cache_sizes_are_value_errors(kw):
    with pytest.raises(ValueError, match="more bytes than a 64-bit size can count"):
        attn.KVCache(**kw)


@pytest.mark.parametrize("grow", [False, True])
def test_refused_cache_allocation_is_a_memory_error_with_the_size(grow):
    # 2^40 positions × 64 × 4 bytes = 256 TiB: countable, beyond any address space.
    with pytest.raises(MemoryError, match=r"cannot allocate 281474976710656 bytes \(256\.0 TiB\) for KVCache keys"):
        attn.KVCache(1, 1, 64, 2**40, grow=grow)


def test_failed_reserve_and_huge_appends_leave_the_cache_usable():
    rng = np.random.default_rng(1)
    c = attn.KVCache(2, 3, 8, 4, grow=True)
    k1 = rng.standard_normal((2, 3, 3, 8), dtype=np.float32)
    v1 = rng.standard_normal((2, 3, 3, 8), dtype=np.float32)
    c.append(k1, v1)

    def unchanged():
        assert c.capacity == 4
        assert list(c.lengths) == [3, 3]
        np.testing.assert_array_equal(c.keys()[:, :, :3], k1)
        np.testing.assert_array_equal(c.values()[:, :, :3], v1)

    with pytest.raises(ValueError, match="reserve: capacity 4611686018427387904"):
        c.reserve(BIG)
    unchanged()
    with pytest.raises(MemoryError, match="out of memory: cannot allocate"):
        c.reserve(2**50)
    unchanged()
    # 2^40 new tokens from a broadcast (stride-0) array: costs nothing to pass, 192 TiB to store.
    huge = np.broadcast_to(np.zeros((2, 3, 1, 8), np.float32), (2, 3, 2**40, 8))
    with pytest.raises(MemoryError, match="out of memory: cannot allocate"):
        c.append(huge, huge)
    unchanged()
    k2 = rng.standard_normal((2, 3, 2, 8), dtype=np.float32)
    v2 = rng.standard_normal((2, 3, 2, 8), dtype=np.float32)
    c.append(k2, v2)  # grows by doubling, contents kept
    assert c.capacity == 8
    np.testing.assert_array_equal(c.keys()[:, :, :5], np.concatenate([k1, k2], axis=2))
    np.testing.assert_array_equal(c.values()[:, :, :5], np.concatenate([v1, v2], axis=2))


def _round(x, dtype):
    """What the cache's storage type makes of float32 values (round to nearest even)."""
    if dtype == "float16":
        return x.astype(np.float16).astype(np.float32)
    if dtype == "bfloat16":
        u = x.view(np.uint32).astype(np.uint64)
        u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16 << 16
        return u.astype(np.uint32).view(np.float32)
    return x


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_keys_and_values_are_zero_beyond_each_length(dtype):
    rng = np.random.default_rng(2)
    c = attn.KVCache(2, 3, 4, 8, value_dim=5, dtype=dtype, grow=True)
    # Values far from 0, so that a leaked stale row cannot pass for a zero.
    k = (rng.standard_normal((2, 3, 6, 4)) + 10).astype(np.float32)
    v = (rng.standard_normal((2, 3, 6, 5)) - 10).astype(np.float32)
    c.append(k, v)
    c.truncate(2, batch_index=0)  # rows 2..5 of sequence 0 stay in the storage, stale
    k1 = (rng.standard_normal((3, 4, 4)) + 10).astype(np.float32)
    v1 = (rng.standard_normal((3, 4, 5)) - 10).astype(np.float32)
    c.append(k1, v1, batch_index=1)  # 10 > 8: grows to 16, rows 10..15 uninitialised
    assert c.capacity == 16
    lengths = list(c.lengths)
    assert lengths == [2, 10]
    keys, values = c.keys(), c.values()
    assert keys.shape == (2, 3, 16, 4) and values.shape == (2, 3, 16, 5)
    want_k = [k[0, :, :2], np.concatenate([k[1], k1], axis=1)]
    want_v = [v[0, :, :2], np.concatenate([v[1], v1], axis=1)]
    for b in range(2):
        n = lengths[b]
        np.testing.assert_array_equal(keys[b, :, :n], _round(want_k[b], dtype))
        np.testing.assert_array_equal(values[b, :, :n], _round(want_v[b], dtype))
        assert np.all(keys[b, :, n:] == 0), f"sequence {b}: keys beyond its length {n} are not 0"
        assert np.all(values[b, :, n:] == 0), f"sequence {b}: values beyond its length {n} are not 0"
    c.reset()
    assert not np.any(c.keys()) and not np.any(c.values())


N_COPIES, SECONDS = 100, 5.0  # without the lock, about 40% of the copies were torn
if UNDER_TSAN:  # the same 10 copies at least, at TSan's pace: 7 in 5 s on a busy 2-CPU machine
    SECONDS = 30.0


def test_state_dict_is_never_torn_by_a_concurrent_load():
    m = attn.MultiheadAttention(256, 4)
    names = list(m.state_dict())
    ones = {n: np.full_like(a, 1.0) for n, a in m.state_dict().items()}
    twos = {n: np.full_like(a, 2.0) for n, a in m.state_dict().items()}
    m.load_state_dict(ones)  # every copy from here on is all ones or all twos, unless torn
    stop = threading.Event()

    def writer():
        while not stop.is_set():
            m.load_state_dict(ones)
            m.load_state_dict(twos)

    t = threading.Thread(target=writer)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-4)  # hand the GIL over often: the threads interleave more, and faster
    t.start()
    torn, copies, end = [], 0, time.monotonic() + SECONDS
    try:
        while copies < N_COPIES and time.monotonic() < end:
            copies += 1
            sd = m.state_dict()
            assert list(sd) == names
            seen = np.unique(np.concatenate([a.ravel() for a in sd.values()]))
            if len(seen) != 1:
                torn.append(seen)
    finally:
        stop.set()
        t.join()
        sys.setswitchinterval(interval)
    assert copies >= 10, f"only {copies} copies in {SECONDS} s: too few to tell"
    assert not torn, f"{len(torn)} of {copies} state_dict() copies mixed two loads, e.g. values {torn[0]}"


# forward_incremental held the cache's lock until after it had taken the GIL back, while
# KVCache.lengths/truncate/reset/keys wait for that lock holding the GIL: a deadlock within
# a few steps (a review found it). Run in a child process so that a hang fails this test
# instead of stalling the suite.
DEADLOCK_CHILD = r"""
import faulthandler, sys, threading
import numpy as np, attn
faulthandler.dump_traceback_later(60, exit=True)  # a hang: traceback and exit code 1
E, H = 256, 4
layer = attn.MultiheadAttention(E, H)
cache = attn.KVCache(1, H, E // H, 4096, grow=True)
x = np.random.default_rng(0).random((64, 1, E), dtype=np.float32)
stop = threading.Event()
def poke():
    while not stop.is_set():
        cache.lengths
        cache.keys()
t = threading.Thread(target=poke, daemon=True)
t.start()
for i in range(20):
    layer.forward_incremental(x, cache)
    if i % 8 == 7:
        cache.reset()
stop.set()
t.join()
print("done", cache.lengths.tolist())
"""


def test_forward_incremental_beside_cache_methods_on_another_thread_does_not_deadlock():
    import subprocess

    r = subprocess.run([sys.executable, "-c", DEADLOCK_CHILD], capture_output=True, text=True, timeout=180)
    assert r.returncode == 0 and r.stdout.startswith("done"), f"exit {r.returncode}\n{r.stdout}\n{r.stderr[-3000:]}"
    assert r.stdout.split(None, 1)[1].strip() == "[256]"  # 20 steps of 64 tokens, reset after steps 8 and 16


@pytest.mark.parametrize("asked", [{"return_weights": True}, {"return_scores": "masked"}])
def test_a_refused_call_allocates_no_weights_first(asked):
    # The (1, 1, 2^17, 2^17) weights were allocated before sdpa checked K: a MemoryError of
    # 64 GiB instead of the error naming K's head dim.
    L = 2**17
    q = np.broadcast_to(np.zeros(1, np.float32), (1, 1, L, 4))
    k = np.broadcast_to(np.zeros(1, np.float32), (1, 1, L, 8))
    with pytest.raises(ValueError, match="sdpa: K: head dim 8 does not match Q's head dim 4"):
        attn.sdpa(q, k, q, **asked)
