// MultiheadAttention: torch.nn.MultiheadAttention (eval mode) over attn::MultiHeadAttention,
// with torch's constructor arguments, forward signature and state_dict names.
#include <pybind11/stl.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "attn/kv_cache.hpp"
#include "attn/mha.hpp"
#include "attn/safetensors.hpp"
#include "attn/threads.hpp"
#include "bind.hpp"
#include "convert.hpp"
#include "core/check.hpp"
#include "core/float32_values.hpp"
#include "interruptible.hpp"
#include "mha/inputs.hpp"
#include "mha/layer_prefix.hpp"
#include "options.hpp"

namespace attn_py {

namespace {

// The layer's default output dtype: a float16/bfloat16 input's, else float32 (as the C++ layer).
attn::DType default_out(attn::DType x) { return x == attn::DType::f16 || x == attn::DType::bf16 ? x : attn::DType::f32; }

// nn.MultiheadAttention's Python face over attn::MultiHeadAttention (eval mode). One call at a
// time per layer: its workspace is reused between calls.
// The layer's multiply-adds, about (interruptible.hpp): the projections (2·E per element of the
// query — Q and the output — and of the key — K and V, at most) and attention over `keys`.
double layer_work(const attn::TensorView& query, const attn::TensorView& key, std::int64_t keys, std::int64_t E) {
    return 2.0 * static_cast<double>(E) * static_cast<double>(query.numel() + key.numel()) + attention_work(query, keys, E);
}

class PyMha {
public:
    // The weights are packed for the projection GEMM once (MultiHeadAttention::pack_weights;
    // load_state_dict re-packs): Python can change them only through load_state_dict /
    // load_safetensors, so the packed copy is never stale here. Costs float32 panels of each
    // weight matrix beside it.
    explicit PyMha(attn::MultiHeadAttention layer) : layer_(std::move(layer)) { layer_.pack_weights(); }

    // Scalar keywords as given, converted by name (convert.hpp).
    py::tuple forward(const py::object& query, const py::object& key, const py::object& value,
                      const py::object& key_padding_mask, const py::object& need_weights_arg,
                      const py::object& attn_mask, const py::object& average_attn_weights_arg,
                      const py::object& is_causal, const py::object& impl, const py::object& threads_obj,
                      const py::object& dtype, const py::object& out_dtype, const py::object& intermediate_dtype,
                      const py::object& causal_alignment) {
        const int threads = threads_arg(threads_obj);
        const bool bf16 = uint16_is_bf16_arg(dtype);
        const bool need_weights = bool_arg(need_weights_arg, "need_weights");
        const bool average_attn_weights = bool_arg(average_attn_weights_arg, "average_attn_weights");
        const char* layout = "(L, B, E), (B, L, E) with batch_first, or unbatched (L, E)";
        const Input q = input(query, "query", 2, 3, layout, bf16);
        // The same object for query/key/value lets the layer fuse the projections.
        const Input k = key.is(query) ? q : input(key, "key", 2, 3, layout, bf16);
        const Input v = value.is(key) ? k : (value.is(query) ? q : input(value, "value", 2, 3, layout, bf16));
        attn::MhaForwardOptions o;
        Input kpm, am;
        if (!key_padding_mask.is_none()) {
            kpm = input(key_padding_mask, "key_padding_mask", 1, 2, "(B, Lk) or unbatched (Lk,)", bf16);
            o.key_padding_mask = kpm.view;
        }
        if (!attn_mask.is_none()) {
            am = input(attn_mask, "attn_mask", 2, 3, "(Lq, Lk) or (B*h, Lq, Lk)", bf16);
            o.attn_mask = am.view;
        }
        o.need_weights = need_weights;
        o.average_attn_weights = average_attn_weights;
        o.causal = causal_arg(is_causal, causal_alignment);
        o.impl = attn::parse_impl(str_arg(impl, "impl"));
        o.out_dtype = out_dtype_arg(out_dtype, default_out(q.view.dtype()));
        o.intermediate_dtype = out_dtype_arg(intermediate_dtype, attn::DType::f32, "intermediate_dtype");
        const attn::Shape os = layer_.output_shape(q.view);
        py::array out = new_array(*o.out_dtype, std::vector<py::ssize_t>(os.dims.begin(), os.dims.begin() + os.rank), "the output");
        const attn::TensorView ov = output_view(out, 0);
        py::object weights = py::none();
        attn::TensorView wv;
        if (need_weights) {
            const attn::Shape ws = layer_.weights_shape(q.view, k.view, average_attn_weights);
            py::array w = new_array(attn::DType::f32, std::vector<py::ssize_t>(ws.dims.begin(), ws.dims.begin() + ws.rank),
                                    "the attention weights");
            wv = output_view(w, 0);
            weights = w;
        }
        {
            const int seq = layer_.config().batch_first && k.view.rank() == 3 ? 1 : 0;  // the key's L
            const InterruptibleCall nogil(layer_work(q.view, k.view, k.view.dim(seq), layer_.config().embed_dim));
            const std::lock_guard<std::mutex> lock(mutex_);
            const attn::ScopedNumThreads scoped_threads(threads);
            with_python_names([&] { layer_.forward_into(q.view, k.view, v.view, o, ov, need_weights ? &wv : nullptr, &workspace_); },
                              {{"causal:", "is_causal:"}});  // the option, not "a causal attn_mask"
        }
        return py::make_tuple(out, weights);
    }

    // New tokens of every sequence through the layer, their K/V appended to `cache`
    // (MultiHeadAttention::forward_incremental): causal, bottom-right per sequence.
    py::array forward_incremental(const py::object& x_new, const py::object& cache, const py::object& threads_obj,
                                  const py::object& dtype, const py::object& out_dtype) {
        const int threads = threads_arg(threads_obj);
        const Input x = input(x_new, "x_new", 2, 3, "(T, B, E), (B, T, E) with batch_first, or unbatched (T, E)",
                              uint16_is_bf16_arg(dtype));
        const attn::Shape xs = x.view.shape();
        py::array out = new_array(out_dtype_arg(out_dtype, default_out(x.view.dtype())),
                                  std::vector<py::ssize_t>(xs.dims.begin(), xs.dims.begin() + xs.rank), "the output");
        const attn::TensorView ov = output_view(out, 0);
        std::mutex* cache_mutex = nullptr;
        attn::KVCache& c = kv_cache_of(cache, "cache", cache_mutex);
        InterruptibleCall nogil(0);
        // Both locks with the GIL released, and both let go before it is taken back (bind.hpp).
        const std::scoped_lock locks(*cache_mutex, mutex_);
        nogil.arm(layer_work(x.view, x.view, c.capacity(), layer_.config().embed_dim));  // the capacity: a bound
        const attn::ScopedNumThreads scoped_threads(threads);
        layer_.forward_incremental_into(x.view, c, ov, &workspace_);
        return out;
    }

    // Packed variable-length input (MultiHeadAttention::forward_packed): query (Tq, E) rows of
    // N sequences back to back, cu_seqlens (N+1,) their offsets; key/value None = self-attention
    // (key = query, value = key), cu_seqlens_k None = cu_seqlens. Returns (Tq, E) in the query's
    // dtype when it is 16-bit (bfloat16 as uint16 bits), else float32 — as forward_packed.
    py::array forward_packed(const py::object& query, const py::object& cu_seqlens, const py::object& key,
                             const py::object& value, const py::object& cu_seqlens_k, const py::object& is_causal,
                             const py::object& impl, const py::object& threads_obj, const py::object& dtype,
                             const py::object& intermediate_dtype, const py::object& causal_alignment) {
        const int threads = threads_arg(threads_obj);
        const bool bf16 = uint16_is_bf16_arg(dtype);
        const Input q = input(query, "query", 2, 2, "(Tq, E)", bf16);
        const Input k = key.is_none() || key.is(query) ? q : input(key, "key", 2, 2, "(Tk, kdim)", bf16);
        const Input v = value.is_none() || value.is(key) ? k
                        : (value.is(query) ? q : input(value, "value", 2, 2, "(Tk, vdim)", bf16));
        const Input cq = input(cu_seqlens, "cu_seqlens", 1, 1, "(N+1,)");
        const Input ck = cu_seqlens_k.is_none() ? cq : input(cu_seqlens_k, "cu_seqlens_k", 1, 1, "(N+1,)");
        attn::MhaPackedOptions o;
        o.causal = causal_arg(is_causal, causal_alignment);
        o.impl = attn::parse_impl(str_arg(impl, "impl"));
        o.intermediate_dtype = out_dtype_arg(intermediate_dtype, attn::DType::f32, "intermediate_dtype");
        attn::Tensor out;
        {
            const InterruptibleCall nogil(layer_work(q.view, k.view, k.view.dim(0), layer_.config().embed_dim));  // Tk: a bound
            const std::lock_guard<std::mutex> lock(mutex_);
            const attn::ScopedNumThreads scoped_threads(threads);
            // The core's cu_seqlens_q is this method's cu_seqlens (and its cu_seqlens_k when not given).
            with_python_names([&] { out = layer_.forward_packed(q.view, k.view, v.view, cq.view, ck.view, o); },
                              {{"cu_seqlens_q", "cu_seqlens"},
                               {"cu_seqlens_k", cu_seqlens_k.is_none() ? "cu_seqlens (as cu_seqlens_k)" : "cu_seqlens_k"}});
        }
        py::array a = new_array(out.dtype(), dims_of(out.view()), "the output (Tq, E)");
        std::memcpy(a.mutable_data(), out.data(), static_cast<std::size_t>(out.numel()) * attn::dtype_size(out.dtype()));
        return a;
    }

    void load_state_dict(const py::object& state_dict, const py::object& dtype) {
        if (!py::isinstance<py::dict>(state_dict)) {
            type_error("state_dict: expected a dict of name -> array but got " +
                       std::string(py::str(py::type::of(state_dict).attr("__name__"))));
        }
        std::vector<Input> keep;
        // A layer that stores bfloat16 returns its weights as uint16 bits (state_dict): such arrays
        // load back without dtype= (a review found the round trip refused); a torch.bfloat16
        // state_dict loads as it is (named_inputs), as save_safetensors takes it.
        const bool bf16 = dtype.is_none() ? layer_.config().param_dtype == attn::DType::bf16 : uint16_is_bf16_arg(dtype);
        const auto tensors = named_inputs(py::reinterpret_borrow<py::dict>(state_dict), "state_dict", keep, bf16);
        py::gil_scoped_release nogil;
        const std::lock_guard<std::mutex> lock(mutex_);
        layer_.load_state_dict(tensors);
    }

    // prefix: one layer of a whole model's file ("layers.0.self_attn."), as `attn mha --params
    // FILE:PREFIX` reads it (detail::layer_of): only its tensors are read.
    void load_safetensors(const py::object& path_arg, const py::object& prefix_arg) {
        const std::string path = path_arg_of(path_arg, "path");
        const std::string prefix = prefix_arg.is_none() ? std::string() : str_arg(prefix_arg, "prefix");
        if (!prefix_arg.is_none() && prefix.empty()) {
            value_error("load_safetensors: prefix: expected a layer's prefix such as 'layers.0.self_attn.', or None "
                        "for a file of this layer's tensors alone, but got ''");
        }
        py::gil_scoped_release nogil;
        // The file's content is a value, not the type of an argument: an error about it is a
        // ValueError, also one about a tensor's dtype (load_state_dict's "expected a floating
        // dtype", a TypeError for a dict's array: docs/errors.md, "In Python").
        try {
            std::vector<std::string> held;
            const attn::SafetensorsFile f = attn::read_safetensors_prefix(path, prefix, &held);
            const auto tensors = attn::detail::layer_of(f, held, path, prefix,
                                                        {"load_safetensors: prefix", "prefix=", "give the prefix", true});
            const std::lock_guard<std::mutex> lock(mutex_);
            layer_.load_state_dict(tensors);
        } catch (const attn::Error& e) {
            throw attn::Error(e.what(), attn::ErrorKind::value);
        }
    }

    // Copies of the parameters, in torch's state_dict order (a dict keeps insertion order),
    // taken under the lock load_state_dict and forward take: a concurrent load cannot tear
    // them. The parameters' shapes and addresses are fixed at construction, so the arrays are
    // made first (with the GIL) and filled under the lock (without it).
    // Each array has its parameter's storage dtype (16-bit weight matrices: float16, or uint16
    // bfloat16 bits).
    py::dict state_dict() {
        const auto params = layer_.state_dict();
        std::vector<py::array> arrays;
        for (const auto& [name, view] : params) {
            arrays.push_back(new_array(view.dtype(), std::vector<py::ssize_t>(view.shape().dims.begin(),
                                                                              view.shape().dims.begin() + view.rank()),
                                     "a parameter's copy"));
        }
        std::vector<void*> dst;
        for (auto& a : arrays) dst.push_back(a.mutable_data());
        {
            py::gil_scoped_release nogil;
            const std::lock_guard<std::mutex> lock(mutex_);
            for (std::size_t i = 0; i < params.size(); ++i) std::memcpy(dst[i], params[i].second.data(),
                                                                           static_cast<std::size_t>(params[i].second.numel()) * attn::dtype_size(params[i].second.dtype()));
        }
        py::dict d;
        for (std::size_t i = 0; i < params.size(); ++i) d[py::str(params[i].first)] = arrays[i];
        return d;
    }

    const attn::MhaConfig& config() const { return layer_.config(); }
    std::int64_t head_dim() const { return layer_.head_dim(); }

private:
    attn::MultiHeadAttention layer_;
    attn::MhaWorkspace workspace_;
    std::mutex mutex_;
};

// The weight matrices' storage: None → float32, else storage_dtype_arg's.
attn::DType param_dtype_arg(const py::object& dtype) {
    if (dtype.is_none()) return attn::DType::f32;
    if (const auto dt = storage_dtype_arg(dtype)) return *dt;
    type_error("dtype: parameters are float32, float16 or bfloat16 but got " + std::string(py::str(dtype)));
}

// torch's constructor arguments as given, converted by name (convert.hpp's scalar arguments).
std::unique_ptr<PyMha> make_mha(const py::object& embed_dim, const py::object& num_heads, const py::object& dropout_arg,
                                const py::object& bias, const py::object& add_bias_kv,
                                const py::object& add_zero_attn, const py::object& kdim, const py::object& vdim,
                                const py::object& batch_first, const py::object& device, const py::object& dtype,
                                const py::object& num_kv_heads, const py::object& sinks, const py::object& softcap,
                                const py::object& alibi_slopes) {
    const double dropout = float_arg(dropout_arg, "dropout");
    // A probability by the library's rule, in its words with torch's name for it ("MultiHeadAttention:
    // dropout: must be in [0, 1) but got 1.5"); then this class's own limit: it does not train.
    attn::detail::require_dropout_p(attn::detail::kMha, dropout, "dropout");
    if (dropout != 0.0) {
        value_error("dropout: attn's MultiheadAttention is inference-only (eval mode); expected 0.0 but got " +
                    attn::detail::shortest(dropout));
    }
    // torch's spelling of the one CPU device: "cpu", or with an index, "cpu:0" (torch.device("cpu", 0)),
    // which torch's module takes too.
    if (!device.is_none()) {
        const std::string d = py::str(device);
        const bool indexed = d.size() > 4 && d.compare(0, 4, "cpu:") == 0 &&
                             std::all_of(d.begin() + 4, d.end(), [](unsigned char ch) { return std::isdigit(ch) != 0; });
        if (d != "cpu" && !indexed) value_error("device: only 'cpu' is supported but got " + d);
    }
    attn::MhaConfig c;
    c.param_dtype = param_dtype_arg(dtype);
    c.embed_dim = int_arg(embed_dim, "embed_dim");
    c.num_heads = int_arg(num_heads, "num_heads");
    // None is each one's default (embed_dim, embed_dim, num_heads: the config's 0); an explicit
    // 0 is not, since torch reads kdim=0 as a 0-wide key.
    auto positive_or_default = [](const py::object& obj, const char* name) -> std::int64_t {
        const std::optional<std::int64_t> n = optional_int_arg(obj, name);
        if (n && *n < 1) value_error(std::string(name) + ": expected a positive int or None (the default) but got " +
                                     std::to_string(*n));
        return n.value_or(0);
    };
    c.kdim = positive_or_default(kdim, "kdim");
    c.vdim = positive_or_default(vdim, "vdim");
    c.num_kv_heads = positive_or_default(num_kv_heads, "num_kv_heads");
    c.bias = bool_arg(bias, "bias");
    c.batch_first = bool_arg(batch_first, "batch_first");
    c.add_bias_kv = bool_arg(add_bias_kv, "add_bias_kv");
    c.add_zero_attn = bool_arg(add_zero_attn, "add_zero_attn");
    c.sinks = bool_arg(sinks, "sinks");
    c.softcap = float_arg(softcap, "softcap");
    // alibi_slopes: None (off), True (attn.alibi_slopes(num_heads)), or an array (num_heads,);
    // the layer checks the count and the values — and num_heads, in its words, when it is < 1
    // (then there are no standard slopes to make).
    if (py::isinstance<py::bool_>(alibi_slopes)) {
        if (alibi_slopes.cast<bool>() && c.num_heads >= 1) {
            const attn::Tensor std_slopes = attn::alibi_slopes(c.num_heads);
            c.alibi_slopes.assign(std_slopes.data_as<const float>(), std_slopes.data_as<const float>() + c.num_heads);
        }
    } else if (!alibi_slopes.is_none()) {
        const Input a = input(alibi_slopes, "alibi_slopes", 1, 1, "(num_heads,)");
        const attn::Tensor f = attn::detail::float32_values(a.view, "alibi_slopes");
        c.alibi_slopes.assign(f.data_as<const float>(), f.data_as<const float>() + f.numel());
    }
    return std::make_unique<PyMha>(attn::MultiHeadAttention(c));
}

}  // namespace

void bind_mha(py::module_& m) {
    py::class_<PyMha>(m, "MultiheadAttention",
                      "torch.nn.MultiheadAttention (eval mode) with attn's kernels; weight matrices stored in\n"
                      "dtype= (float32 default, float16, \"bfloat16\"), biases float32. Unlike torch's, a new layer's\n"
                      "parameters are all zero (no random init): load them with load_state_dict or load_safetensors.")
        .def(py::init(&make_mha), py::arg("embed_dim"), py::arg("num_heads"), py::arg("dropout") = 0.0,
             py::arg("bias") = true, py::arg("add_bias_kv") = false, py::arg("add_zero_attn") = false,
             py::arg("kdim") = py::none(), py::arg("vdim") = py::none(), py::arg("batch_first") = false,
             py::arg("device") = py::none(), py::arg("dtype") = py::none(), py::kw_only(),
             py::arg("num_kv_heads") = py::none(), py::arg("sinks") = false, py::arg("softcap") = 0.0,
             py::arg("alibi_slopes") = py::none(),
             "attn extensions (keyword-only): num_kv_heads (GQA); sinks=True adds the parameter 'sinks'\n"
             "(num_heads,), a sink logit per head (gpt-oss); softcap=c caps every score to c*tanh(s/c)\n"
             "(0 = off); alibi_slopes=True (attn.alibi_slopes(num_heads)) or an array (num_heads,).")
        .def("forward", &PyMha::forward, py::arg("query"), py::arg("key"), py::arg("value"),
             py::arg("key_padding_mask") = py::none(), py::arg("need_weights") = true,
             py::arg("attn_mask") = py::none(), py::arg("average_attn_weights") = true, py::arg("is_causal") = false,
             py::kw_only(), py::arg("impl") = "auto", py::arg("threads") = py::none(), py::arg("dtype") = py::none(),
             py::arg("out_dtype") = py::none(), py::arg("intermediate_dtype") = py::none(),
             py::arg("causal_alignment") = "top-left",
             "Returns (output, weights or None), as torch. threads: None = attn.get_num_threads().\n"
             "query/key/value: float32, float64, float16, or uint16 bfloat16 bits with dtype=\"bfloat16\";\n"
             "a float key_padding_mask/attn_mask likewise (bool masks: True = masked, as torch).\n"
             "out_dtype=\"float32\"|\"float16\"|\"bfloat16\": the output's dtype (default: the query's when\n"
             "16-bit, else float32; bfloat16 is returned as uint16 bits). Weights are float32.\n"
             "intermediate_dtype=\"float16\"|\"bfloat16\": Q, K, V and the attention output rounded once to\n"
             "it, as torch's 16-bit layer keeps them (faster on bfloat16 pairs); default float32.\n"
             "is_causal=True is torch's top-left mask (query i sees keys 0..i); causal_alignment=\"bottom-right\"\n"
             "aligns it to the end instead (keys 0..i+Lk-Lq: the queries are the last Lq of Lk positions), as\n"
             "scaled_dot_product_attention's causal_alignment.")
        .def("__call__", &PyMha::forward, py::arg("query"), py::arg("key"), py::arg("value"),
             py::arg("key_padding_mask") = py::none(), py::arg("need_weights") = true,
             py::arg("attn_mask") = py::none(), py::arg("average_attn_weights") = true, py::arg("is_causal") = false,
             py::kw_only(), py::arg("impl") = "auto", py::arg("threads") = py::none(), py::arg("dtype") = py::none(),
             py::arg("out_dtype") = py::none(), py::arg("intermediate_dtype") = py::none(),
             py::arg("causal_alignment") = "top-left")
        .def("forward_incremental", &PyMha::forward_incremental, py::arg("x_new"), py::arg("cache"), py::kw_only(),
             py::arg("threads") = py::none(), py::arg("dtype") = py::none(), py::arg("out_dtype") = py::none(),
             "Self-attention of new tokens against a KVCache: projects x_new, appends its keys and values\n"
             "to every sequence of the cache, attends causally (each sequence at its own length) and\n"
             "returns the output shaped like x_new. Feeding a sequence in any split equals one causal\n"
             "forward over the whole sequence.")
        .def("forward_packed", &PyMha::forward_packed, py::arg("query"), py::arg("cu_seqlens"),
             py::arg("key") = py::none(), py::arg("value") = py::none(), py::kw_only(),
             py::arg("cu_seqlens_k") = py::none(), py::arg("is_causal") = false, py::arg("impl") = "auto",
             py::arg("threads") = py::none(), py::arg("dtype") = py::none(), py::arg("intermediate_dtype") = py::none(),
             py::arg("causal_alignment") = "top-left",
             "Packed variable-length input without padding (attn.sdpa_varlen inside): query (Tq, E) holds\n"
             "N sequences back to back, cu_seqlens (N+1,) int32/int64 their offsets (cu[0] = 0, last = Tq).\n"
             "key (Tk, kdim) defaults to query (self-attention), value (Tk, vdim) to key, cu_seqlens_k to\n"
             "cu_seqlens. Sequence b's rows are what forward() gives that sequence alone (is_causal and\n"
             "causal_alignment per sequence, at its own lengths). Returns (Tq, E): float32, or a 16-bit query's dtype\n"
             "(dtype=\"bfloat16\": uint16 arrays are bfloat16 bits). intermediate_dtype= as forward's.")
        .def("load_state_dict", &PyMha::load_state_dict, py::arg("state_dict"), py::kw_only(), py::arg("dtype") = py::none(),
             "Copies the arrays (torch names; float32/float64/float16, torch.bfloat16 tensors, uint16\n"
             "bfloat16 bits with dtype=\"bfloat16\" — the default for a layer that stores bfloat16, so\n"
             "state_dict() loads back)\n"
             "into the parameters, converted to their storage dtype; the names must match exactly.")
        .def("load_safetensors", &PyMha::load_safetensors, py::arg("path"), py::kw_only(), py::arg("prefix") = py::none(),
             "Loads the parameters from a safetensors file whose tensors carry this layer's state_dict\n"
             "names, as load_state_dict; the layer is unchanged if any is refused. prefix= selects one\n"
             "layer of a whole model's file, e.g. prefix=\"layers.0.self_attn.\": the tensors whose names\n"
             "start with it, without it (only those are read), as `attn mha --params FILE:PREFIX`.")
        .def("state_dict", &PyMha::state_dict,
             "Copies of the parameters in their storage dtype (bfloat16: uint16 bits).")
        .def_property_readonly("param_dtype", [](const PyMha& s) { return std::string(attn::dtype_name(s.config().param_dtype)); }, "The weight matrices' dtype: \"float32\", \"float16\" or \"bfloat16\".")
        .def_property_readonly("embed_dim", [](const PyMha& s) { return s.config().embed_dim; }, "E, the model dim (query features and output features).")
        .def_property_readonly("num_heads", [](const PyMha& s) { return s.config().num_heads; }, "h, the attention heads.")
        .def_property_readonly("head_dim", &PyMha::head_dim, "E // num_heads.")
        .def_property_readonly("kdim", [](const PyMha& s) { return s.config().kdim ? s.config().kdim : s.config().embed_dim; }, "Key features (embed_dim unless given).")
        .def_property_readonly("vdim", [](const PyMha& s) { return s.config().vdim ? s.config().vdim : s.config().embed_dim; }, "Value features (embed_dim unless given).")
        .def_property_readonly("batch_first", [](const PyMha& s) { return s.config().batch_first; }, "True: inputs and outputs are (B, L, E); False: (L, B, E), PyTorch's default.")
        .def_property_readonly("softcap", [](const PyMha& s) { return s.config().softcap; }, "The logit soft-cap C (0: off).")
        .def_property_readonly("has_sinks", [](const PyMha& s) { return s.config().sinks; }, "Whether the layer has a learned sink logit per head.");
}

}  // namespace attn_py
