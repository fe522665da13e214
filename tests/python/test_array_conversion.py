# Every array argument goes through one conversion (python/convert.cpp). Its rule: an array the
# kernels can read in place (any strides that are whole elements — transposed, negative, zero —
# and read-only buffers) is read in place; any other (non-native byte order, a data pointer or
# stride not aligned to the element) is copied once to a native, aligned array, and the copy is
# counted. Here each argument kind is sent in each odd layout and byte order, and the result
# must equal, bit for bit, the same call on a plain native C-contiguous copy of the same values
# — before the rule, big-endian arrays were read as if little-endian (errors up to 1e38, masked
# keys visible). Then: wrong argument types and unconvertible arrays are TypeError/ValueError
# naming the argument, and an allocation failure is a MemoryError with the size.
import numpy as np
import pytest

import attn

B, H, LQ, LK, D = 2, 2, 5, 7, 8
E, HEADS = 8, 2


def native(a):
    """The same values as a plain native-order C-contiguous array (the reference call's input)."""
    return np.array(a, dtype=a.dtype.newbyteorder("="), order="C")


def big_endian(a):
    return a.astype(a.dtype.newbyteorder(">"))


def little_endian(a):
    return a.astype(a.dtype.newbyteorder("<"))


def every_other(a):
    """A view with the values at every second element of a larger buffer (non-contiguous)."""
    if a.ndim == 0:
        return a
    wide = np.zeros(a.shape[:-1] + (2 * a.shape[-1],), a.dtype)
    wide[..., ::2] = a
    return wide[..., ::2]


def fortran(a):
    return np.asfortranarray(a)


def reversed_strides(a):
    """Every axis with a negative stride."""
    return np.flip(np.flip(a).copy())


def zero_stride(a):
    """The first axis broadcast from its first entry (stride 0): other values than `a`."""
    return np.broadcast_to(a[:1], a.shape) if a.ndim else a


def read_only(a):
    a = a.copy()
    a.setflags(write=False)
    return a


def misaligned(a):
    """The same values in a buffer one byte off the element's alignment."""
    buf = np.zeros(a.nbytes + 1, np.uint8)
    buf[1:] = np.ascontiguousarray(a).view(np.uint8).ravel()
    return np.frombuffer(buf, dtype=a.dtype, offset=1).reshape(a.shape)


def odd_byte_stride(a):
    """A field of a packed structured array: byte strides not a multiple of the item size."""
    s = np.zeros(a.shape, dtype=[("pad", "u1"), ("x", a.dtype)])
    s["x"] = a
    return s["x"]


# name → (layout, does the conversion copy it? given the item size)
LAYOUTS = {
    "big-endian": (big_endian, lambda item: item > 1),
    "little-endian": (little_endian, lambda item: False),  # native here: no copy
    "big-endian, non-contiguous": (lambda a: every_other(big_endian(a)), lambda item: item > 1),
    "big-endian, negative strides": (lambda a: reversed_strides(big_endian(a)), lambda item: item > 1),
    "non-contiguous": (every_other, lambda item: False),
    "fortran order": (fortran, lambda item: False),
    "negative strides": (reversed_strides, lambda item: False),
    "zero stride": (zero_stride, lambda item: False),
    "read-only": (read_only, lambda item: False),
    "misaligned by 1 byte": (misaligned, lambda item: item > 1),
    "byte stride not a multiple of the item": (odd_byte_stride, lambda item: item > 1),
}


def rng(seed=0):
    return np.random.default_rng(seed)


def qkv(dtype=np.float32, seed=0):
    r = rng(seed)
    return (r.standard_normal((B, H, LQ, D)).astype(dtype), r.standard_normal((B, H, LK, D)).astype(dtype),
            r.standard_normal((B, H, LK, D)).astype(dtype))


def additive_mask(dtype, seed=1):
    m = rng(seed).standard_normal((B, 1, LQ, LK)).astype(dtype) * 3
    m[:, :, :, 3] = -np.inf  # masked keys: a misread -inf becomes a finite (visible) score
    m[0, 0, 1, :] = -np.inf  # a fully masked row
    return m


def bool_mask(seed=2):
    m = rng(seed).random((B, 1, LQ, LK)) < 0.6
    m[..., 0] = True
    return m


def sdpa_all(q, k, v, **kw):
    return attn.sdpa(q, k, v, return_lse=True, return_weights=True, **kw)


# Argument kinds: name → (the native array, a call taking it that returns a tuple of arrays).
def _kinds():
    q, k, v = qkv()
    q64, k64, v64 = qkv(np.float64, seed=3)
    kinds = {
        "query f32": (q, lambda a: sdpa_all(a, k, v)),
        "key f32": (k, lambda a: sdpa_all(q, a, v)),
        "value f32": (v, lambda a: sdpa_all(q, k, a)),
        "query f64": (q64, lambda a: sdpa_all(a, k64, v64)),
        "key f64": (k64, lambda a: sdpa_all(q64, a, v64)),
        "value f64": (v64, lambda a: sdpa_all(q64, k64, a)),
        "attn_mask bool": (bool_mask(), lambda a: sdpa_all(q, k, v, attn_mask=a)),
        "attn_mask f32": (additive_mask(np.float32), lambda a: sdpa_all(q, k, v, attn_mask=a)),
        "attn_mask f64": (additive_mask(np.float64), lambda a: sdpa_all(q64, k64, v64, attn_mask=a)),
        "key_lengths i64": (np.array([4, 7], np.int64), lambda a: sdpa_all(q, k, v, key_lengths=a, is_causal=True,
                                                                            causal_alignment="bottom-right")),
        "key_lengths i32": (np.array([6, 3], np.int32), lambda a: sdpa_all(q, k, v, key_lengths=a)),
        "query_offset i64": (np.array([1, 3], np.int64), lambda a: sdpa_all(q, k, v, query_offset=a, is_causal=True)),
        "query_offset i32": (np.array([2, -1], np.int32),
                             lambda a: sdpa_all(q, k, v, query_offset=a, window=(2, 1))),
    }
    # The backward's extra inputs: out, lse, grad_out.
    o, lse, _ = sdpa_all(q, k, v, is_causal=True)
    g = rng(4).standard_normal(o.shape).astype(np.float32)
    bwd = attn.scaled_dot_product_attention_backward
    kinds["backward grad_out"] = (g, lambda a: bwd(q, k, v, o, lse, a, is_causal=True))
    kinds["backward lse"] = (lse, lambda a: bwd(q, k, v, o, a, g, is_causal=True))
    kinds["backward out"] = (o, lambda a: bwd(q, k, v, a, lse, g, is_causal=True))
    kinds["backward query"] = (q, lambda a: bwd(a, k, v, o, lse, g, is_causal=True))
    return kinds


KINDS = _kinds()


def mha_state(dtype, seed=5):
    r = rng(seed)
    return {"in_proj_weight": r.standard_normal((3 * E, E)).astype(dtype) * 0.3,
            "in_proj_bias": r.standard_normal(3 * E).astype(dtype),
            "out_proj.weight": r.standard_normal((E, E)).astype(dtype) * 0.3,
            "out_proj.bias": r.standard_normal(E).astype(dtype)}


def mha_forward(state, x, **kw):
    m = attn.MultiheadAttention(E, HEADS, batch_first=True)
    m.load_state_dict(state)
    out, w = m(x, x, x, **kw)
    return out, w


MHA_X = rng(6).standard_normal((B, LK, E)).astype(np.float32)
KPM = rng(7).random((B, LK)) < 0.3
KPM[:, 0] = False


def check_layout(name, native_arg, call, layout):
    make, copies = LAYOUTS[layout]
    odd = make(native_arg)
    ref = call(native(odd))
    before = attn._input_copies()
    got = call(odd)
    expected_copies = 1 if copies(native_arg.dtype.itemsize) else 0
    assert attn._input_copies() - before == expected_copies, f"{name}, {layout}: copies"
    for r, g in zip(ref if isinstance(ref, tuple) else (ref,), got if isinstance(got, tuple) else (got,)):
        if r is None:
            assert g is None
            continue
        np.testing.assert_array_equal(g, r, err_msg=f"{name}, {layout}")


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("kind", list(KINDS))
def test_sdpa_arguments_in_every_layout(kind, layout):
    native_arg, call = KINDS[kind]
    # (The backward's out and lse are inputs: a broadcast one is read like any other layout.)
    check_layout(kind, native_arg, call, layout)


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_mha_state_dict_weights_in_every_layout(dtype, layout):
    state = mha_state(dtype)
    make, copies = LAYOUTS[layout]
    odd = {n: make(a) for n, a in state.items()}
    ref = mha_forward({n: native(a) for n, a in odd.items()}, MHA_X)
    before = attn._input_copies()
    got = mha_forward(odd, MHA_X)
    assert attn._input_copies() - before == (len(state) if copies(np.dtype(dtype).itemsize) else 0)
    for r, g in zip(ref, got):
        np.testing.assert_array_equal(g, r, err_msg=layout)


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("kind", ["query", "key_padding_mask bool", "key_padding_mask f32", "attn_mask f32",
                                  "attn_mask bool"])
def test_mha_forward_inputs_in_every_layout(kind, layout):
    state = mha_state(np.float32)
    keep = bool_mask()[0, 0, :, :LK]
    arrays = {"query": MHA_X, "key_padding_mask bool": KPM,
              "key_padding_mask f32": np.where(KPM, -np.inf, 0.5).astype(np.float32),
              # (Lq, Lk) masks on a cross-attention of Lq = LQ queries over the LK tokens of MHA_X;
              # torch's convention for bool: True = masked.
              "attn_mask f32": additive_mask(np.float32)[0, 0].copy(), "attn_mask bool": ~keep}

    def call(a):
        if kind == "query":
            return mha_forward(state, a)
        m = attn.MultiheadAttention(E, HEADS, batch_first=True)
        m.load_state_dict(state)
        if kind.startswith("key_padding_mask"):
            return m(MHA_X, MHA_X, MHA_X, key_padding_mask=a)
        return m(MHA_X[:, :LQ], MHA_X, MHA_X, attn_mask=a)

    check_layout(kind, arrays[kind], call, layout)


def cache_after_append(k_new, v_new, one_sequence=False, dtype="float32"):
    c = attn.KVCache(B, H, D, 16, dtype=dtype)
    if one_sequence:  # after a batch append, so that every sequence has keys for decode
        c.append(*qkv(seed=11)[1:])
        c.append(k_new, v_new, batch_index=1)
    else:
        c.append(k_new, v_new)
    q = rng(8).standard_normal((B, H, 2, D)).astype(np.float32)
    out, lse = attn.decode_attention(q, c, return_lse=True)
    # Only each sequence's filled rows: the storage beyond them holds nothing defined.
    n = c.lengths
    filled = tuple(x[b, :, :n[b]] for x in (c.keys(), c.values()) for b in range(B))
    return filled + (n, out, lse)


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("kind", ["k_new f32", "v_new f32", "k_new f16", "v_new f64", "one sequence k_new",
                                  "decode query"])
def test_kv_cache_inputs_in_every_layout(kind, layout):
    _, k, v = qkv(seed=9)
    if kind == "k_new f16":
        arg, call = k.astype(np.float16), lambda a: cache_after_append(a, v.astype(np.float16), dtype="float16")
    elif kind == "v_new f64":
        arg, call = v.astype(np.float64), lambda a: cache_after_append(k.astype(np.float64), a)
    elif kind == "k_new f32":
        arg, call = k, lambda a: cache_after_append(a, v)
    elif kind == "v_new f32":
        arg, call = v, lambda a: cache_after_append(k, a)
    elif kind == "one sequence k_new":
        arg, call = k[0].copy(), lambda a: cache_after_append(a, v[0], one_sequence=True)
    else:
        c = attn.KVCache(B, H, D, 16)
        c.append(k, v)
        arg = rng(10).standard_normal((B, H, 3, D)).astype(np.float32)

        def call(a):
            return attn.decode_attention(a, c, return_lse=True)
    check_layout(kind, arg, call, layout)


def test_big_endian_is_read_as_its_values_not_its_bytes():
    # Independent of the native-copy comparison: the big-endian call equals the textbook.
    from reference import close, textbook
    q, k, v = qkv()
    m = additive_mask(np.float32)
    ref, _, _ = textbook(q, k, v, bias=m)
    close(attn.sdpa(big_endian(q), big_endian(k), big_endian(v), attn_mask=big_endian(m)), ref)


# ---- errors: never pybind11's "Unable to cast" / "incompatible function arguments" ------------

def _cache():
    c = attn.KVCache(B, H, D, 16)
    _, k, v = qkv()
    c.append(k, v)
    return c


def _mha():
    m = attn.MultiheadAttention(E, HEADS, batch_first=True)
    m.load_state_dict(mha_state(np.float32))
    return m


Q, K, V = qkv()
X = MHA_X
# (label, call, exception, the argument the message must name)
BAD_ARGUMENTS = [
    ("sdpa scale str", lambda: attn.sdpa(Q, K, V, scale="x"), TypeError, "scale"),
    ("sdpa scale list", lambda: attn.sdpa(Q, K, V, scale=[1.0]), TypeError, "scale"),
    ("sdpa scale bool", lambda: attn.sdpa(Q, K, V, scale=True), TypeError, "scale"),
    ("sdpa dropout_p str", lambda: attn.sdpa(Q, K, V, dropout_p="0.1"), TypeError, "dropout_p"),
    ("sdpa is_causal str", lambda: attn.sdpa(Q, K, V, is_causal="yes"), TypeError, "is_causal"),
    ("sdpa is_causal array", lambda: attn.sdpa(Q, K, V, is_causal=np.array([1, 0])), TypeError, "is_causal"),
    ("sdpa causal_alignment int", lambda: attn.sdpa(Q, K, V, is_causal=True, causal_alignment=1), TypeError,
     "causal_alignment"),
    ("sdpa window_alignment None", lambda: attn.sdpa(Q, K, V, window_alignment=None), TypeError,
     "window_alignment"),
    ("sdpa window int", lambda: attn.sdpa(Q, K, V, window=5), TypeError, "window"),
    ("sdpa window str side", lambda: attn.sdpa(Q, K, V, window=("a", 1)), TypeError, "window"),
    ("sdpa return_lse str", lambda: attn.sdpa(Q, K, V, return_lse="yes"), TypeError, "return_lse"),
    ("sdpa return_weights None", lambda: attn.sdpa(Q, K, V, return_weights=None), TypeError, "return_weights"),
    ("sdpa dropout_seed negative", lambda: attn.sdpa(Q, K, V, dropout_seed=-1), ValueError, "dropout_seed"),
    ("sdpa dropout_seed 2**64", lambda: attn.sdpa(Q, K, V, dropout_seed=2**64), ValueError, "dropout_seed"),
    ("sdpa dropout_seed float", lambda: attn.sdpa(Q, K, V, dropout_seed=1.5), TypeError, "dropout_seed"),
    ("sdpa impl int", lambda: attn.sdpa(Q, K, V, impl=3), TypeError, "impl"),
    ("sdpa query_offset str", lambda: attn.sdpa(Q, K, V, query_offset="x"), TypeError, "query_offset"),
    ("sdpa query_offset float", lambda: attn.sdpa(Q, K, V, query_offset=1.5), TypeError, "query_offset"),
    ("sdpa query_offset 2**70", lambda: attn.sdpa(Q, K, V, query_offset=2**70), ValueError, "query_offset"),
    ("sdpa key_lengths floats", lambda: attn.sdpa(Q, K, V, key_lengths=[1.5, 2.0]), TypeError, "key_lengths"),
    ("sdpa mask uint8", lambda: attn.sdpa(Q, K, V, attn_mask=np.ones((LQ, LK), np.uint8)), TypeError,
     "attn_mask"),
    ("sdpa mask complex big-endian", lambda: attn.sdpa(Q, K, V, attn_mask=np.ones((LQ, LK), ">c8")), TypeError,
     "attn_mask"),
    ("backward dropout_p str", lambda: attn.sdpa_backward(Q, K, V, Q, Q[..., 0], Q, dropout_p="x"), TypeError,
     "dropout_p"),
    ("KVCache batch str", lambda: attn.KVCache("2", H, D, 16), TypeError, "batch"),
    ("KVCache head_dim float", lambda: attn.KVCache(B, H, 8.0, 16), TypeError, "head_dim"),
    ("KVCache capacity 2**70", lambda: attn.KVCache(B, H, D, 2**70), ValueError, "capacity"),
    ("KVCache value_dim str", lambda: attn.KVCache(B, H, D, 16, value_dim="4"), TypeError, "value_dim"),
    ("KVCache dtype numpy int type", lambda: attn.KVCache(B, H, D, 16, dtype=np.int8), TypeError, "dtype"),
    ("PagedKVCache dtype torch int", lambda: attn.PagedKVCache(H, D, 4, dtype=__import__("torch").int8), TypeError, "dtype"),
    ("KVCache grow str", lambda: attn.KVCache(B, H, D, 16, grow="yes"), TypeError, "grow"),
    ("KVCache max_capacity None", lambda: attn.KVCache(B, H, D, 16, max_capacity=None), TypeError,
     "max_capacity"),
    ("append batch_index str", lambda: _cache().append(K[0], V[0], batch_index="1"), TypeError, "batch_index"),
    ("append batch_index float", lambda: _cache().append(K[0], V[0], batch_index=1.0), TypeError, "batch_index"),
    ("truncate new_length str", lambda: _cache().truncate("3"), TypeError, "new_length"),
    ("truncate batch_index float", lambda: _cache().truncate(3, batch_index=0.0), TypeError, "batch_index"),
    ("reset batch_index str", lambda: _cache().reset(batch_index="0"), TypeError, "batch_index"),
    ("reserve None", lambda: _cache().reserve(None), TypeError, "capacity"),
    ("decode scale str", lambda: attn.decode_attention(Q, _cache(), scale="x"), TypeError, "scale"),
    ("decode window_left float", lambda: attn.decode_attention(Q, _cache(), window_left=1.5), TypeError,
     "window_left"),
    ("decode return_lse None", lambda: attn.decode_attention(Q, _cache(), return_lse=None), TypeError,
     "return_lse"),
    ("decode is_causal int array", lambda: attn.decode_attention(Q, _cache(), is_causal=np.ones(2)), TypeError,
     "is_causal"),
    ("MHA embed_dim str", lambda: attn.MultiheadAttention("8", 2), TypeError, "embed_dim"),
    ("MHA num_heads float", lambda: attn.MultiheadAttention(8, 2.0), TypeError, "num_heads"),
    ("MHA kdim str", lambda: attn.MultiheadAttention(8, 2, kdim="x"), TypeError, "kdim"),
    ("MHA vdim 2**70", lambda: attn.MultiheadAttention(8, 2, vdim=2**70), ValueError, "vdim"),
    ("MHA num_kv_heads list", lambda: attn.MultiheadAttention(8, 2, num_kv_heads=[1]), TypeError,
     "num_kv_heads"),
    # An explicit 0 is not the default (torch reads kdim=0 as a 0-wide key): refused.
    ("MHA kdim 0", lambda: attn.MultiheadAttention(8, 2, kdim=0), ValueError, "kdim"),
    ("MHA vdim -1", lambda: attn.MultiheadAttention(8, 2, vdim=-1), ValueError, "vdim"),
    ("MHA num_kv_heads 0", lambda: attn.MultiheadAttention(8, 2, num_kv_heads=0), ValueError, "num_kv_heads"),
    ("MHA bias str", lambda: attn.MultiheadAttention(8, 2, bias="no"), TypeError, "bias"),
    ("MHA batch_first None", lambda: attn.MultiheadAttention(8, 2, batch_first=None), TypeError, "batch_first"),
    ("MHA dropout str", lambda: attn.MultiheadAttention(8, 2, dropout="0"), TypeError, "dropout"),
    ("MHA dtype object", lambda: attn.MultiheadAttention(8, 2, dtype=object()), TypeError, "dtype"),
    ("MHA dtype float64", lambda: attn.MultiheadAttention(8, 2, dtype="float64"), TypeError, "dtype"),
    ("MHA forward need_weights str", lambda: _mha()(X, X, X, need_weights="no"), TypeError, "need_weights"),
    ("MHA forward average_attn_weights None", lambda: _mha()(X, X, X, average_attn_weights=None), TypeError,
     "average_attn_weights"),
    ("MHA forward is_causal str", lambda: _mha().forward(X, X, X, is_causal="no"), TypeError, "is_causal"),
    ("MHA forward impl None", lambda: _mha()(X, X, X, impl=None), TypeError, "impl"),
    ("MHA load_state_dict list", lambda: _mha().load_state_dict([("in_proj_weight", 1)]), TypeError,
     "state_dict"),
    ("MHA load_state_dict int key", lambda: _mha().load_state_dict({1: X}), TypeError, "state_dict"),
    ("MHA load_safetensors int", lambda: _mha().load_safetensors(123), TypeError, "path"),
    # These four gave pybind11's signature dump, or named another argument:
    ("decode cache None", lambda: attn.decode_attention(Q, None), TypeError, "cache"),
    ("decode window_left -5", lambda: attn.decode_attention(Q, _cache(), window_left=-5), ValueError,
     "window_left"),
    ("alibi_slopes heads str", lambda: attn.alibi_slopes("4"), TypeError, "heads"),
    # set_num_threads took pybind11's int caster: True was 1, "2" and 2**40 its signature dump.
    ("set_num_threads bool", lambda: attn.set_num_threads(True), TypeError, "n"),
    ("set_num_threads str", lambda: attn.set_num_threads("2"), TypeError, "n"),
    ("set_num_threads 2**40", lambda: attn.set_num_threads(2**40), ValueError, "set_num_threads"),
    ("packed MHA cu_seqlens short", lambda: _mha().forward_packed(np.zeros((6, E), np.float32), np.array([0, 3, 5])), ValueError,
     "cu_seqlens"),
]

RAGGED = [[1.0, 2.0], [3.0]]
OBJECTS = np.array([[object(), object()]], dtype=object)
BAD_ARRAYS = [
    ("query ragged", lambda: attn.sdpa(RAGGED, K, V), "query"),
    ("key objects", lambda: attn.sdpa(Q, OBJECTS, V), "key"),
    ("value of None", lambda: attn.sdpa(Q, K, [[None, None]]), "value"),
    ("attn_mask ragged", lambda: attn.sdpa(Q, K, V, attn_mask=RAGGED), "attn_mask"),
    ("attn_mask objects", lambda: attn.sdpa(Q, K, V, attn_mask=OBJECTS), "attn_mask"),
    ("key_lengths ragged", lambda: attn.sdpa(Q, K, V, key_lengths=[[1], [2, 3]]), "key_lengths"),
    ("key_lengths str", lambda: attn.sdpa(Q, K, V, key_lengths="7"), "key_lengths"),
    ("query_offset ragged", lambda: attn.sdpa(Q, K, V, query_offset=[[1], [2, 3]]), "query_offset"),
    ("backward grad_out ragged", lambda: attn.sdpa_backward(Q, K, V, Q, Q[..., 0], RAGGED), "grad_out"),
    ("append k_new ragged", lambda: _cache().append(RAGGED, V), "k_new"),
    ("append v_new objects", lambda: _cache().append(K, OBJECTS), "v_new"),
    ("state_dict value ragged", lambda: _mha().load_state_dict({"in_proj_weight": RAGGED}),
     "state_dict['in_proj_weight']"),
    ("MHA key_padding_mask ragged", lambda: _mha()(X, X, X, key_padding_mask=RAGGED), "key_padding_mask"),
    ("decode query objects", lambda: attn.decode_attention(OBJECTS, _cache()), "query"),
    ("query None", lambda: attn.sdpa(None, K, V), "query"),  # said "got shape ()" (numpy's view of None)
    ("query str", lambda: attn.sdpa("abc", K, V), "query"),   # as None: a 0-d string array
    ("key bytes", lambda: attn.sdpa(Q, b"abc", V), "key"),
]

PYBIND_INTERNALS = ("Unable to cast", "incompatible function arguments", "Internal error", "error_already_set")


@pytest.mark.parametrize("label, call, exc, name", BAD_ARGUMENTS, ids=[b[0] for b in BAD_ARGUMENTS])
def test_wrong_argument_types_name_the_argument(label, call, exc, name):
    with pytest.raises(exc) as e:
        call()
    msg = str(e.value)
    assert msg.startswith(name + ":") or f"{name}:" in msg, msg
    assert not any(s in msg for s in PYBIND_INTERNALS), msg


@pytest.mark.parametrize("label, call, name", BAD_ARRAYS, ids=[b[0] for b in BAD_ARRAYS])
def test_unconvertible_arrays_name_the_argument(label, call, name):
    with pytest.raises((TypeError, ValueError)) as e:
        call()
    msg = str(e.value)
    assert f"{name}:" in msg, msg
    assert not any(s in msg for s in PYBIND_INTERNALS), msg



# A dict key with a lone surrogate has no UTF-8 form: a ValueError naming the dict's keys, before
# any file exists (pybind11's cast said only "Unable to cast Python instance to C++ type").
@pytest.mark.parametrize("what", ["tensors", "state_dict"])
def test_a_key_that_is_not_utf8_is_named(tmp_path, what):
    out = tmp_path / "p.safetensors"
    entry = {"in_proj_weight\ud800": np.zeros((3 * E, E), np.float32)}
    with pytest.raises(ValueError) as e:
        if what == "tensors":
            attn.save_safetensors(str(out), entry)
        else:
            _mha().load_state_dict(entry)
    msg = str(e.value)
    assert msg.startswith(what + " key: expected a str encodable as UTF-8"), msg
    assert not any(s in msg for s in PYBIND_INTERNALS), msg
    assert list(tmp_path.iterdir()) == []


BIG = np.zeros((2, 8, 1024, 64), np.float32)
CALLS_THAT_DO_NOT_FIT = [
    ("misspelt keyword", lambda: attn.sdpa(BIG, BIG, BIG, is_casual=True),
     "scaled_dot_product_attention(): unexpected keyword argument 'is_casual' (did you mean 'is_causal'?)"),
    ("backward keyword", lambda: attn.sdpa_backward(BIG, BIG, BIG, BIG, BIG[..., 0], BIG, windw=(1, 1)),
     "scaled_dot_product_attention_backward(): unexpected keyword argument 'windw' (did you mean 'window'?)"),
    ("too many positional", lambda: attn.sdpa(BIG, BIG, BIG, None, 0.0, False, None, "top-left"),
     "scaled_dot_product_attention() takes at most 7 positional arguments (query, key, value, attn_mask, "
     "dropout_p, is_causal, scale) but 8 were given; the others are keyword-only: causal_alignment"),
    ("missing", lambda: attn.sdpa(BIG, BIG), "scaled_dot_product_attention() missing required argument: 'value'"),
    ("twice", lambda: attn.sdpa(BIG, BIG, BIG, key=BIG), "scaled_dot_product_attention(): got multiple values for argument 'key'"),
    ("method keyword", lambda: attn.MultiheadAttention(64, 4)(BIG[0], BIG[0], BIG[0], need_weight=False),
     "MultiheadAttention.__call__(): unexpected keyword argument 'need_weight' (did you mean 'need_weights'?)"),
    ("nothing close", lambda: _cache().append(BIG, BIG, zzz=1),
     "KVCache.append(): unexpected keyword argument 'zzz' (it takes: k_new, v_new, batch_index, dtype)"),
    ("class argument", lambda: attn.paged_attention(BIG, 3, [0]), "paged_attention(): cache: expected attn.PagedKVCache but got int"),
    ("constructor keyword", lambda: attn.MultiheadAttention(64, 4, batchfirst=True),
     "MultiheadAttention(): unexpected keyword argument 'batchfirst' (did you mean 'batch_first'?)"),
    ("constructor missing", lambda: attn.KVCache(1, 2), "KVCache() missing required arguments: 'head_dim', 'capacity'"),
]


@pytest.mark.parametrize("label, call, want", CALLS_THAT_DO_NOT_FIT, ids=[c[0] for c in CALLS_THAT_DO_NOT_FIT])
def test_a_call_that_does_not_fit_gets_one_line(label, call, want):
    # pybind11 printed every argument's repr: about 10 000 characters for these arrays, the
    # mistake at the end (an exploratory test found it).
    with pytest.raises(TypeError) as e:
        call()
    msg = str(e.value)
    assert msg.startswith(want), msg
    assert len(msg) < 400 and "\n" not in msg and not any(s in msg for s in PYBIND_INTERNALS), msg


@pytest.mark.parametrize("dtype", [bool, np.float32])
def test_a_mask_error_names_attn_mask_not_the_cores_option(dtype):
    # The core calls the two kinds bool_mask and additive_mask; the Python caller gave attn_mask.
    q = np.ones((1, 2, 3, 4), np.float32)
    m = np.ones((5, 3, 3), dtype)
    for call in (lambda: attn.sdpa(q, q, q, attn_mask=m), lambda: attn.sdpa_backward(q, q, q, q, q[..., 0], q, attn_mask=m)):
        with pytest.raises(ValueError, match=r"attn_mask: shape \(5, 3, 3\) cannot be broadcast") as e:
            call()
        assert "bool_mask" not in str(e.value) and "additive_mask" not in str(e.value)

def test_scalars_of_numpy_types_are_accepted():
    # numpy scalars and 0-d arrays are numbers as much as Python's: same result as the Python call.
    ref = attn.sdpa(Q, K, V, scale=0.25, is_causal=True, dropout_p=0.0)
    for scale in (np.float32(0.25), np.float64(0.25), np.array(0.25)):
        np.testing.assert_array_equal(attn.sdpa(Q, K, V, scale=scale, is_causal=np.bool_(True)), ref)
    np.testing.assert_array_equal(attn.sdpa(Q, K, V, alibi_slopes=np.bool_(True)), attn.sdpa(Q, K, V, alibi_slopes=True))
    c = attn.KVCache(np.int64(B), np.int32(H), np.int16(D), np.uint8(16))
    c.append(K[0], V[0], batch_index=np.int64(1))
    assert list(c.lengths) == [0, LK]


HUGE = 2**50  # elements: ~4 PiB of float32, more than any machine here


@pytest.mark.parametrize("what", ["big-endian query copy", "misaligned key copy", "output"])
def test_allocation_failure_is_memory_error_with_the_size(what):
    # A later argument is unconvertible, so that a conversion that did not copy fails at once
    # (TypeError) instead of computing attention over 2**47 keys.
    if what == "big-endian query copy":
        q = np.broadcast_to(np.zeros((1, 1, 1, 1), ">f4"), (1, 1, HUGE // D, D))  # zero strides: no memory
        call = lambda: attn.sdpa(q, RAGGED, V[:1, :1])  # noqa: E731
    elif what == "misaligned key copy":
        k = np.broadcast_to(misaligned(np.zeros((1, 1, 1, D), np.float32)), (1, 1, HUGE // D, D))
        call = lambda: attn.sdpa(Q[:1, :1], k, RAGGED)  # noqa: E731
    else:
        q = np.broadcast_to(np.zeros((1, 1, 1, 1), np.float32), (1, 1, HUGE // D, D))
        call = lambda: attn.sdpa(q, K[:1, :1], V[:1, :1])  # noqa: E731
    with pytest.raises(MemoryError) as e:
        call()
    assert "PiB" in str(e.value), str(e.value)  # numpy's message: "Unable to allocate 4.00 PiB ..."
