#include "attn/tensor.hpp"

#include "element_io.hpp"

#include <cstdlib>
#include <cstring>
#include <new>
#include <optional>
#include <sstream>

#include "allocate.hpp"
#include "attn/error.hpp"
#include "attn/half.hpp"
#include "check.hpp"
#include "checked_size.hpp"
#include "float_env.hpp"

namespace attn {

Shape::Shape(std::initializer_list<std::int64_t> d) {
    if (d.size() > static_cast<std::size_t>(kMaxRank)) {
        throw Error("shape: rank must be at most 4 but got " + std::to_string(d.size()));
    }
    for (std::int64_t v : d) {
        if (v < 0) throw Error("shape: dimensions must be >= 0 but got " + std::to_string(v));
        dims[static_cast<std::size_t>(rank++)] = v;
    }
}

// Dims may also be set directly (readers, bindings), so the count is checked here too.
std::int64_t Shape::numel() const { return detail::checked_numel("shape", "shape", *this); }

std::string Shape::str() const {
    std::ostringstream s;
    if (rank < 0 || rank > kMaxRank) return "(a shape of rank " + std::to_string(rank) + ")";  // rank is a public field
    s << '(';
    for (int i = 0; i < rank; ++i) s << (i ? ", " : "") << dims[static_cast<std::size_t>(i)];
    if (rank == 1) s << ',';
    s << ')';
    return s.str();
}

bool Shape::operator==(const Shape& o) const {
    if (rank != o.rank || rank < 0 || rank > kMaxRank) return false;
    for (int i = 0; i < rank; ++i)
        if (dims[static_cast<std::size_t>(i)] != o.dims[static_cast<std::size_t>(i)]) return false;
    return true;
}

Strides contiguous_strides(const Shape& shape) {
    // Each stride is a product of trailing dims, so it fits whenever the element count does
    // (numpy's rule for zero dims: the non-zero dims' product must fit; see checked_size.hpp).
    (void)shape.numel();
    Strides s{};
    std::int64_t acc = 1;
    for (int i = shape.rank - 1; i >= 0; --i) {
        s[static_cast<std::size_t>(i)] = acc;
        acc *= shape[i];
    }
    return s;
}

TensorView::TensorView(void* data, DType dtype, Shape shape, Strides strides)
    : data_(data), dtype_(dtype), shape_(shape), strides_(strides) {
    if (shape_.rank < 0 || shape_.rank > kMaxRank) {
        throw Error("TensorView: shape: rank must be in [0, 4] but got " + std::to_string(shape_.rank));
    }
    for (int i = shape_.rank; i < kMaxRank; ++i) strides_[static_cast<std::size_t>(i)] = 0;
}

TensorView::TensorView(void* data, DType dtype, Shape shape)
    : TensorView(data, dtype, shape, contiguous_strides(shape)) {}

bool TensorView::is_contiguous() const {
    const Strides c = contiguous_strides(shape_);
    for (int i = 0; i < rank(); ++i)
        if (dim(i) != 1 && stride(i) != c[static_cast<std::size_t>(i)]) return false;
    return true;
}

static void check_dim(const TensorView& v, int d, const char* op) {
    if (d < 0 || d >= v.rank()) {
        throw Error(std::string(op) + ": dimension " + std::to_string(d) + " is out of range for a rank-" +
                    std::to_string(v.rank()) + " tensor");
    }
}

TensorView TensorView::transpose(int a, int b) const {
    check_dim(*this, a, "transpose");
    check_dim(*this, b, "transpose");
    Shape s = shape_;
    Strides st = strides_;
    std::swap(s.dims[static_cast<std::size_t>(a)], s.dims[static_cast<std::size_t>(b)]);
    std::swap(st[static_cast<std::size_t>(a)], st[static_cast<std::size_t>(b)]);
    return {data_, dtype_, s, st};
}

TensorView TensorView::slice(int d, std::int64_t start, std::int64_t length) const {
    check_dim(*this, d, "slice");
    // Made only for an error: a valid slice allocates nothing (sdpa_varlen slices its outputs after
    // its kernels, where a refusal of this string's bytes was a bare std::bad_alloc).
    const auto where = [&] {
        return " does not fit dimension " + std::to_string(d) + " of size " + std::to_string(dim(d));
    };
    if (start < 0 || length < 0) {
        throw Error("slice: start " + std::to_string(start) + " and length " + std::to_string(length) +
                    " must be >= 0; the range" + where());
    }
    const auto end = detail::size_add(start, length);  // start + length may overflow
    if (!end || *end > dim(d)) {
        throw Error("slice: range [" + std::to_string(start) + ", " +
                    (end ? std::to_string(*end) : std::to_string(start) + " + " + std::to_string(length)) + ")" +
                    where());
    }
    Shape s = shape_;
    s.dims[static_cast<std::size_t>(d)] = length;
    auto* p = static_cast<char*>(data_) +
              start * stride(d) * static_cast<std::int64_t>(dtype_size(dtype_));
    return {p, dtype_, s, strides_};
}

TensorView TensorView::broadcast_to(const Shape& target, std::string_view what) const {
    if (target.rank < 0 || target.rank > kMaxRank) {  // a public field: checked before it indexes
        throw Error(std::string(what) + ": target rank must be in [0, " + std::to_string(kMaxRank) + "] but got " +
                    std::to_string(target.rank));
    }
    if (rank() > target.rank) {
        throw Error(std::string(what) + ": shape " + shape_.str() + " has more dimensions than " +
                    target.str() + " it must broadcast to");
    }
    Strides st{};
    const int lead = target.rank - rank();
    for (int i = 0; i < target.rank; ++i) {
        if (i < lead) continue;  // missing leading dims broadcast with stride 0
        const std::int64_t have = dim(i - lead);
        if (have == target[i]) {
            st[static_cast<std::size_t>(i)] = stride(i - lead);
        } else if (have == 1) {
            st[static_cast<std::size_t>(i)] = 0;
        } else {
            throw Error(std::string(what) + ": shape " + shape_.str() + " cannot be broadcast to " +
                        target.str() + " (dimension " + std::to_string(i - lead) + " is " +
                        std::to_string(have) + ", expected " + (target[i] == 1 ? "1" : "1 or " + std::to_string(target[i])) + ")");
        }
    }
    return {data_, dtype_, target, st};
}

double TensorView::load_as_double(std::int64_t i) const {
    const char* p = static_cast<const char*>(data_) + i * static_cast<std::int64_t>(dtype_size(dtype_));
    switch (dtype_) {
        case DType::f32: { float v; std::memcpy(&v, p, 4); return v; }
        case DType::f64: { double v; std::memcpy(&v, p, 8); return v; }
        case DType::f16: { std::uint16_t v; std::memcpy(&v, p, 2); return f16_to_float(v); }
        case DType::bf16: { std::uint16_t v; std::memcpy(&v, p, 2); return bf16_to_float(v); }
        case DType::boolean: return *p != 0 ? 1.0 : 0.0;
        case DType::i32: { std::int32_t v; std::memcpy(&v, p, 4); return v; }
        case DType::i64: { std::int64_t v; std::memcpy(&v, p, 8); return static_cast<double>(v); }
    }
    return 0.0;
}

void Tensor::Free::operator()(void* p) const { std::free(p); }

Tensor::Tensor(DType dtype, Shape shape, bool fill_zero, std::string_view name) {
    // The description is built only for a message: built before the allocation, it was an
    // allocation of its own, whose refusal was a bare std::bad_alloc naming nothing (every
    // workspace buffer of the MHA layer met it first).
    const auto what = [&] { return std::string(name) + " (" + std::string(dtype_name(dtype)) + ")"; };
    const std::optional<std::int64_t> known = detail::shape_bytes(shape, dtype_size(dtype));
    const std::int64_t bytes = known ? *known : detail::checked_bytes("Tensor", what(), shape, dtype_size(dtype));
    void* p = detail::allocate_streamed_or_null(bytes);
    if (p == nullptr) detail::throw_out_of_memory(bytes, (what() + " of shape " + shape.str()).c_str());
    if (fill_zero) std::memset(p, 0, static_cast<std::size_t>(bytes));
    storage_.reset(p);
    view_ = TensorView(p, dtype, shape);
}

Tensor to_dtype(const TensorView& src, DType dst, std::string_view name) {
    detail::require_data("to_dtype", src, "tensor");
    if (!is_floating(src.dtype()) || !is_floating(dst)) {
        throw Error("to_dtype: can only convert floating tensors to a floating dtype, got " +
                    std::string(dtype_name(src.dtype())) + " -> " + std::string(dtype_name(dst)), ErrorKind::type);
    }
    Tensor out(dst, src.shape(), false, name);
    const Shape& s = src.shape();
    std::array<std::int64_t, kMaxRank> n{1, 1, 1, 1};
    for (int i = 0; i < s.rank; ++i) n[static_cast<std::size_t>(i)] = s[i];
    // The same dtype is a copy of the bits: through double, a signalling NaN would come back
    // quiet (fuzz_safetensors: its round-trip check, and a strided float32 tensor written to a file).
    const bool same = src.dtype() == dst;
    // Through double: under the caller's DAZ a bfloat16 subnormal (a float32 one) read as 0, and
    // FTZ flushed a float32 subnormal rounded to bfloat16 (float_env.hpp). Python's
    // KVCache.keys() and MultiHeadAttention.load_state_dict convert here, outside any computing call.
    const detail::IeeeSubnormals ieee;
    const std::size_t item = dtype_size(dst);
    char* const out_bytes = static_cast<char*>(out.data());
    std::int64_t k = 0;
    for (std::int64_t a = 0; a < n[0]; ++a)
        for (std::int64_t b = 0; b < n[1]; ++b)
            for (std::int64_t c = 0; c < n[2]; ++c)
                for (std::int64_t d = 0; d < n[3]; ++d, ++k) {
                    const std::int64_t i = src.offset(a, b, c, d);
                    if (same) {
                        std::memcpy(out_bytes + static_cast<std::size_t>(k) * item,
                                    static_cast<const char*>(src.data()) + i * static_cast<std::int64_t>(item), item);
                    } else {
                        detail::store(out.view(), k, src.load_as_double(i));  // rounded once, to nearest even
                    }
                }
    return out;
}

}  // namespace attn
