// libFuzzer target: the safetensors reader on any bytes, both entry points — from memory
// (parse_safetensors) and from a file (read_safetensors, through its fseeko/fread path).
// Either a SafetensorsFile or an attn::Error; the two must agree. A file that reads must
// round-trip: write_safetensors then read_safetensors give every tensor back with its shape —
// floats converted to float32, integers and bool bit for bit — and the same metadata.
#include <cstdint>
#include <cstring>
#include <optional>

#include "attn/error.hpp"
#include "attn/safetensors.hpp"
#include "scratch.hpp"

using attn_fuzz::finding;

namespace {

std::optional<attn::SafetensorsFile> try_read(const auto& read) {
    try {
        return read();
    } catch (const attn::Error&) {
        return std::nullopt;
    }
}

bool same_bytes(const attn::Tensor& a, const attn::Tensor& b) {
    return a.dtype() == b.dtype() && a.shape() == b.shape() &&
           (a.nbytes() == 0 || std::memcmp(a.data(), b.data(), a.nbytes()) == 0);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    static attn_fuzz::MemFile file("attn-fuzz.safetensors");
    static const std::string copy = attn_fuzz::scratch_dir() + "/roundtrip.safetensors";
    const auto mem = try_read([&] { return attn::parse_safetensors(data, size, "fuzz input"); });
    file.set(data, size);
    const auto disk = try_read([&] { return attn::read_safetensors(file.path()); });
    if (mem.has_value() != disk.has_value()) {
        finding(std::string("parse_safetensors ") + (mem ? "accepted" : "refused") + " what read_safetensors " +
                (disk ? "accepted" : "refused"));
    }
    if (!mem) return 0;
    std::size_t total = 0;
    std::vector<std::pair<std::string, attn::TensorView>> views;
    for (std::size_t i = 0; i < mem->tensors.size(); ++i) {
        const auto& [name, t] = mem->tensors[i];
        total += t.nbytes();
        if (disk->tensors[i].first != name || !same_bytes(disk->tensors[i].second, t)) {
            finding("parse_safetensors and read_safetensors differ at tensor '" + name + "'");
        }
        if (mem->find(name) != &t) finding("find('" + name + "') does not return the tensor of that name");
        views.emplace_back(name, t.view());
    }
    if (total > size) finding("the tensors hold " + std::to_string(total) + " bytes, more than the file's " + std::to_string(size));
    if (mem->metadata != disk->metadata) finding("parse_safetensors and read_safetensors differ in metadata");

    attn::write_safetensors(copy, views, mem->metadata);  // what was read must be writable
    const attn::SafetensorsFile back = attn::read_safetensors(copy);
    if (back.tensors.size() != mem->tensors.size() || back.metadata != mem->metadata) {
        finding("write_safetensors/read_safetensors round trip changed the tensor list or the metadata");
    }
    for (const auto& [name, t] : mem->tensors) {
        const attn::Tensor* b = back.find(name);
        // Floats are written as F32; I64, I32 and BOOL as they are.
        const bool same = b != nullptr && (attn::is_floating(t.dtype()) ? same_bytes(*b, attn::to_dtype(t.view(), attn::DType::f32))
                                                                         : same_bytes(*b, t));
        if (!same) {
            finding("write_safetensors/read_safetensors round trip changed tensor '" + name + "'");
        }
    }
    return 0;
}
