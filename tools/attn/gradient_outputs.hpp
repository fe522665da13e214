// The backward as attn sdpa and attn ring take it, with one set of rules and messages: --grad-out
// dO asks for the gradients of <O, dO>, --dq, --dk and --dv say where they go (all three, and only
// with --grad-out), --dsinks where the sinks' gradient goes (with --grad-out and --sinks).
#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "attn/dtype.hpp"
#include "attn/tensor.hpp"
#include "output_files.hpp"

namespace attn::cli {

struct GradientOutputs {
    std::string grad_out, dq, dk, dv, dsinks;  // the options' values ("" = not given)

    bool backward() const { return !grad_out.empty(); }

    // Declares the five options on cmd, stored here. Their help: the gradients are computed `how`
    // (" through the ring", or ""), come out in --out-dtype with `dtype_default` when it is not
    // given, and are written as `written` says (", written by rank 0", or "").
    void add_options(CLI::App* cmd, const std::string& how, const std::string& dtype_default, const std::string& written);

    // The options' combinations (sinks_given: --sinks was given), before anything is read.
    void check_flags(bool sinks_given) const;

    // With --grad-out: whether the --dq, --dk and --dv paths can hold `dtype` (bfloat16 only in
    // .safetensors, float64 only in .npy), before any compute.
    void check_dtypes(DType dtype) const;

    // With --grad-out: dQ, dK, dV and, with --dsinks, dsinks appended to `files` (written with
    // the command's other outputs, all or none).
    void add_files(std::vector<OutputFiles::Output>& files, const Tensor& dq_t, const Tensor& dk_t, const Tensor& dv_t,
                   const Tensor& dsinks_t) const;
};

}  // namespace attn::cli
