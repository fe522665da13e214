// The backward as attn sdpa and attn ring take it, with one set of rules and messages: --grad-out
// dO asks for the gradients of <O, dO>, --dq, --dk and --dv say where they go (all three, and only
// with --grad-out), --dsinks where the sinks' gradient goes (with --grad-out and --sinks).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "attn/dtype.hpp"
#include "attn/tensor.hpp"
#include "output_files.hpp"

namespace attn::cli {

// dQ, dK and dV's dtypes.
struct GradientDtypes {
    DType dq, dk, dv;
};

// The one rule of attn sdpa and attn ring: --out-dtype (`requested`) sets all three when given;
// else each gradient has its own input's dtype as the core reads it (attn ring reads a float64
// input as float32). One dtype for all three (Q's) rounded a float32 K's gradient to 8 bits under
// a bfloat16 Q, and overflowed a bfloat16 V's past float16's 65504 under a float16 Q.
GradientDtypes gradient_dtypes(const std::optional<DType>& requested, DType q, DType k, DType v);

struct GradientOutputs {
    std::string grad_out, dq, dk, dv, dsinks;  // the options' values ("" = not given)

    bool backward() const { return !grad_out.empty(); }

    // Declares the five options on cmd, stored here. Their help: the gradients are computed `how`
    // (" through the ring", or ""), come out in --out-dtype, or when it is not given in their
    // input's dtype as `dtype_default` says after "Q", "K" or "V" ("'s dtype", or "'s dtype if
    // 16-bit, else float32"), and are written as `written` says (attn ring: by rank 0, or each
    // rank its rows with --shard-outputs; "" elsewhere) — dsinks as `dsinks_written` (attn ring:
    // always rank 0).
    void add_options(CLI::App* cmd, const std::string& how, const std::string& dtype_default, const std::string& written,
                     const std::string& dsinks_written);

    // The options' combinations (sinks_given: --sinks was given), before anything is read.
    void check_flags(bool sinks_given) const;

    // With --grad-out: whether the --dq, --dk and --dv paths can hold their dtypes (bfloat16 only
    // in .safetensors, float64 only in .npy), before any compute; out_dtypes: what the command's
    // --out-dtype takes (OutputFiles::check_dtype).
    void check_dtypes(const GradientDtypes& dtypes, const std::vector<DType>& out_dtypes) const;

    // With --grad-out: dQ, dK, dV and, with --dsinks, dsinks appended to `files` (written with
    // the command's other outputs, all or none).
    void add_files(std::vector<OutputFiles::Output>& files, const Tensor& dq_t, const Tensor& dk_t, const Tensor& dv_t,
                   const Tensor& dsinks_t) const;
};

}  // namespace attn::cli
