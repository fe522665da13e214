#include "flag_names.hpp"

#include <cctype>
#include <cstddef>

namespace attn::cli {

namespace {

// A name with an underscore (state_dict, num_heads, attn_mask) cannot be an English word, so it is
// the argument wherever it stands as a word of its own in the rest of the message: "state_dict
// does not fit", "dividing num_heads 4", "pass a causal attn_mask". Not after "'s " (a whole
// model's state_dict is the concept, not the option) and not inside a formula ("B·num_heads").
std::string with_names_in_text(std::string text, const std::vector<FlagName>& names) {
    for (const auto& [core, flag] : names) {
        if (core.find('_') == std::string_view::npos) continue;
        for (std::size_t at = text.find(core); at != std::string::npos; at = text.find(core, at + 1)) {
            const std::size_t end = at + core.size();
            const bool starts = at == 0 || (text[at - 1] == ' ' && !(at >= 3 && text.compare(at - 3, 3, "'s ") == 0));
            const bool ends = end == text.size() || std::string_view(" ,;)").find(text[end]) != std::string_view::npos;
            if (!starts || !ends) continue;
            text.replace(at, core.size(), flag);
            at += flag.size() - 1;
        }
    }
    return text;
}

}  // namespace

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
            if (message.compare(at, from.size(), from) == 0)
                return message.substr(0, at) + std::string(flag) + with_names_in_text(message.substr(at + core.size()), names);
        }
        return message.substr(0, at) + with_names_in_text(message.substr(at), names);
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
