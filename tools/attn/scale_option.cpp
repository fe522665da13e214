#include "scale_option.hpp"

namespace attn::cli {

CLI::Option* add_scale_option(CLI::App* cmd, std::optional<double>& scale) {
    return cmd->add_option("--scale", scale,
                           "score scale (default 1/sqrt(Dk)); 0, or a number that is a normal float32 "
                           "(2^-126 ≈ 1.1754944e-38 <= |scale| <= 3.4028235e38 there)");
}

}  // namespace attn::cli
