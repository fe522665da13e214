#include "array_layout.hpp"

namespace attn_py {

namespace {

std::string shape_str(const std::vector<std::int64_t>& shape) {
    std::string s = "(";
    for (std::size_t i = 0; i < shape.size(); ++i) {  // appended in two steps: g++ 12's LTO warned (a
        s += i ? ", " : "";                           // -Wstringop-overflow false positive) on `", " + string`
        s += std::to_string(shape[i]);
    }
    return s + (shape.size() == 1 ? ",)" : ")");
}

bool dtype_of(char kind, std::int64_t size, bool uint16_is_bf16, attn::DType& out) {
    if (kind == 'u' && size == 2 && uint16_is_bf16) out = attn::DType::bf16;
    else if (kind == 'f' && size == 4) out = attn::DType::f32;
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
    if (!dtype_of(a.kind, a.itemsize, a.uint16_is_bf16, r.dtype)) {
        r.refusal = ArrayLayout::Refusal::dtype;
        // Only the dtypes attn reads at all: which of them this argument takes is the library's
        // check, whose message names them (a float Q, an int key_lengths, a bool or float mask).
        r.message = name + ": unsupported dtype " + a.dtype_name +
                    " (attn reads float32, float64, float16, bool, int32 and int64 arrays, and uint16 ones as "
                    "bfloat16 bits under dtype=\"bfloat16\"; each argument takes some of them)";
        return r;
    }
    r.shape.rank = static_cast<int>(ndim);
    // Byte order and alignment first: a swapped or misaligned element cannot be read in place
    // whatever the strides are (the caller copies; counted, documented in convert.hpp).
    r.needs_copy = !a.native_order || !a.aligned;
    for (int i = 0; i < r.shape.rank; ++i) {
        const auto u = static_cast<std::size_t>(i);
        r.shape.dims[u] = a.shape[u];
        // Byte strides that no element stride can express: copied too.
        if (a.byte_strides[u] % a.itemsize != 0) r.needs_copy = true;
        r.strides[u] = a.byte_strides[u] / a.itemsize;
    }
    return r;
}

attn::TensorView expand_rank(const attn::TensorView& t, int rank) {
    if (t.rank() >= rank) return t;
    attn::Shape s;
    attn::Strides st{};
    s.rank = rank;
    const int pad = rank - t.rank();
    for (int i = 0; i < rank; ++i) {
        const auto u = static_cast<std::size_t>(i);
        s.dims[u] = i < pad ? 1 : t.dim(i - pad);
        st[u] = i < pad ? 0 : t.stride(i - pad);
    }
    return attn::TensorView(t.data(), t.dtype(), s, st);
}

}  // namespace attn_py
