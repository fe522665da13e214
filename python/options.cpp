#include "options.hpp"

#include "convert.hpp"
#include "core/check.hpp"
#include "core/float32_values.hpp"

#include <algorithm>
#include <cctype>

namespace attn_py {

namespace {

attn::Align align_of(const py::object& given, const char* name) {
    const std::string alignment = str_arg(given, name);
    if (alignment == "top-left") return attn::Align::top_left;
    if (alignment == "bottom-right") return attn::Align::bottom_right;
    value_error(std::string(name) + ": expected \"top-left\" or \"bottom-right\" but got \"" + alignment + "\"");
}

// window=(left, right): each side an int >= 0, or −1 / None for unbounded (attn::sdpa checks
// the range and names the values).
attn::Window window_of(const py::object& window, const py::object& alignment) {
    attn::Window w;
    w.align = align_of(alignment, "window_alignment");
    if (window.is_none()) return w;
    const char* expected = "window: expected (left, right), each an int >= 0 or -1/None for unbounded, but got ";
    if (!py::isinstance<py::sequence>(window) || py::isinstance<py::str>(window) || py::len(window) != 2) {
        type_error(expected + std::string(py::repr(window)));
    }
    const auto side = [&](const py::handle& h) -> std::int64_t {
        if (h.is_none()) return -1;
        const std::optional<std::int64_t> v = int_of(h, "window");
        if (!v) type_error(expected + std::string(py::repr(window)));
        return *v;
    };
    const py::sequence s = window.cast<py::sequence>();
    w.left = side(s[0]);
    w.right = side(s[1]);
    return w;
}

// An int for every sequence, or a (B,) int32/int64 array (one per sequence; `sequences` is B).
std::optional<attn::QueryOffset> query_offset_of(const py::object& offset, const std::string& sequences, py::array& keep) {
    if (offset.is_none()) return std::nullopt;
    if (const std::optional<std::int64_t> v = int_of(offset, "query_offset")) return attn::QueryOffset(*v);
    keep = as_array(offset, "query_offset");
    if (keep.ndim() == 0) {  // a 0-d array or tensor, a float: named as given, not as its dtype's "scalar"
        type_error("query_offset: expected an int or a (" + sequences + ",) int32/int64 array but got " + given(offset));
    }
    return attn::QueryOffset(view_of(keep, "query_offset", 1, 1, ("an int or shape (" + sequences + ",)").c_str()));
}

}  // namespace

attn::Causal causal_arg(const py::object& is_causal, const py::object& causal_alignment) {
    const attn::Align causal = align_of(causal_alignment, "causal_alignment");
    return !bool_arg(is_causal, "is_causal")         ? attn::Causal::none
           : causal == attn::Align::top_left ? attn::Causal::top_left
                                             : attn::Causal::bottom_right;
}

void set_alignment(const AlignmentArgs& args, CallOptions& out) {
    out.sdpa.causal = causal_arg(args.is_causal, args.causal_alignment);
    out.sdpa.window = window_of(args.window, args.window_alignment);
    out.sdpa.query_offset = query_offset_of(args.query_offset, args.sequences, out.query_offset);
}

namespace {

// alibi_slopes and sinks, which the core keeps in float32: any floating array (a Python list is
// float64) is rounded to float32 once by the library's rule (core/float32_values.hpp), as
// MultiheadAttention(alibi_slopes=) and attn.torch take them; another dtype is left for the core
// to refuse by name.
attn::TensorView float32_parameters(py::array& a, const char* name, int max_rank, const char* layout) {
    const attn::TensorView v = view_of(a, name, 1, max_rank, layout);
    if (v.dtype() == attn::DType::f32 || !attn::is_floating(v.dtype())) return v;
    const attn::Tensor f = attn::detail::float32_values(v, name);
    std::vector<py::ssize_t> dims;
    for (int d = 0; d < f.view().rank(); ++d) dims.push_back(f.view().dim(d));
    py::array_t<float> copy(dims);
    std::copy(f.data_as<float>(), f.data_as<float>() + f.numel(), copy.mutable_data());
    a = copy;
    return view_of(a, name, 1, max_rank, layout);
}

}  // namespace

void set_modifiers(const ModifierArgs& args, std::int64_t heads, CallOptions& out, const char* sequences) {
    const std::string slopes_layout = "(Hq,) or (" + std::string(sequences) + ", Hq)";
    if (!args.softcap.is_none()) out.sdpa.softcap = float_arg(args.softcap, "softcap");
    // True or False (Python's or NumPy's bool) asks for the paper's slopes or none.
    if (py::isinstance<py::bool_>(args.alibi_slopes) ||
        py::isinstance(args.alibi_slopes, py::module_::import("numpy").attr("bool_"))) {
        if (bool_arg(args.alibi_slopes, "alibi_slopes")) {
            py::array_t<float> a(static_cast<py::ssize_t>(heads));
            if (heads > 0) {  // no heads (an empty call, only checked: _check_sdpa) have no slopes
                const attn::Tensor s = attn::alibi_slopes(heads);
                std::copy(s.data_as<float>(), s.data_as<float>() + heads, a.mutable_data());
            }
            out.alibi_slopes = a;
            out.sdpa.alibi_slopes = view_of(out.alibi_slopes, "alibi_slopes", 1, 2, slopes_layout.c_str());
        }
    } else if (!args.alibi_slopes.is_none()) {
        out.alibi_slopes = as_array(args.alibi_slopes, "alibi_slopes");
        out.sdpa.alibi_slopes = float32_parameters(out.alibi_slopes, "alibi_slopes", 2, slopes_layout.c_str());
    }
    if (!args.sinks.is_none()) {
        out.sinks = as_array(args.sinks, "sinks");
        out.sdpa.sinks = float32_parameters(out.sinks, "sinks", 1, "(Hq,)");
    }
}

void set_mask(const py::object& attn_mask, bool uint16_is_bf16, CallOptions& out, int query_rank) {
    if (attn_mask.is_none()) return;
    out.mask = as_array(attn_mask, "attn_mask");
    const char* layout = query_rank == 2   ? "a mask broadcastable to query's (Lq, Lk)"
                         : query_rank == 3 ? "a mask broadcastable to query's (H, Lq, Lk)"
                                           : "a mask broadcastable to (B, H, Lq, Lk)";
    const attn::TensorView m = view_of(out.mask, "attn_mask", 0, query_rank, layout, uint16_is_bf16);
    if (m.dtype() == attn::DType::boolean) {
        out.sdpa.bool_mask = m;
    } else if (attn::is_floating(m.dtype())) {  // float16/bfloat16: widened once by attn (a 16-bit model's mask)
        out.sdpa.additive_mask = m;
    } else {
        type_error("attn_mask: dtype must be bool (True = may attend) or float32, float64, float16 or bfloat16 "
                   "(added) but got " + std::string(attn::dtype_name(m.dtype())));
    }
}

std::optional<std::uint64_t> dropout_seed_arg(const py::object& seed, double p, std::string_view op) {
    const std::optional<std::uint64_t> s = seed.is_none() ? std::nullopt : std::optional(uint_arg(seed, "dropout_seed"));
    static const std::string seed_value = "dropout_seed=N, " + std::string(kUint64Range);
    attn::detail::require_dropout(op, p, s, {"dropout_p", "dropout_seed", seed_value});
    return s;
}

attn::DropoutOrigin dropout_origin_arg(const py::object& origin) {
    attn::DropoutOrigin o;
    if (origin.is_none()) return o;
    const auto wrong = [&] {
        type_error("dropout_origin: expected (batch, head, row, key), four ints >= 0 (where the call's (0, 0, 0, 0) sits "
                   "in the whole problem), or None, but got " + std::string(py::repr(origin)));
    };
    if (!py::isinstance<py::sequence>(origin) || py::isinstance<py::str>(origin) || py::len(origin) != 4) wrong();
    const py::sequence s = origin.cast<py::sequence>();
    const struct {
        std::int64_t* field;
        const char* name;
    } fields[] = {{&o.batch, "dropout_origin.batch"}, {&o.head, "dropout_origin.head"},
                  {&o.row, "dropout_origin.row"}, {&o.key, "dropout_origin.key"}};
    for (std::size_t i = 0; i < 4; ++i) {
        const std::optional<std::int64_t> v = int_of(s[i], fields[i].name);
        if (!v) wrong();
        *fields[i].field = *v;
    }
    return o;
}

CallOptions make_options(std::string_view op, const SdpaArgs& args, const ModifierArgs& modifiers, std::int64_t heads) {
    CallOptions o = make_options(op, args);
    set_modifiers(modifiers, heads, o, args.alignment.sequences);
    return o;
}

CallOptions make_options(std::string_view op, const SdpaArgs& args) {
    CallOptions o;
    o.sdpa.scale = optional_float_arg(args.scale, "scale");
    o.sdpa.dropout_p = float_arg(args.dropout_p, "dropout_p");
    o.sdpa.dropout_seed = dropout_seed_arg(args.dropout_seed, o.sdpa.dropout_p, op);
    o.sdpa.dropout_origin = dropout_origin_arg(args.dropout_origin);
    o.sdpa.impl = attn::parse_impl(str_arg(args.impl, "impl"));
    set_alignment(args.alignment, o);
    set_mask(args.attn_mask, args.uint16_is_bf16, o, args.query_rank);
    if (!args.key_lengths.is_none()) {
        o.key_lengths = as_array(args.key_lengths, "key_lengths");
        o.sdpa.key_lengths = view_of(o.key_lengths, "key_lengths", 1, 1, "shape (B,)");
    }
    return o;
}

std::string python_names(const std::string& message, Renames renames) {
    std::string m = message;
    // Whole words only ("cu_seqlens_q has 3 entries" too, not only "cu_seqlens_q: "), never a
    // part of a longer name.
    const auto in_word = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
    const auto rename = [&](const std::string& core, const std::string& python) {
        for (std::size_t at = m.find(core); at != std::string::npos; at = m.find(core, at)) {
            const std::size_t end = at + core.size();
            if ((at > 0 && in_word(m[at - 1])) || (end < m.size() && in_word(m[end]))) {
                ++at;
                continue;
            }
            m.replace(at, core.size(), python);
            at += python.size();
        }
    };
    rename("bool_mask", "attn_mask");
    rename("additive_mask", "attn_mask");
    for (const auto& [core, python] : renames) rename(core, python);
    return m;
}

}  // namespace attn_py
