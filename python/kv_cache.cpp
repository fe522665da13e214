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
#include "attn/threads.hpp"
#include "bind.hpp"
#include "convert.hpp"
#include "interruptible.hpp"
#include "options.hpp"

namespace attn_py {

namespace {

// attn::KVCache for Python: one operation at a time (a mutex, taken with the GIL released).
class PyKVCache {
public:
    explicit PyKVCache(const attn::KVCacheConfig& c) : cache_(c) {}

    // k_new (B, Hkv, T, Dk), v_new (B, Hkv, T, Dv); or one sequence's (Hkv, T, ·) with batch_index.
    // dtype="bfloat16": uint16 k_new/v_new hold bfloat16 bits (sdpa's dtype= keyword).
    void append(const py::object& k_new, const py::object& v_new, const py::object& batch_index, const py::object& dtype) {
        const bool bf16 = uint16_is_bf16_arg(dtype);
        const std::optional<std::int64_t> index = optional_int_arg(batch_index, "batch_index");
        const bool one = index.has_value();
        const int r = one ? 3 : 4;
        const char* layout = one ? "(Hkv, T, D) with batch_index" : "(B, Hkv, T, D)";
        const Input k = input(k_new, "k_new", r, r, layout, bf16);
        const Input v = input(v_new, "v_new", r, r, layout, bf16);
        const std::int64_t b = index.value_or(0);
        py::gil_scoped_release nogil;
        const std::lock_guard<std::mutex> lock(mutex);
        if (one) {
            cache_.append(b, k.view, v.view);
        } else {
            cache_.append(k.view, v.view);
        }
    }

    void truncate(const py::object& new_length_arg, const py::object& batch_index) {
        const std::int64_t new_length = int_arg(new_length_arg, "new_length");
        const std::optional<std::int64_t> index = optional_int_arg(batch_index, "batch_index");
        if (!index && new_length < 0)  // the core's truncate_all would name itself
            value_error("KVCache.truncate: new_length must be >= 0 but got " + std::to_string(new_length));
        const std::lock_guard<std::mutex> lock(mutex);
        if (!index) {
            cache_.truncate_all(new_length);
        } else {
            cache_.truncate(*index, new_length);
        }
    }

    void reset(const py::object& batch_index) {
        const std::optional<std::int64_t> index = optional_int_arg(batch_index, "batch_index");
        const std::lock_guard<std::mutex> lock(mutex);
        if (!index) {
            cache_.reset();
        } else {
            cache_.reset(*index);
        }
    }

    void reserve(const py::object& capacity_arg) {
        const std::int64_t capacity = int_arg(capacity_arg, "capacity");
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
        py::array out = new_array(attn::DType::f32, {B, H, cap, D},
                                  keys ? "the keys' copy (B, Hkv, capacity, Dk)" : "the values' copy (B, Hkv, capacity, Dv)");
        float* dst = static_cast<float*>(out.mutable_data());
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
    attn::KVCache& cache() { return cache_; }
    std::mutex mutex;

private:
    attn::KVCache cache_;
};

// Arguments as given, converted by name (convert.hpp's scalar arguments).
std::unique_ptr<PyKVCache> make_cache(const py::object& batch, const py::object& kv_heads, const py::object& head_dim,
                                      const py::object& capacity, const py::object& value_dim,
                                      const py::object& dtype_arg, const py::object& grow,
                                      const py::object& max_capacity) {
    attn::KVCacheConfig c;
    c.batch = int_arg(batch, "batch");
    c.kv_heads = int_arg(kv_heads, "kv_heads");
    c.head_dim = int_arg(head_dim, "head_dim");
    c.value_dim = optional_int_arg(value_dim, "value_dim").value_or(0);
    c.capacity = int_arg(capacity, "capacity");
    c.storage = cache_storage_arg(dtype_arg);
    c.grow = bool_arg(grow, "grow");
    c.max_capacity = int_arg(max_capacity, "max_capacity");
    return std::make_unique<PyKVCache>(c);
}

// query (B, Hq, Lq, Dk) float32, float16 or bfloat16 (uint16 bits with dtype="bfloat16"),
// any Lq (the decode kernel for a few rows per KV head, flash otherwise) → out (B, Hq, Lq, Dv) [, lse (B, Hq, Lq)
// float32, float64 for a float64 query]. out follows a 16-bit query's dtype unless out_dtype= says otherwise (float32 for a
// float32 or float64 query, as before). window_left = w is the older spelling of window=(w, None).
py::object decode_py(const py::object& query, const py::object& cache_obj, const py::object& scale, const py::object& is_causal,
                     const py::object& window_left_arg, const py::object& causal_alignment, const py::object& window,
                     const py::object& window_alignment, const py::object& query_offset,
                     const py::object& attn_mask, const py::object& return_lse_arg, const py::object& softcap,
                     const py::object& alibi_slopes, const py::object& sinks, const py::object& threads_obj,
                     const py::object& dtype, const py::object& out_dtype, const py::object& impl) {
    const int threads = threads_arg(threads_obj);
    std::mutex* cache_mutex = nullptr;
    attn::KVCache& cache = kv_cache_of(cache_obj, "cache", cache_mutex);
    const std::int64_t window_left = int_arg(window_left_arg, "window_left");
    if (window_left < -1)
        value_error("window_left: expected -1 (no window) or a number of keys >= 0 but got " + std::to_string(window_left));
    const bool return_lse = bool_arg(return_lse_arg, "return_lse");
    const bool bf16_bits = uint16_is_bf16_arg(dtype);
    const Input q = input(query, "query", 4, 4, "(B, Hq, Lq, Dk)", bf16_bits);
    if (window_left != -1 && !window.is_none()) {
        value_error("window_left: give window=(left, right) or window_left, not both (got window_left=" +
                    std::to_string(window_left) + " and window=" + std::string(py::repr(window)) + ")");
    }
    const py::object win = window_left != -1 ? py::object(py::make_tuple(window_left, -1)) : window;
    CallOptions o;
    o.sdpa.scale = optional_float_arg(scale, "scale");
    o.sdpa.impl = attn::parse_impl(str_arg(impl, "impl"));
    set_alignment({is_causal, causal_alignment, win, window_alignment, query_offset}, o);
    set_modifiers({softcap, alibi_slopes, sinks}, q.view.dim(1), o);  // as scaled_dot_product_attention's
    set_mask(attn_mask, bf16_bits, o);
    const std::int64_t dv = cache.value_dim() ? cache.value_dim() : cache.head_dim();
    const attn::TensorView& qv = q.view;
    const attn::DType odt = out_dtype_arg(out_dtype, sixteen_bit_or_f32(qv.dtype()), "out_dtype", /*with_float64=*/true);
    py::array out = new_array(odt, {qv.dim(0), qv.dim(1), qv.dim(2), dv}, "out (B, Hq, Lq, Dv)");
    // As sdpa's: lse float64 for a float64 query (the reference's double lse), else float32 (stat_dtype).
    py::array lse = return_lse ? new_array(stat_dtype(qv.dtype()), {qv.dim(0), qv.dim(1), qv.dim(2)}, "lse (B, Hq, Lq)") : py::array();
    const attn::TensorView ov = output_view(out, 4);
    attn::TensorView lv;
    if (return_lse) lv = output_view(lse, 3);
    {
        InterruptibleCall nogil(0);
        const std::lock_guard<std::mutex> lock(*cache_mutex);
        nogil.arm(attention_work(qv, cache.capacity(), dv));  // the capacity: a bound of the lengths
        const attn::ScopedNumThreads scoped_threads(threads);
        with_python_names([&] { attn::decode_attention(qv, cache, o.sdpa, ov, return_lse ? &lv : nullptr); });
    }
    if (!return_lse) return out;
    return py::make_tuple(out, lse);
}

}  // namespace

attn::KVCache& kv_cache_of(const py::handle& obj, const char* name, std::mutex*& mutex) {
    if (!py::isinstance<PyKVCache>(obj)) {
        type_error(std::string(name) + ": expected an attn.KVCache but got " +
                   std::string(py::str(py::type::of(obj).attr("__name__"))));
    }
    PyKVCache& c = obj.cast<PyKVCache&>();
    mutex = &c.mutex;
    return c.cache();
}

void bind_kv_cache(py::module_& m) {
    py::class_<PyKVCache>(m, "KVCache",
                          "Keys and values of earlier tokens for incremental decoding (attn::KVCache).\n"
                          "Storage (B, Hkv, capacity, D) in float32, float16 or bfloat16.")
        .def(py::init(&make_cache), py::arg("batch"), py::arg("kv_heads"), py::arg("head_dim"), py::arg("capacity"),
             py::kw_only(), py::arg("value_dim") = py::none(), py::arg("dtype") = "float32", py::arg("grow") = false,
             py::arg("max_capacity") = 0,
             "A cache of `batch` sequences, each with room for `capacity` tokens of kv_heads keys of head_dim\n"
             "and values of value_dim (None: head_dim), stored in dtype (\"float32\", \"float16\", \"bfloat16\").\n"
             "An append that does not fit raises, or with grow=True doubles the capacity, up to max_capacity\n"
             "(0 = no limit).")
        .def("append", &PyKVCache::append, py::arg("k_new"), py::arg("v_new"), py::arg("batch_index") = py::none(),
             py::kw_only(), py::arg("dtype") = py::none(),
             "Appends T tokens: (B, Hkv, T, D) arrays, or (Hkv, T, D) for one sequence with batch_index.\n"
             "Any float dtype (rounded to the storage dtype); dtype=\"bfloat16\": uint16 arrays hold bfloat16 bits.")
        .def("truncate", &PyKVCache::truncate, py::arg("new_length"), py::arg("batch_index") = py::none(),
             "Rolls back: sequence batch_index to new_length (0 <= new_length <= its length); without\n"
             "batch_index, every sequence longer than new_length to new_length (shorter ones keep theirs).")
        .def("reset", &PyKVCache::reset, py::arg("batch_index") = py::none(),
             "Empties sequence batch_index (without it, every sequence) to length 0; keeps the memory.")
        .def("reserve", &PyKVCache::reserve, py::arg("capacity"),
             "Makes room for `capacity` tokens per sequence (grows the storage even when grow=False).")
        .def("keys", [](PyKVCache& c) { return c.copy_of(true); },
             "A float32 copy of the keys, (B, Hkv, capacity, Dk). Sequence b's positions at or beyond\n"
             "lengths[b] hold no token and are 0 (never the stale or uninitialised storage there).")
        .def("values", [](PyKVCache& c) { return c.copy_of(false); },
             "A float32 copy of the values, (B, Hkv, capacity, Dv). Sequence b's positions at or beyond\n"
             "lengths[b] hold no token and are 0 (never the stale or uninitialised storage there).")
        .def_property_readonly("lengths", &PyKVCache::lengths, "Tokens held per sequence: an int64 array of B entries.")
        .def_property_readonly("capacity", [](PyKVCache& c) { return c.cache().capacity(); }, "Positions each sequence can hold now (the cache grows past it only when made with grow=True).")
        .def_property_readonly("batch", [](PyKVCache& c) { return c.cache().batch(); }, "B, the number of sequences.")
        .def_property_readonly("kv_heads", [](PyKVCache& c) { return c.cache().kv_heads(); }, "Hkv, the key/value heads.")
        .def_property_readonly("head_dim", [](PyKVCache& c) { return c.cache().head_dim(); }, "Dk, the key head dim.")
        .def_property_readonly("dtype", [](PyKVCache& c) { return std::string(attn::dtype_name(c.cache().storage())); }, "The storage dtype: \"float32\", \"float16\" or \"bfloat16\".");
    m.def("decode_attention", &decode_py, py::arg("query"), py::arg("cache"), py::kw_only(),
          py::arg("scale") = py::none(), py::arg("is_causal") = true, py::arg("window_left") = -1,
          py::arg("causal_alignment") = "bottom-right", py::arg("window") = py::none(),
          py::arg("window_alignment") = "bottom-right", py::arg("query_offset") = py::none(),
          py::arg("attn_mask") = py::none(), py::arg("return_lse") = false, py::arg("softcap") = py::none(),
          py::arg("alibi_slopes") = py::none(),
          py::arg("sinks") = py::none(), py::arg("threads") = py::none(), py::arg("dtype") = py::none(),
          py::arg("out_dtype") = py::none(), py::arg("impl") = "auto",
          "New queries (B, Hq, Lq, Dk) float32, float16 or bfloat16 (uint16 bits with dtype=\"bfloat16\") against everything in the cache (the decode kernel for\n"
          "a few rows per KV head, group*Lq below one flash panel (two with float32 K/V), flash otherwise; append the new tokens' keys/values first). Causal and window align bottom-right per\n"
          "sequence by default: new query i of sequence b (length n_b) has its diagonal at\n"
          "i + n_b - Lq. window=(left, right), window_alignment, causal_alignment and query_offset\n"
          "mean what they mean in scaled_dot_product_attention; window_left=w is window=(w, None);\n"
          "so do the score modifiers softcap, alibi_slopes (True, (Hq,) or (B, Hq)) and sinks (Hq,).\n"
          "attn_mask: bool (True = may attend) or float (added), broadcastable to (B, Hq, Lq, n) with n the\n"
          "cache's longest sequence, at least 1 (column j = cache position j; positions past a sequence's length stay hidden).\n"
          "out_dtype=\"float32\"|\"float64\"|\"float16\"|\"bfloat16\": out's dtype (default: a 16-bit query's, else\n"
          "float32; float64: the float32 result widened exactly, or a float64 query's double result);\n"
          "bfloat16 is a uint16 array of its bits. lse is float32 (float64 for a float64 query, as in scaled_dot_product_attention).\n"
          "impl=\"auto\" (the choice above), \"decode\" (up to 16 new queries), \"flash\" or \"reference\", as in\n"
          "scaled_dot_product_attention.");
}

}  // namespace attn_py
