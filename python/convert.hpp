// NumPy ↔ attn::TensorView, written once for every binding of the `attn` module.
//
// Zero-copy: an input array becomes an attn::TensorView over its own buffer — numpy's byte
// strides divided by the item size, negative and zero strides included — so transposed views
// and slices are read in place. The one case that copies is a stride that is not a multiple
// of the item size (e.g. a field of a structured array): that input is copied once to a
// contiguous array and the copy is counted (input_copies(), attn._input_copies() in Python;
// tests use it to check that no copy happens where none is promised).
// Outputs are fresh NumPy arrays (owning their memory) that the kernels write directly.
// The arrays are held by the caller for the whole call, so every view built from them stays
// valid; the GIL is released only around the C++ computation.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "attn/error.hpp"
#include "attn/tensor.hpp"

namespace attn_py {

namespace py = pybind11;

// A Python-side argument error that must surface as TypeError (module.cpp's translator);
// any other attn::Error is a ValueError unless its message is about a dtype.
struct PyTypeError : attn::Error {
    using attn::Error::Error;
};

[[noreturn]] void type_error(const std::string& msg);
[[noreturn]] void value_error(const std::string& msg);

// "(2, 3)" / "(8,)": a shape as numpy prints it, for messages.
std::string shape_str(const py::array& a);

// Anything array-like → a NumPy array, without copying one that already is (np.asarray).
// `name` is the Python argument, for the TypeError when that is impossible — e.g. a torch
// tensor with requires_grad=True (attn has no autograd yet: pass .detach()).
py::array as_array(const py::handle& obj, const std::string& name);

// A view of `a` with its own rank, which must lie in [min_rank, max_rank] (`layout` names the
// dims for the error). A stride that is not a multiple of the item size replaces `a` by a
// contiguous copy (counted).
attn::TensorView view_of(py::array& a, const std::string& name, int min_rank, int max_rank, const char* layout);

// One array argument: the array, which keeps the memory alive for the call, and its view.
struct Input {
    py::array array;
    attn::TensorView view;
};
Input input(const py::handle& obj, const std::string& name, int min_rank, int max_rank, const char* layout);

// `t` seen with `rank` dims by adding leading size-1 (stride-0) dims: (L, D) → (1, 1, L, D).
attn::TensorView expand_rank(const attn::TensorView& t, int rank);

// A new C-contiguous float64 array when dt is f64, else float32.
py::array new_array(attn::DType dt, const std::vector<py::ssize_t>& dims);

// A fresh output array's view, expanded to `rank` dims.
attn::TensorView output_view(py::array& a, int rank);

// t's dims from `first` on, as array dims.
std::vector<py::ssize_t> dims_of(const attn::TensorView& t, int first = 0);

// A Python int or numpy integer scalar (not a bool, not an array) as int64; nullopt for
// anything else.
// `name` is for the error when it does not fit in int64.
std::optional<std::int64_t> int_of(const py::handle& obj, const std::string& name);

// How many inputs have been copied (strides not a multiple of the item size).
std::int64_t input_copies();

}  // namespace attn_py
