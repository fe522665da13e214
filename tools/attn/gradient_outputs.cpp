#include "gradient_outputs.hpp"

#include "attn/error.hpp"

namespace attn::cli {

GradientDtypes gradient_dtypes(const std::optional<DType>& requested, DType q, DType k, DType v) {
    if (requested) return {*requested, *requested, *requested};
    return {q, k, v};
}

void GradientOutputs::add_options(CLI::App* cmd, const std::string& how, const std::string& dtype_default,
                                  const std::string& written, const std::string& dsinks_written) {
    cmd->add_option("--grad-out", grad_out,
                    "dO (B, Hq, Lq, Dv): also compute the gradients of <O, dO>" + how + " (needs --dq, --dk, --dv)");
    const auto in_dtype = [&](const char* input) {
        return " in --out-dtype (default: " + std::string(input) + dtype_default + ")" + written;
    };
    cmd->add_option("--dq", dq, "write dQ (B, Hq, Lq, Dk)" + in_dtype("Q"));
    cmd->add_option("--dk", dk, "write dK (B, Hkv, Lk, Dk)" + in_dtype("K"));
    cmd->add_option("--dv", dv, "write dV (B, Hkv, Lk, Dv)" + in_dtype("V"));
    cmd->add_option("--dsinks", dsinks, "with --grad-out and --sinks: write d loss / d sinks (Hq,) as float32" + dsinks_written);
}

void GradientOutputs::check_flags(bool sinks_given) const {
    if (backward() && (dq.empty() || dk.empty() || dv.empty())) {
        throw Error("--grad-out: needs --dq, --dk and --dv (where to write the gradients)");
    }
    if (!backward() && (!dq.empty() || !dk.empty() || !dv.empty())) {
        throw Error("--dq/--dk/--dv: need --grad-out dO.npy (the gradient of the loss with respect to O)");
    }
    if (!dsinks.empty() && (!backward() || !sinks_given))
        throw Error("--dsinks: needs --grad-out and --sinks (the gradient of the sink logits)");
}

void GradientOutputs::check_dtypes(const GradientDtypes& dtypes, const std::vector<DType>& out_dtypes) const {
    if (!backward()) return;
    OutputFiles::check_dtype("--dq", dq, dtypes.dq, out_dtypes);
    OutputFiles::check_dtype("--dk", dk, dtypes.dk, out_dtypes);
    OutputFiles::check_dtype("--dv", dv, dtypes.dv, out_dtypes);
}

void GradientOutputs::add_files(std::vector<OutputFiles::Output>& files, const Tensor& dq_t, const Tensor& dk_t,
                                const Tensor& dv_t, const Tensor& dsinks_t) const {
    if (!backward()) return;
    files.push_back({"--dq", dq, dq_t.view()});
    files.push_back({"--dk", dk, dk_t.view()});
    files.push_back({"--dv", dv, dv_t.view()});
    if (!dsinks.empty()) files.push_back({"--dsinks", dsinks, dsinks_t.view()});
}

}  // namespace attn::cli
