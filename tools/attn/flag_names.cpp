#include "flag_names.hpp"

#include <cctype>
#include <cstddef>

namespace attn::cli {

std::string with_flag_names(const std::string& message, std::initializer_list<std::string_view> ops,
                            const std::vector<FlagName>& names) {
    for (const std::string_view op : ops) {
        const std::string head = std::string(op) + ": ";
        if (message.compare(0, head.size(), head) != 0) continue;
        std::size_t at = head.size();
        // "rank 2: " (an error one rank of a ring raised) stays before the argument.
        if (message.compare(at, 5, "rank ") == 0) {
            std::size_t end = at + 5;
            while (end < message.size() && std::isdigit(static_cast<unsigned char>(message[end]))) ++end;
            if (end > at + 5 && message.compare(end, 2, ": ") == 0) at = end + 2;
        }
        for (const auto& [core, flag] : names) {
            const std::string from = std::string(core) + ": ";
            if (message.compare(at, from.size(), from) == 0) return message.substr(0, at) + std::string(flag) + message.substr(at + core.size());
        }
        return message;
    }
    return message;
}

std::vector<FlagName> attention_flag_names(bool query_offsets_file, bool alibi) {
    return {{"Q", "--q"}, {"K", "--k"}, {"V", "--v"}, {"key_lengths", "--key-lengths"},
            {"query_offset", query_offsets_file ? "--query-offsets" : "--query-offset"},
            {"alibi_slopes", alibi ? "--alibi" : "--alibi-slopes"}, {"sinks", "--sinks"}, {"grad_out", "--grad-out"},
            {"softcap", "--softcap"}, {"dropout_p", "--dropout"}, {"scale", "--scale"}, {"dsinks", "--dsinks"},
            {"window", "--window-left/--window-right"}, {"impl", "--impl"}};
}

}  // namespace attn::cli
