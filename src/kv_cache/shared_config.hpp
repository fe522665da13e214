// The settings KVCacheConfig and PagedKVCacheConfig share — the K/V head geometry and the
// storage dtype — checked by one rule, so the two caches accept and refuse the same values
// with the same messages.
#pragma once

#include <string_view>

#include "attn/tensor.hpp"
#include "../core/check.hpp"

namespace attn::detail {

// value_dim 0 becomes head_dim; then kv_heads, head_dim and value_dim must each be >= 1.
template <class Config>
void resolve_kv_heads(std::string_view op, Config& c) {
    if (c.value_dim == 0) c.value_dim = c.head_dim;
    if (c.kv_heads < 1) fail(op, "kv_heads must be >= 1 but got ", c.kv_heads);
    if (c.head_dim < 1) fail(op, "head_dim must be >= 1 but got ", c.head_dim);
    if (c.value_dim < 1) fail(op, "value_dim must be >= 1 (or 0 = head_dim) but got ", c.value_dim);
}

// The storage types convert_row (rows.hpp) writes.
inline void require_kv_storage(std::string_view op, DType storage) {
    if (storage != DType::f32 && storage != DType::f16 && storage != DType::bf16) {
        fail_type(op, "storage must be float32, float16 or bfloat16 but got ", dtype_name(storage));
    }
}

}  // namespace attn::detail
