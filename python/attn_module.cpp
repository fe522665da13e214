// The `attn` Python module: attn::sdpa, attn::sdpa_backward and attn::MultiHeadAttention on
// NumPy arrays, with PyTorch's names and conventions (README.md, "Python").
//
// Zero-copy: an input array becomes an attn::TensorView over its own buffer — numpy's byte
// strides divided by the item size, negative and zero strides included — so transposed views
// and slices are read in place. The one case that copies is a stride that is not a multiple
// of the item size (e.g. a field of a structured array): that input is copied once to a
// contiguous array and the copy is counted in attn._input_copies() (tests use the counter to
// check that no copy happens where none is promised).
// Outputs are fresh NumPy arrays (owning their memory) that the kernels write directly.
// The input arrays are function arguments, so they outlive every view built from them; the
// GIL is released only around the C++ computation.
// Errors: attn::Error becomes TypeError when it is about a dtype, ValueError otherwise, with
// the same message.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <atomic>
#include <ctime>
#include <memory>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "attn/decode.hpp"
#include "attn/error.hpp"
#include "attn/kv_cache.hpp"
#include "attn/mha.hpp"
#include "attn/safetensors.hpp"
#include "attn/sdpa.hpp"
#include "attn/sdpa_backward.hpp"
#include "attn/tensor.hpp"
#include "attn/version.hpp"

namespace py = pybind11;

namespace {

std::atomic<std::int64_t> g_input_copies{0};

// A Python-side argument error: raised as TypeError/ValueError by the translator below.
struct PyTypeError : attn::Error {
    using attn::Error::Error;
};

[[noreturn]] void type_error(const std::string& msg) { throw PyTypeError(msg); }
[[noreturn]] void value_error(const std::string& msg) { throw attn::Error(msg); }

std::string shape_str(const py::array& a) {
    std::string s = "(";
    for (py::ssize_t i = 0; i < a.ndim(); ++i) {
        if (i) s += ", ";
        s += std::to_string(a.shape(i));
    }
    return s + (a.ndim() == 1 ? ",)" : ")");
}

// numpy dtype → attn dtype; unsupported dtypes are a TypeError naming the argument.
attn::DType dtype_of(const py::array& a, const std::string& what) {
    const py::dtype dt = a.dtype();
    const char kind = dt.kind();
    const auto size = dt.itemsize();
    if (kind == 'f' && size == 4) return attn::DType::f32;
    if (kind == 'f' && size == 8) return attn::DType::f64;
    if (kind == 'f' && size == 2) return attn::DType::f16;
    if (kind == 'b' && size == 1) return attn::DType::boolean;
    if (kind == 'i' && size == 4) return attn::DType::i32;
    if (kind == 'i' && size == 8) return attn::DType::i64;
    type_error(what + ": unsupported dtype " + dt.attr("name").cast<std::string>() +
               " (expected float32, float64, float16, bool, int32 or int64)");
}

// Anything array-like → a NumPy array without copying one that already is (np.asarray).
py::array as_array(const py::handle& obj) {
    py::array a = py::array::ensure(obj);
    if (!a) throw py::error_already_set();
    return a;
}

// A view of `a` (kept alive by the caller) with `rank` dims: leading size-1 dims are added when
// a has fewer. Strides not divisible by the item size force one counted copy into `holder`.
attn::TensorView view_of(py::array& a, const std::string& what, int min_rank, int max_rank,
                         const char* layout) {
    if (a.ndim() < min_rank || a.ndim() > max_rank) {
        value_error(what + ": expected " + layout + " (rank " + std::to_string(min_rank) +
                    (min_rank == max_rank ? "" : " to " + std::to_string(max_rank)) + ") but got shape " +
                    shape_str(a));
    }
    const attn::DType dt = dtype_of(a, what);
    const auto item = static_cast<py::ssize_t>(a.itemsize());
    for (py::ssize_t i = 0; i < a.ndim(); ++i) {
        if (a.strides(i) % item != 0) {
            // Byte strides that no element stride can express: copy (counted, documented).
            a = py::array::ensure(a, py::array::c_style | py::array::forcecast);
            if (!a) throw py::error_already_set();
            ++g_input_copies;
            break;
        }
    }
    attn::Shape shape;
    attn::Strides strides{};
    shape.rank = static_cast<int>(a.ndim());
    for (int i = 0; i < shape.rank; ++i) {
        shape.dims[static_cast<std::size_t>(i)] = a.shape(i);
        strides[static_cast<std::size_t>(i)] = a.strides(i) / item;
    }
    return attn::TensorView(const_cast<void*>(a.data()), dt, shape, strides);
}

// (…, L, D) of rank 2..4 seen as rank 4 by adding leading size-1 dims.
attn::TensorView to_rank4(const attn::TensorView& t) {
    if (t.rank() == 4) return t;
    attn::Shape s;
    attn::Strides st{};
    s.rank = 4;
    const int pad = 4 - t.rank();
    for (int i = 0; i < 4; ++i) {
        const auto u = static_cast<std::size_t>(i);
        s.dims[u] = i < pad ? 1 : t.dim(i - pad);
        st[u] = i < pad ? 0 : t.stride(i - pad);
    }
    return attn::TensorView(t.data(), t.dtype(), s, st);
}

// A new C-contiguous array of `dtype` with the given dims; and its view.
py::array new_array(attn::DType dt, const std::vector<py::ssize_t>& dims) {
    if (dt == attn::DType::f64) return py::array_t<double>(dims);
    return py::array_t<float>(dims);
}

attn::TensorView out_view(py::array& a, int rank4_pad) {
    attn::TensorView v = view_of(a, "output", 0, 4, "an array");
    if (rank4_pad == 0) return v;
    attn::Shape s;
    attn::Strides st{};
    s.rank = v.rank() + rank4_pad;
    for (int i = 0; i < s.rank; ++i) {
        const auto u = static_cast<std::size_t>(i);
        s.dims[u] = i < rank4_pad ? 1 : v.dim(i - rank4_pad);
        st[u] = i < rank4_pad ? 0 : v.stride(i - rank4_pad);
    }
    return attn::TensorView(v.data(), v.dtype(), s, st);
}

attn::Causal causal_of(bool is_causal, const std::string& alignment) {
    if (alignment != "top-left" && alignment != "bottom-right") {
        value_error("causal_alignment: expected \"top-left\" or \"bottom-right\" but got \"" + alignment + "\"");
    }
    if (!is_causal) return attn::Causal::none;
    return alignment == "top-left" ? attn::Causal::top_left : attn::Causal::bottom_right;
}

// The arrays (and therefore the memory) behind one call's options.
struct OptionArrays {
    py::array mask, key_lengths;
};

attn::SdpaOptions make_options(const py::object& attn_mask, double dropout_p, bool is_causal,
                               const std::optional<double>& scale, const std::string& causal_alignment,
                               const py::object& key_lengths, std::uint64_t dropout_seed, const std::string& impl,
                               OptionArrays& keep) {
    attn::SdpaOptions o;
    o.scale = scale;
    o.causal = causal_of(is_causal, causal_alignment);
    o.dropout_p = dropout_p;
    o.dropout_seed = dropout_seed;
    o.impl = attn::parse_impl(impl);
    if (!attn_mask.is_none()) {
        keep.mask = as_array(attn_mask);
        const attn::TensorView m = view_of(keep.mask, "attn_mask", 0, 4, "a mask broadcastable to (B, H, Lq, Lk)");
        if (m.dtype() == attn::DType::boolean) {
            o.bool_mask = m;
        } else if (m.dtype() == attn::DType::f32 || m.dtype() == attn::DType::f64) {
            o.additive_mask = m;
        } else {
            type_error("attn_mask: dtype must be bool (True = may attend) or float32/float64 (added) but got " +
                       std::string(attn::dtype_name(m.dtype())));
        }
    }
    if (!key_lengths.is_none()) {
        keep.key_lengths = as_array(key_lengths);
        o.key_lengths = view_of(keep.key_lengths, "key_lengths", 1, 1, "shape (B,)");
    }
    return o;
}

std::vector<py::ssize_t> dims_of(const attn::TensorView& t, int skip) {
    std::vector<py::ssize_t> d;
    for (int i = skip; i < t.rank(); ++i) d.push_back(t.dim(i));
    return d;
}

// query (…, Lq, D) rank 2..4, key/value of the same rank.
py::object sdpa_py(const py::object& query, const py::object& key, const py::object& value,
                   const py::object& attn_mask, double dropout_p, bool is_causal, std::optional<double> scale,
                   const std::string& causal_alignment, const py::object& key_lengths, bool return_lse,
                   bool return_weights, std::uint64_t dropout_seed, const std::string& impl) {
    py::array qa = as_array(query), ka = as_array(key), va = as_array(value);
    const char* layout = "(B, H, L, D), (H, L, D) or (L, D)";
    const attn::TensorView q0 = view_of(qa, "query", 2, 4, layout);
    const attn::TensorView k0 = view_of(ka, "key", 2, 4, layout);
    const attn::TensorView v0 = view_of(va, "value", 2, 4, layout);
    if (k0.rank() != q0.rank() || v0.rank() != q0.rank()) {
        value_error("key/value: expected the rank of query (" + std::to_string(q0.rank()) + ") but got key " +
                    shape_str(ka) + " and value " + shape_str(va));
    }
    OptionArrays keep;
    const attn::SdpaOptions opt =
        make_options(attn_mask, dropout_p, is_causal, scale, causal_alignment, key_lengths, dropout_seed, impl, keep);
    const attn::TensorView q = to_rank4(q0), k = to_rank4(k0), v = to_rank4(v0);
    const int pad = 4 - q0.rank();
    // Outputs follow the query's dtype (float32 → float32; float64 → float64).
    const attn::DType odt = q.dtype() == attn::DType::f64 ? attn::DType::f64 : attn::DType::f32;
    std::vector<py::ssize_t> od = dims_of(q0, 0);
    od.back() = v.dim(3);
    py::array out = new_array(odt, od);
    std::vector<py::ssize_t> ld(od.begin(), od.end() - 1);
    std::vector<py::ssize_t> wd = ld;
    wd.push_back(k.dim(2));
    py::array lse = return_lse ? new_array(odt, ld) : py::array();
    py::array w = return_weights ? new_array(odt, wd) : py::array();
    const attn::TensorView ov = out_view(out, pad);
    attn::TensorView lv, wv;
    if (return_lse) lv = out_view(lse, pad);
    if (return_weights) wv = out_view(w, pad);
    {
        py::gil_scoped_release nogil;
        attn::sdpa(q, k, v, opt, ov, return_lse ? &lv : nullptr, return_weights ? &wv : nullptr);
    }
    if (!return_lse && !return_weights) return out;
    py::list r;
    r.append(out);
    if (return_lse) r.append(lse);
    if (return_weights) r.append(w);
    return py::tuple(r);
}

py::tuple sdpa_backward_py(const py::object& query, const py::object& key, const py::object& value,
                           const py::object& out, const py::object& lse, const py::object& grad_out,
                           const py::object& attn_mask, double dropout_p, bool is_causal, std::optional<double> scale,
                           const std::string& causal_alignment, const py::object& key_lengths,
                           std::uint64_t dropout_seed, const std::string& impl) {
    py::array qa = as_array(query), ka = as_array(key), va = as_array(value);
    py::array oa = as_array(out), la = as_array(lse), ga = as_array(grad_out);
    const char* layout = "(B, H, L, D), (H, L, D) or (L, D)";
    const attn::TensorView q0 = view_of(qa, "query", 2, 4, layout);
    const int r = q0.rank();
    const attn::TensorView k0 = view_of(ka, "key", r, r, "the query's rank");
    const attn::TensorView v0 = view_of(va, "value", r, r, "the query's rank");
    const attn::TensorView o0 = view_of(oa, "out", r, r, "the query's rank");
    const attn::TensorView l0 = view_of(la, "lse", r - 1, r - 1, "the query's shape without D");
    const attn::TensorView g0 = view_of(ga, "grad_out", r, r, "the query's rank");
    OptionArrays keep;
    const attn::SdpaOptions opt =
        make_options(attn_mask, dropout_p, is_causal, scale, causal_alignment, key_lengths, dropout_seed, impl, keep);
    const int pad = 4 - r;
    attn::TensorView l = l0;
    {
        attn::Shape s;
        attn::Strides st{};
        s.rank = 3;
        for (int i = 0; i < 3; ++i) {
            const auto u = static_cast<std::size_t>(i);
            s.dims[u] = i < pad ? 1 : l0.dim(i - pad);
            st[u] = i < pad ? 0 : l0.stride(i - pad);
        }
        l = attn::TensorView(l0.data(), l0.dtype(), s, st);
    }
    const attn::DType odt = q0.dtype() == attn::DType::f64 ? attn::DType::f64 : attn::DType::f32;
    py::array dq = new_array(odt, dims_of(q0, 0));
    py::array dk = new_array(odt, dims_of(k0, 0));
    py::array dv = new_array(odt, dims_of(v0, 0));
    const attn::TensorView dqv = out_view(dq, pad), dkv = out_view(dk, pad), dvv = out_view(dv, pad);
    {
        py::gil_scoped_release nogil;
        attn::sdpa_backward(to_rank4(q0), to_rank4(k0), to_rank4(v0), to_rank4(o0), l, to_rank4(g0), opt, dqv, dkv,
                            dvv);
    }
    return py::make_tuple(dq, dk, dv);
}

std::vector<std::pair<std::string, attn::TensorView>> tensors_of(const py::dict& d, std::vector<py::array>& keep) {
    std::vector<std::pair<std::string, attn::TensorView>> out;
    for (const auto& item : d) {
        if (!py::isinstance<py::str>(item.first)) {
            type_error("state_dict: keys must be str but got " + std::string(py::str(py::type::of(item.first))));
        }
        const std::string name = item.first.cast<std::string>();
        keep.push_back(as_array(item.second));
        out.emplace_back(name, view_of(keep.back(), "state_dict['" + name + "']", 0, 4, "an array of rank <= 4"));
    }
    return out;
}

// nn.MultiheadAttention's Python face over attn::MultiHeadAttention (eval mode). One call at a
// time per layer: its workspace is reused between calls.
class PyMha {
public:
    explicit PyMha(attn::MultiHeadAttention layer) : layer_(std::move(layer)) {}

    py::tuple forward(const py::object& query, const py::object& key, const py::object& value,
                      const py::object& key_padding_mask, bool need_weights, const py::object& attn_mask,
                      bool average_attn_weights, bool is_causal, const std::string& impl) {
        py::array qa = as_array(query);
        // The same object for query/key/value lets the layer fuse the projections.
        py::array ka = key.is(query) ? qa : as_array(key);
        py::array va = value.is(key) ? ka : (value.is(query) ? qa : as_array(value));
        const char* layout = "(L, B, E), (B, L, E) with batch_first, or unbatched (L, E)";
        const attn::TensorView q = view_of(qa, "query", 2, 3, layout);
        const attn::TensorView k = view_of(ka, "key", 2, 3, layout);
        const attn::TensorView v = view_of(va, "value", 2, 3, layout);
        attn::MhaForwardOptions o;
        py::array kpm, am;
        if (!key_padding_mask.is_none()) {
            kpm = as_array(key_padding_mask);
            o.key_padding_mask = view_of(kpm, "key_padding_mask", 1, 2, "(B, Lk) or unbatched (Lk,)");
        }
        if (!attn_mask.is_none()) {
            am = as_array(attn_mask);
            o.attn_mask = view_of(am, "attn_mask", 2, 3, "(Lq, Lk) or (B*h, Lq, Lk)");
        }
        o.need_weights = need_weights;
        o.average_attn_weights = average_attn_weights;
        o.is_causal = is_causal;
        o.impl = attn::parse_impl(impl);
        const attn::Shape os = layer_.output_shape(q);
        py::array out = py::array_t<float>(std::vector<py::ssize_t>(os.dims.begin(), os.dims.begin() + os.rank));
        const attn::TensorView ov = out_view(out, 0);
        py::object weights = py::none();
        attn::TensorView wv;
        if (need_weights) {
            const attn::Shape ws = layer_.weights_shape(q, k, average_attn_weights);
            py::array w = py::array_t<float>(std::vector<py::ssize_t>(ws.dims.begin(), ws.dims.begin() + ws.rank));
            wv = out_view(w, 0);
            weights = w;
        }
        {
            py::gil_scoped_release nogil;
            const std::lock_guard<std::mutex> lock(mutex_);
            layer_.forward_into(q, k, v, o, ov, need_weights ? &wv : nullptr, &workspace_);
        }
        return py::make_tuple(out, weights);
    }

    void load_state_dict(const py::dict& d) {
        std::vector<py::array> keep;
        const auto tensors = tensors_of(d, keep);
        py::gil_scoped_release nogil;
        const std::lock_guard<std::mutex> lock(mutex_);
        layer_.load_state_dict(tensors);
    }

    void load_safetensors(const std::string& path) {
        py::gil_scoped_release nogil;
        const attn::SafetensorsFile f = attn::read_safetensors(path);
        std::vector<std::pair<std::string, attn::TensorView>> tensors;
        for (const auto& [name, t] : f.tensors) tensors.emplace_back(name, t.view());
        const std::lock_guard<std::mutex> lock(mutex_);
        layer_.load_state_dict(tensors);
    }

    // Copies of the parameters, in torch's state_dict order (a dict keeps insertion order).
    py::dict state_dict() const {
        py::dict d;
        for (const auto& [name, view] : layer_.state_dict()) {
            std::vector<py::ssize_t> dims(view.shape().dims.begin(), view.shape().dims.begin() + view.rank());
            py::array_t<float> a(dims);
            std::copy_n(view.data_as<const float>(), view.numel(), a.mutable_data());
            d[py::str(name)] = a;
        }
        return d;
    }

    const attn::MhaConfig& config() const { return layer_.config(); }
    std::int64_t head_dim() const { return layer_.head_dim(); }

private:
    attn::MultiHeadAttention layer_;
    attn::MhaWorkspace workspace_;
    std::mutex mutex_;
};

std::unique_ptr<PyMha> make_mha(std::int64_t embed_dim, std::int64_t num_heads, double dropout, bool bias, bool add_bias_kv,
               bool add_zero_attn, const py::object& kdim, const py::object& vdim, bool batch_first,
               const py::object& device, const py::object& dtype, const py::object& num_kv_heads) {
    if (dropout != 0.0) {
        value_error("dropout: attn's MultiheadAttention is inference-only (eval mode); expected 0.0 but got " +
                    std::to_string(dropout));
    }
    if (!device.is_none() && std::string(py::str(device)) != "cpu") {
        value_error("device: only 'cpu' is supported but got " + std::string(py::str(device)));
    }
    if (!dtype.is_none() && !(py::dtype::from_args(dtype).kind() == 'f' && py::dtype::from_args(dtype).itemsize() == 4)) {
        type_error("dtype: parameters are float32 but got " + std::string(py::str(dtype)));
    }
    attn::MhaConfig c;
    c.embed_dim = embed_dim;
    c.num_heads = num_heads;
    c.kdim = kdim.is_none() ? 0 : kdim.cast<std::int64_t>();
    c.vdim = vdim.is_none() ? 0 : vdim.cast<std::int64_t>();
    c.num_kv_heads = num_kv_heads.is_none() ? 0 : num_kv_heads.cast<std::int64_t>();
    c.bias = bias;
    c.batch_first = batch_first;
    c.add_bias_kv = add_bias_kv;
    c.add_zero_attn = add_zero_attn;
    return std::make_unique<PyMha>(attn::MultiHeadAttention(c));
}

// attn::KVCache for Python: one operation at a time (a mutex, taken with the GIL released).
class PyKVCache {
public:
    explicit PyKVCache(const attn::KVCacheConfig& c) : cache_(c) {}

    // k_new (B, Hkv, T, Dk), v_new (B, Hkv, T, Dv); or one sequence's (Hkv, T, ·) with batch_index.
    void append(const py::object& k_new, const py::object& v_new, const py::object& batch_index) {
        py::array ka = as_array(k_new), va = as_array(v_new);
        const bool one = !batch_index.is_none();
        const int r = one ? 3 : 4;
        const char* layout = one ? "(Hkv, T, D) with batch_index" : "(B, Hkv, T, D)";
        const attn::TensorView k = view_of(ka, "k_new", r, r, layout);
        const attn::TensorView v = view_of(va, "v_new", r, r, layout);
        const std::int64_t b = one ? batch_index.cast<std::int64_t>() : 0;
        py::gil_scoped_release nogil;
        const std::lock_guard<std::mutex> lock(mutex);
        if (one) {
            cache_.append(b, k, v);
        } else {
            cache_.append(k, v);
        }
    }

    void truncate(std::int64_t new_length, const py::object& batch_index) {
        const std::lock_guard<std::mutex> lock(mutex);
        if (batch_index.is_none()) {
            cache_.truncate_all(new_length);
        } else {
            cache_.truncate(batch_index.cast<std::int64_t>(), new_length);
        }
    }

    void reset(const py::object& batch_index) {
        const std::lock_guard<std::mutex> lock(mutex);
        if (batch_index.is_none()) {
            cache_.reset();
        } else {
            cache_.reset(batch_index.cast<std::int64_t>());
        }
    }

    void reserve(std::int64_t capacity) {
        py::gil_scoped_release nogil;
        const std::lock_guard<std::mutex> lock(mutex);
        cache_.reserve(capacity);
    }

    // A float32 copy of the storage (B, Hkv, capacity, D): a view could dangle after growth.
    py::array copy_of(bool keys) {
        const std::lock_guard<std::mutex> lock(mutex);
        const attn::TensorView src = keys ? cache_.keys() : cache_.values();
        py::array out = py::array_t<float>(std::vector<py::ssize_t>{src.dim(0), src.dim(1), src.dim(2), src.dim(3)});
        const attn::Tensor t = attn::to_dtype(src, attn::DType::f32);
        std::copy_n(t.data_as<const float>(), t.numel(), static_cast<float*>(out.mutable_data()));
        return out;
    }

    py::array lengths() {
        const std::lock_guard<std::mutex> lock(mutex);
        const auto& l = cache_.lengths();
        py::array_t<std::int64_t> out(static_cast<py::ssize_t>(l.size()));
        std::copy(l.begin(), l.end(), out.mutable_data());
        return out;
    }

    const attn::KVCache& cache() const { return cache_; }
    std::mutex mutex;

private:
    attn::KVCache cache_;
};

std::unique_ptr<PyKVCache> make_cache(std::int64_t batch, std::int64_t kv_heads, std::int64_t head_dim,
                                      std::int64_t capacity, const py::object& value_dim, const std::string& dtype,
                                      bool grow, std::int64_t max_capacity) {
    attn::KVCacheConfig c;
    c.batch = batch;
    c.kv_heads = kv_heads;
    c.head_dim = head_dim;
    c.value_dim = value_dim.is_none() ? 0 : value_dim.cast<std::int64_t>();
    c.capacity = capacity;
    if (dtype == "float32") {
        c.storage = attn::DType::f32;
    } else if (dtype == "float16") {
        c.storage = attn::DType::f16;
    } else if (dtype == "bfloat16") {
        c.storage = attn::DType::bf16;
    } else {
        type_error("dtype: the cache stores \"float32\", \"float16\" or \"bfloat16\" but got \"" + dtype + "\"");
    }
    c.grow = grow;
    c.max_capacity = max_capacity;
    return std::make_unique<PyKVCache>(c);
}

// query (B, Hq, Lq, Dk) float32, Lq <= 16 → out (B, Hq, Lq, Dv) [, lse (B, Hq, Lq)].
py::object decode_py(const py::object& query, PyKVCache& cache, std::optional<double> scale, bool is_causal,
                     std::int64_t window_left, bool return_lse) {
    py::array qa = as_array(query);
    const attn::TensorView q = view_of(qa, "query", 4, 4, "(B, Hq, Lq, Dk)");
    attn::SdpaOptions o;
    o.scale = scale;
    o.causal = is_causal ? attn::Causal::bottom_right : attn::Causal::none;
    o.window.left = window_left;
    o.window.align = attn::Align::bottom_right;
    const std::int64_t dv = cache.cache().value_dim() ? cache.cache().value_dim() : cache.cache().head_dim();
    py::array out = py::array_t<float>(std::vector<py::ssize_t>{q.dim(0), q.dim(1), q.dim(2), dv});
    py::array lse = return_lse ? py::array(py::array_t<float>(std::vector<py::ssize_t>{q.dim(0), q.dim(1), q.dim(2)}))
                               : py::array();
    const attn::TensorView ov = out_view(out, 0);
    attn::TensorView lv;
    if (return_lse) lv = out_view(lse, 0);
    {
        py::gil_scoped_release nogil;
        const std::lock_guard<std::mutex> lock(cache.mutex);
        attn::decode_attention(q, cache.cache(), o, ov, return_lse ? &lv : nullptr);
    }
    if (!return_lse) return out;
    return py::make_tuple(out, lse);
}

// For bench/python_bench.py: the C++ call alone, timed in C++ on views built once — the
// baseline the binding's overhead is measured against, in the same process and build.
// q/k/v (B, H, L, D) float32; returns the seconds of each of `runs` calls.
std::vector<double> time_cpp_sdpa(const py::object& query, const py::object& key, const py::object& value,
                                  int runs, bool cpu_clock) {
    py::array qa = as_array(query), ka = as_array(key), va = as_array(value);
    const attn::TensorView q = view_of(qa, "query", 4, 4, "(B, H, L, D)");
    const attn::TensorView k = view_of(ka, "key", 4, 4, "(B, H, L, D)");
    const attn::TensorView v = view_of(va, "value", 4, 4, "(B, H, L, D)");
    py::array out = py::array_t<float>(std::vector<py::ssize_t>{q.dim(0), q.dim(1), q.dim(2), v.dim(3)});
    const attn::TensorView ov = out_view(out, 0);
    std::vector<double> seconds;
    py::gil_scoped_release nogil;
    // cpu_clock: the process's CPU time (all threads), like Python's time.process_time —
    // robust to other processes on a loaded machine when attn runs on one thread.
    const auto now = [cpu_clock] {
        timespec ts{};
        clock_gettime(cpu_clock ? CLOCK_PROCESS_CPUTIME_ID : CLOCK_MONOTONIC, &ts);
        return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
    };
    for (int r = 0; r < runs; ++r) {
        const double t0 = now();
        attn::sdpa(q, k, v, attn::SdpaOptions{}, ov);
        seconds.push_back(now() - t0);
    }
    return seconds;
}

}  // namespace

PYBIND11_MODULE(attn, m) {
    m.doc() = "attn: scaled dot-product attention for CPUs, on NumPy arrays with PyTorch's names";
    m.attr("__version__") = attn::kVersion;

    py::register_exception_translator([](std::exception_ptr p) {
        try {
            if (p) std::rethrow_exception(p);
        } catch (const PyTypeError& e) {
            PyErr_SetString(PyExc_TypeError, e.what());
        } catch (const attn::Error& e) {
            // The C++ layer names dtype problems "…: dtype must be …".
            const std::string msg = e.what();
            PyErr_SetString(msg.find("dtype") != std::string::npos ? PyExc_TypeError : PyExc_ValueError, e.what());
        }
    });

    m.def("scaled_dot_product_attention", &sdpa_py, py::arg("query"), py::arg("key"), py::arg("value"),
          py::arg("attn_mask") = py::none(), py::arg("dropout_p") = 0.0, py::arg("is_causal") = false,
          py::arg("scale") = py::none(), py::kw_only(), py::arg("causal_alignment") = "top-left",
          py::arg("key_lengths") = py::none(), py::arg("return_lse") = false, py::arg("return_weights") = false,
          py::arg("dropout_seed") = 0, py::arg("impl") = "auto",
          "softmax(query·keyᵀ·scale + mask)·value, as torch.nn.functional.scaled_dot_product_attention.\n"
          "query (B, H, Lq, D), (H, Lq, D) or (Lq, D); key/value of the same rank (Hq % Hkv == 0: GQA).\n"
          "attn_mask: bool (True = may attend) or float (added), broadcastable to (B, H, Lq, Lk).\n"
          "Returns out, or (out[, lse][, weights]) when return_lse / return_weights.");
    m.def("scaled_dot_product_attention_backward", &sdpa_backward_py, py::arg("query"), py::arg("key"),
          py::arg("value"), py::arg("out"), py::arg("lse"), py::arg("grad_out"), py::arg("attn_mask") = py::none(),
          py::arg("dropout_p") = 0.0, py::arg("is_causal") = false, py::arg("scale") = py::none(), py::kw_only(),
          py::arg("causal_alignment") = "top-left", py::arg("key_lengths") = py::none(),
          py::arg("dropout_seed") = 0, py::arg("impl") = "auto",
          "Gradients (dq, dk, dv) of scaled_dot_product_attention given the forward's out and lse\n"
          "(return_lse=True) and grad_out = dLoss/dout; the same options as the forward.");
    m.attr("sdpa") = m.attr("scaled_dot_product_attention");
    m.attr("sdpa_backward") = m.attr("scaled_dot_product_attention_backward");
    m.def("_input_copies", [] { return g_input_copies.load(); },
          "How many input arrays the binding has copied so far (only strides that are not a multiple "
          "of the item size are copied).");

    m.def("_time_cpp_sdpa", &time_cpp_sdpa, py::arg("query"), py::arg("key"), py::arg("value"), py::arg("runs"),
          py::arg("cpu_clock") = false,
          "Benchmark helper: seconds of each of `runs` plain attn::sdpa calls made from C++.");

    py::class_<PyKVCache>(m, "KVCache",
                          "Keys and values of earlier tokens for incremental decoding (attn::KVCache).\n"
                          "Storage (B, Hkv, capacity, D) in float32, float16 or bfloat16.")
        .def(py::init(&make_cache), py::arg("batch"), py::arg("kv_heads"), py::arg("head_dim"), py::arg("capacity"),
             py::kw_only(), py::arg("value_dim") = py::none(), py::arg("dtype") = "float32", py::arg("grow") = false,
             py::arg("max_capacity") = 0)
        .def("append", &PyKVCache::append, py::arg("k_new"), py::arg("v_new"), py::arg("batch_index") = py::none(),
             "Appends T tokens: (B, Hkv, T, D) arrays, or (Hkv, T, D) for one sequence with batch_index.")
        .def("truncate", &PyKVCache::truncate, py::arg("new_length"), py::arg("batch_index") = py::none())
        .def("reset", &PyKVCache::reset, py::arg("batch_index") = py::none())
        .def("reserve", &PyKVCache::reserve, py::arg("capacity"))
        .def("keys", [](PyKVCache& c) { return c.copy_of(true); }, "A float32 copy of the key storage.")
        .def("values", [](PyKVCache& c) { return c.copy_of(false); }, "A float32 copy of the value storage.")
        .def_property_readonly("lengths", &PyKVCache::lengths)
        .def_property_readonly("capacity", [](PyKVCache& c) { return c.cache().capacity(); })
        .def_property_readonly("batch", [](PyKVCache& c) { return c.cache().batch(); })
        .def_property_readonly("kv_heads", [](PyKVCache& c) { return c.cache().kv_heads(); })
        .def_property_readonly("head_dim", [](PyKVCache& c) { return c.cache().head_dim(); })
        .def_property_readonly("dtype", [](PyKVCache& c) { return std::string(attn::dtype_name(c.cache().storage())); });
    m.def("decode_attention", &decode_py, py::arg("query"), py::arg("cache"), py::kw_only(),
          py::arg("scale") = py::none(), py::arg("is_causal") = true, py::arg("window_left") = -1,
          py::arg("return_lse") = false,
          "One generation step: query (B, Hq, Lq <= 16, Dk) float32 against everything in the cache\n"
          "(append the new tokens' keys/values first). Causal alignment is bottom-right per sequence.");

    py::class_<PyMha>(m, "MultiheadAttention",
                      "torch.nn.MultiheadAttention (eval mode) with attn's kernels; float32 parameters.")
        .def(py::init(&make_mha), py::arg("embed_dim"), py::arg("num_heads"), py::arg("dropout") = 0.0,
             py::arg("bias") = true, py::arg("add_bias_kv") = false, py::arg("add_zero_attn") = false,
             py::arg("kdim") = py::none(), py::arg("vdim") = py::none(), py::arg("batch_first") = false,
             py::arg("device") = py::none(), py::arg("dtype") = py::none(), py::kw_only(),
             py::arg("num_kv_heads") = py::none())
        .def("forward", &PyMha::forward, py::arg("query"), py::arg("key"), py::arg("value"),
             py::arg("key_padding_mask") = py::none(), py::arg("need_weights") = true,
             py::arg("attn_mask") = py::none(), py::arg("average_attn_weights") = true, py::arg("is_causal") = false,
             py::kw_only(), py::arg("impl") = "auto", "Returns (output, weights or None), as torch.")
        .def("__call__", &PyMha::forward, py::arg("query"), py::arg("key"), py::arg("value"),
             py::arg("key_padding_mask") = py::none(), py::arg("need_weights") = true,
             py::arg("attn_mask") = py::none(), py::arg("average_attn_weights") = true, py::arg("is_causal") = false,
             py::kw_only(), py::arg("impl") = "auto")
        .def("load_state_dict", &PyMha::load_state_dict, py::arg("state_dict"),
             "Copies the arrays (torch names; float32/float64/float16) into the parameters; the names "
             "must match exactly.")
        .def("load_safetensors", &PyMha::load_safetensors, py::arg("path"))
        .def("state_dict", &PyMha::state_dict, "Copies of the parameters as float32 arrays.")
        .def_property_readonly("embed_dim", [](const PyMha& s) { return s.config().embed_dim; })
        .def_property_readonly("num_heads", [](const PyMha& s) { return s.config().num_heads; })
        .def_property_readonly("head_dim", &PyMha::head_dim)
        .def_property_readonly("kdim", [](const PyMha& s) { return s.config().kdim ? s.config().kdim : s.config().embed_dim; })
        .def_property_readonly("vdim", [](const PyMha& s) { return s.config().vdim ? s.config().vdim : s.config().embed_dim; })
        .def_property_readonly("batch_first", [](const PyMha& s) { return s.config().batch_first; });
}
