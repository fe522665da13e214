# Where a call's dropout mask comes from, in Python as in C++: dropout_origin (a piece of a larger
# problem takes the whole's keep decisions) on scaled_dot_product_attention and its backward, and
# varlen_dropout_seed (the seed sdpa_varlen gives sequence b). Against the float64 reference with
# the mask re-derived in numpy (reference.dropout_factor), and against the whole problem.
import numpy as np
import pytest

import attn
from reference import close, close_grads, dropout_factor, textbook

P, SEED = 0.3, 2**40 + 9


def qkv(seed, B, H, Lq, Lk, D=8, Dv=6):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((B, H, Lq, D), dtype=np.float32), rng.standard_normal((B, H, Lk, D), dtype=np.float32),
            rng.standard_normal((B, H, Lk, Dv), dtype=np.float32))


@pytest.mark.parametrize("impl", ["auto", "reference"])
def test_origin_gives_the_reference_with_the_wholes_mask(impl):
    B, H, Lq, Lk = 2, 3, 6, 10
    q, k, v = qkv(1, B, H, Lq, Lk)
    origin = (3, 5, 100, 37)  # the key origin not a multiple of 4: the Philox block starts mid-way
    out, lse, w = attn.sdpa(q, k, v, dropout_p=P, dropout_seed=SEED, dropout_origin=origin, impl=impl,
                            return_lse=True, return_weights=True)
    _, ref_lse, ref_w = textbook(q, k, v)
    z = dropout_factor(P, SEED, B, H, Lq, Lk, origin)
    assert not np.array_equal(z, dropout_factor(P, SEED, B, H, Lq, Lk))  # the origin moves the mask
    close(w, ref_w * z)
    close(out, (ref_w * z) @ v.astype(np.float64))
    close(lse, ref_lse)  # the undropped softmax's


def test_pieces_drop_what_the_whole_drops():
    B, H, L = 3, 4, 12
    q, k, v = qkv(2, B, H, L, L)
    out, w = attn.sdpa(q, k, v, dropout_p=P, dropout_seed=SEED, return_weights=True)
    b, h, r = slice(1, 3), slice(2, 4), slice(5, 12)  # a slice of the batch, the heads and the rows
    po, pw = attn.sdpa(q[b, h, r], k[b, h], v[b, h], dropout_p=P, dropout_seed=SEED, dropout_origin=(1, 2, 5, 0),
                       return_weights=True)
    close(po, out[b, h, r].astype(np.float64))
    close(pw, w[b, h, r].astype(np.float64))
    # Keys 5.. of every row: another softmax, the same keep decisions (a dropped weight is 0).
    _, kw = attn.sdpa(q, k[:, :, 5:], v[:, :, 5:], dropout_p=P, dropout_seed=SEED, dropout_origin=(0, 0, 0, 5),
                      return_weights=True)
    assert np.array_equal(kw == 0, w[..., 5:] == 0)
    _, unplaced = attn.sdpa(q, k[:, :, 5:], v[:, :, 5:], dropout_p=P, dropout_seed=SEED, return_weights=True)
    assert not np.array_equal(unplaced == 0, w[..., 5:] == 0)


def test_backward_takes_the_origin():
    B, H, L = 3, 4, 9
    q, k, v = qkv(3, B, H, L, L)
    g = np.random.default_rng(4).standard_normal((B, H, L, 6), dtype=np.float32)
    out, lse = attn.sdpa(q, k, v, dropout_p=P, dropout_seed=SEED, return_lse=True)
    whole = attn.sdpa_backward(q, k, v, out, lse, g, dropout_p=P, dropout_seed=SEED)
    b, h = slice(1, 3), slice(2, 4)
    piece = [np.ascontiguousarray(x[b, h]) for x in (q, k, v, out, lse, g)]
    grads = attn.sdpa_backward(*piece, dropout_p=P, dropout_seed=SEED, dropout_origin=(1, 2, 0, 0))
    close_grads([(got, want[b, h]) for got, want in zip(grads, whole)])
    unplaced = attn.sdpa_backward(*piece, dropout_p=P, dropout_seed=SEED)
    assert not np.allclose(unplaced[0], whole[0][b, h], atol=1e-3)  # without it, another mask


ORIGIN_ERRORS = [
    ((1, 2, 3), TypeError, r"dropout_origin: expected \(batch, head, row, key\), four ints >= 0 .* but got \(1, 2, 3\)"),
    ("0000", TypeError, "dropout_origin: expected"),
    ((0, 0, 0.5, 0), TypeError, "dropout_origin: expected"),
    ((-1, 0, 0, 0), ValueError, r"dropout_origin\.batch: must be >= 0 with batch \+ B <= 2\^32 \(B = 1\) but got -1"),
    ((0, 0, 2**32, 0), ValueError, r"dropout_origin\.row: must be >= 0 with row \+ Lq <= 2\^32"),
    ((0, 0, 0, 2**70), ValueError, r"dropout_origin\.key: expected an int64"),
]


@pytest.mark.parametrize("origin,error,message", ORIGIN_ERRORS)
def test_origin_errors_name_it(origin, error, message):
    q, k, v = qkv(5, 1, 2, 4, 4)
    with pytest.raises(error, match=message):
        attn.sdpa(q, k, v, dropout_p=P, dropout_seed=1, dropout_origin=origin)
    with pytest.raises(error, match=message):
        attn.sdpa_backward(q, k, v, v, q[..., 0], v, dropout_p=P, dropout_seed=1, dropout_origin=origin)


def splitmix64(seed, b):
    """include/attn/sdpa_varlen.hpp's formula, in Python integers."""
    m = 2**64 - 1
    z = (seed + (b + 1) * 0x9E3779B97F4A7C15) & m
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & m
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m
    return z ^ (z >> 31)


def test_varlen_dropout_seed_is_the_documented_formula():
    assert attn.varlen_dropout_seed(0, 0) == 0xE220A8397B1DCDAF
    for seed, b in [(0, 7), (SEED, 0), (SEED, 3), (2**64 - 1, 2**40), (12345, 1)]:
        assert attn.varlen_dropout_seed(seed, b) == splitmix64(seed, b)
        assert attn.varlen_dropout_seed(np.uint64(seed), np.int64(b)) == splitmix64(seed, b)


def test_each_varlen_sequence_drops_as_sdpa_with_its_seed():
    lens_q, lens_k = [5, 1, 9], [7, 3, 9]
    rng = np.random.default_rng(6)
    q = rng.standard_normal((sum(lens_q), 2, 8), dtype=np.float32)
    k = rng.standard_normal((sum(lens_k), 2, 8), dtype=np.float32)
    v = rng.standard_normal((sum(lens_k), 2, 6), dtype=np.float32)
    cq, ck = (np.concatenate([[0], np.cumsum(n)]).astype(np.int64) for n in (lens_q, lens_k))
    out, lse = attn.sdpa_varlen(q, k, v, cq, ck, dropout_p=P, dropout_seed=SEED, return_lse=True)
    g = rng.standard_normal(out.shape, dtype=np.float32)
    dq, dk, dv = attn.sdpa_varlen_backward(q, k, v, cq, ck, out, lse, g, dropout_p=P, dropout_seed=SEED)
    seq = lambda x, cu, b: np.ascontiguousarray(x[cu[b]:cu[b + 1]].transpose(1, 0, 2))  # noqa: E731  (H, L, D)
    for b in range(3):
        s = attn.varlen_dropout_seed(SEED, b)
        o_b, lse_b = attn.sdpa(seq(q, cq, b), seq(k, ck, b), seq(v, ck, b), dropout_p=P, dropout_seed=s, return_lse=True)
        close(seq(out, cq, b), o_b.astype(np.float64))
        grads_b = attn.sdpa_backward(seq(q, cq, b), seq(k, ck, b), seq(v, ck, b), o_b, lse_b, seq(g, cq, b),
                                     dropout_p=P, dropout_seed=s)
        close_grads([(seq(got, cu, b), want) for got, cu, want in zip((dq, dk, dv), (cq, ck, ck), grads_b)])
        if lens_q[b] * lens_k[b] > 20:  # enough weights that two masks cannot agree by chance
            other = attn.sdpa(seq(q, cq, b), seq(k, ck, b), seq(v, ck, b), dropout_p=P, dropout_seed=SEED)
            assert not np.allclose(seq(out, cq, b), other)  # the varlen call's own seed is not sequence b's


@pytest.mark.parametrize("args,error,message", [
    ((-1, 0), ValueError, "seed"),
    ((2**64, 0), ValueError, "seed"),
    ((1.5, 0), TypeError, "seed"),
    ((0, -1), ValueError, r"b: expected a sequence index >= 0 but got -1"),
    ((0, 1.5), TypeError, "b: expected an int"),
])
def test_varlen_dropout_seed_errors_name_the_argument(args, error, message):
    with pytest.raises(error, match=message):
        attn.varlen_dropout_seed(*args)
