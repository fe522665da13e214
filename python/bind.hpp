// The parts of the `attn` module, registered by module.cpp (one file per concept).
#pragma once

#include <pybind11/pybind11.h>

namespace attn_py {

void bind_sdpa(pybind11::module_& m);      // sdpa.cpp: scaled_dot_product_attention (+ backward)
void bind_mha(pybind11::module_& m);       // mha.cpp: MultiheadAttention
void bind_kv_cache(pybind11::module_& m);  // kv_cache.cpp: KVCache, decode_attention

}  // namespace attn_py
