// JSON strings as nlohmann-json's dump() writes them, for the safetensors header: written by
// hand so that neither writing a header nor quoting a value of one in a message needs a JSON
// document in memory (nlohmann's value destructor allocates, and an allocation failure there
// is std::terminate).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace attn::detail {

// Appends `text` in double quotes with \" \\ \b \f \n \r \t and \u00xx (lowercase hex) for the
// other controls; every other character as it is (non-ASCII too). Stops, without the closing
// quote, once `out` holds `limit` bytes or more (a cut copy, for messages). Returns false —
// with `out` cut anywhere — when `text` is not well-formed UTF-8, which JSON text must be.
bool append_json_string(std::string& out, std::string_view text, std::size_t limit = std::string::npos);

}  // namespace attn::detail
