// Python keyword arguments → attn::SdpaOptions, shared by scaled_dot_product_attention, its
// backward and decode_attention so that each keyword means the same everywhere:
//   is_causal + causal_alignment   "top-left" (torch's is_causal) or "bottom-right"
//   window=(left, right)           keys d−left .. d+right around the diagonal d; −1 or None =
//                                  unbounded on that side; window=None = no window
//   window_alignment               where the window's diagonal sits, like causal_alignment
//   query_offset                   an int, or a (B,) int32/int64 array: d_b(i) = i + offset_b
//                                  for causal and window alike (include/attn/sdpa.hpp)
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "attn/error.hpp"
#include "attn/sdpa.hpp"
#include "convert.hpp"

namespace attn_py {

namespace py = pybind11;

// The masking keywords every attention call takes, as given (converted by set_alignment, so
// that a wrong type is a TypeError naming the keyword: convert.hpp's scalar arguments).
struct AlignmentArgs {
    py::object is_causal;
    py::object causal_alignment;
    py::object window;
    py::object window_alignment;
    py::object query_offset;
    const char* sequences = "B";  // what query_offset's messages call the count: packed calls' is "N"
};

// The keywords of scaled_dot_product_attention and its backward, as given.
struct SdpaArgs {
    py::object attn_mask;
    py::object dropout_p;
    py::object scale;
    py::object key_lengths;
    AlignmentArgs alignment;
    py::object dropout_seed;
    py::object impl;
    bool uint16_is_bf16 = false;  // the call's dtype="bfloat16": a uint16 attn_mask holds bfloat16 bits
    py::object dropout_origin = py::none();  // (batch, head, row, key); only sdpa and its backward take it
    int query_rank = 4;  // the query's rank (2 to 4): attn_mask may not have more (set_mask)
};

// Options whose views point into arrays held here, alive as long as this object.
struct CallOptions {
    attn::SdpaOptions sdpa;
    py::array mask, key_lengths, query_offset, alibi_slopes, sinks;
};

// The score modifiers, as given: softcap (float, 0/None = off), alibi_slopes ((Hq,) or
// (B, Hq) float32 array, or True for attn.alibi_slopes(Hq)), sinks ((Hq,) float32 array); another
// floating dtype (a list) is rounded to float32 once, as MultiheadAttention's slopes are.
struct ModifierArgs {
    py::object softcap;
    py::object alibi_slopes;
    py::object sinks;
};

// Sets softcap, alibi_slopes and sinks of `out` (arrays kept in `out`); `heads` = Hq, for
// alibi_slopes=True; `sequences` names the count of per-sequence slopes in messages, (Hq,) or
// (B, Hq) — packed calls' is "N", as AlignmentArgs::sequences.
void set_modifiers(const ModifierArgs& args, std::int64_t heads, CallOptions& out, const char* sequences = "B");

// is_causal (a bool) and causal_alignment ("top-left", torch's is_causal, or "bottom-right") as
// one attn::Causal: every call with a causal mask reads the pair here.
attn::Causal causal_arg(const py::object& is_causal, const py::object& causal_alignment);

// Sets causal, window and query_offset of `out` (arrays kept in `out`).
void set_alignment(const AlignmentArgs& args, CallOptions& out);

// Sets bool_mask (a bool attn_mask: True = may attend) or additive_mask (a float one) of `out`;
// None sets neither. uint16_is_bf16: the call's dtype="bfloat16" (a uint16 mask holds its bits).
// query_rank: a mask of higher rank is refused — it would broadcast the result past the query's
// shape, which the result keeps (torch's sdpa refuses it too: its scores take the mask in place).
void set_mask(const py::object& attn_mask, bool uint16_is_bf16, CallOptions& out, int query_rank = 4);

// The keywords of the library's call `op` ("sdpa", "sdpa_backward", …: its errors name it).
CallOptions make_options(std::string_view op, const SdpaArgs& args);
// make_options, then set_modifiers(modifiers, heads): every call with the sdpa keywords.
CallOptions make_options(std::string_view op, const SdpaArgs& args, const ModifierArgs& modifiers, std::int64_t heads);

// dropout_seed= as given, for the library's call `op` with dropout_p = p: None (nullopt) or an int
// in [0, 2**64). p and the seed are checked here, before any output is allocated, by the library's
// rule in its words with Python's spelling of a seed (detail::require_dropout, as the CLI does with
// its options): "sdpa: dropout_seed: dropout_p = 0.5 needs a seed (dropout_seed=N, an int in
// [0, 2**64)): …" — attn has no global generator, and a default seed would apply the same keep
// mask at every training step without a word.
std::optional<std::uint64_t> dropout_seed_arg(const py::object& seed, double p, std::string_view op);

// dropout_origin= as given: None (the call is the whole problem) or (batch, head, row, key), four
// ints — SdpaOptions::dropout_origin, whose range attn::sdpa checks, naming the field.
attn::DropoutOrigin dropout_origin_arg(const py::object& origin);

// Runs a core call; an attn::Error from it names the core's bool_mask / additive_mask as the
// Python keyword they came from, attn_mask, and each core argument of `renames` (pairs "core",
// "python") as the binding's name for it (a message names the argument the caller gave).
using Renames = std::initializer_list<std::pair<const char*, const char*>>;
std::string python_names(const std::string& message, Renames renames = {});
template <class F>
void with_python_names(F&& call, Renames renames = {}) {
    try {
        call();
    } catch (const PyTypeError&) {
        throw;
    } catch (const attn::Error& e) {
        throw attn::Error(python_names(e.what(), renames), e.kind());
    }
}

}  // namespace attn_py
