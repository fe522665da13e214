// The safetensors header reader (safetensors_header.hpp). The SAX handler gathers what the
// checks need of each entry; the checks then run in the order, and with the messages, that
// they had when the header was first parsed into a nlohmann::json document: keys in sorted
// order (the document kept objects in a std::map), values shown as its dump() showed them.
#include "safetensors_header.hpp"

#include <algorithm>
#include <cstddef>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <utility>

#include "../core/check.hpp"
#include "../core/checked_size.hpp"
#include "attn/error.hpp"
#include "json_text.hpp"

namespace attn::detail {
namespace {

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

// Bytes per element of the format's other dtypes: a file may hold them (a checkpoint's uint8
// buffers, ...); their entries are checked like any other, and only reading one is an error.
std::size_t unreadable_dtype_size(const std::string& s) {
    static const std::map<std::string, std::size_t> known = {{"U64", 8}, {"U32", 4}, {"I16", 2},     {"U16", 2},
                                                             {"I8", 1},  {"U8", 1},  {"F8_E4M3", 1}, {"F8_E5M2", 1}};
    const auto it = known.find(s);
    return it == known.end() ? 0 : it->second;
}

// The format nests three deep: the header object, a tensor's entry (or __metadata__), and the
// shape and data_offsets arrays. A deeper array or object is refused, so what is kept of a
// value below never holds more than that.
constexpr std::size_t kMaxDepth = 3;

// Bytes of a value's text kept for a message: detail::quoted() shows 80 and "..." when there is more.
constexpr std::size_t kTextKept = 160;

// The text nlohmann's dump() gives a value, rebuilt from the parser's events for messages
// ("data_offsets must be [begin, end] but got '[4]'"): arrays in order, objects with their
// keys sorted, cut after about kTextKept bytes.
class ValueText {
public:
    bool active() const { return active_; }
    void begin() {
        active_ = true;
        open_.clear();
    }
    // Each returns true when the value is complete (take() it).
    bool scalar(std::string text) { return add(std::move(text)); }
    void open(bool object) { open_.push_back({object, {}, {}}); }
    void key(std::string k) { open_.back().key = std::move(k); }
    bool close() {
        Container c = std::move(open_.back());
        open_.pop_back();
        if (c.object) std::sort(c.items.begin(), c.items.end());  // no key twice: that is refused first
        std::string t(1, c.object ? '{' : '[');
        for (const auto& [k, v] : c.items) {
            if (t.size() >= kTextKept) break;
            if (t.size() > 1) t += ',';
            if (c.object) {
                append_json_string(t, k, kTextKept);  // file text: the parser checked it is UTF-8
                t += ':';
            }
            t += v;
        }
        t += c.object ? '}' : ']';
        return add(std::move(t));
    }
    std::string take() {
        active_ = false;
        return std::move(text_);
    }

private:
    struct Container {
        bool object;
        std::vector<std::pair<std::string, std::string>> items;  // (key, text); arrays: no key
        std::string key;                                         // of the member being read
    };
    bool add(std::string t) {
        if (open_.empty()) {
            text_ = std::move(t);
            return true;
        }
        Container& c = open_.back();
        c.items.emplace_back(std::move(c.key), std::move(t));
        return false;
    }
    bool active_ = false;
    std::vector<Container> open_;  // at most kMaxDepth - 1
    std::string text_;
};

std::string json_string_text(std::string_view s) {
    std::string out;
    append_json_string(out, s, kTextKept);
    return out;
}

// An element of shape or data_offsets, as nlohmann reports numbers: a non-negative integer as
// unsigned, a negative one (and -0) as signed, anything else not an integer.
struct Integer {
    enum class Kind { non_negative, negative, other } kind = Kind::other;
    std::uint64_t value = 0;  // non_negative
    std::string text;         // its dump()
};

// One of an entry's dtype, shape, data_offsets.
struct Field {
    bool present = false;
    const char* type = "";       // a nlohmann type_name(): "string", "array", ...
    std::string text;            // the value's dump(), cut (ValueText)
    std::string string;          // type "string": the value
    std::size_t size = 0;        // type "array": its element count
    std::vector<Integer> items;  // type "array": the first kMaxRank + 1 elements (more is refused by count)
};

struct RawEntry {
    std::string name;
    const char* type = "";  // the entry's type_name(): "object" unless malformed
    bool has_unexpected = false;
    std::string unexpected;  // the first key (sorted) that is not dtype, shape or data_offsets
    Field dtype, shape, offsets;
};

struct RawMetadata {
    bool present = false, is_object = false;
    std::string text;                            // !is_object: the value's dump()
    std::map<std::string, std::string> strings;  // the string members
    std::map<std::string, std::string> others;   // the other members' dump()s
};

std::uint64_t non_negative(const Integer& v, const std::string& what, const std::string& field) {
    if (v.kind == Integer::Kind::negative) fail(what, field + " must be >= 0 but got " + v.text);
    if (v.kind == Integer::Kind::other) fail(what, field + " must be a non-negative integer but got " + detail::quoted(v.text));
    return v.value;
}

// nlohmann-json's SAX interface (nlohmann::json::sax_parse): every value reported in the
// order of the text, with each open array or object's role kept on a stack of at most kMaxDepth.
class HeaderReader {
public:
    explicit HeaderReader(const std::string& file) : file_(file) {}

    bool null() { return scalar("null", "null", {}); }
    bool boolean(bool v) { return scalar("boolean", v ? "true" : "false", {}); }
    bool number_integer(std::int64_t v) { return scalar("number", std::to_string(v), {Integer::Kind::negative, 0, {}}); }
    bool number_unsigned(std::uint64_t v) {
        return scalar("number", std::to_string(v), {Integer::Kind::non_negative, v, {}});
    }
    // A scalar nlohmann::json allocates nothing when destroyed; its dump() is the float's text.
    bool number_float(double v, const std::string&) { return scalar("number", nlohmann::json(v).dump(), {}); }
    bool string(std::string& v) { return scalar("string", json_string_text(v), {}, &v); }
    bool binary(nlohmann::json::binary_t&) { return scalar("binary", "<binary>", {}); }  // JSON text has none
    bool start_object(std::size_t) { return start(true); }
    bool start_array(std::size_t) { return start(false); }
    bool key(std::string& k);
    bool end_object() { return end(); }
    bool end_array() { return end(); }
    bool parse_error(std::size_t, const std::string&, const nlohmann::json::exception& e) {
        fail(file_, std::string("header is not valid JSON (") + e.what() + ")");
    }

    // The checks, after the whole text parsed.
    std::vector<SafetensorsEntry> entries(std::uint64_t data_size, std::map<std::string, std::string>& metadata);

private:
    enum class Role { header, metadata, entry, shape_or_offsets, other };
    struct Open {
        Role role;
        bool object;
        std::set<std::string> keys;  // object: the keys so far
        std::string key;             // object: of the member being read
        std::size_t count = 0;       // array: elements so far
    };

    bool scalar(const char* type, std::string text, Integer item, std::string* str = nullptr);
    bool start(bool object);
    bool end();
    // Where a new value goes: notes it in its parent, and returns the role an array or object
    // there has; sets capture_into_ when the value's text is wanted for a message.
    Role place(const char* type, std::string* str, Integer* item);
    void capture_done();
    void error_once(std::string msg) {
        if (first_error_.empty()) first_error_ = std::move(msg);
    }
    std::string path() const;

    const std::string& file_;
    std::vector<Open> open_;
    std::size_t deep_ = 0;    // arrays and objects open below kMaxDepth (refused, their contents skipped)
    std::string first_error_;  // a key given twice or too deep a value, whichever comes first in the text
    const char* top_type_ = "";
    std::vector<RawEntry> raw_;
    RawMetadata metadata_;
    Field* field_ = nullptr;  // the entry field whose value is being read
    ValueText capture_;
    std::string* capture_into_ = nullptr;
};

std::string HeaderReader::path() const {
    std::string p;
    for (const Open& o : open_) p += "[" + (o.object ? detail::quoted(o.key) : std::to_string(o.count - 1)) + "]";
    return p;
}

HeaderReader::Role HeaderReader::place(const char* type, std::string* str, Integer* item) {
    if (open_.empty()) {
        top_type_ = type;
        return Role::header;
    }
    Open& parent = open_.back();
    if (!parent.object) ++parent.count;
    switch (parent.role) {
        case Role::header:
            if (parent.key == "__metadata__") {
                metadata_.present = true;
                metadata_.is_object = std::string_view(type) == "object";
                if (!metadata_.is_object) capture_into_ = &metadata_.text;
                return Role::metadata;
            }
            raw_.push_back({});
            raw_.back().name = parent.key;
            raw_.back().type = type;
            return Role::entry;
        case Role::entry: {
            RawEntry& e = raw_.back();
            field_ = parent.key == "dtype" ? &e.dtype : parent.key == "shape" ? &e.shape : parent.key == "data_offsets" ? &e.offsets : nullptr;
            if (field_ == nullptr) {
                if (!e.has_unexpected || parent.key < e.unexpected) e.unexpected = parent.key;
                e.has_unexpected = true;
                return Role::other;
            }
            field_->present = true;
            field_->type = type;
            capture_into_ = &field_->text;
            if (str != nullptr) field_->string = std::move(*str);
            return field_ == &e.dtype ? Role::other : Role::shape_or_offsets;
        }
        case Role::metadata:
            if (str != nullptr) {
                metadata_.strings[parent.key] = std::move(*str);
            } else {
                capture_into_ = &metadata_.others[parent.key];
            }
            return Role::other;
        case Role::shape_or_offsets:
            if (item != nullptr && field_->items.size() <= static_cast<std::size_t>(kMaxRank)) field_->items.push_back(std::move(*item));
            return Role::other;
        case Role::other:
            return Role::other;
    }
    return Role::other;
}

void HeaderReader::capture_done() {
    *capture_into_ = capture_.take();
    capture_into_ = nullptr;
}

bool HeaderReader::scalar(const char* type, std::string text, Integer item, std::string* str) {
    if (deep_ > 0) return true;
    item.text = text;
    const bool capturing = capture_.active();
    place(type, str, &item);
    if (!capturing && capture_into_ != nullptr) capture_.begin();
    if (capture_.active() && capture_.scalar(std::move(text))) capture_done();
    return true;
}

bool HeaderReader::start(bool object) {
    if (deep_ > 0 || open_.size() == kMaxDepth) {
        if (deep_++ == 0) {
            // The path names the parent's member or element that holds this value.
            if (!open_.empty() && !open_.back().object) ++open_.back().count;
            error_once("header nests deeper than the format: " + path() + " is " + (object ? "an object" : "an array") +
                       " (the format has an object of tensors, each an object whose shape and data_offsets are arrays of integers)");
        }
        return true;
    }
    const bool capturing = capture_.active();
    const Role role = place(object ? "object" : "array", nullptr, nullptr);
    if (!capturing && capture_into_ != nullptr) capture_.begin();
    if (capture_.active()) capture_.open(object);
    // Only a real array is read element by element; an object in a shape's place is just text.
    const bool read_elements = role == Role::shape_or_offsets && !object;
    const bool own_role = object && (role == Role::header || role == Role::metadata || role == Role::entry);
    open_.push_back({read_elements || own_role ? role : Role::other, object, {}, {}, 0});
    return true;
}

bool HeaderReader::key(std::string& k) {
    if (deep_ > 0) return true;
    Open& o = open_.back();
    if (!o.keys.insert(k).second) error_once("header names " + detail::quoted(k) + " more than once");
    if (capture_.active()) capture_.key(k);
    o.key = std::move(k);
    return true;
}

bool HeaderReader::end() {
    if (deep_ > 0) {
        --deep_;
        return true;
    }
    const Open& o = open_.back();
    if (o.role == Role::shape_or_offsets) field_->size = o.count;
    open_.pop_back();
    if (capture_.active() && capture_.close()) capture_done();
    return true;
}

const Field& checked_present(const Field& f, const std::string& what, const char* name) {
    if (!f.present) fail(what, std::string("missing field '") + name + "'");
    return f;
}

SafetensorsEntry check_entry(const RawEntry& r, std::uint64_t data_size, const std::string& file) {
    const std::string what = file + ": tensor " + detail::quoted(r.name);
    if (r.name.empty()) fail(file, "a tensor has an empty name");
    if (std::string_view(r.type) != "object") fail(what, "entry must be a JSON object but got " + std::string(r.type));
    if (r.has_unexpected) fail(what, "unexpected field " + detail::quoted(r.unexpected) + " (expected dtype, shape, data_offsets)");
    const Field& dt = checked_present(r.dtype, what, "dtype");
    const Field& sh = checked_present(r.shape, what, "shape");
    const Field& off = checked_present(r.offsets, what, "data_offsets");
    SafetensorsEntry e;
    e.name = r.name;

    if (std::string_view(dt.type) != "string") fail(what, "dtype must be a string but got " + detail::quoted(dt.text));
    const std::string& ds = dt.string;
    std::size_t elem_size = 0;
    if (parse_dtype(ds, e.dtype)) {
        elem_size = dtype_size(e.dtype);
    } else if ((elem_size = unreadable_dtype_size(ds)) != 0) {
        e.unreadable = ds;
    } else {
        fail(what, "unknown dtype " + detail::quoted(ds) + " (expected " + kSafetensorsReadable + ")");
    }

    if (std::string_view(sh.type) != "array") fail(what, "shape must be an array but got " + detail::quoted(sh.text));
    if (sh.size > static_cast<std::size_t>(kMaxRank)) {
        fail(what, "rank " + std::to_string(sh.size) + " is not supported (at most " + std::to_string(kMaxRank) + ")");
    }
    // numel · itemsize, checked (it is compared with the offsets below); a zero-size shape
    // whose other dims overflow is refused too, its strides would.
    for (std::size_t i = 0; i < sh.size; ++i) {
        const std::uint64_t d = non_negative(sh.items[i], what, "shape[" + std::to_string(i) + "]");
        if (d > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
            fail(what, "shape[" + std::to_string(i) + "] = " + std::to_string(d) + " is too large");
        }
        e.shape.dims[i] = static_cast<std::int64_t>(d);
    }
    e.shape.rank = static_cast<int>(sh.size);
    const auto bytes = static_cast<std::uint64_t>(checked_bytes(what, "data", e.shape, elem_size));

    if (std::string_view(off.type) != "array" || off.size != 2) {
        fail(what, "data_offsets must be [begin, end] but got " + detail::quoted(off.text));
    }
    e.begin = non_negative(off.items[0], what, "data_offsets[0]");
    e.end = non_negative(off.items[1], what, "data_offsets[1]");
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

void check_metadata(RawMetadata& m, const std::string& file, std::map<std::string, std::string>& metadata) {
    if (!m.is_object) fail(file, "__metadata__ must be an object of strings but got " + detail::quoted(m.text));
    if (!m.others.empty()) {
        const auto& [k, text] = *m.others.begin();
        fail(file, "__metadata__[" + detail::quoted(k) + "] must be a string but got " + detail::quoted(text));
    }
    metadata = std::move(m.strings);
}

std::vector<SafetensorsEntry> HeaderReader::entries(std::uint64_t data_size, std::map<std::string, std::string>& metadata) {
    if (!first_error_.empty()) fail(file_, first_error_);
    if (std::string_view(top_type_) != "object") fail(file_, std::string("header must be a JSON object but is ") + top_type_);

    // In the order of the names, __metadata__ among them, as the checks ran on the document.
    std::sort(raw_.begin(), raw_.end(), [](const RawEntry& a, const RawEntry& b) { return a.name < b.name; });
    std::vector<SafetensorsEntry> entries;
    entries.reserve(raw_.size());
    bool metadata_checked = !metadata_.present;
    for (const RawEntry& r : raw_) {
        if (!metadata_checked && r.name > "__metadata__") {
            check_metadata(metadata_, file_, metadata);
            metadata_checked = true;
        }
        entries.push_back(check_entry(r, data_size, file_));
    }
    if (!metadata_checked) check_metadata(metadata_, file_, metadata);
    return entries;
}

}  // namespace

std::vector<SafetensorsEntry> parse_safetensors_header(std::string_view text, std::uint64_t data_size, const std::string& file,
                                                       std::map<std::string, std::string>& metadata) {
    // nlohmann stops at a NUL byte as at the end of input; the format allows none.
    if (const std::size_t z = text.find('\0'); z != std::string_view::npos) {
        fail(file, "header is not valid JSON (NUL byte at header offset " + std::to_string(z) + ")");
    }
    HeaderReader reader(file);
    // parse_error throws; every other event returns true, so false is not expected.
    if (!nlohmann::json::sax_parse(text.begin(), text.end(), &reader)) fail(file, "header is not valid JSON");
    std::vector<SafetensorsEntry> entries = reader.entries(data_size, metadata);

    // The data must be covered exactly: sorted by offset, each tensor starts where the
    // previous one ended (a gap is a hole, an earlier start an overlap), the last ends at the end.
    std::sort(entries.begin(), entries.end(), [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
        return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
    });
    std::uint64_t pos = 0;
    const SafetensorsEntry* prev = nullptr;
    for (const SafetensorsEntry& e : entries) {
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

}  // namespace attn::detail
