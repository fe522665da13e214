#include "strict_options.hpp"

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <string_view>
#include <system_error>
#include <type_traits>

#include "attn/error.hpp"
#include "core/check.hpp"
#include "number_text.hpp"

namespace attn::cli {
namespace {

// One leading '+' is allowed ("+3"); from_chars itself takes only '-'.
std::string_view digits_of(std::string_view s) { return s.size() > 1 && s[0] == '+' && s[1] != '-' ? s.substr(1) : s; }

// Each reader returns why the text is not a value ("" when it is one) and stores the value.
template <class T>
std::string read_integer(const std::string& text, T& value) {
    const char* what = std::is_signed_v<T> ? "an integer" : "a non-negative integer";
    if (text.empty()) return std::string("expected ") + what + " but got an empty string";
    if (!std::is_signed_v<T> && text[0] == '-') return std::string("expected ") + what + " but got " + detail::quoted(text);
    const std::string_view s = digits_of(text);
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value, 10);
    if (ec == std::errc::result_out_of_range && end == s.data() + s.size()) {
        return text + " is out of range (" + std::to_string(std::numeric_limits<T>::min()) + " to " +
               std::to_string(std::numeric_limits<T>::max()) + ")";
    }
    if (ec != std::errc() || end != s.data() + s.size()) return std::string("expected ") + what + " but got " + detail::quoted(text);
    return {};
}

std::string read_finite_double(const std::string& text, double& value) {
    if (text.empty()) return "expected a number but got an empty string";
    const std::string_view s = digits_of(text);
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value, std::chars_format::general);
    if (ec == std::errc::result_out_of_range && end == s.data() + s.size()) {
        // from_chars rounds to nearest even and says "out of range" (leaving the value) only for
        // what rounds to 0 or to infinity: a magnitude up to 2^-1075, half the smallest double
        // (3e-324 reads as 5e-324), or from 2^1024 - 2^970, half a step past the largest
        // (1.7976931348623158e308 reads as the largest). strtod (the C locale: the CLI sets none)
        // tells which; the messages state those bounds — ties, which round away from the extreme
        // doubles, and no doubles themselves: written with 17 digits.
        if (std::isinf(std::strtod(text.c_str(), nullptr))) {
            return text + " overflows a double: it rounds to infinity, as every magnitude from 2^1024 - 2^970 ≈ "
                   "1.7976931348623158e+308 up does (the largest double is " +
                   detail::shortest(std::numeric_limits<double>::max()) + ")";
        }
        return text + " underflows a double: it is not 0 but rounds to 0, as every magnitude up to 2^-1075 ≈ "
               "2.4703282292062327e-324 does (half the smallest double, " +
               detail::shortest(std::numeric_limits<double>::denorm_min()) + "; a larger one reads as " +
               detail::shortest(std::numeric_limits<double>::denorm_min()) + " or more); give 0 for zero";
    }
    if (ec != std::errc() || end != s.data() + s.size()) return "expected a number but got " + detail::quoted(text);
    if (!std::isfinite(value)) return "expected a finite number but got " + detail::quoted(text);
    return {};
}

template <class T, class Read>
T parse_or_throw(const std::string& flag, const std::string& text, Read read) {
    T value{};
    const std::string why = read(text, value);
    if (!why.empty()) throw Error(flag + ": " + why);
    return value;
}

// A CLI11 check that runs one reader and hands CLI11 the value's canonical text to convert
// (CLI11 converts integers with base 0, so "010" would otherwise become 8). CLI11 prefixes
// the message with the option's name. What the user wrote is kept for messages (number_text.hpp).
template <class T>
CLI::Validator strict(const char* name, std::string (*read)(const std::string&, T&), const CLI::Option* opt) {
    return CLI::Validator(
        [read, opt](std::string& text) -> std::string {
            T value{};
            std::string why = read(text, value);
            if (!why.empty()) return why;
            const std::string written = text;
            if constexpr (std::is_floating_point_v<T>) {
                text = detail::shortest(value);
            } else {
                text = std::to_string(value);
            }
            record_number_text(*opt, written, text);
            return {};
        },
        "", name);
}

void apply(CLI::App& app) {
    const CLI::Validator not_empty(
        [](std::string& text) -> std::string {
            return text.empty() ? kEmptyValueRefused : "";
        },
        "", "NOT_EMPTY");
    for (CLI::Option* opt : app.get_options()) {
        if (opt->get_type_size_max() == 0) continue;  // a flag: no value to check
        opt->check(not_empty);
        // "FLOAT:FLOAT in [0 - 1]" once a command's own Range check is attached: the type comes first.
        const std::string full = opt->get_type_name();
        const std::string type = full.substr(0, full.find(':'));
        // transform, not check: CLI11 copies the text for a check, and the canonical text must
        // reach the conversion. (A transform runs first, before the command's own checks.)
        if (type == "INT") opt->transform(strict<std::int64_t>("STRICT_INT", read_integer<std::int64_t>, opt));
        else if (type == "UINT") opt->transform(strict<std::uint64_t>("STRICT_UINT", read_integer<std::uint64_t>, opt));
        else if (type == "FLOAT") opt->transform(strict<double>("STRICT_FLOAT", read_finite_double, opt));
    }
    for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) apply(*sub);
}

}  // namespace

std::int64_t parse_int64(const std::string& flag, const std::string& text) {
    return parse_or_throw<std::int64_t>(flag, text, read_integer<std::int64_t>);
}

std::uint64_t parse_uint64(const std::string& flag, const std::string& text) {
    return parse_or_throw<std::uint64_t>(flag, text, read_integer<std::uint64_t>);
}

double parse_finite_double(const std::string& flag, const std::string& text) {
    return parse_or_throw<double>(flag, text, read_finite_double);
}

void make_options_strict(CLI::App& app) { apply(app); }

std::uint64_t dropout_seed(std::string_view op, const char* dropout_flag, double p, const char* seed_flag,
                           const std::optional<std::uint64_t>& seed) {
    const std::string seed_value = std::string(seed_flag) + " N";  // how a seed is given here: "--seed N"
    detail::require_dropout(op, p, seed, {dropout_flag, seed_flag, seed_value});
    if (p == 0.0 && seed) throw Error(std::string(seed_flag) + ": only with " + dropout_flag + " P > 0 (it seeds the dropout mask)");
    return seed.value_or(0);
}

Align window_align_option(const std::optional<std::string>& text, std::int64_t left, std::int64_t right) {
    if (!text) return Align::top_left;
    if (*text != "top-left" && *text != "bottom-right") {
        throw Error("--window-align: expected top-left or bottom-right but got " + detail::quoted(*text));
    }
    if (left < 0 && right < 0) throw Error("--window-align: only with --window-left or --window-right (it aligns the window)");
    return *text == "top-left" ? Align::top_left : Align::bottom_right;
}

void require_query_offset_use(const std::optional<std::int64_t>& offset, const std::string& offsets_file, Causal causal,
                              std::int64_t window_left, std::int64_t window_right, bool alibi) {
    if ((!offset && offsets_file.empty()) || causal != Causal::none || window_left >= 0 || window_right >= 0 || alibi) return;
    throw Error(std::string(offset ? "--query-offset" : "--query-offsets") + ": only with --causal, --window-left/--window-right or --alibi/--alibi-slopes " +
                "(it places the diagonal they measure from; without them it changes nothing)");
}

}  // namespace attn::cli
