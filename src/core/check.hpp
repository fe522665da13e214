// The one place for argument checks and internal invariants (docs/conventions.md, "Errors").
//
// User input: every entry point checks each argument before it writes anything and throws
// attn::Error through fail(), whose message is "<op>: <argument>: <expectation> but got <what>"
// — op is the public function or class name (sdpa, sdpa_backward, decode_attention,
// KVCache, MultiHeadAttention, ring_attention, ...), so a user can find the call at fault:
//     fail("sdpa", "K: head dim ", k.dim(3), " does not match Q's head dim ", q.dim(3));
// The require_* helpers are the checks that several entry points share.
//
// Internal invariants (a kernel's precondition that validation already guarantees) are
// ATTN_DASSERT: checked in debug builds, free in release builds — never for user input.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "attn/error.hpp"
#include "attn/tensor.hpp"

namespace attn {
// Shapes stream as "(2, 8, 512, 64)" in messages (found by ADL from fail below).
inline std::ostream& operator<<(std::ostream& s, const Shape& shape) { return s << shape.str(); }
}  // namespace attn

namespace attn::detail {

// "op: " followed by the parts, streamed (numbers, strings, Shape via str()), as an Error of `kind`.
template <class... Parts>
[[noreturn]] void fail_as(ErrorKind kind, std::string_view op, const Parts&... parts) {
    std::ostringstream s;
    s << op << ": ";
    (s << ... << parts);
    throw Error(s.str(), kind);
}

// A value the argument does not take (ErrorKind::value).
template <class... Parts>
[[noreturn]] void fail(std::string_view op, const Parts&... parts) {
    fail_as(ErrorKind::value, op, parts...);
}

// A dtype (or type) the argument does not take (ErrorKind::type: Python's TypeError):
//     fail_type("sdpa", "bool_mask: dtype must be bool (true = may attend) but got ", "int32");
template <class... Parts>
[[noreturn]] void fail_type(std::string_view op, const Parts&... parts) {
    fail_as(ErrorKind::type, op, parts...);
}

// "(1, 1, 1)": a view's strides (in elements), for messages.
std::string strides_text(const TensorView& t);

// A double in its shortest exact decimal form ("1", "0.3", "3.4028236e+38"), for messages: six
// digits would print a value just outside a bound as the bound itself.
std::string shortest(double value);

// The one way a message shows text it did not write — a path, text read from a file (a .npy
// header's descr or keys, a safetensors name or dtype), a value given on the command line — in
// single quotes (docs/errors.md, "Quoting"): control bytes (NUL, newline, escape sequences; C1
// controls) and bytes that are not well-formed UTF-8 become \xNN, the quote and the backslash
// \' and \\, so a hostile name cannot break the one-line message, end the quotes early, cut it at
// a NUL, colour the terminal or make the message invalid UTF-8 (which Python shows as an empty
// message), and every quoted text reads back as exactly one byte string. Text past `max_bytes` is
// cut with "..." at a character boundary: file text at 80; a path is shown whole (quoted_path).
inline constexpr std::size_t kQuotedMaxBytes = 80;
std::string quoted(std::string_view text, std::size_t max_bytes = kQuotedMaxBytes);
// A path in a message, whole (the user must be able to tell which file): quoted()'s rule, uncut.
std::string quoted_path(std::string_view path);

// "it holds 3: 'a', 'b', 'c'" for a message about a name that is not there: the count and the
// names, quoted (file text), cut with ", …" past about 200 characters; "it holds no tensors".
std::string names_held(const std::vector<std::string>& names);

// Whether a null data pointer is refused outright, or only when the tensor has elements
// (require_data: an empty one is never read), so that an empty tensor's rank is checked whatever
// its pointer.
enum class NullData { refused, allowed_if_empty };

// t is non-null (or empty, with NullData::allowed_if_empty) and has `rank` dimensions; `layout`
// names them, e.g. "(B, Hq, Lq, Dk)".
void require_rank(std::string_view op, const TensorView& t, std::string_view name, int rank, std::string_view layout,
                  NullData null_data = NullData::refused);

// t has exactly `expected`.
void require_shape(std::string_view op, const TensorView& t, std::string_view name, const Shape& expected,
                   std::string_view layout);

// No element: a dim is 0. Such a tensor is never read, so its data pointer may be null (numel()
// would throw for a broadcast view of more than 2^63 elements, which is not empty and which a
// check must describe by its own rule).
bool is_empty(const TensorView& t);

// t holds its elements: a null data pointer is refused unless t is empty (never read: an empty
// tensor's pointer may be null, torch's often is), "op: name: data pointer is null but its shape
// (2, 1, 3) has elements". A default TensorView, or a default Tensor (MhaOutput::weights without
// need_weights), has rank 0 — one element — and no data: the message says so.
void require_data(std::string_view op, const TensorView& t, std::string_view name);
// Its rule and wording without the throw, for a check that collects every problem before it
// reports them (MultiHeadAttention::load_state_dict): "data pointer is null but its shape
// (2, 1, 3) has elements", or "" when t holds its elements.
std::string missing_data(const TensorView& t);

// t's data pointer is a multiple of its element size. The kernels read and write elements
// through typed pointers (and compilers vectorise loops on that assumption): a misaligned one
// is undefined behaviour, so it is an error here, not a crash or a wrong answer later (the
// Python module copies a misaligned array first). require_floating and require_f32_or_f64
// include it; every other tensor read as floats calls it.
void require_element_aligned(std::string_view op, const TensorView& t, std::string_view name);

// t's dtype is float32 or float64 (what outputs and compute-precision inputs may be).
void require_f32_or_f64(std::string_view op, const TensorView& t, std::string_view name);

// t's dtype is float32, float64, float16 or bfloat16 (attention's inputs, out and gradients).
void require_floating(std::string_view op, const TensorView& t, std::string_view name);

// A gradient (or grad_out): non-null, floating (a 16-bit gradient is the float32 result
// rounded once) and of the shape `expected` of the tensor `like` names.
void require_gradient_like(std::string_view op, const TensorView& t, std::string_view name, const Shape& expected,
                           std::string_view like);

// An output needs its own memory for every element: a stride-0 (broadcast) dimension of
// size > 1, or strides that overlap ((2, 4, 3) with strides (1, 1, 1)), would make several
// results land on one address.
void require_distinct_elements(std::string_view op, const TensorView& t, std::string_view name);

// A call's out and lse: written (a forward: outputs, under the rule above, and apart from the
// inputs) or read (a backward: inputs like q, so broadcast views and shared memory are fine;
// the gradients it writes are kept apart from them: require_gradient_outputs).
enum class OutLse { written, read };

// a and b may share a byte: their address ranges intersect, and they are not rows that
// interleave without meeting (Q = buf[..., :D], out = buf[..., D:]). Conservative for other
// strided layouts; an empty view touches nothing.
bool share_memory(const TensorView& a, const TensorView& b);

// An output must not share memory with a tensor the kernel still reads.
void require_disjoint(std::string_view op, const TensorView& out, std::string_view out_name, const TensorView& other,
                      std::string_view other_name);

// An enum argument within its `count` values: one cast from a wrong integer would run some
// default branch of a switch (Impl(77) ran the reference, Causal(9) bottom-right). `names`
// lists the values for the message ("Impl::automatic, reference, flash, decode").
template <class Enum>
void require_enum(std::string_view op, std::string_view name, Enum value, int count, std::string_view names) {
    const int v = static_cast<int>(value);
    if (v < 0 || v >= count) fail(op, name, ": must be one of ", names, " but got the value ", v);
}

// The names dropout's two arguments have in the caller's messages: the library's fields, or the
// CLI's options (--dropout, --seed) and Python's keywords (dropout), so that one rule has one
// wording with whatever the user typed in it (the seed's message names both: a rename of the
// argument before it, flag_names.hpp's, would leave "dropout_p" in the CLI's text). seed_value
// is how the caller writes a seed, the hint after "needs a seed": a C++ field takes any 64-bit
// value, a Python keyword an int in a range, a CLI option a number after the flag.
struct DropoutNames {
    std::string_view p = "dropout_p";
    std::string_view seed = "dropout_seed";
    std::string_view seed_value = "dropout_seed = N, any std::uint64_t";
};

// Dropout's two arguments, for every entry point that takes them (sdpa and its backward,
// varlen, ring, the MHA's training calls, the CLI): 0 <= p < 1, and a seed when p > 0 — attn
// has no global generator, and a default seed would drop the same weights on every training
// step (docs/conventions.md, "Dropout"):
// "op: dropout_seed: dropout_p = P needs a seed (dropout_seed = N, any std::uint64_t): the keep
// mask is a function of it, …".
void require_dropout(std::string_view op, double p, const std::optional<std::uint64_t>& seed,
                     const DropoutNames& names = {});
// Its first half, the one rule for a dropout probability: 0 <= p < 1, else
// "op: dropout_p: must be in [0, 1) but got P" (`name` for dropout_p). The CLI checks its option
// with it before it looks at the seed or reads a file; Python's MultiheadAttention its `dropout`.
void require_dropout_p(std::string_view op, double p, std::string_view name = "dropout_p");

// An optional tensor argument as the pointer the checks take: null when not given.
inline const TensorView* view_or_null(const std::optional<TensorView>& t) { return t ? &*t : nullptr; }

// A tensor and the name its messages use.
struct Named {
    const TensorView* t;
    const char* name;
};

// Outputs a kernel writes while it still reads the inputs: no output shares memory with an
// input or with another output (require_disjoint). A null `t` is passed over (an output or
// option not given).
void require_apart(std::string_view op, const std::vector<Named>& inputs, const std::vector<Named>& outputs);

// What every backward entry point writes (sdpa_backward, sdpa_varlen_backward,
// ring_attention_backward): each gradient has its own memory per element and shares none with
// an input or another gradient. dsinks, when given, is (Hq,) float32/float64, needs `sinks`
// (null without) and shares memory with none of them. Empty tensors have nothing to overlap.
void require_gradient_outputs(std::string_view op, const std::vector<Named>& inputs,
                              const std::vector<Named>& gradients, const TensorView* dsinks,
                              const TensorView* sinks, std::int64_t Hq);

// Q (rank 4, already checked) against a KV cache's shape: the same head dim, and heads a
// multiple of the cache's kv_heads. Named as the cache's: the caller passed no K.
void require_query_fits_cache(std::string_view op, const TensorView& q, std::int64_t kv_heads, std::int64_t head_dim);

// A (B,) int32/int64 vector (key_lengths, query_offset); returns it. `count` names B in the
// message as the caller's documentation does: packed sequences are N, not a batch.
TensorView require_per_sequence(std::string_view op, const TensorView& t, std::string_view name, std::int64_t B,
                                std::string_view count = "B");

// An int32/int64 element, exactly (a double would round values above 2^53).
std::int64_t load_int(const TensorView& t, std::int64_t offset);

}  // namespace attn::detail

#ifdef NDEBUG
#define ATTN_DASSERT(cond) ((void)0)
#else
#define ATTN_DASSERT(cond)                                                                          \
    ((cond) ? (void)0                                                                               \
            : (std::fprintf(stderr, "%s:%d: internal invariant failed: %s\n", __FILE__, __LINE__, #cond), \
               std::abort()))
#endif
