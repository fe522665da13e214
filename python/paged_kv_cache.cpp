// PagedKVCache and paged_attention: attn::PagedKVCache (a page pool shared by sequences that
// are added, appended, forked copy-on-write, truncated and freed) and attention reading its
// pages directly. The masking keywords mean what they mean in decode_attention (options.hpp),
// bottom-right by default. One operation at a time per cache (a mutex, taken with the GIL
// released), so Python threads may share a cache.
#include <pybind11/stl.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "attn/paged_kv_cache.hpp"
#include "attn/threads.hpp"
#include "bind.hpp"
#include "convert.hpp"
#include "interruptible.hpp"
#include "options.hpp"

namespace attn_py {
namespace {

struct PyPagedKVCache {
    explicit PyPagedKVCache(const attn::PagedKVCacheConfig& c) : cache(c) {}
    attn::PagedKVCache cache;
    std::mutex mutex;
};

// The longest of the sequences (their keys, for attention_work); an unknown id counts 0 and is
// paged_attention's to name. Under the cache's lock.
std::int64_t longest(const attn::PagedKVCache& cache, const std::vector<attn::PagedKVCache::SeqId>& seqs) {
    std::int64_t n = 0;
    for (const attn::PagedKVCache::SeqId s : seqs) {
        try {
            n = std::max(n, cache.length(s));
        } catch (const attn::Error&) {
        }
    }
    return n;
}

std::unique_ptr<PyPagedKVCache> make_cache(const py::object& kv_heads, const py::object& head_dim,
                                           const py::object& num_pages, const py::object& page_size,
                                           const py::object& value_dim, const py::object& dtype) {
    attn::PagedKVCacheConfig c;
    c.kv_heads = int_arg(kv_heads, "kv_heads");
    c.head_dim = int_arg(head_dim, "head_dim");
    c.num_pages = int_arg(num_pages, "num_pages");
    c.page_size = int_arg(page_size, "page_size");
    c.value_dim = optional_int_arg(value_dim, "value_dim").value_or(0);
    c.storage = cache_storage_arg(dtype);
    return std::make_unique<PyPagedKVCache>(c);
}

py::object paged_attention_py(const py::object& query, PyPagedKVCache& c, const py::object& seqs_arg,
                              const py::object& scale, const py::object& is_causal, const py::object& causal_alignment,
                              const py::object& window, const py::object& window_alignment,
                              const py::object& query_offset, const py::object& attn_mask, const py::object& return_lse_arg,
                              const py::object& softcap, const py::object& alibi_slopes, const py::object& sinks,
                              const py::object& dtype, const py::object& out_dtype, const py::object& threads_obj,
                              const py::object& impl) {
    const int threads = threads_arg(threads_obj);
    const bool return_lse = bool_arg(return_lse_arg, "return_lse");
    const bool bf16_bits = uint16_is_bf16_arg(dtype);
    const Input q = input(query, "query", 4, 4, "(B, Hq, Lq, Dk)", bf16_bits);
    if (!py::isinstance<py::iterable>(seqs_arg)) {
        type_error("seqs: expected an iterable of sequence ids (one per batch row) but got " +
                   std::string(py::str(py::type::of(seqs_arg))));
    }
    // A torch tensor iterates as 0-d tensors, which int_arg (numbers only) refuses: an array-like
    // (a torch tensor of a scheduler's ids) is read through NumPy, whose elements are its scalars.
    py::object ids = seqs_arg;
    if (!py::isinstance<py::array>(seqs_arg) && py::hasattr(seqs_arg, "__array__")) {
        const py::array a = as_array(seqs_arg, "seqs");
        if (a.ndim() != 1) {
            value_error("seqs: expected one sequence id per batch row, shape (B,), but got shape " +
                        std::string(py::str(py::tuple(a.attr("shape")))));
        }
        ids = a;
    }
    std::vector<attn::PagedKVCache::SeqId> seqs;
    for (const py::handle& s : py::iterable(ids)) seqs.push_back(int_arg(py::reinterpret_borrow<py::object>(s), "seqs"));
    CallOptions o;
    o.sdpa.scale = optional_float_arg(scale, "scale");
    o.sdpa.impl = attn::parse_impl(str_arg(impl, "impl"));
    set_alignment({is_causal, causal_alignment, window, window_alignment, query_offset}, o);
    set_modifiers({softcap, alibi_slopes, sinks}, q.view.dim(1), o);
    set_mask(attn_mask, bf16_bits, o);
    const attn::TensorView& qv = q.view;
    const attn::DType odt = out_dtype_arg(out_dtype, sixteen_bit_or_f32(qv.dtype()), "out_dtype", /*with_float64=*/true);
    py::array out = new_array(odt, {qv.dim(0), qv.dim(1), qv.dim(2), c.cache.value_dim()}, "out (B, Hq, Lq, Dv)");
    py::array lse = return_lse ? new_array(attn::DType::f32, {qv.dim(0), qv.dim(1), qv.dim(2)}, "lse (B, Hq, Lq)") : py::array();
    const attn::TensorView ov = output_view(out, 4);
    attn::TensorView lv;
    if (return_lse) lv = output_view(lse, 3);
    {
        InterruptibleCall nogil(0);
        const std::lock_guard<std::mutex> lock(c.mutex);
        nogil.arm(attention_work(qv, longest(c.cache, seqs), c.cache.value_dim()));
        const attn::ScopedNumThreads scoped_threads(threads);
        with_python_names([&] { attn::paged_attention(qv, c.cache, seqs, o.sdpa, ov, return_lse ? &lv : nullptr); });
    }
    if (!return_lse) return out;
    return py::make_tuple(out, lse);
}

}  // namespace

void bind_paged_kv_cache(py::module_& m) {
    using Seq = attn::PagedKVCache::SeqId;
    py::class_<PyPagedKVCache>(m, "PagedKVCache",
                               "A pool of num_pages pages of page_size tokens (a power of two) shared by sequences\n"
                               "(attn::PagedKVCache): add_sequence, append, fork (copy-on-write), truncate, free.\n"
                               "Storage float32, float16 or bfloat16. A full pool is a ValueError; nothing is written.")
        .def(py::init(&make_cache), py::arg("kv_heads"), py::arg("head_dim"), py::arg("num_pages"), py::kw_only(),
             py::arg("page_size") = 16, py::arg("value_dim") = py::none(), py::arg("dtype") = "float32",
             "kv_heads (Hkv), head_dim (Dk), num_pages in the pool; page_size tokens per page (a power of two);\n"
             "value_dim Dv (default head_dim); dtype of the pool: \"float32\", \"float16\" or \"bfloat16\".")
        .def("add_sequence",
             [](PyPagedKVCache& c) {
                 const std::lock_guard<std::mutex> lock(c.mutex);
                 return c.cache.add_sequence();
             },
             "A new empty sequence; returns its id (ids of freed sequences are reused).")
        .def("append",
             [](PyPagedKVCache& c, const py::object& seq, const py::object& k_new, const py::object& v_new,
                const py::object& dtype) {
                 const Seq s = int_arg(seq, "seq");
                 const bool bf16 = uint16_is_bf16_arg(dtype);
                 const Input k = input(k_new, "k_new", 3, 3, "(Hkv, T, Dk)", bf16);
                 const Input v = input(v_new, "v_new", 3, 3, "(Hkv, T, Dv)", bf16);
                 py::gil_scoped_release nogil;
                 const std::lock_guard<std::mutex> lock(c.mutex);
                 c.cache.append(s, k.view, v.view);
             },
             py::arg("seq"), py::arg("k_new"), py::arg("v_new"), py::kw_only(), py::arg("dtype") = py::none(),
             "Appends T tokens (Hkv, T, D) to sequence seq (any float dtype, rounded to the pool's;\n"
             "dtype=\"bfloat16\": uint16 arrays hold bfloat16 bits).")
        .def("fork",
             [](PyPagedKVCache& c, const py::object& seq) {
                 const Seq s = int_arg(seq, "seq");
                 const std::lock_guard<std::mutex> lock(c.mutex);
                 return c.cache.fork(s);
             },
             py::arg("seq"), "A new sequence sharing seq's pages (copied only when written).")
        .def("truncate",
             [](PyPagedKVCache& c, const py::object& seq, const py::object& n) {
                 const Seq s = int_arg(seq, "seq");
                 const std::int64_t len = int_arg(n, "new_length");
                 const std::lock_guard<std::mutex> lock(c.mutex);
                 c.cache.truncate(s, len);
             },
             py::arg("seq"), py::arg("new_length"),
             "Keeps positions 0 .. new_length-1 of seq; pages no sequence holds any more go back to the pool.")
        .def("free",
             [](PyPagedKVCache& c, const py::object& seq) {
                 const Seq s = int_arg(seq, "seq");
                 const std::lock_guard<std::mutex> lock(c.mutex);
                 c.cache.free(s);
             },
             py::arg("seq"), "Ends seq; its pages that no other sequence shares go back to the pool.")
        .def("length",
             [](PyPagedKVCache& c, const py::object& seq) {
                 const Seq s = int_arg(seq, "seq");
                 const std::lock_guard<std::mutex> lock(c.mutex);
                 return c.cache.length(s);
             },
             py::arg("seq"), "Tokens held by seq.")
        .def("page_table",
             [](PyPagedKVCache& c, const py::object& seq) {
                 const Seq s = int_arg(seq, "seq");
                 const std::lock_guard<std::mutex> lock(c.mutex);
                 return c.cache.page_table(s);
             },
             py::arg("seq"), "seq's pages in position order: position j is row j % page_size of page_table[j // page_size].")
        .def("pages_needed",
             [](PyPagedKVCache& c, const py::object& seq, const py::object& tokens) {
                 const Seq s = int_arg(seq, "seq");
                 const std::int64_t t = int_arg(tokens, "tokens");
                 const std::lock_guard<std::mutex> lock(c.mutex);
                 return c.cache.pages_needed(s, t);
             },
             py::arg("seq"), py::arg("tokens"),
             "Free pages an append of `tokens` tokens to seq would take (new pages and a copy-on-write copy):\n"
             "admission control for a scheduler, compared with free_pages.")
        .def_property_readonly("free_pages", [](PyPagedKVCache& c) {
            const std::lock_guard<std::mutex> lock(c.mutex);
            return c.cache.free_pages();
        }, "Pages no sequence holds.")
        .def_property_readonly("num_pages", [](PyPagedKVCache& c) { return c.cache.num_pages(); }, "Pages in the pool.")
        .def_property_readonly("page_size", [](PyPagedKVCache& c) { return c.cache.page_size(); }, "Tokens per page.")
        .def_property_readonly("pool_bytes", [](PyPagedKVCache& c) { return c.cache.pool_bytes(); }, "Bytes of the key and value pools together.")
        .def_property_readonly("dtype", [](PyPagedKVCache& c) { return std::string(attn::dtype_name(c.cache.storage())); }, "The pool's dtype: \"float32\", \"float16\" or \"bfloat16\".");
    m.def("paged_attention", &paged_attention_py, py::arg("query"), py::arg("cache"), py::arg("seqs"), py::kw_only(),
          py::arg("scale") = py::none(), py::arg("is_causal") = true, py::arg("causal_alignment") = "bottom-right",
          py::arg("window") = py::none(), py::arg("window_alignment") = "bottom-right",
          py::arg("query_offset") = py::none(), py::arg("attn_mask") = py::none(), py::arg("return_lse") = false,
          py::arg("softcap") = py::none(),
          py::arg("alibi_slopes") = py::none(), py::arg("sinks") = py::none(), py::arg("dtype") = py::none(),
          py::arg("out_dtype") = py::none(), py::arg("threads") = py::none(), py::arg("impl") = "auto",
          "query (B, Hq, Lq, Dk) float32, float16 or bfloat16 (uint16 bits with dtype=\"bfloat16\"), batch row b = sequence seqs[b] (seqs: ids in a list, NumPy array or torch tensor), against the cache's pages (decode\n"
          "kernel for a few rows per KV head, group*Lq below one flash panel (two with float32 K/V); flash reading the pages of any pool otherwise,\n"
          "chunked prefill included). Append the new tokens first. Keywords as\n"
          "decode_attention's (score modifiers and attn_mask included; the mask's last dim is the longest of seqs), and so are dtype=, out_dtype= (default: a 16-bit query's dtype, else float32) and threads=.\n"
          "impl=\"auto\" (the choice above), \"flash\" (any Lq) or \"decode\" (blocks of 16 queries); \"reference\" reads no pages\n"
          "and is refused. Returns out (B, Hq, Lq, Dv) [, lse float32].");
}

}  // namespace attn_py
