// NumPy .npy files: float32, float64, float16, bool, int32, int64; C order, or Fortran order
// (np.save of a transposed array: read into C order, one copy); format versions 1.0, 2.0 (and
// 3.0, whose only change is a UTF-8 header).
//
// Files are never trusted: the header is parsed strictly, and its shape is checked
// against the bytes the file really holds before anything is allocated. Every error
// is an attn::Error that starts with the file name.
#pragma once

#include <string>

#include "attn/error.hpp"
#include "attn/tensor.hpp"

namespace attn {

// Whether a .npy file holds `dtype`: every attn dtype but bfloat16, which NumPy does not have
// (write_npy refuses it; the CLI's hints list what a .npy output can be given from this).
constexpr bool npy_holds(DType dtype) { return dtype != DType::bf16; }

// Reads a regular file only: a FIFO, a device or a directory is refused before it is read.
Tensor read_npy(const std::string& path);

// Writes any view (strided or not) in C order. A regular file appears complete or not at
// all: the data goes to a temporary file in the same directory that is then renamed. A
// character device or FIFO (/dev/null, a named pipe) is written into, never replaced.
// (docs/conventions.md, "Files".)
void write_npy(const std::string& path, const TensorView& tensor);

}  // namespace attn
