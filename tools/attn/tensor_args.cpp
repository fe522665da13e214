#include "core/check.hpp"
#include "tensor_args.hpp"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <new>
#include <utility>

#include "attn/error.hpp"
#include "attn/npy.hpp"
#include "attn/safetensors.hpp"
#include "core/check.hpp"

namespace attn::cli {
namespace {

constexpr std::string_view kSafetensors = ".safetensors";

bool ends_with(const std::string& s, std::string_view suffix) {
    return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// A spec's file and, for FILE.safetensors:NAME, the tensor's name (else empty). One rule for
// every reader of a spec: a spec that names an existing file is that file (a .npy may be called
// "run.safetensors:v2.npy"); any other is split after its first ".safetensors:", so a name may
// hold ':' (TensorFlow's "dense/kernel:0").
std::pair<std::string, std::string> split_spec(const std::string& spec) {
    const std::string marker = std::string(kSafetensors) + ":";
    const std::size_t at = spec.find(marker);
    struct stat st {};
    if (at != std::string::npos && at > 0 && ::stat(spec.c_str(), &st) != 0) {
        const std::size_t colon = at + marker.size() - 1;
        return {spec.substr(0, colon), spec.substr(colon + 1)};
    }
    return {spec, ""};
}

Tensor read_spec(const std::string& spec) {
    // Split first: a tensor may itself be named "x.safetensors" (FILE.safetensors:x.safetensors).
    const auto [file, name] = split_spec(spec);
    if (file != spec) {
        if (name.empty()) throw Error(detail::quoted_path(spec) + ": the tensor name after ':' is empty (FILE.safetensors:NAME)");
        // Neither reading finds a file: say both, not only the one split_spec fell back to.
        if (struct stat st {}; ::stat(file.c_str(), &st) != 0) {
            throw Error(detail::quoted_path(spec) + ": no file of that name, nor a file " + detail::quoted_path(file) +
                        " to read the tensor " + detail::quoted(name) + " from (" +
                        std::strerror(errno) + ")");
        }
        return read_safetensors_tensor(file, name);
    }
    if (ends_with(spec, kSafetensors)) {
        // The names it holds say what NAME is: attn's own outputs hold one, named after their option
        // (out, lse, weights, ...), which nothing told a user who passed such a file on.
        std::string held;
        try {
            held = " (" + detail::names_held(safetensors_names(spec)) + ")";
        } catch (const Error&) {  // no such file, or not a safetensors one: the advice alone
        }
        throw Error(detail::quoted_path(spec) + " is a safetensors file: name the tensor as " + detail::quoted_path(spec + ":NAME") +
                    held);
    }
    return read_npy(spec);
}

}  // namespace

std::string dtype_list(const std::vector<DType>& dtypes) {
    std::string s;
    for (std::size_t i = 0; i < dtypes.size(); ++i)
        s += (i == 0 ? "" : (i + 1 == dtypes.size() ? " or " : ", ")) + std::string(dtype_name(dtypes[i]));
    return s;
}

Tensor read_tensor_arg(const std::string& flag, const std::string& spec) {
    try {
        return read_spec(spec);
    } catch (const Error& e) {  // the file's own message, prefixed with the option it was given to
        throw Error(flag + ": " + e.what());
    }
}

Tensor read_tensor_arg(const std::string& flag, const std::string& spec, std::initializer_list<DType> allowed) {
    Tensor t = read_tensor_arg(flag, spec);
    for (const DType d : allowed)
        if (t.dtype() == d) return t;
    throw Error(flag + ": " + detail::quoted_path(spec) + " must hold " + dtype_list(allowed) + " but holds " +
                std::string(dtype_name(t.dtype())));
}

Tensor read_float_arg(const std::string& flag, const std::string& spec) {
    return read_tensor_arg(flag, spec, {DType::f32, DType::f64, DType::f16, DType::bf16});
}

std::optional<DType> parse_out_dtype(const std::string& text, bool with_float64) {
    if (text.empty()) return std::nullopt;
    return parse_float_dtype("--out-dtype", text, with_float64);
}

DType out_dtype_for(std::optional<DType> given, DType q_dtype) {
    // The default: a 16-bit Q's dtype; float32 for float32 and float64 Q (the CLI has written
    // float32 outputs for float64 inputs since its first version: tests/torch's contract;
    // docs/conventions.md "The CLI's output dtype").
    if (given) return *given;
    return q_dtype == DType::f16 || q_dtype == DType::bf16 ? q_dtype : DType::f32;
}

std::vector<DType> float_dtypes(bool with_float64) {
    std::vector<DType> d{DType::f16, DType::bf16, DType::f32};
    if (with_float64) d.push_back(DType::f64);
    return d;
}

DType parse_float_dtype(const std::string& flag, const std::string& text, bool with_float64) {
    const std::vector<DType> takes = float_dtypes(with_float64);
    for (const DType d : takes)
        if (text == dtype_name(d)) return d;
    throw Error(flag + ": expected " + dtype_list(takes) + " but got " + detail::quoted(text));
}

std::string tensor_arg_file(const std::string& spec) { return split_spec(spec).first; }

bool same_tensor_arg(const std::string& a, const std::string& b) {
    if (a == b) return true;
    const auto [fa, na] = split_spec(a);
    const auto [fb, nb] = split_spec(b);
    if (na != nb) return false;
    struct stat sa {}, sb {};
    return ::stat(fa.c_str(), &sa) == 0 && ::stat(fb.c_str(), &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

}  // namespace attn::cli
