// attn::MultiHeadAttention: the configuration's checks and the parameters (PyTorch's
// state_dict names). The forward pass is in mha_forward.cpp, training in mha_backward.cpp.
#include "attn/mha.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "../core/check.hpp"
#include "../core/checked_size.hpp"
#include "../sdpa/option_values.hpp"
#include "../sdpa/problem.hpp"
#include "config_values.hpp"
#include "inputs.hpp"

namespace attn {

using detail::fail;
using detail::fail_type;
using detail::kMha;

namespace {

// After "missing tensor 'X'": what the state_dict holds instead. A whole model's state_dict
// prefixes each layer's names ("layers.0.self_attn.out_proj.weight"): such a name is shown with
// the prefix to remove; otherwise (with `list`) the names it holds (names_held).
std::string what_it_holds(const std::vector<std::pair<std::string, TensorView>>& tensors, const std::string& wanted,
                          bool list = true) {
    for (const auto& [name, t] : tensors) {
        const std::size_t n = name.size(), w = wanted.size();
        if (n > w + 1 && name.compare(n - w, w, wanted) == 0 && name[n - w - 1] == '.') {
            return " — it holds " + detail::quoted(name) + ": a whole model's state_dict, whose names carry the prefix " +
                   detail::quoted(name.substr(0, n - w)) + " to remove";
        }
    }
    if (!list) return "";
    std::vector<std::string> names;
    for (const auto& [name, t] : tensors) names.push_back(name);
    return " — " + detail::names_held(names);
}

// Heads of equal size, E / h: num_heads divides embed_dim. Named first as the argument at fault
// (embed_dim is the layer's size; `source` says where it came from), so a caller that spells it
// otherwise renames it (attn mha's --num-heads, tools/attn/flag_names.hpp).
void require_heads_divide(std::int64_t embed_dim, std::int64_t num_heads, const char* source) {
    if (embed_dim % num_heads != 0) fail(kMha, "num_heads: must divide embed_dim ", embed_dim, source, " but got ", num_heads);
}

}  // namespace

void detail::check_config_values(std::int64_t num_heads, double softcap) {
    if (num_heads < 1) fail(kMha, "num_heads: must be >= 1 but got ", num_heads);
    require_softcap(softcap, kMha);
}

MultiHeadAttention::MultiHeadAttention(const MhaConfig& config) : config_(config) {
    MhaConfig& c = config_;
    if (c.embed_dim < 1) fail(kMha, "embed_dim must be >= 1 but got ", c.embed_dim);
    detail::check_config_values(c.num_heads, c.softcap);
    require_heads_divide(c.embed_dim, c.num_heads, "");
    // The parameters' sizes are sums of these (E + 2·E_kv rows, E_kv ≤ E): kept far from int64's end.
    constexpr std::int64_t kMaxDim = std::numeric_limits<std::int64_t>::max() / 4;
    if (c.embed_dim > kMaxDim) fail(kMha, "embed_dim must be < 2^61 but got ", c.embed_dim);
    if (c.kdim == 0) c.kdim = c.embed_dim;
    if (c.vdim == 0) c.vdim = c.embed_dim;
    if (c.kdim < 1) fail(kMha, "kdim must be >= 1 (or 0 for embed_dim) but got ", c.kdim);
    if (c.vdim < 1) fail(kMha, "vdim must be >= 1 (or 0 for embed_dim) but got ", c.vdim);
    if (c.num_kv_heads == 0) c.num_kv_heads = c.num_heads;
    if (c.num_kv_heads < 1 || c.num_heads % c.num_kv_heads != 0) {
        fail(kMha, "num_kv_heads must divide num_heads ", c.num_heads, " but got ", c.num_kv_heads);
    }
    if (!c.alibi_slopes.empty()) {
        if (static_cast<std::int64_t>(c.alibi_slopes.size()) != c.num_heads) {
            fail(kMha, "alibi_slopes: expected one slope per head (", c.num_heads, ") but got ", c.alibi_slopes.size());
        }
        if (c.add_bias_kv || c.add_zero_attn) {
            fail(kMha, "alibi_slopes: not with add_bias_kv or add_zero_attn (their appended key has no position to measure "
                       "a distance from)");
        }
        alibi_ = Tensor(DType::f32, Shape{c.num_heads});
        std::copy(c.alibi_slopes.begin(), c.alibi_slopes.end(), alibi_.data_as<float>());
        detail::require_finite_f32(kMha, alibi_.view(), "alibi_slopes");  // sdpa's rule for the slopes it is given
    }
    if (c.param_dtype != DType::f32 && c.param_dtype != DType::f16 && c.param_dtype != DType::bf16) {
        fail_type(kMha, "param_dtype: expected float32, float16 or bfloat16 but got ", dtype_name(c.param_dtype));
    }
    // Sizes that come from the config are said as the config's (the Tensor's own message names
    // no argument of this constructor).
    for (const auto& [name, shape] : parameter_shapes()) {
        const DType dt = is_weight_matrix(name) ? c.param_dtype : DType::f32;
        const std::string what = "parameter " + name + " (from embed_dim, kdim, vdim and the heads)";
        detail::checked_bytes(kMha, what, shape, dtype_size(dt));
        try {
            params_.emplace(name, Tensor(dt, shape, true));
        } catch (const OutOfMemory& e) {
            throw OutOfMemory(std::string(kMha) + ": " + what + ": " + e.what());
        }
    }
}

bool MultiHeadAttention::is_weight_matrix(std::string_view name) {
    return name == "in_proj_weight" || name == "q_proj_weight" || name == "k_proj_weight" || name == "v_proj_weight" ||
           name == "out_proj.weight";
}

void MultiHeadAttention::set_param_dtype(DType dtype) {
    if (dtype != DType::f32 && dtype != DType::f16 && dtype != DType::bf16) {
        fail_type(kMha, "set_param_dtype: expected float32, float16 or bfloat16 but got ", dtype_name(dtype));
    }
    // Everything that can fail (the conversions, the packing) before anything changes: out of
    // memory leaves every matrix in its old dtype (one at a time could leave them mixed).
    std::map<std::string, Tensor, std::less<>> converted;
    for (const auto& [name, t] : params_)
        if (is_weight_matrix(name) && t.dtype() != dtype) converted.emplace(name, to_dtype(t.view(), dtype));
    std::map<std::string, const Tensor*, std::less<>> replace;
    for (const auto& [name, t] : converted) replace.emplace(name, &t);
    auto packed = packed_ != nullptr ? packed_with(replace) : nullptr;
    for (auto& [name, t] : converted) params_.at(name) = std::move(t);
    config_.param_dtype = dtype;
    packed_ = std::move(packed);
}

std::vector<std::pair<std::string, Shape>> MultiHeadAttention::parameter_shapes() const {
    const MhaConfig& c = config_;
    const std::int64_t E = c.embed_dim, Ekv = c.num_kv_heads * head_dim();
    std::vector<std::pair<std::string, Shape>> p;
    if (c.kdim == E && c.vdim == E) {
        p.emplace_back("in_proj_weight", Shape{E + 2 * Ekv, E});
    } else {
        p.emplace_back("q_proj_weight", Shape{E, E});
        p.emplace_back("k_proj_weight", Shape{Ekv, c.kdim});
        p.emplace_back("v_proj_weight", Shape{Ekv, c.vdim});
    }
    if (c.bias) p.emplace_back("in_proj_bias", Shape{E + 2 * Ekv});
    if (c.add_bias_kv) {
        p.emplace_back("bias_k", Shape{1, 1, Ekv});
        p.emplace_back("bias_v", Shape{1, 1, Ekv});
    }
    p.emplace_back("out_proj.weight", Shape{E, E});
    if (c.bias) p.emplace_back("out_proj.bias", Shape{E});
    if (c.sinks) p.emplace_back("sinks", Shape{c.num_heads});
    return p;
}

void MultiHeadAttention::score_modifiers(SdpaOptions& o) const {
    o.softcap = config_.softcap;
    if (alibi_.data() != nullptr) o.alibi_slopes = alibi_.view();
    if (config_.sinks) o.sinks = parameter("sinks");
}

// Every configuration has parameters (in_proj, out_proj): none means the layer was moved from.
void MultiHeadAttention::require_parameters() const {
    if (params_.empty()) fail(kMha, "the layer holds no parameters (it was moved from)");
}

TensorView MultiHeadAttention::parameter(std::string_view name) const {
    require_parameters();
    const auto it = params_.find(name);
    if (it == params_.end()) fail(kMha, "no parameter named '", name, "' in this configuration");
    return it->second.view();
}

std::vector<std::pair<std::string, TensorView>> MultiHeadAttention::state_dict() const {
    std::vector<std::pair<std::string, TensorView>> out;
    for (const auto& [name, shape] : parameter_shapes()) out.emplace_back(name, parameter(name));
    return out;
}

void MultiHeadAttention::load_state_dict(const std::vector<std::pair<std::string, TensorView>>& tensors) {
    require_parameters();
    // All problems are collected and reported together; nothing is copied unless none. The error
    // is a dtype one (ErrorKind::type) when every problem is a tensor's dtype.
    std::string problems;
    ErrorKind kind = ErrorKind::type;
    auto add_as = [&](ErrorKind k, const std::string& p) {
        problems += (problems.empty() ? "" : "; ") + p;
        if (k == ErrorKind::value) kind = ErrorKind::value;
    };
    auto add = [&](const std::string& p) { add_as(ErrorKind::value, p); };
    const auto expected = parameter_shapes();
    for (const auto& [name, shape] : expected) {
        const auto it = std::find_if(tensors.begin(), tensors.end(), [&n = name](const auto& t) { return t.first == n; });
        if (it == tensors.end()) {
            add("missing tensor '" + name + "' (expected shape " + shape.str() + ")" + what_it_holds(tensors, name, false));
        } else if (!(it->second.shape() == shape)) {
            add("tensor '" + name + "': expected shape " + shape.str() + " but got " + it->second.shape().str());
        } else if (!is_floating(it->second.dtype())) {
            add_as(ErrorKind::type,
                   "tensor '" + name + "': expected a floating dtype but got " + std::string(dtype_name(it->second.dtype())));
        } else if (const std::string missing = detail::missing_data(it->second); !missing.empty()) {
            add("tensor '" + name + "': " + missing);
        }
    }
    for (std::size_t i = 0; i < tensors.size(); ++i) {
        const std::string& name = tensors[i].first;
        const bool known = std::any_of(expected.begin(), expected.end(), [&](const auto& e) { return e.first == name; });
        if (!known) {
            std::string why;
            if (name == "bias_k" || name == "bias_v") why = " (the layer was built without add_bias_kv)";
            if (name == "sinks") why = " (the layer was built without sinks)";
            add("unexpected tensor " + detail::quoted(name) + " with shape " + tensors[i].second.shape().str() + why);
        }
        for (std::size_t j = 0; j < i; ++j)
            if (tensors[j].first == name) add("tensor " + detail::quoted(name) + " is given more than once");
    }
    if (!problems.empty()) {
        detail::fail_as(kind, kMha, "state_dict does not fit (E=", config_.embed_dim, ", heads=", config_.num_heads, ", kv heads=",
             config_.num_kv_heads, ", kdim=", config_.kdim, ", vdim=", config_.vdim, ", bias=", config_.bias ? "true" : "false",
             "): ", problems);
    }
    // Every tensor is converted, and the packed weights made from them, before any parameter
    // changes: out of memory in either leaves the layer as it was (packing after the copies
    // left the new parameters in place behind the error). The copies below cannot fail.
    std::vector<Tensor> converted;
    converted.reserve(tensors.size());
    for (const auto& [name, view] : tensors) converted.push_back(to_dtype(view, params_.at(name).dtype()));
    // After the conversion: a float64 sink of 1e300 is inf in a float32 parameter.
    for (std::size_t i = 0; i < tensors.size(); ++i)
        if (tensors[i].first == "sinks") detail::check_finite_sinks(converted[i].view(), "state_dict: tensor 'sinks'");
    std::map<std::string, const Tensor*, std::less<>> replace;
    for (std::size_t i = 0; i < tensors.size(); ++i) replace.emplace(tensors[i].first, &converted[i]);
    auto packed = packed_ != nullptr ? packed_with(replace) : nullptr;
    for (std::size_t i = 0; i < tensors.size(); ++i) {
        Tensor& dst = params_.at(tensors[i].first);
        std::memcpy(dst.data(), converted[i].data(), dst.nbytes());
    }
    packed_ = std::move(packed);
}

MultiHeadAttention MultiHeadAttention::from_state_dict(const std::vector<std::pair<std::string, TensorView>>& tensors,
                                                       std::int64_t num_heads, bool batch_first, double softcap,
                                                       std::vector<float> alibi_slopes, std::optional<DType> param_dtype,
                                                       bool add_zero_attn) {
    detail::check_config_values(num_heads, softcap);  // the arguments before the tensors
    auto find = [&](const char* name) -> const TensorView* {
        for (const auto& [n, t] : tensors)
            if (n == name) return &t;
        return nullptr;
    };
    const TensorView* wo = find("out_proj.weight");
    if (wo == nullptr) {
        fail(kMha, "state_dict: missing tensor 'out_proj.weight' (expected shape (E, E); it gives embed_dim)",
             what_it_holds(tensors, "out_proj.weight"));
    }
    if (wo->rank() != 2 || wo->dim(0) != wo->dim(1) || wo->dim(0) < 1) {
        fail(kMha, "state_dict: tensor 'out_proj.weight': expected shape (E, E) but got ", wo->shape());
    }
    MhaConfig c;
    c.embed_dim = wo->dim(0);
    c.num_heads = num_heads;
    c.batch_first = batch_first;
    require_heads_divide(c.embed_dim, num_heads, " (from out_proj.weight)");
    const std::int64_t E = c.embed_dim, dh = E / num_heads;
    std::int64_t Ekv = E;
    const char* kv_source = "in_proj_weight";  // the tensor E_kv comes from, for the message below
    Shape kv_shape;
    if (const TensorView* w = find("in_proj_weight")) {
        // (E + 2·E_kv, E); E_kv = E unless the weights are grouped-query.
        if (w->rank() != 2 || w->dim(1) != E || w->dim(0) <= E || (w->dim(0) - E) % 2 != 0) {
            fail(kMha, "state_dict: tensor 'in_proj_weight': expected shape (3·E, E) = ", Shape{3 * E, E},
                 " (or (E + 2·E_kv, E) for grouped-query attention) but got ", w->shape());
        }
        Ekv = (w->dim(0) - E) / 2;
        kv_shape = w->shape();
    } else {
        const TensorView* k = find("k_proj_weight");
        const TensorView* v = find("v_proj_weight");
        if (k == nullptr || v == nullptr || find("q_proj_weight") == nullptr) {
            fail(kMha, "state_dict: missing tensor 'in_proj_weight' (expected shape ", Shape{3 * E, E},
                 "), or q_proj_weight, k_proj_weight and v_proj_weight when kdim or vdim differ from embed_dim",
                 what_it_holds(tensors, "in_proj_weight"));
        }
        if (k->rank() != 2 || k->dim(1) < 1) fail(kMha, "state_dict: tensor 'k_proj_weight': expected shape (E, kdim) but got ", k->shape());
        if (v->rank() != 2 || v->dim(1) < 1) fail(kMha, "state_dict: tensor 'v_proj_weight': expected shape (E, vdim) but got ", v->shape());
        c.kdim = k->dim(1);
        c.vdim = v->dim(1);
        Ekv = k->dim(0);
        kv_source = "k_proj_weight";
        kv_shape = k->shape();
    }
    if (Ekv < 1 || Ekv % dh != 0 || num_heads % (Ekv / dh) != 0) {
        fail(kMha, "state_dict: tensor '", kv_source, "' of shape ", kv_shape, " gives key/value projections of ", Ekv,
             " outputs, which is not a number of heads of size ", dh, " dividing num_heads ", num_heads, " (expected ",
             E, " outputs, or fewer heads for grouped-query attention)");
    }
    c.num_kv_heads = Ekv / dh;
    c.bias = find("in_proj_bias") != nullptr || find("out_proj.bias") != nullptr;
    c.add_bias_kv = find("bias_k") != nullptr || find("bias_v") != nullptr;
    c.sinks = find("sinks") != nullptr;
    c.add_zero_attn = add_zero_attn;
    c.softcap = softcap;
    c.alibi_slopes = std::move(alibi_slopes);
    // A 16-bit checkpoint stays 16-bit: the weight matrices' common 16-bit dtype, if any.
    std::optional<DType> common;
    bool mixed = false;
    for (const auto& [n, t] : tensors) {
        if (!is_weight_matrix(n)) continue;
        if (common && *common != t.dtype()) mixed = true;
        common = t.dtype();
    }
    c.param_dtype = !mixed && common && (*common == DType::f16 || *common == DType::bf16) ? *common : DType::f32;
    if (param_dtype) c.param_dtype = *param_dtype;
    MultiHeadAttention layer(c);
    layer.load_state_dict(tensors);
    return layer;
}

}  // namespace attn
