"""attn: scaled dot-product attention for CPUs, on NumPy arrays with PyTorch's names.

Everything is defined by the extension attn._attn (python/*.cpp) and re-exported here;
`import attn.torch` adds torch tensors, autograd and nn.Module wrappers (python/attn/torch/).
"""
from . import _attn

# Every name of the extension, the private helpers (_input_copies, ...) included.
globals().update({k: v for k, v in vars(_attn).items() if not (k.startswith("__") and k.endswith("__"))})
__version__ = _attn.__version__
__doc__ = _attn.__doc__

# The classes name this package as their home, so help(attn) lists them beside the functions.
for _cls in (v for v in list(globals().values()) if isinstance(v, type) and v.__module__ == _attn.__name__):
    _cls.__module__ = __name__
# A call that does not fit a signature raises one line naming the mismatch, not pybind11's dump of
# every argument, and running out of memory a MemoryError naming the call (_concise_errors.py).
from . import _concise_errors

_concise_errors.apply(globals(), __name__)
if "dist" in globals():
    _concise_errors.apply(vars(globals()["dist"]), __name__, __name__ + ".dist")
# `import attn.dist` (the MPI submodule, when built) as well as `attn.dist` after `import attn`.
if "dist" in globals():
    import sys as _sys

    _sys.modules[__name__ + ".dist"] = globals()["dist"]
    del _sys
del _cls  # loop and import helpers: not names of the package
