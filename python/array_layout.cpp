#include "array_layout.hpp"

namespace attn_py {

namespace {

std::string shape_str(const std::vector<std::int64_t>& shape) {
    std::string s = "(";
    for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
    return s + (shape.size() == 1 ? ",)" : ")");
}

bool dtype_of(char kind, std::int64_t size, attn::DType& out) {
    if (kind == 'f' && size == 4) out = attn::DType::f32;
    else if (kind == 'f' && size == 8) out = attn::DType::f64;
    else if (kind == 'f' && size == 2) out = attn::DType::f16;
    else if (kind == 'b' && size == 1) out = attn::DType::boolean;
    else if (kind == 'i' && size == 4) out = attn::DType::i32;
    else if (kind == 'i' && size == 8) out = attn::DType::i64;
    else return false;
    return true;
}

}  // namespace

ArrayLayout layout_of(const RawArray& a, const std::string& name, int min_rank, int max_rank, const char* layout) {
    ArrayLayout r;
    const auto ndim = static_cast<std::int64_t>(a.shape.size());
    if (ndim < min_rank || ndim > max_rank || ndim > attn::kMaxRank) {
        r.refusal = ArrayLayout::Refusal::rank;
        r.message = name + ": expected " + layout + " (rank " + std::to_string(min_rank) +
                    (min_rank == max_rank ? "" : " to " + std::to_string(max_rank)) + ") but got shape " +
                    shape_str(a.shape);
        return r;
    }
    if (!dtype_of(a.kind, a.itemsize, r.dtype)) {
        r.refusal = ArrayLayout::Refusal::dtype;
        r.message = name + ": unsupported dtype " + a.dtype_name +
                    " (expected float32, float64, float16, bool, int32 or int64)";
        return r;
    }
    r.shape.rank = static_cast<int>(ndim);
    for (int i = 0; i < r.shape.rank; ++i) {
        const auto u = static_cast<std::size_t>(i);
        r.shape.dims[u] = a.shape[u];
        // Byte strides that no element stride can express: the caller copies (counted, documented).
        if (a.byte_strides[u] % a.itemsize != 0) r.needs_copy = true;
        r.strides[u] = a.byte_strides[u] / a.itemsize;
    }
    return r;
}

}  // namespace attn_py
