"""Ctrl-C during a long call (python/interruptible.hpp, README.md "Python"): a
SIGINT stops the call between two of its tasks and raises KeyboardInterrupt at once — not when the
call would have ended —, the SIGINT handler is Python's again afterwards, and the module keeps
working. With a Python handler of the caller's own, the call runs to its end, as before.

The long call is a flash sdpa sized to take about a second on this machine (its time measured here,
uninterrupted); the SIGINT comes from a timer thread, as a terminal's Ctrl-C reaches the process."""
import ctypes
import os
import signal
import threading
import time

import numpy as np
import pytest

import attn
from reference import close, textbook
from tsan import UNDER_TSAN

L, D = 4096, 64
AFTER = 0.15  # seconds before the SIGINT


def sigint_handler_address():
    """The C-level SIGINT handler (struct sigaction's first field, the handler's address, on Linux)."""
    libc = ctypes.CDLL(None, use_errno=True)
    old = ctypes.create_string_buffer(256)  # larger than any struct sigaction
    assert libc.sigaction(signal.SIGINT, None, old) == 0, os.strerror(ctypes.get_errno())
    return ctypes.c_void_p.from_buffer(old).value


@pytest.fixture(scope="module")
def long_call():
    """q, k, v (1, H, L, D) of a flash call that takes about a second here, and its uninterrupted
    time: H scaled by the time of fewer heads until it does (the machine may be shared: the time
    is measured, not assumed)."""
    rng = np.random.default_rng(7)
    heads = 2
    while True:
        q, k, v = (rng.standard_normal((1, heads, L, D), dtype=np.float32) for _ in range(3))
        start = time.perf_counter()
        attn.sdpa(q, k, v)
        full = time.perf_counter() - start
        if full > 0.8 or heads >= 256:
            return q, k, v, full
        heads = min(256, max(2 * heads, int(np.ceil(heads * 1.2 / full))))


def sigint_in(seconds):
    timer = threading.Timer(seconds, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    return timer


@pytest.mark.skipif(UNDER_TSAN, reason="TSan's runtime holds a signal until the thread enters a function "
                    "it intercepts (tsan.py)")
def test_ctrl_c_stops_a_long_call_at_once(long_call):
    q, k, v, full = long_call
    assert full > 4 * AFTER, f"the call took {full:.3f} s: too short to tell an interrupt from its end"
    handler = sigint_handler_address()
    timer = sigint_in(AFTER)
    start = time.perf_counter()
    with pytest.raises(KeyboardInterrupt):
        attn.sdpa(q, k, v)
        time.sleep(10)  # not reached with the fix; without it, the KeyboardInterrupt comes here
    stopped = time.perf_counter() - start
    timer.join()
    # Stopped within a few tasks of the signal (a task is a block of 64 queries of one head: a few ms).
    assert stopped < AFTER + 0.25 * full, f"KeyboardInterrupt after {stopped:.3f} s; the whole call takes {full:.3f} s"
    assert sigint_handler_address() == handler  # Python's handler is back
    # The module still works: a call after it gives the right answer.
    few = q[:, :1, :256], k[:, :1], v[:, :1]
    close(attn.sdpa(*few), textbook(*few)[0])


def test_a_python_handler_of_its_own_lets_the_call_finish(long_call):
    q, k, v, full = long_call
    seen = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: seen.append(signum))
    try:
        timer = sigint_in(AFTER)
        start = time.perf_counter()
        out = attn.sdpa(q, k, v)
        took = time.perf_counter() - start
        timer.join()
    finally:
        signal.signal(signal.SIGINT, previous)
    assert seen == [signal.SIGINT]
    assert took > 0.5 * full, f"the call took {took:.3f} s of {full:.3f} s"  # the SIGINT came during it
    few = q[:, -1:, :256], k[:, -1:], v[:, -1:]  # the last head: the call finished
    close(out[:, -1:, :256], textbook(*few)[0])
