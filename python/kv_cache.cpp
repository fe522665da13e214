// KVCache and decode_attention: attn::KVCache's state for incremental decoding, and one
// generation step against it — attn::decode_attention, sdpa's problem with K/V the cache's
// rows and key_lengths its lengths, so the masking keywords mean what they mean in
// scaled_dot_product_attention (options.hpp), with bottom-right as the default alignment.
#include <pybind11/stl.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "attn/decode.hpp"
#include "attn/kv_cache.hpp"
#include "bind.hpp"
#include "convert.hpp"
#include "options.hpp"

namespace attn_py {

namespace {

// attn::KVCache for Python: one operation at a time (a mutex, taken with the GIL released).
class PyKVCache {
public:
    explicit PyKVCache(const attn::KVCacheConfig& c) : cache_(c) {}

    // k_new (B, Hkv, T, Dk), v_new (B, Hkv, T, Dv); or one sequence's (Hkv, T, ·) with batch_index.
    void append(const py::object& k_new, const py::object& v_new, const py::object& batch_index) {
        const bool one = !batch_index.is_none();
        const int r = one ? 3 : 4;
        const char* layout = one ? "(Hkv, T, D) with batch_index" : "(B, Hkv, T, D)";
        const Input k = input(k_new, "k_new", r, r, layout);
        const Input v = input(v_new, "v_new", r, r, layout);
        const std::int64_t b = one ? batch_index.cast<std::int64_t>() : 0;
        py::gil_scoped_release nogil;
        const std::lock_guard<std::mutex> lock(mutex);
        if (one) {
            cache_.append(b, k.view, v.view);
        } else {
            cache_.append(k.view, v.view);
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
    // Only each sequence's written rows are copied; positions at or beyond its length are 0,
    // never the stale or uninitialised storage behind them.
    py::array copy_of(bool keys) {
        const std::lock_guard<std::mutex> lock(mutex);
        const attn::TensorView src = keys ? cache_.keys() : cache_.values();
        const std::int64_t B = src.dim(0), H = src.dim(1), cap = src.dim(2), D = src.dim(3);
        py::array_t<float> out(std::vector<py::ssize_t>{B, H, cap, D});
        float* dst = out.mutable_data();
        std::fill_n(dst, out.size(), 0.0f);
        for (std::int64_t b = 0; b < B; ++b) {
            const std::int64_t len = cache_.length(b);
            if (len == 0) continue;
            const attn::Tensor rows = attn::to_dtype(src.slice(0, b, 1).slice(2, 0, len), attn::DType::f32);  // (1, H, len, D)
            for (std::int64_t h = 0; h < H; ++h) {
                std::copy_n(rows.data_as<const float>() + h * len * D, len * D, dst + ((b * H + h) * cap) * D);
            }
        }
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

// query (B, Hq, Lq, Dk) float32, Lq <= 16 (decode kernel; more runs as prefill)
// → out (B, Hq, Lq, Dv) [, lse (B, Hq, Lq)]. window_left = w is the older spelling of
// window=(w, None).
py::object decode_py(const py::object& query, PyKVCache& cache, std::optional<double> scale, bool is_causal,
                     std::int64_t window_left, const std::string& causal_alignment, const py::object& window,
                     const std::string& window_alignment, const py::object& query_offset, bool return_lse) {
    const Input q = input(query, "query", 4, 4, "(B, Hq, Lq, Dk)");
    if (window_left != -1 && !window.is_none()) {
        value_error("window_left: give window=(left, right) or window_left, not both (got window_left=" +
                    std::to_string(window_left) + " and window=" + std::string(py::repr(window)) + ")");
    }
    const py::object win = window_left != -1 ? py::object(py::make_tuple(window_left, -1)) : window;
    CallOptions o;
    o.sdpa.scale = scale;
    set_alignment({is_causal, causal_alignment, win, window_alignment, query_offset}, o);
    const std::int64_t dv = cache.cache().value_dim() ? cache.cache().value_dim() : cache.cache().head_dim();
    const attn::TensorView& qv = q.view;
    py::array out = new_array(attn::DType::f32, {qv.dim(0), qv.dim(1), qv.dim(2), dv});
    py::array lse = return_lse ? new_array(attn::DType::f32, {qv.dim(0), qv.dim(1), qv.dim(2)}) : py::array();
    const attn::TensorView ov = output_view(out, 4);
    attn::TensorView lv;
    if (return_lse) lv = output_view(lse, 3);
    {
        py::gil_scoped_release nogil;
        const std::lock_guard<std::mutex> lock(cache.mutex);
        attn::decode_attention(qv, cache.cache(), o.sdpa, ov, return_lse ? &lv : nullptr);
    }
    if (!return_lse) return out;
    return py::make_tuple(out, lse);
}

}  // namespace

void bind_kv_cache(py::module_& m) {
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
        .def("keys", [](PyKVCache& c) { return c.copy_of(true); },
             "A float32 copy of the keys, (B, Hkv, capacity, Dk). Sequence b's positions at or beyond\n"
             "lengths[b] hold no token and are 0 (never the stale or uninitialised storage there).")
        .def("values", [](PyKVCache& c) { return c.copy_of(false); },
             "A float32 copy of the values, (B, Hkv, capacity, Dv). Sequence b's positions at or beyond\n"
             "lengths[b] hold no token and are 0 (never the stale or uninitialised storage there).")
        .def_property_readonly("lengths", &PyKVCache::lengths)
        .def_property_readonly("capacity", [](PyKVCache& c) { return c.cache().capacity(); })
        .def_property_readonly("batch", [](PyKVCache& c) { return c.cache().batch(); })
        .def_property_readonly("kv_heads", [](PyKVCache& c) { return c.cache().kv_heads(); })
        .def_property_readonly("head_dim", [](PyKVCache& c) { return c.cache().head_dim(); })
        .def_property_readonly("dtype", [](PyKVCache& c) { return std::string(attn::dtype_name(c.cache().storage())); });
    m.def("decode_attention", &decode_py, py::arg("query"), py::arg("cache"), py::kw_only(),
          py::arg("scale") = py::none(), py::arg("is_causal") = true, py::arg("window_left") = -1,
          py::arg("causal_alignment") = "bottom-right", py::arg("window") = py::none(),
          py::arg("window_alignment") = "bottom-right", py::arg("query_offset") = py::none(),
          py::arg("return_lse") = false,
          "One generation step: query (B, Hq, Lq <= 16, Dk) float32 against everything in the cache\n"
          "(append the new tokens' keys/values first). Causal and window align bottom-right per\n"
          "sequence by default: new query i of sequence b (length n_b) has its diagonal at\n"
          "i + n_b - Lq. window=(left, right), window_alignment, causal_alignment and query_offset\n"
          "mean what they mean in scaled_dot_product_attention; window_left=w is window=(w, None).");
}

}  // namespace attn_py
