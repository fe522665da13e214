// layer_of: one layer's tensors of a whole model's state_dict (layer_prefix.hpp).
#include "layer_prefix.hpp"

#include <algorithm>
#include <string_view>

#include "../core/check.hpp"

namespace attn::detail {

std::vector<std::pair<std::string, TensorView>> layer_of(const SafetensorsFile& params, const std::vector<std::string>& held,
                                                         const std::string& file, const std::string& prefix,
                                                         const PrefixSpelling& spelling) {
    const auto select = [&](const std::string& p) { return spelling.select + (spelling.quote_prefix ? quoted(p) : p); };
    const std::string& arg = spelling.argument;
    std::vector<std::pair<std::string, TensorView>> state;
    std::vector<std::string> layers;  // the prefixes before "out_proj.weight"
    const std::string marker = "out_proj.weight";
    for (const auto& [name, t] : params.tensors) {
        const std::string rest = name.substr(prefix.size());
        state.emplace_back(rest, t.view());
        if (rest.size() > marker.size() && rest.compare(rest.size() - marker.size(), marker.size(), marker) == 0)
            layers.push_back(prefix + rest.substr(0, rest.size() - marker.size()));
    }
    if (state.empty() && !prefix.empty()) {
        throw Error(arg + ": " + quoted_path(file) + " has no tensor whose name starts with " + quoted(prefix) + " (" + names_held(held) + ")");
    }
    // A prefix that is a whole tensor's name (FILE:NAME picks one tensor for every other CLI option).
    if (std::any_of(state.begin(), state.end(), [](const auto& t) { return t.first.empty(); })) {
        std::string layer = prefix;
        for (const char* own : {"in_proj_weight", "in_proj_bias", "q_proj_weight", "k_proj_weight", "v_proj_weight",
                                "out_proj.weight", "out_proj.bias", "bias_k", "bias_v"}) {
            const std::string_view o(own);
            if (layer.size() >= o.size() && layer.compare(layer.size() - o.size(), o.size(), o) == 0) {
                layer.resize(layer.size() - o.size());
                break;
            }
        }
        throw Error(arg + ": " + quoted(prefix) + " is a tensor of " + quoted_path(file) + ", not a layer: " + spelling.give +
                    " its layer's tensors share" + (layer != prefix ? " (" + select(layer) + ")" : ""));
    }
    const bool has_layer = std::any_of(state.begin(), state.end(), [&](const auto& t) { return t.first == marker; });
    if (!has_layer && !layers.empty()) {
        const std::string& p = layers.front();
        if (!prefix.empty() && p == prefix + ".") {
            throw Error(arg + ": " + quoted_path(file) + " has no tensor " + quoted(prefix + marker) + " but has " + quoted(p + marker) +
                        ": end the prefix with '.' (" + select(p) + ")");
        }
        throw Error(arg + ": " + quoted_path(file) + " holds " + std::to_string(layers.size()) + " attention layer" +
                    (layers.size() > 1 ? "s" : "") + " whose names carry a prefix (" + quoted(p + marker) +
                    "): select one with " + select(p));
    }
    return state;
}

}  // namespace attn::detail
