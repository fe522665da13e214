#include "json_text.hpp"

#include <cstdio>

#include "../core/utf8.hpp"

namespace attn::detail {

bool append_json_string(std::string& out, std::string_view text, std::size_t limit) {
    out += '"';
    for (std::size_t i = 0; i < text.size();) {
        if (out.size() >= limit) return true;
        const std::size_t n = utf8_sequence_length(text, i);
        if (n == 0) return false;
        const auto c = static_cast<unsigned char>(text[i]);
        switch (c) {
            case '"': out += "\\\""; break;
            case '\\': out += "\\\\"; break;
            case '\b': out += "\\b"; break;
            case '\f': out += "\\f"; break;
            case '\n': out += "\\n"; break;
            case '\r': out += "\\r"; break;
            case '\t': out += "\\t"; break;
            default:
                if (c < 0x20) {
                    char esc[7];
                    std::snprintf(esc, sizeof esc, "\\u%04x", c);
                    out += esc;
                } else {
                    out.append(text.substr(i, n));
                }
        }
        i += n;
    }
    out += '"';
    return true;
}

}  // namespace attn::detail
