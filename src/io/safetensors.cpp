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
#include <nlohmann/json.hpp>
#include <map>
#include <set>
#include <vector>

#include "../core/check.hpp"
#include "../core/checked_size.hpp"
#include "attn/error.hpp"
#include "atomic_file.hpp"
#include "input_file.hpp"
#include "tensor_writers.hpp"

static_assert(std::endian::native == std::endian::little, "safetensors I/O assumes a little-endian host");

namespace attn {
namespace {

using json = nlohmann::json;

struct Entry {
    std::string name;
    DType dtype = DType::f32;
    std::string unreadable;  // a dtype of the format that attn has no type for ("U8", ...), else empty
    Shape shape;
    std::uint64_t begin = 0, end = 0;  // relative to the data section
};

[[noreturn]] void fail(const std::string& what, const std::string& msg) { throw Error(what + ": " + msg); }

// dtype strings of the format that attn has a type for.
bool parse_dtype(const std::string& s, DType& out) {
    static const std::map<std::string, DType> readable = {{"F32", DType::f32},  {"F16", DType::f16}, {"BF16", DType::bf16},
                                                          {"F64", DType::f64},  {"I64", DType::i64}, {"I32", DType::i32},
                                                          {"BOOL", DType::boolean}};
    const auto it = readable.find(s);
    if (it == readable.end()) return false;
    out = it->second;
    return true;
}
constexpr const char* kReadable = "F32, F16, BF16, F64, I64, I32 or BOOL";

// Bytes per element of the format's other dtypes: a file may hold them (a checkpoint's uint8
// buffers, ...); their entries are checked like any other, and only reading one is an error.
std::size_t unreadable_dtype_size(const std::string& s) {
    static const std::map<std::string, std::size_t> known = {{"U64", 8}, {"U32", 4}, {"I16", 2},     {"U16", 2},
                                                             {"I8", 1},  {"U8", 1},  {"F8_E4M3", 1}, {"F8_E5M2", 1}};
    const auto it = known.find(s);
    return it == known.end() ? 0 : it->second;
}

std::uint64_t json_uint(const json& v, const std::string& what, const std::string& field) {
    if (!v.is_number_unsigned()) {
        if (v.is_number_integer()) fail(what, field + " must be >= 0 but got " + v.dump());
        fail(what, field + " must be a non-negative integer but got " + detail::quoted(v.dump()));
    }
    return v.get<std::uint64_t>();
}

Entry parse_entry(const std::string& name, const json& v, std::uint64_t data_size, const std::string& file) {
    const std::string what = file + ": tensor " + detail::quoted(name);
    if (name.empty()) fail(file, "a tensor has an empty name");
    if (!v.is_object()) fail(what, "entry must be a JSON object but got " + std::string(v.type_name()));
    for (const auto& [key, _] : v.items()) {
        if (key != "dtype" && key != "shape" && key != "data_offsets") {
            fail(what, "unexpected field " + detail::quoted(key) + " (expected dtype, shape, data_offsets)");
        }
    }
    for (const char* field : {"dtype", "shape", "data_offsets"}) {
        if (!v.contains(field)) fail(what, std::string("missing field '") + field + "'");
    }
    Entry e;
    e.name = name;

    const json& dt = v["dtype"];
    if (!dt.is_string()) fail(what, "dtype must be a string but got " + detail::quoted(dt.dump()));
    const std::string ds = dt.get<std::string>();
    std::size_t elem_size = 0;
    if (parse_dtype(ds, e.dtype)) {
        elem_size = dtype_size(e.dtype);
    } else if ((elem_size = unreadable_dtype_size(ds)) != 0) {
        e.unreadable = ds;
    } else {
        fail(what, "unknown dtype " + detail::quoted(ds) + " (expected " + kReadable + ")");
    }

    const json& sh = v["shape"];
    if (!sh.is_array()) fail(what, "shape must be an array but got " + detail::quoted(sh.dump()));
    if (sh.size() > static_cast<std::size_t>(kMaxRank)) {
        fail(what, "rank " + std::to_string(sh.size()) + " is not supported (at most " + std::to_string(kMaxRank) + ")");
    }
    // numel · itemsize, checked (it is compared with the offsets below); a zero-size shape
    // whose other dims overflow is refused too, its strides would.
    for (std::size_t i = 0; i < sh.size(); ++i) {
        const std::uint64_t d = json_uint(sh[i], what, "shape[" + std::to_string(i) + "]");
        if (d > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
            fail(what, "shape[" + std::to_string(i) + "] = " + std::to_string(d) + " is too large");
        }
        e.shape.dims[i] = static_cast<std::int64_t>(d);
    }
    e.shape.rank = static_cast<int>(sh.size());
    const auto bytes = static_cast<std::uint64_t>(detail::checked_bytes(what, "data", e.shape, elem_size));

    const json& off = v["data_offsets"];
    if (!off.is_array() || off.size() != 2) fail(what, "data_offsets must be [begin, end] but got " + detail::quoted(off.dump()));
    e.begin = json_uint(off[0], what, "data_offsets[0]");
    e.end = json_uint(off[1], what, "data_offsets[1]");
    if (e.end < e.begin) {
        fail(what, "data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) + "] end before they begin");
    }
    if (e.end > data_size) {
        fail(what, "data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) +
                       "] run past the end of the data section (" + std::to_string(data_size) + " bytes)");
    }
    if (e.end - e.begin != bytes) {
        fail(what, "shape " + e.shape.str() + " of " + ds + " needs " + std::to_string(bytes) +
                       " bytes but data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) +
                       "] hold " + std::to_string(e.end - e.begin));
    }
    return e;
}

// Parses and checks a header; `data_size` is the number of bytes after it.
std::vector<Entry> parse_header(std::string_view text, std::uint64_t data_size, const std::string& file,
                                std::map<std::string, std::string>& metadata) {
    // nlohmann keeps the last of duplicate keys silently; JSON objects here must not repeat one
    // (two tensors of one name, or two "dtype"s in one entry), so the parser callback watches
    // the keys of every open object as they stream past.
    std::vector<std::set<std::string>> open;  // the keys of each object being parsed, innermost last
    std::string duplicate;
    const json::parser_callback_t watch = [&](int, json::parse_event_t event, json& parsed) {
        if (event == json::parse_event_t::object_start) open.emplace_back();
        else if (event == json::parse_event_t::object_end && !open.empty()) open.pop_back();
        else if (event == json::parse_event_t::key && !open.empty()) {
            const std::string key = parsed.get<std::string>();
            if (!open.back().insert(key).second && duplicate.empty()) duplicate = key;
        }
        return true;
    };
    // nlohmann stops at a NUL byte as at the end of input; the format allows none.
    if (const std::size_t z = text.find('\0'); z != std::string_view::npos) {
        fail(file, "header is not valid JSON (NUL byte at header offset " + std::to_string(z) + ")");
    }
    json header;
    try {
        header = json::parse(text.begin(), text.end(), watch);
    } catch (const json::exception& e) {
        fail(file, std::string("header is not valid JSON (") + e.what() + ")");
    }
    if (!duplicate.empty()) fail(file, "header names " + detail::quoted(duplicate) + " more than once");
    if (!header.is_object()) fail(file, std::string("header must be a JSON object but is ") + header.type_name());

    std::vector<Entry> entries;
    for (const auto& [name, value] : header.items()) {
        if (name == "__metadata__") {
            if (!value.is_object()) fail(file, "__metadata__ must be an object of strings but got " + detail::quoted(value.dump()));
            for (const auto& [k, s] : value.items()) {
                if (!s.is_string()) fail(file, "__metadata__[" + detail::quoted(k) + "] must be a string but got " + detail::quoted(s.dump()));
                metadata[k] = s.get<std::string>();
            }
            continue;
        }
        entries.push_back(parse_entry(name, value, data_size, file));
    }

    // The data must be covered exactly: sorted by offset, each tensor starts where the
    // previous one ended (a gap is a hole, an earlier start an overlap), the last ends at the end.
    std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
        return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
    });
    std::uint64_t pos = 0;
    const Entry* prev = nullptr;
    for (const Entry& e : entries) {
        if (e.begin < pos) {
            fail(file, "tensor " + detail::quoted(e.name) + " data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) +
                           "] overlap tensor " + detail::quoted(prev->name) + " [" + std::to_string(prev->begin) + ", " +
                           std::to_string(prev->end) + "]");
        }
        if (e.begin > pos) {
            fail(file, "bytes [" + std::to_string(pos) + ", " + std::to_string(e.begin) +
                           ") of the data section belong to no tensor (before tensor " + detail::quoted(e.name) + ")");
        }
        pos = e.end;
        prev = &e;
    }
    if (pos != data_size) {
        fail(file, "bytes [" + std::to_string(pos) + ", " + std::to_string(data_size) +
                       ") at the end of the data section belong to no tensor");
    }
    return entries;
}

// `read_raw(offset, dst, bytes)` copies bytes of the file; load() asks only for ranges it
// has checked against `total`.
// `only`: read the data of that tensor alone (the header is still checked whole; a missing
// name is an error listing the names the file has).
SafetensorsFile load(std::uint64_t total, const std::function<void(std::uint64_t, void*, std::size_t)>& read_raw,
                     const std::string& file, const std::string* only = nullptr) {
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
    const std::vector<Entry> entries = parse_header(text, data_size, file, out.metadata);
    if (only != nullptr && std::none_of(entries.begin(), entries.end(), [&](const Entry& e) { return e.name == *only; })) {
        std::vector<std::string> names;
        for (const Entry& e : entries) names.push_back(e.name);
        fail(file, "has no tensor named " + detail::quoted(*only) + " (" + detail::names_held(names) + ")");
    }
    for (const Entry& e : entries) {  // a tensor attn has no type for is refused only when it is to be read
        if (only != nullptr && e.name != *only) continue;
        if (!e.unreadable.empty()) {
            fail(file + ": tensor " + detail::quoted(e.name), "dtype " + e.unreadable + " is not supported (" + kReadable + ")" +
                                                         (only == nullptr ? "; read the others by name" : ""));
        }
    }
    for (const Entry& e : entries) {
        if (only != nullptr && e.name != *only) continue;
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

SafetensorsFile read_safetensors(const std::string& path) {
    const detail::InputFile f(path);  // regular files only; never blocks on a FIFO
    return load(f.size(), [&f](std::uint64_t off, void* dst, std::size_t n) { f.read_at(off, dst, n); }, path);
}

Tensor read_safetensors_tensor(const std::string& path, const std::string& name) {
    const detail::InputFile f(path);
    SafetensorsFile one =
        load(f.size(), [&f](std::uint64_t off, void* dst, std::size_t n) { f.read_at(off, dst, n); }, path, &name);
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
    return checked_mul(path, "tensor '" + name + "'", view.numel(), elem);
}
}  // namespace

SafetensorsHeader safetensors_header(const std::string& path, const std::vector<std::pair<std::string, TensorView>>& tensors,
                                     const std::map<std::string, std::string>& metadata, bool keep_16bit) {
    json header = json::object();
    std::set<std::string> names;
    std::int64_t offset = 0;
    for (const auto& [name, view] : tensors) {
        if (name.empty() || name == "__metadata__") {
            throw Error(path + ": tensor name '" + name + "' is not allowed (empty or reserved)");
        }
        if (!names.insert(name).second) throw Error(path + ": tensor '" + name + "' is given more than once");
        if (view.data() == nullptr && view.numel() != 0) throw Error(path + ": tensor '" + name + "' has no data");
        const std::string dt = stored_dtype(view.dtype(), keep_16bit);
        json shape = json::array();
        for (int i = 0; i < view.rank(); ++i) shape.push_back(view.dim(i));
        const std::int64_t bytes = stored_bytes(path, name, view, keep_16bit);
        const std::int64_t end = checked_add(path, "the data of tensors up to '" + name + "'", offset, bytes);
        header[name] = {{"dtype", dt}, {"shape", shape}, {"data_offsets", {offset, end}}};
        offset = end;
    }
    if (!metadata.empty()) header["__metadata__"] = metadata;
    std::string text = header.dump();
    text.append((8 - text.size() % 8) % 8, ' ');  // keeps the data 8-byte aligned, as the format suggests
    return {std::move(text), offset};
}

void write_safetensors_into(AtomicFile& out, const SafetensorsHeader& header,
                            const std::vector<std::pair<std::string, TensorView>>& tensors, bool keep_16bit) {
    const std::string& text = header.text;
    out.reserve(checked_add(out.path(), "the file", 8 + static_cast<std::int64_t>(text.size()), header.data_bytes));
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
