"""torch's own allocations, out of memory, as the MemoryError every attn call raises.

attn's calls raise MemoryError naming the call and what it was allocating
(attn._concise_errors.out_of_memory). The torch ops attn.torch runs around them — MultiheadAttention's
projections — allocate through torch, whose CPU allocator raises a RuntimeError
("DefaultCPUAllocator: can't allocate memory: you tried to allocate N bytes"): `allocating`
turns that one into the same MemoryError, naming the call and the buffer, around a whole step
(no wrapper per op). Any other RuntimeError passes unchanged.
"""
import contextlib

from .. import _concise_errors

# What torch's CPU allocator says when it is refused (c10/core/impl/alloc_cpu.cpp; the second on Windows).
_TORCH_REFUSALS = ("DefaultCPUAllocator: can't allocate memory", "DefaultCPUAllocator: not enough memory")


@contextlib.contextmanager
def allocating(call, what):
    """Inside the block, torch running out of memory is MemoryError("<call>: out of memory allocating
    <what>: <torch's message, with the bytes>")."""
    try:
        yield
    except RuntimeError as e:
        if not any(s in str(e) for s in _TORCH_REFUSALS):
            raise
        raise MemoryError(_concise_errors.out_of_memory(call, f"out of memory allocating {what}: {e}")) from None
