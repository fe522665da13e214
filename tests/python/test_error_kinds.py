"""TypeError or ValueError by what an error is about, given where it is raised (attn::ErrorKind),
not by the words of its message: the translator made TypeError of any message that contained
"dtype" and ValueError of the rest, so a value problem that mentions a dtype (a name, a path)
was a TypeError and a dtype problem worded otherwise ("an (N+1,) int32 or int64 tensor") a
ValueError (docs/errors.md, "In Python")."""
import numpy as np
import pytest

import attn

F32 = np.float32


def qkv(b=1, h=2, lq=4, lk=6, d=8):
    rng = np.random.default_rng(0)
    return (rng.standard_normal((b, h, lq, d)).astype(F32), rng.standard_normal((b, h, lk, d)).astype(F32),
            rng.standard_normal((b, h, lk, d)).astype(F32))


def layer():
    return attn.MultiheadAttention(8, 2)


# A value problem whose message happens to hold the word "dtype".
def unexpected_tensor_named_dtype():
    m = layer()
    sd = m.state_dict()
    sd["in_proj_dtype"] = np.zeros(3, F32)  # a stray key, not a dtype problem
    m.load_state_dict(sd)


def unwritable_path_with_dtype(tmp_path):
    attn.save_safetensors(str(tmp_path / "no_dtype_dir" / "w.safetensors"), {"w": np.zeros(2, F32)})


@pytest.mark.parametrize("call, words", [
    (lambda tmp: unexpected_tensor_named_dtype(), ["unexpected tensor 'in_proj_dtype'"]),
    (unwritable_path_with_dtype, ["no_dtype_dir"]),
])
def test_a_value_problem_that_mentions_dtype_is_a_value_error(call, words, tmp_path):
    with pytest.raises(ValueError) as e:
        call(tmp_path)
    assert not isinstance(e.value, TypeError)
    assert "dtype" in str(e.value)
    for w in words:
        assert w in str(e.value), str(e.value)


def _sdpa(**kw):
    q, k, v = qkv()
    args = dict(query=q, key=k, value=v)
    args.update(kw)
    return attn.scaled_dot_product_attention(**args)


def _varlen(q_dtype=F32, cu_dtype=np.int32):
    x = np.zeros((6, 2, 8), q_dtype)
    cu = np.array([0, 2, 6], cu_dtype)
    return attn.sdpa_varlen(x, np.zeros((6, 2, 8), F32), np.zeros((6, 2, 8), F32), cu, cu)


def _cache(**kw):
    return attn.KVCache(1, 2, 8, 16, **kw)


def _packed_cu(dtype):
    return layer().forward_packed(np.zeros((5, 8), F32), np.array([0, 2, 5], dtype))


def _state_dict_int():
    m = layer()
    sd = m.state_dict()
    sd["in_proj_weight"] = sd["in_proj_weight"].astype(np.int32)
    m.load_state_dict(sd)


# Every dtype refusal the module reaches, from the core's checks and the binding's: the message
# names the argument and the dtype it was given. (Each was a TypeError by its words before; now
# by the kind its check gives, so a check that gives none fails here.)
@pytest.mark.parametrize("call, words", [
    (lambda: _sdpa(query=np.zeros((1, 2, 4, 8), np.int32)), ["Q", "int32"]),
    (lambda: _sdpa(attn_mask=np.zeros((4, 6), np.int32)), ["attn_mask", "int32"]),
    (lambda: _sdpa(key_lengths=np.array([3.0], F32)), ["key_lengths", "float32"]),
    (lambda: _sdpa(query_offset=np.array([1.0], F32)), ["query_offset", "float32"]),
    (lambda: _sdpa(alibi_slopes=np.ones(2, np.int64)), ["alibi_slopes", "int64"]),  # float64: rounded
    (lambda: _sdpa(sinks=np.ones(2, np.int32)), ["sinks", "int32"]),
    (lambda: _sdpa(out_dtype="int8"), ["out_dtype", "int8"]),
    (lambda: _sdpa(dtype="float16"), ["dtype", "float16"]),
    (lambda: _varlen(q_dtype=np.int32), ["q", "int32"]),
    (lambda: _varlen(cu_dtype=F32), ["cu_seqlens_q", "float32"]),
    (lambda: _cache().append(np.zeros((1, 2, 3, 8), np.int32), np.zeros((1, 2, 3, 8), F32)), ["int32"]),
    (lambda: _cache(dtype="int8"), ["dtype", "int8"]),
    (lambda: layer()(np.zeros((3, 1, 8), np.int32), np.zeros((3, 1, 8), F32), np.zeros((3, 1, 8), F32)),
     ["query", "int32"]),
    (lambda: layer()(*(np.zeros((3, 1, 8), F32),) * 3, key_padding_mask=np.zeros((1, 3), np.int32)),
     ["key_padding_mask", "int32"]),
    (lambda: layer()(*(np.zeros((3, 1, 8), F32),) * 3, out_dtype="float64"), ["out_dtype", "float64"]),
    (lambda: layer().forward_incremental(np.zeros((1, 8), np.int32), _cache()), ["x_new", "int32"]),
    (lambda: _packed_cu(F32), ["cu_seqlens", "int32 or int64", "float32"]),
    (_state_dict_int, ["in_proj_weight", "int32"]),
])
def test_every_dtype_refusal_is_a_type_error(call, words):
    with pytest.raises(TypeError) as e:
        call()
    for w in words:
        assert w in str(e.value), str(e.value)
