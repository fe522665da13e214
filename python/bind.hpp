// The parts of the `attn` module, registered by module.cpp (one file per concept).
#pragma once

#include <pybind11/pybind11.h>

#include <mutex>

#include "attn/kv_cache.hpp"

namespace attn_py {

void bind_sdpa(pybind11::module_& m);      // sdpa.cpp: scaled_dot_product_attention (+ backward)
void bind_mha(pybind11::module_& m);       // mha.cpp: MultiheadAttention
void bind_kv_cache(pybind11::module_& m);  // kv_cache.cpp: KVCache, decode_attention
void bind_threads(pybind11::module_& m);   // threads.cpp: _ScopedThreads
void bind_varlen(pybind11::module_& m);    // varlen.cpp: sdpa_varlen (+ backward), packed sequences
void bind_paged_kv_cache(pybind11::module_& m);  // paged_kv_cache.cpp: PagedKVCache, paged_attention
void bind_safetensors(pybind11::module_& m);  // safetensors.cpp: save_safetensors
void bind_dist(pybind11::module_& m);      // dist.cpp: attn.dist (ring attention, MPI builds only)

// kv_cache.cpp: the attn::KVCache inside a Python attn.KVCache (TypeError naming `name` for
// any other object) and, in `mutex`, the lock of its one-operation-at-a-time rule. Take it with
// the GIL released and let it go before the GIL is taken back: the KVCache methods wait for it
// holding the GIL, so a thread that holds it and waits for the GIL deadlocks with them.
attn::KVCache& kv_cache_of(const pybind11::handle& obj, const char* name, std::mutex*& mutex);

}  // namespace attn_py
