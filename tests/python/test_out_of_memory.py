"""Running out of memory from Python: a MemoryError whose message names the call first
("attn.KVCache.append: …") and then, where the binding or the library knows it, what was being
allocated and how many bytes (python/attn/_concise_errors.py; convert.hpp's new_array).

Sizes are far past any machine (broadcast inputs cost nothing to pass): no limit is needed, except
where a refusal must come from inside a kernel (RLIMIT_AS in a child process)."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import attn
from asan import UNDER_ASAN
from tsan import UNDER_TSAN
from attn import _concise_errors

BIG = 1 << 40  # rows: 2^40 x 8 float32 = 32 TiB


def wide(*shape, dtype=np.float32):
    """A (.., n, ..) array of ones that takes one element of memory."""
    return np.broadcast_to(np.ones((1,) * len(shape), dtype), shape)


def cache(value_dim=8):
    c = attn.KVCache(1, 1, 8, 4, value_dim=value_dim)
    c.append(np.ones((1, 1, 2, 8), np.float32), np.ones((1, 1, 2, value_dim), np.float32))
    return c


def paged():
    c = attn.PagedKVCache(1, 8, 4, page_size=4)
    s = c.add_sequence()
    c.append(s, np.ones((1, 2, 8), np.float32), np.ones((1, 2, 8), np.float32))
    return c, s


CU = np.array([0, BIG], np.int64)
SMALL = np.ones((1, 1, 4, 8), np.float32)
CALLS = {
    "weights": (lambda: attn.sdpa(*(wide(1, 1, 1 << 20, 8),) * 3, return_weights=True),
                r"attn\.scaled_dot_product_attention: out of memory allocating the weights \(…, Lq, Lk\): "
                r"Unable to allocate 4\.00 TiB for an array with shape \(1, 1, 1048576, 1048576\) and data type float32"),
    "sdpa": (lambda: attn.sdpa(wide(1, 1, BIG, 8), SMALL, SMALL),
             r"attn\.scaled_dot_product_attention: out of memory allocating out: Unable to allocate 32\.0 TiB"),
    "sdpa_backward": (lambda: attn.sdpa_backward(wide(1, 1, BIG, 8), SMALL, SMALL, wide(1, 1, BIG, 8), wide(1, 1, BIG),
                                                 wide(1, 1, BIG, 8)),
                      r"attn\.scaled_dot_product_attention_backward: out of memory allocating dq \(the query's shape\)"),
    "sdpa_varlen": (lambda: attn.sdpa_varlen(wide(BIG, 1, 8), wide(BIG, 1, 8), wide(BIG, 1, 8), CU, CU),
                    r"attn\.sdpa_varlen: out of memory allocating out \(Tq, Hq, Dv\)"),
    "sdpa_varlen_backward": (lambda: attn.sdpa_varlen_backward(*(wide(BIG, 1, 8),) * 3, CU, CU, wide(BIG, 1, 8),
                                                               wide(BIG, 1), wide(BIG, 1, 8)),
                             r"attn\.sdpa_varlen_backward: out of memory allocating dq"),
    "decode_attention": (lambda: attn.decode_attention(wide(1, 1, BIG, 8), cache()),
                         r"attn\.decode_attention: out of memory allocating out \(B, Hq, Lq, Dv\)"),
    "paged_attention": (lambda: attn.paged_attention(wide(1, 1, BIG, 8), *(lambda c, s: (c, [s]))(*paged())),
                        r"attn\.paged_attention: out of memory allocating out \(B, Hq, Lq, Dv\)"),
    "KVCache": (lambda: attn.KVCache(1, 1, 64, BIG),
                r"attn\.KVCache: out of memory: cannot allocate 281474976710656 bytes \(256\.0 TiB\) for KVCache keys"),
    "KVCache.append": (lambda: attn.KVCache(1, 1, 8, 4, grow=True).append(wide(1, 1, BIG, 8), wide(1, 1, BIG, 8)),
                       r"attn\.KVCache\.append: out of memory: cannot allocate"),
    "PagedKVCache": (lambda: attn.PagedKVCache(1, 64, 2**31 - 1),
                     r"attn\.PagedKVCache: out of memory: cannot allocate"),
    "MultiheadAttention": (lambda: attn.MultiheadAttention(1 << 18, 1),
                           r"attn\.MultiheadAttention: MultiHeadAttention: parameter in_proj_weight .*out of memory"),
    "MultiheadAttention.forward": (lambda: attn.MultiheadAttention(8, 1, batch_first=True).forward(*(wide(1, BIG, 8),) * 3,
                                                                                                   need_weights=False),
                                   r"attn\.MultiheadAttention\.forward: out of memory allocating the output"),
}


@pytest.mark.parametrize("name", sorted(CALLS))
def test_memory_error_names_the_call_and_what_it_allocated(name):
    call, message = CALLS[name]
    with pytest.raises(MemoryError, match=message):
        call()


def test_a_call_through_the_instance_is_named_as_the_class():
    m = attn.MultiheadAttention(8, 1, batch_first=True)
    with pytest.raises(MemoryError, match=r"^attn\.MultiheadAttention: out of memory allocating the output"):
        m(*(wide(1, BIG, 8),) * 3, need_weights=False)


def test_an_anonymous_bad_alloc_still_names_the_call():
    said = _concise_errors.out_of_memory("attn.decode_attention", MemoryError("std::bad_alloc"))
    assert said == "attn.decode_attention: out of memory (std::bad_alloc: the allocation that failed has no name)"


def test_out_of_memory_converting_an_input_is_a_memory_error_not_a_type_error():
    # np.asarray failing for want of memory was a TypeError "query: expected an array … but got …".
    class NoMemory:
        def __array__(self, *args, **kwargs):
            raise MemoryError("no memory for the copy")

    with pytest.raises(MemoryError, match=r"^attn\.scaled_dot_product_attention: out of memory: no memory for the copy"):
        attn.sdpa(NoMemory(), SMALL, SMALL)


def test_out_of_memory_reading_bfloat16_bits_is_a_memory_error_not_a_type_error():
    # A torch.bfloat16 state_dict entry is read as its bits; running out of memory there was a
    # TypeError "a torch.bfloat16 tensor whose bits NumPy cannot read: MemoryError: …".
    torch = pytest.importorskip("torch")

    class NoMemoryForBits(torch.Tensor):
        def numpy(self, *args, **kwargs):
            raise MemoryError("no memory for the bits")

    m = attn.MultiheadAttention(8, 2, dtype="bfloat16")
    sd = {k: torch.from_numpy(v.view(np.int16)).view(torch.bfloat16).as_subclass(NoMemoryForBits) if v.dtype == np.uint16
          else torch.from_numpy(v) for k, v in m.state_dict().items()}
    with pytest.raises(MemoryError, match=r"^attn\.MultiheadAttention\.load_state_dict: out of memory: no memory for the bits"):
        m.load_state_dict(sd)


def test_attn_torch_names_the_core_call():
    torch = pytest.importorskip("torch")
    import attn.torch as at

    q = torch.ones(1, 1, 1, 8, dtype=torch.bfloat16).expand(1, 1, BIG, 8)
    k = torch.ones(1, 1, 1, 8, dtype=torch.bfloat16)
    with pytest.raises(MemoryError, match=r"^attn\.scaled_dot_product_attention: out of memory allocating out: "
                                          r"Unable to allocate 16\.0 TiB .* data type uint16"):
        at.scaled_dot_product_attention(q, k, k)


@pytest.mark.parametrize("self_attention", [True, False])
def test_attn_torch_multihead_attention_projections_raise_a_named_memory_error(self_attention):
    # torch's own allocator raised RuntimeError("[enforce fail at alloc_cpu.cpp] … DefaultCPUAllocator:
    # can't allocate memory …") from the input projections, where every attn call raises MemoryError.
    torch = pytest.importorskip("torch")
    import attn.torch as at

    m = at.MultiheadAttention(8, 1, batch_first=True)
    x = torch.ones(1, 1, 8).expand(1, BIG, 8)
    kv = x if self_attention else torch.ones(1, 1, 8).expand(1, BIG, 8)  # one fused GEMM, or three
    with torch.no_grad(), pytest.raises(MemoryError, match=r"^attn\.torch\.MultiheadAttention\.forward: out of memory "
                                                           r"allocating the input projections \(query, key, value: "
                                                           r"N, L, E each\): .*can't allocate memory: you tried to "
                                                           r"allocate \d+ bytes"):
        m(x, kv, kv, need_weights=False)


# The backward's own tables (the visible keys of every query row, B·Lq entries each) were a bare
# std::bad_alloc: under a sweep of address-space limits every refusal must name the call and
# what it was allocating.
SWEEP = textwrap.dedent("""
    import resource, numpy as np, attn
    n = 1 << 22
    q = np.broadcast_to(np.ones((1, 1, 1, 8), np.float32), (1, 1, n, 8))
    k = np.ones((1, 1, 1, 8), np.float32)
    o, lse = attn.sdpa(q, k, k, return_lse=True, threads=1)
    with open("/proc/self/status") as f:
        base = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize"))
    for mib in range(0, 1024, 8):
        resource.setrlimit(resource.RLIMIT_AS, (base + (mib << 20), resource.RLIM_INFINITY))
        try:
            attn.sdpa_backward(q, k, k, o, lse, o, threads=1)
            break
        except MemoryError as e:
            print(e)
        finally:
            resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    print("done")
""")


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs /proc")
@pytest.mark.skipif(UNDER_ASAN or UNDER_TSAN, reason="ASan's shadow memory cannot live under an RLIMIT_AS (asan.py); "
                    "TSan's allocator ends the process there (tsan.py)")
def test_every_refusal_inside_the_backward_is_named():
    p = subprocess.run([sys.executable, "-c", SWEEP], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[-1] == "done" and len(lines) > 1, p.stdout
    for line in lines[:-1]:
        assert line.startswith("attn.scaled_dot_product_attention_backward: out of memory"), line
        assert "has no name" not in line, line


# attn.dist in a child process of one rank (MPI stays out of the test process): the output that
# cannot be allocated, and the ring's own buffers under an address-space limit — which every
# rank agrees on; that agreement turned running out of memory into ValueError("out of memory").
# The accumulators (double, twice the float32 output each) were a bare std::bad_alloc: the
# message named the call only.
RING = textwrap.dedent("""
    import resource, numpy as np
    from mpi4py import MPI
    import attn
    w = lambda *s: np.broadcast_to(np.ones((1,) * len(s), np.float32), s)
    big = w(1, 1, 1 << 40, 8)
    n, small = 1 << 22, w(1, 1, 4, 8)  # out (dq): 128 MiB, its accumulator 256 MiB
    # The forward's out and lse, which the backward does not take broadcast.
    o, lse = np.ones((1, 1, n, 8), np.float32), np.zeros((1, 1, n), np.float32)
    forward = attn.dist.ring_attention
    backward = lambda q, *kv: attn.dist.ring_attention_backward(q, *kv, o, lse, w(1, 1, n, 8), MPI.COMM_WORLD)
    for call, make in ((forward, lambda: (big, big, big, MPI.COMM_WORLD)),
                       (forward, lambda: (small, w(1, 1, 1 << 24, 8), w(1, 1, 1 << 24, 8), MPI.COMM_WORLD)),
                       (forward, lambda: (w(1, 1, n, 8), small, small, MPI.COMM_WORLD)),
                       (backward, lambda: (w(1, 1, n, 8), small, small))):
        with open("/proc/self/status") as f:
            base = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize"))
        resource.setrlimit(resource.RLIMIT_AS, (base + (256 << 20), resource.RLIM_INFINITY))
        try:
            call(*make())
            print("no error")
        except Exception as e:
            print(type(e).__name__, e)
        finally:
            resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
""")


@pytest.mark.skipif(not hasattr(attn, "dist") or not os.path.exists("/proc/self/status"), reason="needs attn.dist and /proc")
@pytest.mark.skipif(UNDER_ASAN or UNDER_TSAN, reason="ASan's shadow memory cannot live under an RLIMIT_AS (asan.py); "
                    "TSan's allocator ends the process there (tsan.py)")
def test_ring_attention_names_the_call_and_stays_a_memory_error():
    pytest.importorskip("mpi4py")
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    p = subprocess.run([sys.executable, "-c", RING], capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr
    out, buffers, acc_o, acc_dq = p.stdout.splitlines()
    assert out.startswith("MemoryError attn.dist.ring_attention: out of memory allocating out (B, H, L_local, Dv)"), out
    assert buffers.startswith("MemoryError attn.dist.ring_attention: out of memory: cannot allocate 1073741824 bytes "
                              "(1.0 GiB) for the ring's K/V block buffers"), buffers
    assert acc_o == ("MemoryError attn.dist.ring_attention: out of memory: cannot allocate 268435456 bytes (256.0 MiB) "
                     "for the ring's output accumulator acc_o (B, Hq, L_local, Dv) in double"), acc_o
    assert acc_dq == ("MemoryError attn.dist.ring_attention_backward: out of memory: cannot allocate 268435456 bytes "
                      "(256.0 MiB) for the ring's dQ accumulator acc_dq (B, Hq, L_local, Dk) in double"), acc_dq
