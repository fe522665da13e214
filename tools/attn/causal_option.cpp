#include "causal_option.hpp"

#include "strict_options.hpp"

namespace attn::cli {

CLI::Option* add_causal_option(CLI::App* cmd, std::string& value, const std::string& what) {
    // expected(0, 1): the value may be left out; CLI11 then stores default_str. The help shows
    // the forms the command takes, not "TEXT=top-left", which read as if top-left were the default.
    return cmd->add_option("--causal", value, what + ". --causal alone means top-left; without --causal, none")
        ->expected(0, 1)
        ->default_str("top-left")
        ->option_text("[none|top-left|bottom-right]");
}

Causal causal_option(const std::string& value) {
    return with_flag("--causal", [&] { return parse_causal(value); });
}

}  // namespace attn::cli
