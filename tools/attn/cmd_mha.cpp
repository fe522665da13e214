// attn mha --params P.safetensors --num-heads H --query Q.npy [--key K.npy --value V.npy] --out O.npy
//          [--batch-first] [--key-padding-mask M.npy] [--attn-mask A.npy] [--causal [none|top-left|bottom-right]]
//          [--weights W.npy] [--per-head-weights]
//          [--grad-out dO.npy --grads G.safetensors [--dropout-p P --dropout-seed S]]   (training)
//          [--softcap C] [--alibi | --alibi-slopes A.npy]      (a `sinks` tensor in the params: sinks)
//          [--out-dtype float32|float16|bfloat16] [--param-dtype float32|float16|bfloat16]
//          [--intermediate-dtype float32|float16|bfloat16]
// PyTorch nn.MultiheadAttention (eval mode) on .npy files, with its state_dict in safetensors.
#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "attn/error.hpp"
#include "attn/mha.hpp"
#include "attn/npy.hpp"
#include "attn/safetensors.hpp"
#include "core/check.hpp"
#include "core/float32_values.hpp"
#include "attn/sdpa.hpp"
#include "causal_option.hpp"
#include "mha/config_values.hpp"
#include "mha/inputs.hpp"
#include "mha/layer_prefix.hpp"
#include "commands.hpp"
#include "flag_names.hpp"
#include "output_files.hpp"
#include "strict_options.hpp"
#include "tensor_args.hpp"
#include "threads_option.hpp"

namespace attn::cli {
namespace {

struct MhaArgs {
    std::string params, query, key, value, out, key_padding_mask, attn_mask, weights, grad_out, grads, alibi_slopes;
    std::string out_dtype, param_dtype;  // "" = the query's 16-bit dtype / the checkpoint's
    std::string intermediate_dtype;      // "" = float32
    std::string impl = "auto";           // the attention kernel (MhaForwardOptions::impl), as attn sdpa --impl
    std::string causal = "none";         // --causal, in attn sdpa's forms (causal_option.hpp)
    double softcap = 0.0;
    bool alibi = false;
    std::int64_t num_heads = 0;
    double dropout_p = 0.0;
    std::optional<std::uint64_t> dropout_seed;
    bool batch_first = false, per_head = false, add_zero_attn = false;
};

// A training gradient's dtype (--grads; docs/conventions.md, "The gradients' dtypes"): --out-dtype
// when given (all of them), else its tensor's — for a parameter the dtype the layer holds it in
// (--param-dtype when given, else the --params tensor's), for query/key/value the input's — when
// that is 16-bit, else float32 (the layer computes in float32, and attn writes no F64
// safetensors): out_dtype_for's rule for O, per tensor. They were all float32: a bfloat16
// checkpoint's or query's gradient came back in another dtype than torch gives it.
DType training_dtype(std::optional<DType> out_dtype, DType tensor_dtype) { return out_dtype_for(out_dtype, tensor_dtype); }

void run(const MhaArgs& a) {
    if (a.key.empty() != a.value.empty()) {
        throw Error(a.key.empty() ? "--value: given without --key (give both, or neither for self-attention)"
                                  : "--key: given without --value (give both, or neither for self-attention)");
    }
    if (a.per_head && a.weights.empty()) throw Error("--per-head-weights: needs --weights W.npy to write them to");
    if (a.grad_out.empty() != a.grads.empty()) {
        throw Error(a.grads.empty() ? "--grad-out: given without --grads (the file to write the gradients to)"
                                    : "--grads: given without --grad-out (the upstream gradient dLoss/dOutput)");
    }
    const bool training = !a.grads.empty();
    if (training && !a.weights.empty()) throw Error("--weights: not available with --grads (training mode)");
    // The layer's checks of the values that need no file (num_heads, softcap, dropout_p), before
    // any is read, in its words with the option for the field (naming_flags): a bad --softcap was
    // refused only after --params had been read, or a missing one named instead.
    detail::check_config_values(a.num_heads, a.softcap);
    detail::require_dropout_p(detail::kMha, a.dropout_p);  // before the mode: a bad value is named as such
    if (!training && a.dropout_p != 0.0) throw Error("--dropout-p: only with --grads (training mode); eval mode has no dropout");
    const std::uint64_t seed = dropout_seed(detail::kMha, "--dropout-p", a.dropout_p, "--dropout-seed", a.dropout_seed);
    const Impl impl = with_flag("--impl", [&] { return parse_impl(a.impl); });
    const Causal causal = causal_option(a.causal);
    // The dtype options, before any file is read (--out-dtype's default depends on the query).
    const std::optional<DType> out_dtype = parse_out_dtype(a.out_dtype);
    if (!a.intermediate_dtype.empty() && training)
        throw Error("--intermediate-dtype: not with --grads (training keeps float32 intermediates)");
    const std::optional<DType> intermediate_dtype =
        a.intermediate_dtype.empty() ? std::nullopt : std::optional(parse_float_dtype("--intermediate-dtype", a.intermediate_dtype));
    // Weight matrices: as stored (a 16-bit checkpoint stays 16-bit) unless --param-dtype says;
    // training reads float32 weights. `param_dtype` stays as given: it is also the parameters'
    // gradients' dtype (training_dtype).
    std::optional<DType> param_dtype;
    if (!a.param_dtype.empty()) {
        param_dtype = parse_float_dtype("--param-dtype", a.param_dtype);
        if (training && *param_dtype != DType::f32) throw Error("--param-dtype: training (--grads) needs float32 parameters");
    }
    const std::optional<DType> layer_param_dtype = training ? std::optional(DType::f32) : param_dtype;
    OutputFiles outputs;
    outputs.add("--out", a.out);
    outputs.add("--grads", a.grads);
    outputs.add("--weights", a.weights);
    // --params FILE.safetensors[:PREFIX]: PREFIX selects one layer of a whole model's state_dict
    // ("layers.0.self_attn." before each name), removed from the names it selects.
    const std::string params_file = tensor_arg_file(a.params);
    const std::string prefix = a.params.size() > params_file.size() ? a.params.substr(params_file.size() + 1) : "";
    if (a.params.size() > params_file.size() && prefix.empty())
        throw Error("--params: " + detail::quoted_path(a.params) + ": the prefix after ':' is empty (FILE.safetensors:PREFIX, e.g. layers.0.attn.)");
    outputs.add_input("--params", params_file);
    for (const auto& [flag, spec] : {std::pair{"--query", &a.query}, {"--key", &a.key}, {"--value", &a.value},
                                     {"--key-padding-mask", &a.key_padding_mask}, {"--attn-mask", &a.attn_mask},
                                     {"--grad-out", &a.grad_out}, {"--alibi-slopes", &a.alibi_slopes}})
        outputs.add_input(flag, tensor_arg_file(*spec));
    outputs.check();
    OutputFiles::require_safetensors("--grads", a.grads);

    // Only the layer's tensors are read: the rest of a whole model is neither loaded nor, when it
    // holds a dtype attn has no type for (a quantized layer's U8), an error.
    std::vector<std::string> all_names;
    const SafetensorsFile params = [&] {
        try {
            return read_safetensors_prefix(params_file, prefix, &all_names);
        } catch (const Error& e) {  // the file's own message ("x: ..."), prefixed with the option
            throw Error(std::string("--params: ") + e.what());
        }
    }();
    // A whole model's state_dict (a layer's names behind "layers.0.self_attn.") is named as such,
    // with the --params spelling that selects a layer: the layer would only say "missing tensor".
    const std::vector<std::pair<std::string, TensorView>> state =
        detail::layer_of(params, all_names, params_file, prefix,
                         {"--params", "--params " + params_file + ":", "after ':' give the prefix"});
    std::vector<float> slopes;
    if (a.alibi) {
        const Tensor t = alibi_slopes(a.num_heads);
        slopes.assign(t.data_as<const float>(), t.data_as<const float>() + t.numel());
    } else if (!a.alibi_slopes.empty()) {
        const Tensor t = read_tensor_arg("--alibi-slopes", a.alibi_slopes);
        if (!is_floating(t.dtype()) || t.shape().rank != 1) {
            throw Error("--alibi-slopes: " + detail::quoted_path(a.alibi_slopes) + " must hold a floating (num_heads,) array but holds " +
                        std::string(dtype_name(t.dtype())) + " " + t.shape().str());
        }
        const Tensor f = detail::float32_values(t.view(), "--alibi-slopes");
        slopes.assign(f.data_as<const float>(), f.data_as<const float>() + f.numel());
    }
    const MultiHeadAttention layer =
        MultiHeadAttention::from_state_dict(state, a.num_heads, a.batch_first, a.softcap, std::move(slopes), layer_param_dtype,
                                            a.add_zero_attn);

    // Each distinct file is read once: key = value (one file) gets the fused KV projection,
    // no --key/--value the fused QKV projection of self-attention.
    std::map<std::string, Tensor> files;
    auto input = [&](const std::string& flag, const std::string& path) -> TensorView {
        auto it = files.find(path);
        if (it == files.end()) {
            Tensor t = read_float_arg(flag, path);
            it = files.emplace(path, std::move(t)).first;
        }
        return it->second.view();
    };
    const TensorView q = input("--query", a.query);
    const TensorView k = a.key.empty() ? q : input("--key", a.key);
    const TensorView v = a.value.empty() ? q : input("--value", a.value);

    MhaForwardOptions opt;
    Tensor kpm, am;
    read_optional_tensor_arg("--key-padding-mask", a.key_padding_mask, kpm, opt.key_padding_mask);
    read_optional_tensor_arg("--attn-mask", a.attn_mask, am, opt.attn_mask);
    opt.causal = causal;
    opt.impl = impl;
    opt.need_weights = !a.weights.empty();
    opt.average_attn_weights = !a.per_head;
    // O: --out-dtype, default a 16-bit query's dtype, else float32 — in training too, where
    // --out-dtype also sets every gradient's dtype (training_dtype).
    opt.out_dtype = out_dtype_for(out_dtype, q.dtype());
    // Before the layer runs (bfloat16 has no .npy).
    OutputFiles::check_dtype("--out", a.out, *opt.out_dtype, float_dtypes(/*with_float64=*/false));
    opt.intermediate_dtype = intermediate_dtype;
    if (training) {
        // Gradients under state_dict names, then one per distinct input file (self-attention:
        // the query's gradient is the sum of the three uses, as autograd gives).
        const Tensor dy = read_float_arg("--grad-out", a.grad_out);
        MhaForwardState saved;
        const Tensor y = layer.forward_train(q, k, v, opt, MhaTrainOptions{a.dropout_p, seed}, saved);
        MhaGradients g = layer.backward(saved, dy.view());
        // The layer's float32 gradients, each rounded once into training_dtype of its tensor: the
        // parameter as the layer holds it (--param-dtype, else the --params tensor of its name),
        // or the input. `rounded` owns the converted ones.
        std::map<std::string, DType> param_dtypes;
        for (const auto& [name, t] : state) param_dtypes.emplace(name, param_dtype.value_or(t.dtype()));
        std::vector<Tensor> rounded;
        rounded.reserve(g.params.size() + 3);
        std::vector<std::pair<std::string, TensorView>> named;
        auto add_gradient = [&](const std::string& name, const Tensor& grad, DType tensor_dtype) {
            const DType dt = training_dtype(out_dtype, tensor_dtype);
            if (dt == grad.dtype()) {
                named.emplace_back(name, grad.view());
                return;
            }
            rounded.push_back(to_dtype(grad.view(), dt));
            named.emplace_back(name, rounded.back().view());
        };
        for (const auto& [name, t] : g.params) add_gradient(name, t, param_dtypes.at(name));
        auto add_into = [](Tensor& dst, const Tensor& src) {
            float* d = dst.data_as<float>();
            const float* s = src.data_as<const float>();
            for (std::int64_t i = 0; i < dst.numel(); ++i) d[i] += s[i];
        };
        // One input file given twice (however spelt) is one tensor: its gradient is the sum.
        const std::string kp = a.key.empty() ? a.query : a.key, vp = a.value.empty() ? a.query : a.value;
        const bool k_is_q = same_tensor_arg(kp, a.query), v_is_q = same_tensor_arg(vp, a.query),
                   v_is_k = same_tensor_arg(vp, kp);
        if (k_is_q) add_into(g.query, g.key);
        if (v_is_q) add_into(g.query, g.value);
        else if (v_is_k) add_into(g.key, g.value);
        add_gradient("query", g.query, q.dtype());
        if (!k_is_q) add_gradient("key", g.key, k.dtype());
        if (!v_is_q && !v_is_k) add_gradient("value", g.value, v.dtype());
        // One publication for both files: an error writing either leaves neither behind.
        outputs.write_all({{"--grads", a.grads, TensorView(), named}, {"--out", a.out, y.view()}});
        return;
    }
    const MhaOutput r = layer.forward(q, k, v, opt);

    std::vector<OutputFiles::Output> out{{"--out", a.out, r.output.view()}};
    if (opt.need_weights) out.push_back({"--weights", a.weights, r.weights.view()});
    outputs.write_all(out);
}

}  // namespace

void add_mha_command(CLI::App& app) {
    auto args = std::make_shared<MhaArgs>();
    CLI::App* cmd = app.add_subcommand(
        "mha", "Multi-head attention layer with PyTorch nn.MultiheadAttention weights and semantics (eval mode)");
    cmd->add_option("--params", args->params,
                    "PyTorch state_dict as safetensors (F32/F16/BF16): in_proj_weight, in_proj_bias, out_proj.weight, "
                    "out_proj.bias (or q/k/v_proj_weight when kdim/vdim differ); E, kdim, vdim come from the shapes. "
                    "FILE.safetensors:PREFIX takes the tensors whose names start with PREFIX (one layer of a whole "
                    "model: layers.0.self_attn.), without it")
        ->required();
    cmd->add_option("--num-heads", args->num_heads, "number of heads h (embed_dim must be divisible by it)")->required();
    cmd->add_option("--query", args->query, "query (Lq, B, E), (B, Lq, E) with --batch-first, or unbatched (Lq, E)")->required();
    // --key and --value come together or not at all (checked in run_mha): the help says so.
    cmd->add_option("--key", args->key,
                    "key (Lk, B, kdim) in the query's layout; with --value. Neither: the query is key and value "
                    "(self-attention)");
    cmd->add_option("--value", args->value,
                    "value (Lk, B, vdim) in the query's layout; with --key. Neither: the query is key and value "
                    "(self-attention)");
    cmd->add_option("--out", args->out,
                    "output, shaped like the query with E features, in --out-dtype (a path ending in .safetensors gets a "
                    "safetensors file)")->required();
    cmd->add_option("--out-dtype", args->out_dtype,
                    "dtype of the output and, with --grads, of every gradient: float32, float16 or bfloat16 (only into "
                    ".safetensors). Default: the output in the query's dtype when 16-bit, else float32; each gradient "
                    "in its tensor's (see --grads). --weights (the attention weights) are float32 whatever this says");
    cmd->add_option("--intermediate-dtype", args->intermediate_dtype,
                    "dtype of Q, K, V and the attention output between the GEMMs: float32 (default, the most "
                    "accurate), or float16/bfloat16 — each rounded once to it, as PyTorch's 16-bit layer keeps them "
                    "(with bfloat16 weights and input on AVX-512 BF16 every product runs on bf16 pairs)");
    cmd->add_option("--param-dtype", args->param_dtype,
                    "storage of the weight matrices: float32, float16 or bfloat16 (16-bit: widened inside the projection "
                    "GEMM, fp32 accumulation); default: the checkpoint's when all its weight matrices share a 16-bit "
                    "dtype, else float32. With --grads: float32 only, and then every parameter's gradient is float32 "
                    "(unless --out-dtype)");
    cmd->add_flag("--batch-first", args->batch_first, "inputs and output are (B, L, E) instead of (L, B, E)");
    cmd->add_flag("--add-zero-attn", args->add_zero_attn,
                  "the module was built with add_zero_attn=True (a zero key and value appended; no state_dict "
                  "tensor records it)");
    cmd->add_option("--key-padding-mask", args->key_padding_mask,
                    "(B, Lk) or unbatched (Lk,): bool True = padding (ignored key), or float added to the scores");
    cmd->add_option("--attn-mask", args->attn_mask,
                    "(Lq, Lk) or (B*h, Lq, Lk) (unbatched (h, Lq, Lk)): bool True = NOT allowed, or float added");
    cmd->add_option("--impl", args->impl,
                    "attention kernel: auto (default), reference, flash or decode (a few queries per KV head, "
                    "forward only), as attn sdpa --impl");
    add_causal_option(cmd, args->causal,
                      "causal mask, combined with the other masks: top-left: query i sees keys 0..i (nn.MultiheadAttention's "
                      "is_causal); bottom-right: keys 0..i+Lk-Lq (queries that are the last Lq of Lk positions: "
                      "cross-attention on a cache, incremental decoding); none: no causal mask");
    cmd->add_option("--weights", args->weights, "write attention weights (B, Lq, Lk) averaged over heads, float32");
    cmd->add_flag("--per-head-weights", args->per_head, "with --weights: write (B, h, Lq, Lk) per head instead");
    cmd->add_option("--grad-out", args->grad_out, "training: dLoss/dOutput, shaped like the output; needs --grads");
    cmd->add_option("--grads", args->grads,
                    "training: write every gradient as safetensors: the state_dict names, then 'query' (and 'key', "
                    "'value' when they are other files; an input used twice gets the sum). Each in --out-dtype when "
                    "given, else in its tensor's dtype (a parameter's: --param-dtype, else the --params tensor's; an input's: "
                    "its file's) when 16-bit, else F32");
    // The range is checked in run(), in attn's words (a CLI11 Range check would word it its way).
    cmd->add_option("--dropout-p", args->dropout_p, "training: dropout probability on the attention weights (0 <= p < 1)");
    cmd->add_option("--dropout-seed", args->dropout_seed, "training: dropout seed (the keep mask is a function of it)");
    cmd->add_option("--softcap", args->softcap, "logit softcap c: every score becomes c*tanh(s/c) (Gemma 2); 0 = off");
    auto* alibi = cmd->add_flag("--alibi", args->alibi, "ALiBi with the standard slopes for --num-heads heads");
    cmd->add_option("--alibi-slopes", args->alibi_slopes, "ALiBi with these slopes, (num_heads,) .npy")->excludes(alibi);
    add_threads_option(cmd);
    cmd->callback([args] {
        const MhaArgs& a = *args;
        // The layer's own errors, and those of the attention calls it makes with --impl (the kernel
        // that cannot run this call is sdpa's or sdpa_backward's to name: "sdpa: --impl: …").
        naming_flags([&] { run(a); }, {"MultiHeadAttention", "sdpa_backward", "sdpa"},
                     {{"query", "--query"}, {"key", "--key"}, {"value", "--value"}, {"key_padding_mask", "--key-padding-mask"},
                      {"attn_mask", "--attn-mask"}, {"alibi_slopes", a.alibi ? "--alibi" : "--alibi-slopes"},
                      {"grad_output", "--grad-out"}, {"dropout_p", "--dropout-p"}, {"causal", "--causal"},
                      {"num_heads", "--num-heads"}, {"softcap", "--softcap"}, {"impl", "--impl"},
                      {"state_dict", "--params"},  // the layer's tensors, read from --params
                      {"add_zero_attn", "--add-zero-attn"},
                      {"add_bias_kv", "bias_k/bias_v (in --params)"}});  // the layer has them when the file does
    });
}

}  // namespace attn::cli
