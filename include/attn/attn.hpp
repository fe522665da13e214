// attn — the whole public API in one include (link attn::attn).
//
// Entry points (each header says the shapes, options and errors of its functions):
//
//   function / class                    computes                                              header
//   ----------------------------------  ----------------------------------------------------  -----------------------
//   sdpa                                O = softmax(Q·Kᵀ·scale + masks)·V, optional lse and     attn/sdpa.hpp
//                                       weights; picks the decode, flash or reference kernel
//   sdpa_backward                       dQ, dK, dV of sdpa from O, lse and dO (dropout too)    attn/sdpa_backward.hpp
//   sdpa_varlen, sdpa_varlen_backward  sdpa over sequences packed without padding           attn/sdpa_varlen.hpp
//                                       ((T, H, D) + cu_seqlens, FlashAttention's varlen)
//   reference_steps                     the textbook's intermediates S, masked S, A, O, lse    attn/reference.hpp
//                                       in double (for learning and checking)
//   KVCache                             per-sequence K/V storage for generation                attn/kv_cache.hpp
//                                       (float32/float16/bfloat16, growth, truncate)
//   decode_attention                    one generation step: new queries against a KVCache,    attn/decode.hpp
//                                       sdpa's options, each sequence at its own length
//   PagedKVCache, paged_attention      a page pool shared by many sequences (add, append,      attn/paged_kv_cache.hpp
//                                       fork with copy-on-write, truncate, free) and the
//                                       decode kernel reading the pages directly
//   MultiHeadAttention                  PyTorch's nn.MultiheadAttention: projections, heads,    attn/mha.hpp
//                                       masks, forward, forward_train/backward, and
//                                       forward_incremental (new tokens, K/V through a KVCache;
//                                       attn/mha_incremental.hpp)
//   read_safetensors, write_safetensors PyTorch/Hugging Face weight files                       attn/safetensors.hpp
//   read_npy, write_npy                 NumPy .npy files                                       attn/npy.hpp
//   Tensor, TensorView                  owning, aligned tensor; non-owning strided view         attn/tensor.hpp
//   DType, dtype_name                   element types                                          attn/dtype.hpp
//   f16_to_float, float_to_bf16, ...    float16/bfloat16 conversions                           attn/half.hpp
//   Error                               the one exception type for bad arguments and files     attn/error.hpp
//   set_num_threads, num_threads        the one thread setting of every kernel                 attn/threads.hpp
//   ScopedInterruptFlag, Interrupted    stop a long call from another thread or a signal        attn/interrupt.hpp
//                                       handler (Python's Ctrl-C)
//   kVersion                            the library's version string                            attn/version.hpp
//
// Not included here: each lives in its own target with its own dependency (include it
// directly and link that target):
//   attn/ring.hpp     attn::dist::ring_attention, sequence-parallel attention over MPI
//                     (target attn::dist, needs MPI)
//   attn/heatmap.hpp  attn::write_heatmap, attention weights drawn as PNG/SVG
//                     (target attn::viz, needs cairo and pango)
//
// Conventions shared by all of them (layout, masks, alignment, errors): docs/conventions.md.
#pragma once

#include "attn/decode.hpp"
#include "attn/dtype.hpp"
#include "attn/error.hpp"
#include "attn/half.hpp"
#include "attn/interrupt.hpp"
#include "attn/kv_cache.hpp"
#include "attn/mha.hpp"
#include "attn/mha_incremental.hpp"
#include "attn/npy.hpp"
#include "attn/paged_kv_cache.hpp"
#include "attn/reference.hpp"
#include "attn/safetensors.hpp"
#include "attn/sdpa.hpp"
#include "attn/sdpa_backward.hpp"
#include "attn/sdpa_varlen.hpp"
#include "attn/tensor.hpp"
#include "attn/threads.hpp"
#include "attn/version.hpp"
