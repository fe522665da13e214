"""torch tensors ↔ the NumPy arrays attn's extension reads, without copying.

A CPU tensor's .numpy() is a NumPy array over the same memory with the same strides, so
attn reads permuted, sliced and expanded tensors in place (the extension counts the inputs
it must copy in attn._input_copies(); for torch tensors that is none). Outputs are the
extension's fresh arrays, wrapped by torch.from_numpy (no copy either).

bfloat16, which NumPy lacks, crosses as its bits: a bfloat16 tensor is seen as a uint16 array
over the same memory (the extension reads uint16 as bfloat16 under dtype="bfloat16", which
every call from attn.torch passes), and a uint16 result array becomes a bfloat16 tensor.
"""
import numbers

import numpy as np
import torch

import attn as _core  # the package: its calls name themselves in a MemoryError


def _check_tensor(t, name):
    """TypeError/ValueError naming `name` unless `t` is a dense CPU tensor."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor but got {type(t).__name__}")
    if t.device.type != "cpu":
        raise ValueError(f"{name}: attn runs on the CPU but got a tensor on device '{t.device}' "
                         "(move it with .cpu())")
    if t.layout != torch.strided or t.is_nested or t.is_quantized:
        raise TypeError(f"{name}: expected a dense tensor but got layout {t.layout}"
                        + (" (nested)" if t.is_nested else " (quantized)" if t.is_quantized else ""))


def array(t, name):
    """The NumPy view of tensor `t`; TypeError/ValueError naming `name` for what attn cannot read."""
    _check_tensor(t, name)
    t = t.detach().resolve_conj().resolve_neg()
    if t.dtype == torch.bfloat16:  # same memory and strides, read as its bits
        return t.view(torch.int16).numpy().view(np.uint16)
    try:
        a = t.numpy()
    except TypeError:  # a dtype NumPy does not have (complex32, ...)
        raise TypeError(f"{name}: unsupported dtype {t.dtype} (expected torch.float32, torch.float64, "
                        "torch.float16 or torch.bfloat16)") from None
    # uint16 is how bfloat16 crosses (the core reads it as bfloat16 bits under the dtype="bfloat16"
    # every call passes): a torch.uint16 tensor (torch >= 2.3) would be read as bfloat16 — a mask
    # of those bits added to the scores — where the core's own dtype rule refuses every integer
    # mask. Only a bfloat16 tensor may cross as uint16.
    if a.dtype == np.uint16:
        raise TypeError(f"{name}: unsupported dtype {t.dtype} (attn.torch passes bfloat16 tensors as uint16 "
                        "bits, so a uint16 tensor would be read as bfloat16)")
    return a


_FLOAT_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


def float_array(t, name):
    """array() of query/key/value: attn.torch's own dtype error (the core's would list the NumPy
    dtypes it reads, int32 and bool among them, which are not attn.torch's)."""
    _check_tensor(t, name)
    if t.dtype not in _FLOAT_DTYPES:
        raise TypeError(f"{name}: expected dtype torch.float32, torch.float64, torch.float16 or torch.bfloat16 "
                        f"but got {t.dtype}")
    return array(t, name)


def maybe_array(x, name):
    """A tensor as array(); anything else (None, int, list, NumPy array) as given."""
    return array(x, name) if isinstance(x, torch.Tensor) else x


def modifier_array(x, name):
    """alibi_slopes / sinks as maybe_array(), in float32: attn's core keeps them in float32 whatever
    the dtype of q (docs/conventions.md, "Score modifiers"). A float16/bfloat16 tensor (a model
    moved to 16 bits with .to() or .half()) is widened, exactly; a float64 one is rounded."""
    if isinstance(x, torch.Tensor) and x.dtype in (torch.float64, torch.float16, torch.bfloat16):
        x = x.detach().float()
    return maybe_array(x, name)


def tensor(a):
    if a.dtype == np.uint16:  # bfloat16 bits (the extension's bfloat16 results)
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


# The core's out_dtype= names (float64 too: the core's scaled_dot_product_attention writes it).
_OUT_DTYPES = {torch.float32: "float32", torch.float64: "float64", torch.float16: "float16", torch.bfloat16: "bfloat16"}


def out_dtype_name(out_dtype, query):
    """out_dtype= as the extension takes it: None → query's dtype (float64 stays float64)."""
    if out_dtype is None:
        return None
    if out_dtype not in _OUT_DTYPES:
        raise TypeError(f"out_dtype: expected torch.float32, torch.float64, torch.float16, torch.bfloat16 or None but got "
                        f"{out_dtype!r}")
    return _OUT_DTYPES[out_dtype]


def number(x):
    """A float argument of torch's signature (`dropout_p`, `scale`) read as torch's argument parser
    reads one: a 0-dim tensor that does not require grad stands for its value, so
    `scale=torch.tensor(0.125)` (a buffer, say) works as in torch 2.x's F.scaled_dot_product_attention.
    Anything else is returned as given for the caller's checks to name: a tensor that requires grad
    or has dims is a TypeError there, as in torch."""
    if (isinstance(x, torch.Tensor) and x.dim() == 0 and not x.requires_grad and x.device.type != "meta"
            and x.dtype != torch.bool and not x.is_complex()):
        return x.item()
    return x


def check_real(x, name, what):
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        raise TypeError(f"{name}: expected {what} but got {x!r}")


class Threads:
    """Runs attn's calls inside the block on `threads` threads (default torch.get_num_threads()):
    attn's own per-thread setting (attn/threads.hpp), restored when the block ends."""

    def __init__(self, threads):
        # None or 0 (no count of the call's own): torch's. TypeError/ValueError naming `threads`.
        self.scope = _core._ScopedThreads(threads, torch.get_num_threads())

    def __enter__(self):
        self.scope.__enter__()

    def __exit__(self, *exc):
        return self.scope.__exit__(*exc)
