"""Errors that say which call failed: one-line TypeErrors for calls that do not match a
function's signature, and MemoryErrors that name the call.

pybind11 answers a misspelt keyword or a wrong argument count with "incompatible function
arguments", every supported signature and the repr of every argument given: for a (2, 8, 1024, 64)
array some 10,000 characters, the mistake named at the very end. Every function and method of the
extension has one signature (python/*.cpp), so the message can say exactly what did not fit:

    scaled_dot_product_attention(): unexpected keyword argument 'is_casual' (did you mean 'is_causal'?)

Running out of memory raises MemoryError naming the call, then what it was allocating where the
extension knows it (numpy's message or attn's gives the bytes):

    attn.scaled_dot_product_attention: out of memory allocating the weights (…, Lq, Lk): Unable to
    allocate 64.0 GiB for an array with shape (1, 1, 131072, 131072) and data type float32

The wrapper of every function and method of the extension (apply) is the one place that names the
call; attn.torch calls the extension through these wrappers too.

A call that succeeds pays one Python call frame (tens of nanoseconds); only a failing one more.
"""
import difflib
import functools
import re

_SIGNATURE = re.compile(r"^\w+\((.*)\) -> ")


def parameters(doc):
    """(positional names, keyword-only names, required names, {name: type}) from pybind11's first
    doc line."""
    m = _SIGNATURE.match((doc or "").split("\n", 1)[0])
    if m is None:
        return None
    positional, keyword_only, required, types = [], [], [], {}
    target = positional
    # "name: type" or "name: type = default", split at the ", " before the next name (a default
    # such as 'top-left' or a type such as List[int] holds no "name: " of its own); "*" starts the
    # keyword-only ones.
    for part in re.split(r", (?=\w+: |\*(?:,|$))", m.group(1)):
        if part == "*":
            target = keyword_only
            continue
        if not part:  # f() takes nothing
            continue
        if ": " not in part:  # *args / **kwargs: any call fits, nothing to say
            return None
        name, annotation = part.split(": ", 1)
        if name == "self":
            continue
        target.append(name)
        types[name] = annotation.split(" = ", 1)[0]
        if " = " not in part:
            required.append(name)
    return positional, keyword_only, required, types


def _message(name, params, args, kwargs):
    positional, keyword_only, required, types = params
    every = positional + keyword_only
    for key in kwargs:
        if key not in every:
            close = difflib.get_close_matches(key, every, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else f" (it takes: {', '.join(every)})"
            return f"{name}(): unexpected keyword argument {key!r}{hint}"
    if len(args) > len(positional):
        takes = f"at most {len(positional)} positional arguments ({', '.join(positional)})" if positional else "no arguments"
        rest = f"; the others are keyword-only: {', '.join(keyword_only)}" if keyword_only else ""
        return f"{name}() takes {takes} but {len(args)} were given{rest}"
    given = set(positional[:len(args)]) | set(kwargs)
    for key in positional[:len(args)]:
        if key in kwargs:
            return f"{name}(): got multiple values for argument {key!r}"
    missing = [r for r in required if r not in given]
    if missing:
        return f"{name}() missing required argument{'s' if len(missing) > 1 else ''}: {', '.join(map(repr, missing))}"
    # An argument of one of attn's classes (a cache) given something else. Other annotations
    # (int, str) convert from more than their type (numpy integers): pybind11's message then.
    given_values = dict(zip(positional, args), **kwargs)
    for key, value in given_values.items():
        expected = types.get(key, "object")
        if expected.startswith("attn.") and type(value).__name__ != expected.rsplit(".", 1)[-1]:
            shown = expected.replace("._attn.", ".")
            return f"{name}(): {key}: expected {shown} but got {type(value).__name__}"
    return None  # something else pybind11 could not convert: its own message


def out_of_memory(call, error):
    """The message of the MemoryError that `call` ("attn.KVCache.append") raised: its name first."""
    said = str(error)
    if said in ("", "std::bad_alloc"):  # a C++ allocation that named nothing
        said = "out of memory (std::bad_alloc: the allocation that failed has no name)"
    elif "out of memory" not in said:  # numpy's own "Unable to allocate …" (an input's copy)
        said = "out of memory: " + said
    return f"{call}: {said}"


def concise(function, name=None, call_name=None):
    """function, raising the one-line TypeError above instead of pybind11's dump, and a
    MemoryError naming `call_name` (default `name`)."""
    params = parameters(function.__doc__)
    name = name or function.__name__
    call_name = call_name or name
    is_method = "(self: " in (function.__doc__ or "").split("\n", 1)[0]

    @functools.wraps(function)
    def call(*args, **kwargs):
        try:
            return function(*args, **kwargs)
        except MemoryError as e:
            raise MemoryError(out_of_memory(call_name, e)) from None
        except TypeError as e:
            if params is None:
                raise
            if "incompatible function arguments" not in str(e) and "incompatible constructor arguments" not in str(e):
                raise
            # A method's args include self, which the signature's names do not.
            message = _message(name, params, args[1:] if is_method else args, kwargs)
            if message is None:
                raise
        raise TypeError(message)

    return call


def apply(namespace, module_name, prefix=None):
    """Wraps every extension function of `namespace` (a module's globals or a submodule) and the
    public methods, __call__ and the constructor of its classes whose home is `module_name`.
    `prefix` (default `module_name`) is the namespace's public name, for MemoryError: "attn.dist"."""
    prefix = prefix or module_name
    for key, value in list(namespace.items()):
        if type(value).__name__ == "builtin_function_or_method" and not key.startswith("__"):
            namespace[key] = concise(value, call_name=f"{prefix}.{value.__name__}")
        elif isinstance(value, type) and value.__module__ == module_name:
            home = f"{prefix}.{value.__name__}"
            for attr, method in list(vars(value).items()):
                if type(method).__name__ != "instancemethod":
                    continue
                if attr == "__init__":
                    setattr(value, attr, concise(method, value.__name__, home))  # "KVCache(): unexpected keyword …"
                elif attr == "__call__":
                    setattr(value, attr, concise(method, f"{value.__name__}.{attr}", home))
                elif not attr.startswith("_"):
                    setattr(value, attr, concise(method, f"{value.__name__}.{attr}", f"{home}.{attr}"))
