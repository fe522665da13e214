// safetensors reader and writer. The reader validates the whole header (see
// include/attn/safetensors.hpp) before it allocates a tensor or reads a data byte, so a
// hostile file can cost at most the header it declares (capped) and an error.
#include "attn/safetensors.hpp"


#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <map>
#include <set>
#include <vector>

#include "../core/check.hpp"
#include "../core/checked_size.hpp"
#include "attn/error.hpp"
#include "atomic_file.hpp"
#include "input_file.hpp"
#include "json_text.hpp"
#include "safetensors_header.hpp"
#include "tensor_writers.hpp"

static_assert(std::endian::native == std::endian::little, "safetensors I/O assumes a little-endian host");

namespace attn {
namespace {

using detail::SafetensorsEntry;

[[noreturn]] void fail(const std::string& what, const std::string& msg) { throw Error(what + ": " + msg); }

// `read_raw(offset, dst, bytes)` copies bytes of the file; load() asks only for ranges it
// has checked against `total`.
// `only`: read the data of that tensor alone (the header is still checked whole; a missing
// name is an error listing the names the file has). `prefix`: read those whose names start with
// it (the header is checked whole); `held`, when given, gets every name the file holds.
// `read_data` false: check the header and fill `held` only (safetensors_names).
SafetensorsFile load(std::uint64_t total, const std::function<void(std::uint64_t, void*, std::size_t)>& read_raw,
                     const std::string& file, const std::string* only = nullptr, const std::string& prefix = {},
                     std::vector<std::string>* held = nullptr, bool read_data = true) {
    if (total < 8) fail(file, "file is " + std::to_string(total) + " bytes, too short for the 8-byte header length");
    unsigned char len_bytes[8];
    read_raw(0, len_bytes, 8);
    std::uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | len_bytes[i];
    if (std::memcmp(len_bytes, "\x93NUMPY", 6) == 0) fail(file, "is a .npy file, not a safetensors file");
    if (n > total - 8 || n > kSafetensorsMaxHeader) {
        // Not a safetensors file. torch.save writes a zip archive (torch >= 1.6) or a bare pickle
        // (protocol 2+: 0x80, the protocol, then an opcode; no opcode is 0x00): say so. Only
        // here: a real header length can begin with the same bytes (0x80 0x02 is 640).
        const bool zip = std::memcmp(len_bytes, "PK\x03\x04", 4) == 0;
        const bool pickle = len_bytes[0] == 0x80 && len_bytes[1] >= 2 && len_bytes[1] <= 5 && len_bytes[2] != 0;
        if (zip || pickle) {
            fail(file, std::string(zip ? "is a zip archive" : "is a pickle") +
                           " (torch.save writes these), not a safetensors file: save the state_dict with "
                           "safetensors.torch.save_file or attn.save_safetensors");
        }
    }
    if (n > total - 8) {
        fail(file, "header length " + std::to_string(n) + " runs past the end of the file (" +
                       std::to_string(total - 8) + " bytes follow the length)");
    }
    if (n > kSafetensorsMaxHeader) {
        fail(file, "header length " + std::to_string(n) + " exceeds the limit of " +
                       std::to_string(kSafetensorsMaxHeader) + " bytes");
    }
    std::string text(static_cast<std::size_t>(n), '\0');
    read_raw(8, text.data(), text.size());
    const std::uint64_t data_start = 8 + n, data_size = total - data_start;

    SafetensorsFile out;
    const std::vector<SafetensorsEntry> entries = detail::parse_safetensors_header(text, data_size, file, out.metadata);
    if (only != nullptr && std::none_of(entries.begin(), entries.end(), [&](const SafetensorsEntry& e) { return e.name == *only; })) {
        std::vector<std::string> names;
        for (const SafetensorsEntry& e : entries) names.push_back(e.name);
        fail(file, "has no tensor named " + detail::quoted(*only) + " (" + detail::names_held(names) + ")");
    }
    const auto wanted = [&](const std::string& name) {
        return only != nullptr ? name == *only : name.compare(0, prefix.size(), prefix) == 0;
    };
    if (held != nullptr)
        for (const SafetensorsEntry& e : entries) held->push_back(e.name);
    if (!read_data) return out;
    // The hint only where the caller asked for every tensor: one named, or one layer's (a prefix), is
    // needed as it is.
    const bool reads_all = only == nullptr && prefix.empty();
    for (const SafetensorsEntry& e : entries) {  // a tensor attn has no type for is refused only when it is to be read
        if (!wanted(e.name)) continue;
        if (!e.unreadable.empty()) {
            fail(file + ": tensor " + detail::quoted(e.name), "dtype " + e.unreadable + " is not supported (" + detail::kSafetensorsReadable + ")" +
                                                         (reads_all ? "; read the others by name" : ""));
        }
    }
    for (const SafetensorsEntry& e : entries) {
        if (!wanted(e.name)) continue;
        Tensor t(e.dtype, e.shape, false, file + ": tensor " + detail::quoted(e.name));
        read_raw(data_start + e.begin, t.data(), static_cast<std::size_t>(e.end - e.begin));
        out.tensors.emplace_back(e.name, std::move(t));
    }
    return out;
}

}  // namespace

const Tensor* SafetensorsFile::find(std::string_view name) const {
    for (const auto& [n, t] : tensors)
        if (n == name) return &t;
    return nullptr;
}

SafetensorsFile parse_safetensors(const void* data, std::size_t size, const std::string& what) {
    const auto* bytes = static_cast<const unsigned char*>(data);
    return load(size, [&](std::uint64_t off, void* dst, std::size_t n) { std::memcpy(dst, bytes + off, n); }, what);
}

SafetensorsFile read_safetensors(const std::string& path) { return read_safetensors_prefix(path, {}); }

SafetensorsFile read_safetensors_prefix(const std::string& path, const std::string& prefix, std::vector<std::string>* held) {
    const detail::InputFile f(path);  // regular files only; never blocks on a FIFO
    return load(f.size(), [&f](std::uint64_t off, void* dst, std::size_t n) { f.read_at(off, dst, n); }, detail::quoted_path(path),
                nullptr, prefix,
                held);
}

std::vector<std::string> safetensors_names(const std::string& path) {
    const detail::InputFile f(path);
    std::vector<std::string> names;
    load(f.size(), [&f](std::uint64_t off, void* dst, std::size_t n) { f.read_at(off, dst, n); }, path, nullptr, {}, &names,
         /*read_data=*/false);
    return names;
}

Tensor read_safetensors_tensor(const std::string& path, const std::string& name) {
    const detail::InputFile f(path);
    SafetensorsFile one =
        load(f.size(), [&f](std::uint64_t off, void* dst, std::size_t n) { f.read_at(off, dst, n); }, detail::quoted_path(path), &name);
    return std::move(one.tensors.front().second);
}

namespace detail {

namespace {
// What a view is stored as: integers and bool as they are, F16/BF16 kept when asked, every
// other float as F32.
const char* stored_dtype(DType t, bool keep_16bit) {
    if (t == DType::i64) return "I64";
    if (t == DType::i32) return "I32";
    if (t == DType::boolean) return "BOOL";
    if (keep_16bit && t == DType::f16) return "F16";
    if (keep_16bit && t == DType::bf16) return "BF16";
    return "F32";
}

// Bytes of one tensor in the file (its stored dtype), checked: a broadcast view (stride 0) can
// stand for more bytes than a 64-bit offset counts.
std::int64_t stored_bytes(const std::string& path, const std::string& name, const TensorView& view, bool keep_16bit) {
    const std::int64_t elem = std::string_view(stored_dtype(view.dtype(), keep_16bit)) == "F32"
                                  ? 4
                                  : static_cast<std::int64_t>(dtype_size(view.dtype()));
    return checked_mul(detail::quoted_path(path), "tensor " + detail::quoted(name), view.numel(), elem);
}
}  // namespace

SafetensorsHeader safetensors_header(const std::string& path, const std::vector<std::pair<std::string, TensorView>>& tensors,
                                     const std::map<std::string, std::string>& metadata, bool keep_16bit) {
    // The JSON as nlohmann-json's dump() of a std::map wrote it before (so files stay byte for
    // byte the same): members sorted by name, __metadata__ among them; no spaces.
    const std::string file = detail::quoted_path(path);  // every message names the file so
    const auto json_string = [&file](std::string& out, const std::string& text, const std::string& what) {
        if (!append_json_string(out, text)) throw Error(file + ": " + what + " is not valid UTF-8 (a safetensors header is JSON text)");
    };
    std::vector<std::pair<std::string_view, std::string>> members;  // (name, "\"name\":value")
    members.reserve(tensors.size() + 1);
    std::set<std::string_view> names;
    std::int64_t offset = 0;
    for (const auto& [name, view] : tensors) {
        if (name.empty() || name == "__metadata__") {
            throw Error(file + ": tensor name " + detail::quoted(name) + " is not allowed (empty or reserved)");
        }
        if (!names.insert(name).second) throw Error(file + ": tensor " + detail::quoted(name) + " is given more than once");
        if (view.data() == nullptr && view.numel() != 0) throw Error(file + ": tensor " + detail::quoted(name) + " has no data");
        std::string member;
        json_string(member, name, "tensor name " + detail::quoted(name));
        const std::int64_t bytes = stored_bytes(path, name, view, keep_16bit);
        const std::int64_t end = checked_add(file, "the data of tensors up to " + detail::quoted(name), offset, bytes);
        member += ":{\"data_offsets\":[" + std::to_string(offset) + "," + std::to_string(end) + "],\"dtype\":\"" +
                  stored_dtype(view.dtype(), keep_16bit) + "\",\"shape\":[";
        for (int i = 0; i < view.rank(); ++i) {
            if (i > 0) member += ',';
            member += std::to_string(view.dim(i));
        }
        members.emplace_back(name, member + "]}");
        offset = end;
    }
    if (!metadata.empty()) {
        std::string member = "\"__metadata__\":{";
        for (const auto& [key, value] : metadata) {  // a std::map: sorted
            if (member.back() != '{') member += ',';
            json_string(member, key, "metadata key " + detail::quoted(key));
            member += ':';
            json_string(member, value, "the value of metadata key " + detail::quoted(key));
        }
        members.emplace_back("__metadata__", member + "}");
    }
    std::sort(members.begin(), members.end());
    std::string text = "{";
    for (const auto& [name, member] : members) {
        if (text.size() > 1) text += ',';
        text += member;
    }
    text += '}';
    text.append((8 - text.size() % 8) % 8, ' ');  // keeps the data 8-byte aligned, as the format suggests
    return {std::move(text), offset};
}

void write_safetensors_into(AtomicFile& out, const SafetensorsHeader& header,
                            const std::vector<std::pair<std::string, TensorView>>& tensors, bool keep_16bit) {
    const std::string& text = header.text;
    out.reserve(checked_add(detail::quoted_path(out.path()), "the file", 8 + static_cast<std::int64_t>(text.size()), header.data_bytes));
    unsigned char len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>((static_cast<std::uint64_t>(text.size()) >> (8 * i)) & 0xff);
    out.write(len, 8);
    out.write(text.data(), text.size());
    for (const auto& [name, view] : tensors) {
        if (std::string_view(stored_dtype(view.dtype(), keep_16bit)) != "F32") {
            write_elements_into(out, view);  // integers, bool and kept 16-bit floats as they are
            continue;
        }
        // A strided or non-F32 view is first converted to a contiguous F32 copy.
        const Tensor f = (view.dtype() == DType::f32 && view.is_contiguous()) ? Tensor() : to_dtype(view, DType::f32);
        const void* src = f.data() != nullptr ? f.data() : view.data();
        out.write(src, static_cast<std::size_t>(view.numel()) * 4);
    }
}

}  // namespace detail

void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, TensorView>>& tensors,
                       const std::map<std::string, std::string>& metadata, bool keep_16bit) {
    const detail::SafetensorsHeader header = detail::safetensors_header(path, tensors, metadata, keep_16bit);
    detail::AtomicFile out(path);
    detail::write_safetensors_into(out, header, tensors, keep_16bit);
    out.commit();
}

}  // namespace attn
