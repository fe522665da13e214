#include "masks.hpp"

#include <algorithm>

#include "../core/check.hpp"
#include "inputs.hpp"

namespace attn::detail {
namespace {

bool is_bool(const std::optional<TensorView>& m) { return m && m->dtype() == DType::boolean; }

// Every element of a 4-D view, as (b, h, i, j) loops; f(offset_out, b, h, i, j).
template <class F>
void for_each_4d(const Shape& s, F&& f) {
    std::int64_t o = 0;
    for (std::int64_t b = 0; b < s[0]; ++b)
        for (std::int64_t h = 0; h < s[1]; ++h)
            for (std::int64_t i = 0; i < s[2]; ++i)
                for (std::int64_t j = 0; j < s[3]; ++j, ++o) f(o, b, h, i, j);
}

// keep (shape): true where no given PyTorch bool mask says True.
Tensor keep_mask(const Shape& shape, const std::optional<TensorView>& a, const std::optional<TensorView>& p) {
    Tensor keep(DType::boolean, shape, "the MHA layer's keep mask (its boolean masks combined)");
    auto* out = keep.data_as<bool>();
    const TensorView av = a ? a->broadcast_to(shape, "attn_mask") : TensorView();
    const TensorView pv = p ? p->broadcast_to(shape, "key_padding_mask") : TensorView();
    const auto* ad = a ? av.data_as<const unsigned char>() : nullptr;
    const auto* pd = p ? pv.data_as<const unsigned char>() : nullptr;
    for_each_4d(shape, [&](std::int64_t o, std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j) {
        const bool masked = (ad && ad[av.offset(b, h, i, j)] != 0) || (pd && pd[pv.offset(b, h, i, j)] != 0);
        out[o] = !masked;
    });
    return keep;
}

// sum (shape, float32) of the given float masks.
Tensor sum_mask(const Shape& shape, const std::optional<TensorView>& a, const std::optional<TensorView>& p) {
    Tensor sum(DType::f32, shape, "the MHA layer's additive mask (its float masks summed)");
    auto* out = sum.data_as<float>();
    const TensorView av = a ? a->broadcast_to(shape, "attn_mask") : TensorView();
    const TensorView pv = p ? p->broadcast_to(shape, "key_padding_mask") : TensorView();
    for_each_4d(shape, [&](std::int64_t o, std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j) {
        // Rounded to float32 first, as PyTorch adds two float32 masks.
        const float x = a ? static_cast<float>(av.load_as_double(av.offset(b, h, i, j))) : 0.0f;
        const float y = p ? static_cast<float>(pv.load_as_double(pv.offset(b, h, i, j))) : 0.0f;
        out[o] = x + y;
    });
    return sum;
}

}  // namespace

Tensor pad_keys(const TensorView& mask, std::int64_t keys) {
    const bool b = mask.dtype() == DType::boolean;
    const Shape s{mask.dim(0), mask.dim(1), mask.dim(2), keys};
    Tensor out(b ? DType::boolean : DType::f32, s, "a mask of the MHA layer padded for its appended keys");
    for_each_4d(s, [&](std::int64_t o, std::int64_t n, std::int64_t h, std::int64_t i, std::int64_t j) {
        const bool inside = j < mask.dim(3);
        if (b) out.data_as<bool>()[o] = inside && mask.load_as_double(mask.offset(n, h, i, j)) != 0.0;
        else out.data_as<float>()[o] = inside ? static_cast<float>(mask.load_as_double(mask.offset(n, h, i, j))) : 0.0f;
    });
    return out;
}

namespace {
void check_mask_dtype(const TensorView& m, const char* name, const char* bool_meaning) {
    if (m.data() == nullptr) fail(kMha, name, ": data pointer is null");
    if (m.dtype() != DType::boolean && !is_floating(m.dtype())) {
        fail_type(kMha, name, ": dtype must be bool (True = ", bool_meaning, ") or floating (added to the scores) but got ",
             dtype_name(m.dtype()));
    }
}
}  // namespace

PytorchMasks pytorch_masks_4d(const std::optional<TensorView>& attn_mask, const std::optional<TensorView>& key_padding_mask,
                              bool batched, std::int64_t B, std::int64_t h, std::int64_t Lq, std::int64_t Lk) {
    PytorchMasks r;
    if (attn_mask) {
        const TensorView& m = *attn_mask;
        check_mask_dtype(m, "attn_mask", "not allowed");
        const Shape s2{Lq, Lk}, s3{batched ? B * h : h, Lq, Lk};
        if (m.shape() == s2) {
            r.attn = TensorView(m.data(), m.dtype(), Shape{1, 1, Lq, Lk}, Strides{0, 0, m.stride(0), m.stride(1)});
        } else if (m.shape() == s3) {
            // (B·h, Lq, Lk): index b·h + head, so b strides h rows of dim 0.
            r.attn = TensorView(m.data(), m.dtype(), Shape{B, h, Lq, Lk},
                                Strides{h * m.stride(0), m.stride(0), m.stride(1), m.stride(2)});
        } else {
            fail(kMha, "attn_mask: expected shape (Lq, Lk) = ", s2, " or ",
                 batched ? "(B·num_heads, Lq, Lk) = " : "(num_heads, Lq, Lk) = ", s3, " but got ", m.shape());
        }
    }
    if (key_padding_mask) {
        const TensorView& m = *key_padding_mask;
        check_mask_dtype(m, "key_padding_mask", "padding");
        const Shape want = batched ? Shape{B, Lk} : Shape{Lk};
        if (!(m.shape() == want)) {
            fail(kMha, "key_padding_mask: expected shape ", batched ? "(B, Lk) = " : "(Lk,) = ", want, " but got ", m.shape());
        }
        r.kpm = batched ? TensorView(m.data(), m.dtype(), Shape{B, 1, 1, Lk}, Strides{m.stride(0), 0, 0, m.stride(1)})
                        : TensorView(m.data(), m.dtype(), Shape{1, 1, 1, Lk}, Strides{0, 0, 0, m.stride(0)});
    }
    return r;
}

void pad_masks(PytorchMasks& m, std::int64_t keys) {
    if (m.attn) m.attn = (m.attn_store = pad_keys(*m.attn, keys)).view();
    if (m.kpm) m.kpm = (m.kpm_store = pad_keys(*m.kpm, keys)).view();
}

SdpaMasks to_sdpa_masks(const std::optional<TensorView>& attn, const std::optional<TensorView>& kpm) {
    SdpaMasks m;
    // Shape of a mask combining both: the larger of each dim (each is 1 or the full size).
    auto joint = [&] {
        Shape s = attn ? attn->shape() : kpm->shape();
        if (attn && kpm)
            for (int d = 0; d < 4; ++d) s.dims[static_cast<std::size_t>(d)] = std::max(attn->dim(d), kpm->dim(d));
        return s;
    };
    const std::optional<TensorView> none;
    const bool attn_bool = is_bool(attn), kpm_bool = is_bool(kpm);
    const bool attn_float = attn && !attn_bool, kpm_float = kpm && !kpm_bool;

    // Bool masks: one negated keep-mask (both combined when both are bool).
    if (attn_bool || kpm_bool) {
        const Shape s = (attn_bool && kpm_bool) ? joint() : (attn_bool ? attn->shape() : kpm->shape());
        m.keep_store = keep_mask(s, attn_bool ? attn : none, kpm_bool ? kpm : none);
        m.keep = m.keep_store.view();
    }
    // Float masks: passed through when alone and already float32/64; summed when both.
    if (attn_float && kpm_float) {
        m.add_store = sum_mask(joint(), attn, kpm);
        m.add = m.add_store.view();
    } else if (attn_float || kpm_float) {
        const TensorView& f = attn_float ? *attn : *kpm;
        if (f.dtype() == DType::f32 || f.dtype() == DType::f64) {
            m.add = f;
        } else {  // float16 / bfloat16: sdpa adds float32 or float64
            m.add_store = to_dtype(f, DType::f32);
            m.add = m.add_store.view();
        }
    }
    return m;
}

}  // namespace attn::detail
