#include "number_text.hpp"

#include <cctype>
#include <cstddef>
#include <map>
#include <string>

#include "core/check.hpp"

namespace attn::cli {
namespace {

struct Given {
    std::string written, canonical;
};

// One command line is parsed per process: what its options were given as, by flag ("--scale").
std::map<std::string, Given, std::less<>>& given_numbers() {
    static std::map<std::string, Given, std::less<>> numbers;
    return numbers;
}

// A decimal number's value in one spelling: sign, significant digits, exponent of the last digit
// ("-0.0250e2" and "-2.5" both "-25e-1"; every zero "0": "-00" is the integer 0, "-0.0" the double
// whose shortest text is "-0", each the number it says). The texts here are ones the strict
// parser took: [+-]digits[.digits][(e|E)[+-]digits]. A zero's exponent is not read: the parser
// takes 0e99999999999999999999 (0), whose exponent no long holds; any other's is within a few
// hundred of the text's length, or the number would not have been a finite double.
std::string normalized(std::string_view text) {
    std::string sign, digits;
    std::size_t i = 0;
    if (i < text.size() && (text[i] == '+' || text[i] == '-')) sign = text[i++] == '-' ? "-" : "";
    long exponent = 0;
    bool fraction = false;
    for (; i < text.size() && text[i] != 'e' && text[i] != 'E'; ++i) {
        if (text[i] == '.') {
            fraction = true;
            continue;
        }
        if (digits.empty() && text[i] == '0') {
            if (fraction) --exponent;  // a leading zero after the point shifts the digits after it
            continue;
        }
        digits += text[i];
        if (fraction) --exponent;
    }
    if (digits.empty()) return "0";
    if (i < text.size()) exponent += std::stol(std::string(text.substr(i + 1)));
    while (digits.back() == '0') {
        digits.pop_back();
        ++exponent;
    }
    return sign + digits + "e" + std::to_string(exponent);
}

std::string quoted_as_given(const Given& g) {
    if (normalized(g.written) == normalized(g.canonical)) return g.written;
    return g.written + " (reads as " + g.canonical + ")";
}

bool continues_number(const std::string& s, std::size_t at) {
    if (at >= s.size()) return false;
    const auto digit = [&](std::size_t k) { return k < s.size() && std::isdigit(static_cast<unsigned char>(s[k])); };
    return digit(at) || ((s[at] == '.' || s[at] == 'e' || s[at] == 'E') && (digit(at + 1) || (at + 1 < s.size() && (s[at + 1] == '-' || s[at + 1] == '+'))));
}

// Replaces `before + canonical` (a whole number, from `from` on) with `before + quoted`, once.
bool replace_number(std::string& message, std::size_t from, const std::string& before, const Given& g,
                    const std::string& quoted) {
    const std::string pattern = before + g.canonical;
    for (std::size_t at = message.find(pattern, from); at != std::string::npos; at = message.find(pattern, at + 1)) {
        if (continues_number(message, at + pattern.size())) continue;
        message.replace(at + before.size(), g.canonical.size(), quoted);
        return true;
    }
    return false;
}

}  // namespace

void record_number_text(const CLI::Option& opt, const std::string& written, const std::string& canonical) {
    for (const std::string& name : opt.get_lnames()) given_numbers()["--" + name] = Given{written, canonical};
}

std::string given_number(std::string_view flag, double value) {
    const auto it = given_numbers().find(flag);
    return it == given_numbers().end() ? detail::shortest(value) : quoted_as_given(it->second);
}

std::string given_number(std::string_view flag, std::int64_t value) {
    const auto it = given_numbers().find(flag);
    return it == given_numbers().end() ? std::to_string(value) : quoted_as_given(it->second);
}

std::string with_given_numbers(const std::string& message) {
    std::string m = message;
    for (const auto& [flag, g] : given_numbers()) {
        if (g.written == g.canonical) continue;
        const std::string quoted = quoted_as_given(g);
        // "op: FLAG: must be … but got C": the value of the argument the message is about.
        const std::size_t about = m.find(flag + ": ");
        if (about != std::string::npos) replace_number(m, about, "got ", g, quoted);
        // "op: --seed: --dropout = C needs a seed": the value of another argument, named with it.
        replace_number(m, 0, flag + " = ", g, quoted);
    }
    return m;
}

}  // namespace attn::cli
