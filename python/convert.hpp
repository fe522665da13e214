// NumPy ↔ attn::TensorView, written once for every binding of the `attn` module.
//
// Zero-copy: an input array becomes an attn::TensorView over its own buffer — numpy's byte
// strides divided by the item size, negative and zero strides included — so transposed views,
// slices, broadcasts and read-only arrays are read in place. An array the kernels cannot read
// as native typed elements is copied once to a native-order, aligned, C-contiguous array, and
// the copy is counted (input_copies(), attn._input_copies() in Python; tests use it to check
// that no copy happens where none is promised). That is the one rule for every array argument:
//   - a non-native byte order ('>f4', '>i8', ...) is read correctly: the copy is byte-swapped;
//   - a data pointer or stride not aligned to the element (np.frombuffer at offset 1) and a
//     stride that is not a multiple of the item size (a field of a structured array) are copied.
// Outputs are fresh NumPy arrays (owning their memory) that the kernels write directly.
// The arrays are held by the caller for the whole call, so every view built from them stays
// valid; the GIL is released only around the C++ computation.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "array_layout.hpp"  // layout_of, expand_rank
#include "attn/error.hpp"
#include "attn/tensor.hpp"

namespace attn_py {

namespace py = pybind11;

// An argument of a type (or dtype) the binding does not take, raised by the binding in Python's
// words: ErrorKind::type (TypeError, module.cpp's translator), and never renamed
// (with_python_names, options.hpp). An attn::Error is a TypeError or a ValueError by its kind,
// given where it is raised (attn/error.hpp).
struct PyTypeError : attn::Error {
    explicit PyTypeError(const std::string& message) : attn::Error(message, attn::ErrorKind::type) {}
};

[[noreturn]] void type_error(const std::string& msg);
[[noreturn]] void value_error(const std::string& msg);

// "str 'x'", "ndarray array(2)": what was given (its type and repr, a long repr cut), for messages.
std::string given(const py::handle& obj);

// "(2, 3)" / "(8,)": a shape as numpy prints it, for messages.
std::string shape_str(const py::array& a);

// Anything array-like → a NumPy array, without copying one that already is (np.asarray).
// `name` is the Python argument, for the TypeError when that is impossible — e.g. a torch
// tensor with requires_grad=True (no autograd here: pass .detach(), or use attn.torch).
py::array as_array(const py::handle& obj, const std::string& name);

// A view of `a` with its own rank, which must lie in [min_rank, max_rank] (`layout` names the
// dims for the error). The rules are layout_of's (array_layout.hpp): an array the kernels
// cannot read in place replaces `a` by a native, aligned, C-contiguous copy (counted).
// uint16_is_bf16: a uint16 array holds bfloat16 bits (the dtype="bfloat16" keyword).
attn::TensorView view_of(py::array& a, const std::string& name, int min_rank, int max_rank, const char* layout,
                         bool uint16_is_bf16 = false);

// One array argument: the array, which keeps the memory alive for the call, and its view.
struct Input {
    py::array array;
    attn::TensorView view;
};
Input input(const py::handle& obj, const std::string& name, int min_rank, int max_rank, const char* layout,
            bool uint16_is_bf16 = false);

// A dict of name -> array (a state_dict) as named views of rank <= 4, in the dict's order; `keep`
// holds the arrays. Errors name `what` and the key: "state_dict['w']: …". A torch.bfloat16
// tensor (no NumPy form: a bfloat16 model's state_dict) is read as its bits, that entry alone;
// uint16 arrays still need uint16_is_bf16 (the call's dtype="bfloat16").
std::vector<std::pair<std::string, attn::TensorView>> named_inputs(const py::dict& d, const std::string& what,
                                                                   std::vector<Input>& keep, bool uint16_is_bf16);

// A storage dtype given as a str ("float32", "float16", "bfloat16"), a NumPy dtype or type
// (np.float16) or a torch dtype (torch.bfloat16); nullopt for anything else (the caller's
// TypeError names the argument and what it stores).
std::optional<attn::DType> storage_dtype_arg(const py::handle& dtype);
// A cache's dtype= (KVCache, PagedKVCache): storage_dtype_arg's, else a TypeError.
attn::DType cache_storage_arg(const py::handle& dtype);

// A file path: a str or an os.PathLike (pathlib.Path); anything else is a TypeError naming `name`.
std::string path_arg_of(const py::handle& obj, const std::string& name);

// A new C-contiguous array of dtype dt: float64, float32, float16, or for bfloat16 a uint16
// array holding the bits (NumPy has no bfloat16). `what` names it for the MemoryError when numpy
// cannot allocate it ("out of memory allocating the weights (B, H, Lq, Lk): Unable to allocate
// 64.0 GiB for an array with shape …"); the package's wrapper (_concise_errors.py) adds the call.
py::array new_array(attn::DType dt, const std::vector<py::ssize_t>& dims, const char* what);

// A fresh output array's view (a uint16 one is bfloat16), expanded to `rank` dims.
attn::TensorView output_view(py::array& a, int rank);

// dtype= (how to read uint16 inputs): None → false (uint16 refused), "bfloat16" → true.
bool uint16_is_bf16_arg(const py::handle& obj);
// out_dtype= (or the keyword `name`): None → `fallback`; "float32", "float16", "bfloat16" (or
// numpy's dtype or type) → that dtype; "float64" only `with_float64` — the calls whose C++ writes
// a float64 output (sdpa, sdpa_varlen, their backwards, decode_attention, paged_attention: a
// float32 kernel's result widened exactly, the reference's double one kept), as the CLI's
// --out-dtype (docs/conventions.md, "The CLI's output dtype"). The others (the ring, the MHA
// layer, intermediate_dtype) compute in float32 and refuse it, saying so.
attn::DType out_dtype_arg(const py::handle& obj, attn::DType fallback, const char* name = "out_dtype",
                          bool with_float64 = false);
// The same without a fallback: None → nullopt (for a caller whose default differs per output).
std::optional<attn::DType> given_out_dtype_arg(const py::handle& obj, const char* name = "out_dtype",
                                               bool with_float64 = false);
// The default out dtype of the serving calls (decode_attention, paged_attention) and the ring: a
// 16-bit query's own dtype, else float32 (their outputs were float32 before 16-bit queries
// existed); the ring's backward gives each gradient this of its own input's dtype.
attn::DType sixteen_bit_or_f32(attn::DType q);
// Outputs that stay float (lse, weights, scores, dsinks): float64 for float64 q, else float32.
attn::DType stat_dtype(attn::DType q);

// t's dims from `first` on, as array dims.
std::vector<py::ssize_t> dims_of(const attn::TensorView& t, int first = 0);

// A Python int or numpy integer scalar (not a bool, not an array) as int64; nullopt for
// anything else.
// `name` is for the error when it does not fit in int64.
std::optional<std::int64_t> int_of(const py::handle& obj, const std::string& name);

// How many inputs have been copied (byte order, alignment or strides the kernels cannot read).
std::int64_t input_copies();

// Scalar arguments, converted here rather than by pybind11's casters so that a wrong type is
// a TypeError naming the argument and what was given, and a value out of range a ValueError
// (pybind11's own failure prints the whole signature with every array's repr, and .cast<>()
// says only "Unable to cast Python instance to C++ type"). Bindings take such arguments as
// py::object and convert them with these.
std::int64_t int_arg(const py::handle& obj, const std::string& name);                  // int, numpy integer
std::optional<std::int64_t> optional_int_arg(const py::handle& obj, const std::string& name);  // or None
std::uint64_t uint_arg(const py::handle& obj, const std::string& name);                // int in [0, 2**64)
// uint_arg's range in messages: its own ValueError, and the seed's hint in dropout_seed_arg.
inline constexpr std::string_view kUint64Range = "an int in [0, 2**64)";
// threads=: None or 0 → 0 (no count of the call's own: attn's setting, include/attn/threads.hpp),
// else an int from 1 to 4096; `none_means` says in the error what None (and 0) would choose.
int threads_arg(const py::handle& obj, const char* none_means = "attn.get_num_threads()");
double float_arg(const py::handle& obj, const std::string& name);                      // float, int, numpy number
std::optional<double> optional_float_arg(const py::handle& obj, const std::string& name);      // or None
bool bool_arg(const py::handle& obj, const std::string& name);                         // bool, numpy.bool_
std::string str_arg(const py::handle& obj, const std::string& name);

}  // namespace attn_py
