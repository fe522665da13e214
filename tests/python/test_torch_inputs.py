# torch tensors as inputs: read in place like numpy arrays when they can be; a tensor that
# requires grad is a TypeError naming the argument and the ways out (.detach(), attn.torch)
# wherever it is passed — the NumPy functions have no autograd; attn.torch has — rather than
# torch's RuntimeError (or pybind11's "error indicator not set").
import numpy as np
import pytest
import torch

import attn
from reference import close, textbook


def grad_tensor(shape, dtype=torch.float32):
    return torch.randn(shape, dtype=dtype).requires_grad_()


def expect_detach_error(name, call):
    with pytest.raises(TypeError) as e:
        call()
    msg = str(e.value)
    assert name in msg and "requires_grad" in msg and ".detach()" in msg and "attn.torch" in msg, msg


@pytest.mark.parametrize("name", ["query", "key", "value", "attn_mask"])
def test_sdpa_arguments(name):
    args = dict(query=torch.randn(1, 2, 4, 8), key=torch.randn(1, 2, 6, 8), value=torch.randn(1, 2, 6, 8),
                attn_mask=torch.zeros(4, 6))
    args[name] = args[name].requires_grad_()
    expect_detach_error(name, lambda: attn.scaled_dot_product_attention(**args))


@pytest.mark.parametrize("name", ["query", "out", "lse", "grad_out"])
def test_sdpa_backward_arguments(name):
    q = np.random.default_rng(0).standard_normal((1, 2, 4, 8), dtype=np.float32)
    o, lse = attn.sdpa(q, q, q, return_lse=True)
    args = dict(query=q, key=q, value=q, out=o, lse=lse, grad_out=np.ones_like(o))
    args[name] = torch.from_numpy(args[name].copy()).requires_grad_()
    expect_detach_error(name, lambda: attn.sdpa_backward(**args))


def test_mha_forward_and_state_dict():
    m = attn.MultiheadAttention(8, 2)
    x = grad_tensor((5, 1, 8))
    expect_detach_error("query", lambda: m(x, x, x))
    expect_detach_error("key", lambda: m(x.detach(), x, x.detach()))
    expect_detach_error("key_padding_mask", lambda: m(x.detach(), x.detach(), x.detach(),
                                                      key_padding_mask=grad_tensor((1, 5))))
    t = torch.nn.MultiheadAttention(8, 2)
    # named_parameters() are leaves that require grad; state_dict() detaches them.
    expect_detach_error("state_dict['in_proj_weight']", lambda: m.load_state_dict(dict(t.named_parameters())))
    m.load_state_dict(t.state_dict())
    ref, _ = t.eval()(x, x, x)
    close(m(x.detach(), x.detach(), x.detach())[0], ref.detach().double().numpy(), atol=1e-5, rtol=1e-5)


def test_kv_cache_and_decode():
    cache = attn.KVCache(1, 2, 8, 16)
    k = grad_tensor((1, 2, 3, 8))
    expect_detach_error("k_new", lambda: cache.append(k, k.detach()))
    expect_detach_error("v_new", lambda: cache.append(k.detach(), k))
    assert cache.lengths.tolist() == [0]  # nothing written
    cache.append(k.detach(), k.detach())
    expect_detach_error("query", lambda: attn.decode_attention(grad_tensor((1, 2, 1, 8)), cache))


def test_detached_tensors_are_read_in_place():
    q, k, v = (grad_tensor((1, 2, 7, 16)) for _ in range(3))
    qt = q.detach().transpose(1, 2).contiguous().transpose(1, 2)  # (B, L, H, D) memory seen as (B, H, L, D)
    before = attn._input_copies()
    o = attn.sdpa(qt, k.detach(), v.detach(), is_causal=True)
    assert attn._input_copies() == before
    keep = np.tril(np.ones((7, 7), bool))
    close(o, textbook(qt.numpy(), k.detach().numpy(), v.detach().numpy(), keep)[0])


def test_unconvertible_objects_are_a_type_error_with_numpy_reason():
    class Bad:
        def __array__(self, dtype=None):
            raise RuntimeError("no array here")

    z = np.zeros((1, 1, 2, 4), np.float32)
    with pytest.raises(TypeError, match="key: expected an array .* Bad: .*no array here"):
        attn.sdpa(z, Bad(), z)
    # The reason is numpy's message alone: pybind11 appends the Python traceback ("At: ...").
    with pytest.raises(TypeError) as e:
        attn.sdpa(z, Bad(), z)
    assert "At:" not in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_bfloat16_tensor_says_how_to_pass_its_bits():
    # torch cannot export a bfloat16 tensor to NumPy; the message names the argument and the
    # two ways that work — and the first of them does work.
    q = torch.randn(1, 2, 5, 8).to(torch.bfloat16)
    with pytest.raises(TypeError, match=r'^query: a torch.bfloat16 tensor has no NumPy form; pass query.view\(torch.int16\)'):
        attn.sdpa(q, q, q)
    bits = q.view(torch.int16).numpy().view(np.uint16)
    got = attn.sdpa(bits, bits, bits, dtype="bfloat16", out_dtype="float32")
    q32 = q.float().numpy()
    close(got, textbook(q32, q32, q32, None)[0])


def test_bfloat16_state_dict_loads_as_it_is():
    # A bfloat16 torch module's state_dict: save_safetensors took it, load_state_dict refused it
    # (TypeError: pass .view(torch.int16)...). Both read a torch.bfloat16 tensor as its bits.
    torch.manual_seed(0)
    t = torch.nn.MultiheadAttention(16, 2, batch_first=True).bfloat16().eval()
    m = attn.MultiheadAttention(16, 2, batch_first=True, dtype="bfloat16")
    m.load_state_dict(t.state_dict())
    x = torch.randn(1, 5, 16).bfloat16()
    ref, _ = t.float()(x.float(), x.float(), x.float())  # the same bf16 weights, in float32
    bits = x.view(torch.int16).numpy().view(np.uint16)
    got, _ = m(bits, bits, bits, dtype="bfloat16", need_weights=False)  # bfloat16 out: its bits, uint16
    assert got.dtype == np.uint16
    got = torch.from_numpy(got.view(np.int16)).view(torch.bfloat16).float().numpy()
    # bfloat16 intermediates and output (8 bits of mantissa) against torch's float32 on the same weights.
    close(got, ref.detach().numpy(), atol=1e-2, rtol=1e-2)


def test_bfloat16_state_dict_entries_get_every_tensors_checks():
    # The bits path of a torch.bfloat16 entry detached it (requires_grad passed silently) and let
    # torch's own error through for a meta tensor, naming no entry.
    t = torch.nn.MultiheadAttention(16, 2, batch_first=True).bfloat16()
    m = attn.MultiheadAttention(16, 2, batch_first=True, dtype="bfloat16")
    expect_detach_error("state_dict['in_proj_weight']", lambda: m.load_state_dict(dict(t.named_parameters())))
    meta = {k: v.detach().to("meta") for k, v in t.state_dict().items()}
    with pytest.raises(TypeError, match=r"^state_dict\['in_proj_weight'\]: a torch.bfloat16 tensor whose bits"):
        m.load_state_dict(meta)
    # A transposed (strided) entry is read in place, not copied.
    strided = {k: (v.t().contiguous().t() if v.ndim == 2 else v) for k, v in t.state_dict().items()}
    before = attn._input_copies()
    m.load_state_dict(strided)
    assert attn._input_copies() == before
