#include "scale_option.hpp"

namespace attn::cli {

CLI::Option* add_scale_option(CLI::App* cmd, std::optional<double>& scale) {
    return cmd->add_option("--scale", scale,
                           "score scale (default 1/sqrt(Dk)); any number finite in float32 (|scale| <= "
                           "3.4028235e38), and non-zero there unless it is 0 (|scale| > 2^-150)");
}

}  // namespace attn::cli
