// Writing a .npy into an output that is already open, so that several outputs can be
// written completely before any of them is published (the CLI's all-or-nothing outputs).
#pragma once

#include "atomic_file.hpp"
#include "attn/tensor.hpp"

namespace attn::detail {

void write_npy_into(AtomicFile& out, const TensorView& t);  // header + data; no finish/publish

}  // namespace attn::detail
