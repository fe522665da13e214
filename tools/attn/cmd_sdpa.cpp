// attn sdpa --q Q.npy --k K.npy --v V.npy --out O.npy [--mask M.npy] [--causal [none|top-left|bottom-right]]
//           [--out-dtype float16|bfloat16|float32|float64]   (every tensor argument may be FILE.safetensors:NAME,
//                                                     every output path may end in .safetensors)
//           [--scale S] [--weights W.npy] [--lse L.npy] [--impl auto|reference|flash|decode] ...
//           [--key-lengths N.npy] [--query-offset N | --query-offsets F.npy]
//           [--window-left L --window-right R --window-align top-left|bottom-right]
//           [--grad-out dO.npy --dq dQ.npy --dk dK.npy --dv dV.npy [--dsinks dS.npy]] [--dropout P --seed N]
//           [--softcap C] [--alibi-slopes A.npy | --alibi] [--sinks S.npy]
//           [--scores S.npy --scores-stage scaled|softcapped|masked]
//           [--cu-seqlens-q CQ.npy --cu-seqlens-k CK.npy]   (packed (T, H, D) inputs: attn::sdpa_varlen)
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <optional>

#include "attn/error.hpp"
#include "attn/npy.hpp"
#include "attn/sdpa.hpp"
#include "attn/sdpa_backward.hpp"
#include "attn/sdpa_varlen.hpp"
#include "causal_option.hpp"
#include "commands.hpp"
#include "core/check.hpp"
#include "flag_names.hpp"
#include "gradient_outputs.hpp"
#include "output_files.hpp"
#include "scale_option.hpp"
#include "sdpa/option_values.hpp"
#include "strict_options.hpp"
#include "tensor_args.hpp"
#include "threads_option.hpp"

namespace attn::cli {
namespace {

struct SdpaArgs {
    std::string q, k, v, out, mask, key_lengths, weights, lse, causal = "none", impl = "auto";
    std::string out_dtype;  // --out-dtype: "" = the default (out_dtype_for)
    std::optional<double> scale;
    std::optional<std::int64_t> query_offset;  // --query-offset: every sequence
    std::string query_offsets;                 // --query-offsets: a (B,) .npy, one per sequence
    std::int64_t window_left = -1, window_right = -1;
    std::optional<std::string> window_align;  // --window-align (default top-left; only with a window)
    GradientOutputs grad;  // backward: --grad-out, --dq, --dk, --dv, --dsinks
    double softcap = 0.0;
    std::string alibi_slopes, sinks;
    bool alibi = false;  // the standard slopes (attn::alibi_slopes)
    std::string scores;
    std::optional<std::string> scores_stage;  // --scores-stage (default masked; only with --scores)
    std::string cu_seqlens_q, cu_seqlens_k;  // packed sequences (sdpa_varlen)
    double dropout = 0.0;
    std::optional<std::uint64_t> seed;
    bool verbose = false;
};

// Q, K, V and dO are passed to the core in their own dtype (float16/bfloat16 included: no
// float32 copy of the whole tensor; the kernels convert what they read). Which kernel reads
// which dtype is the core's decision, and its error says why when none does.
Tensor read_input(const std::string& flag, const std::string& path) { return read_float_arg(flag, path); }

// --out-dtype takes float64 here (sdpa's reference computes in double; the flash and decode
// kernels' float32 result is widened).
constexpr bool kOutFloat64 = true;

// Every output's dtype against its path (bfloat16 needs .safetensors), before any compute.
void check_output_dtypes(const std::vector<OutputFiles::Output>& outputs) {
    for (const auto& o : outputs) OutputFiles::check_dtype(o.flag, o.path, o.view.dtype(), float_dtypes(kOutFloat64));
}

// --out-dtype, parsed before any file is read.
std::optional<DType> out_dtype_option(const SdpaArgs& a) { return parse_out_dtype(a.out_dtype, kOutFloat64); }

// Packed sequences: q (Tq, Hq, Dk), k/v (Tk, Hkv, D), out (Tq, Hq, Dv), lse (Tq, Hq).
void run_packed(const SdpaArgs& a, const OutputFiles& outputs, std::optional<DType> out_dtype, const SdpaOptions& opt,
                const Tensor& q, const Tensor& k, const Tensor& v, bool backward) {
    if (a.cu_seqlens_q.empty() || a.cu_seqlens_k.empty()) {
        throw Error("--cu-seqlens-q/--cu-seqlens-k: packed inputs need both (the (N+1,) offsets of the queries and "
                    "of the keys)");
    }
    if (!a.weights.empty()) throw Error("--weights: not available for packed sequences (their weights are ragged)");
    if (!a.scores.empty()) throw Error("--scores: not available for packed sequences (their scores are ragged)");
    const Tensor cq = read_tensor_arg("--cu-seqlens-q", a.cu_seqlens_q), ck = read_tensor_arg("--cu-seqlens-k", a.cu_seqlens_k);
    // Output shapes from the inputs, checked first: a malformed one is named before a buffer
    // sized from it is asked for.
    const SdpaVarlenShapes shapes = sdpa_varlen_output_shapes(q, k, v);
    const Tensor o(out_dtype_for(out_dtype, q.dtype()), shapes.out, false, "--out"), l(DType::f32, shapes.lse, false, "--lse");
    const TensorView lv = l.view();
    OutputFiles::check_dtype("--out", a.out, o.dtype(), float_dtypes(kOutFloat64));
    const GradientDtypes gdt = gradient_dtypes(out_dtype, q.dtype(), k.dtype(), v.dtype());
    a.grad.check_dtypes(gdt, float_dtypes(kOutFloat64));
    SdpaReport report;
    sdpa_varlen(q, k, v, cq, ck, opt, o, &lv, &report);
    if (a.verbose) std::fprintf(stderr, "%s\n", report.explanation.c_str());
    std::vector<OutputFiles::Output> files{{"--out", a.out, o.view()}};
    if (!a.lse.empty()) files.push_back({"--lse", a.lse, l.view()});
    Tensor dO, dq, dk, dv, ds;
    if (backward) {
        dO = read_input("--grad-out", a.grad.grad_out);
        dq = Tensor(gdt.dq, q.shape());
        dk = Tensor(gdt.dk, k.shape());
        dv = Tensor(gdt.dv, v.shape());
        SdpaReport back;
        TensorView dsv;  // the sequences' dsinks summed (sdpa_varlen_backward)
        if (!a.grad.dsinks.empty()) {
            ds = Tensor(DType::f32, Shape{q.shape()[1]});
            dsv = ds.view();
        }
        sdpa_varlen_backward(q, k, v, cq, ck, o, l, dO, opt, dq, dk, dv, &back, a.grad.dsinks.empty() ? nullptr : &dsv);
        if (a.verbose) std::fprintf(stderr, "backward: %s\n", back.explanation.c_str());
    }
    a.grad.add_files(files, dq, dk, dv, ds);
    outputs.write_all(files);
}

void run(const SdpaArgs& a) {
    OutputFiles outputs;
    outputs.add("--out", a.out);
    outputs.add("--weights", a.weights);
    outputs.add("--lse", a.lse);
    outputs.add("--dq", a.grad.dq);
    outputs.add("--dk", a.grad.dk);
    outputs.add("--dv", a.grad.dv);
    outputs.add("--dsinks", a.grad.dsinks);
    outputs.add("--scores", a.scores);
    for (const auto& [flag, spec] : {std::pair{"--q", &a.q}, {"--k", &a.k}, {"--v", &a.v}, {"--mask", &a.mask},
                                     {"--grad-out", &a.grad.grad_out}, {"--key-lengths", &a.key_lengths},
                                     {"--query-offsets", &a.query_offsets}, {"--alibi-slopes", &a.alibi_slopes},
                                     {"--sinks", &a.sinks}, {"--cu-seqlens-q", &a.cu_seqlens_q},
                                     {"--cu-seqlens-k", &a.cu_seqlens_k}})
        outputs.add_input(flag, tensor_arg_file(*spec));
    const ScoreStage stage = with_flag("--scores-stage", [&] { return parse_score_stage(a.scores_stage.value_or("masked")); });
    if (a.scores_stage && a.scores.empty()) throw Error("--scores-stage: only with --scores (it says which scores to write)");
    const bool backward = a.grad.backward();
    a.grad.check_flags(!a.sinks.empty());
    if (a.alibi && !a.alibi_slopes.empty()) throw Error("--alibi: give either --alibi or --alibi-slopes, not both");
    const std::optional<DType> out_dtype_given = out_dtype_option(a);
    outputs.check();

    SdpaOptions opt;
    opt.impl = with_flag("--impl", [&] { return parse_impl(a.impl); });
    opt.causal = causal_option(a.causal);
    opt.scale = a.scale;
    opt.window.left = a.window_left;
    opt.window.right = a.window_right;
    opt.window.align = window_align_option(a.window_align, a.window_left, a.window_right);
    // The library's checks of every value that needs no tensor, before any file is read; the
    // call that would have refused them names it (the forward runs first).
    const bool packed = !a.cu_seqlens_q.empty() || !a.cu_seqlens_k.empty();
    const char* const op = packed ? "sdpa_varlen" : "sdpa";
    opt.dropout_seed = dropout_seed(op, "--dropout", a.dropout, "--seed", a.seed);
    opt.dropout_p = a.dropout;
    opt.softcap = a.softcap;  // 0 = off
    if (a.query_offset) opt.query_offset = *a.query_offset;  // --query-offsets: a file, below
    detail::check_option_values(opt, op);
    // After the values' checks: a value out of range is named first, as such.
    require_query_offset_use(a.query_offset, a.query_offsets, opt.causal, a.window_left, a.window_right,
                             a.alibi || !a.alibi_slopes.empty());

    const Tensor q = read_input("--q", a.q);
    const Tensor k = read_input("--k", a.k);
    const Tensor v = read_input("--v", a.v);
    const DType out_dtype = out_dtype_for(out_dtype_given, q.dtype());
    Tensor mask, lengths, offsets;
    if (!a.mask.empty()) {
        // bool, or a float mask added to the scores (float16/bfloat16 widened once by attn::sdpa).
        mask = read_tensor_arg("--mask", a.mask);
        if (mask.dtype() == DType::boolean) {
            opt.bool_mask = mask.view();
        } else if (is_floating(mask.dtype())) {
            opt.additive_mask = mask.view();
        } else {
            throw Error("--mask: " + detail::quoted_path(a.mask) + " must hold bool (true = may attend) or a float dtype (added to the scores) but holds " +
                        std::string(dtype_name(mask.dtype())));
        }
    }
    Tensor slopes, sinks;
    read_optional_float32_arg("--alibi-slopes", a.alibi_slopes, slopes, opt.alibi_slopes);
    if (a.alibi_slopes.empty() && a.alibi) {
        // Q's heads: dim 1 of (B, H, L, D), and of packed (T, H, D) with --cu-seqlens; any other
        // Q is refused by sdpa with its own message (slopes for 1 head are then never read).
        slopes = alibi_slopes(q.shape().rank == 4 || (packed && q.shape().rank == 3) ? q.shape()[1] : 1);
        opt.alibi_slopes = slopes.view();
    }
    read_optional_float32_arg("--sinks", a.sinks, sinks, opt.sinks);
    read_optional_tensor_arg("--key-lengths", a.key_lengths, lengths, opt.key_lengths);
    // sdpa checks the offsets (dtype, shape, range) and names them query_offset.
    read_optional_tensor_arg("--query-offsets", a.query_offsets, offsets, opt.query_offset);
    if (packed) return run_packed(a, outputs, out_dtype_given, opt, q, k, v, backward);
    // Output shapes from the inputs, checked first: a malformed one is named before a buffer
    // sized from it is asked for (a 100-byte .npy can declare (0, 1, 10^15, 8)).
    const SdpaShapes shapes = sdpa_output_shapes(q, k, v);
    const std::int64_t Hq = shapes.out[1];

    Tensor o(out_dtype, shapes.out, false, "--out");
    Tensor w, l, dO, dq, dk, dv, ds, sc;
    ScoresOutput so;
    if (!a.scores.empty()) {
        sc = Tensor(DType::f32, shapes.weights, false, "--scores");
        so = ScoresOutput{sc.view(), stage};
    }
    TensorView wv, lv;
    if (backward) {
        dO = read_input("--grad-out", a.grad.grad_out);
        // The backward needs the forward's lse; keep it even when --lse is not written.
        l = Tensor(DType::f32, shapes.lse, false, "lse");
        lv = l.view();
    }
    if (!a.weights.empty()) {
        w = Tensor(DType::f32, shapes.weights, false, "--weights");
        wv = w.view();
    }
    if (!a.lse.empty() && !backward) {
        l = Tensor(DType::f32, shapes.lse, false, "--lse");
        lv = l.view();
    }
    // Every output against its path's format before any compute (gradients: gradient_dtypes — a float64 input keeps a float64 gradient: the reference backward runs in double).
    check_output_dtypes({{"--out", a.out, o.view()}, {"--weights", a.weights, w.view()}, {"--lse", a.lse, l.view()},
                         {"--scores", a.scores, sc.view()}});
    const GradientDtypes gdt = gradient_dtypes(out_dtype_given, q.dtype(), k.dtype(), v.dtype());
    a.grad.check_dtypes(gdt, float_dtypes(kOutFloat64));
    SdpaReport report;
    sdpa(q, k, v, opt, o, lv.empty() ? nullptr : &lv, a.weights.empty() ? nullptr : &wv, &report,
         a.scores.empty() ? nullptr : &so);
    if (a.verbose) std::fprintf(stderr, "%s\n", report.explanation.c_str());
    if (backward) {
        // Gradients come out in the inputs' shapes, in gradient_dtypes.
        dq = Tensor(gdt.dq, q.shape());
        dk = Tensor(gdt.dk, k.shape());
        dv = Tensor(gdt.dv, v.shape());
        SdpaReport back;
        TensorView dsv;
        if (!a.grad.dsinks.empty()) {
            ds = Tensor(DType::f32, Shape{Hq});
            dsv = ds.view();
        }
        sdpa_backward(q, k, v, o, l, dO, opt, dq, dk, dv, &back, a.grad.dsinks.empty() ? nullptr : &dsv);
        if (a.verbose) std::fprintf(stderr, "backward: %s\n", back.explanation.c_str());
    }

    std::vector<OutputFiles::Output> files{{"--out", a.out, o.view()}};
    if (!a.weights.empty()) files.push_back({"--weights", a.weights, w.view()});
    if (!a.scores.empty()) files.push_back({"--scores", a.scores, sc.view()});
    if (!a.lse.empty()) files.push_back({"--lse", a.lse, l.view()});
    a.grad.add_files(files, dq, dk, dv, ds);
    outputs.write_all(files);
}

}  // namespace

void add_sdpa_command(CLI::App& app) {
    auto args = std::make_shared<SdpaArgs>();
    CLI::App* cmd = app.add_subcommand("sdpa", "Scaled dot-product attention: O = softmax(Q·Kᵀ·scale + mask)·V on .npy or safetensors tensors");
    cmd->add_option("--q", args->q, "queries (B, Hq, Lq, Dk): float32, float64, float16 (.npy) or bfloat16 (FILE.safetensors:NAME, "
                    "which any tensor option accepts)")->required();
    cmd->add_option("--k", args->k, "keys (B, Hkv, Lk, Dk); Hq must be a multiple of Hkv; float32, float64, float16 or bfloat16")->required();
    cmd->add_option("--v", args->v, "values (B, Hkv, Lk, Dv), same dtypes as --k")->required();
    cmd->add_option("--out", args->out, "output O (B, Hq, Lq, Dv), in --out-dtype; a path ending in .safetensors gets a safetensors file "
                    "(one tensor named after the option: out, lse, dq, ...), any other path a .npy")->required();
    cmd->add_option("--out-dtype", args->out_dtype,
                    "dtype of O and, with --grad-out, of dQ/dK/dV: float16, bfloat16 (only into .safetensors), float32 "
                    "or float64 (.npy only). Default: O in a 16-bit Q's dtype, else float32 — a float64 Q too (ask "
                    "for float64 to keep the reference's double result); each gradient in its input's dtype (dQ in "
                    "Q's, dK in K's, dV in V's). lse, weights, "
                    "scores and dsinks stay float32");
    cmd->add_option("--mask", args->mask,
                    "bool keep-mask (true = may attend) or float additive mask, broadcastable to (B, Hq, Lq, Lk)");
    add_causal_option(cmd, args->causal,
                      "top-left: query i sees keys 0..i; bottom-right: keys 0..i+n-Lq, n = the sequence's key length "
                      "(--key-lengths, else Lk; the new tokens of a KV cache); none: no causal mask");
    add_scale_option(cmd, args->scale);
    cmd->add_option("--key-lengths", args->key_lengths,
                    "int32/int64 (B,): sequence b has valid keys 0..n_b-1; bottom-right aligns to n_b per sequence");
    CLI::Option* one_offset = cmd->add_option(
        "--query-offset", args->query_offset,
        "position of query 0 among the keys, every sequence: causal and the window (either alignment) "
        "then put query i's diagonal at i+N (top-left = 0, bottom-right = n-Lq; a past cache: N = past length)");
    cmd->add_option("--query-offsets", args->query_offsets,
                    "int32/int64 (B,) .npy: --query-offset per sequence")
        ->excludes(one_offset);
    cmd->add_option("--window-left", args->window_left, "sliding window: keys a query sees before its diagonal (-1 = all)");
    cmd->add_option("--window-right", args->window_right, "sliding window: keys a query sees after its diagonal (-1 = all)");
    cmd->add_option("--window-align", args->window_align,
                    "diagonal of the window: top-left (default) or bottom-right (only with --window-left/--window-right)");
    cmd->add_option("--weights", args->weights, "write attention weights A (B, Hq, Lq, Lk) as float32");
    cmd->add_option("--lse", args->lse, "write the row log-sum-exp (B, Hq, Lq) as float32");
    cmd->add_option("--impl", args->impl,
                    "kernel: auto, reference, flash or decode (Lq <= 16, forward only); backward: auto, reference or flash");
    args->grad.add_options(cmd, "", "'s dtype", "", "");
    // Also by attn mha's names (--dropout-p, --dropout-seed): one spelling works everywhere.
    cmd->add_option("--dropout,--dropout-p", args->dropout, "dropout probability on the attention weights, 0 <= P < 1 (training)");
    cmd->add_option("--seed,--dropout-seed", args->seed, "dropout seed (the same seed gives the same dropout mask)");
    cmd->add_option("--cu-seqlens-q", args->cu_seqlens_q,
                    "int32/int64 (N+1,) .npy: --q is packed (Tq, Hq, Dk), sequence b's queries are rows "
                    "cu[b]..cu[b+1]-1 (FlashAttention's varlen layout; needs --cu-seqlens-k); out (Tq, Hq, Dv), "
                    "lse (Tq, Hq); causal, window and query offsets apply per sequence (no --mask, --key-lengths)");
    cmd->add_option("--cu-seqlens-k", args->cu_seqlens_k,
                    "int32/int64 (N+1,) .npy: --k and --v are packed (Tk, Hkv, D), sequence b's keys are rows "
                    "cu[b]..cu[b+1]-1");
    cmd->add_option("--softcap", args->softcap, "logit soft-cap C > 0: scores C*tanh(s/C) before any mask (0 = off)");
    cmd->add_option("--alibi-slopes", args->alibi_slopes, "ALiBi slopes (Hq,) or (B, Hq) float32 ((N, Hq) with --cu-seqlens-q: a row per sequence): s -= m_h*|d - j| "
                    "(bottom-right diagonal d)");
    cmd->add_flag("--alibi", args->alibi, "ALiBi with the standard slopes of the ALiBi paper for Hq heads");
    cmd->add_option("--sinks", args->sinks, "attention sink logits (Hq,) float32: softmax mass without a value");
    cmd->add_option("--scores", args->scores, "write the scores (B, Hq, Lq, Lk) as float32 at --scores-stage (not with --dropout)");
    cmd->add_option("--scores-stage", args->scores_stage,
                    "with --scores: scaled (scale*q.k), softcapped (after --softcap) or masked (after ALiBi and masks; default)");
    cmd->add_flag("--verbose", args->verbose, "say which kernel ran and why others were declined");
    add_threads_option(cmd);
    cmd->callback([args] {
        const SdpaArgs& a = *args;
        std::vector<FlagName> names = attention_flag_names(!a.query_offsets.empty(), a.alibi);
        names.insert(names.end(), {{"q", "--q"}, {"k", "--k"}, {"v", "--v"},  // packed sequences' names
                                   {"bool_mask", "--mask"}, {"additive_mask", "--mask"},
                                   {"cu_seqlens_q", "--cu-seqlens-q"}, {"cu_seqlens_k", "--cu-seqlens-k"},
                                   {"scores", "--scores"}, {"weights", "--weights"}, {"lse", "--lse"}});
        naming_flags([&] { run(a); }, {"sdpa_varlen_backward", "sdpa_varlen", "sdpa_backward", "sdpa"}, names);
    });
}

}  // namespace attn::cli
