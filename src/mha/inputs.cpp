#include "inputs.hpp"

#include <cmath>

#include "../core/check.hpp"

namespace attn::detail {

void require_apart_from_parameters(std::string_view op, const MultiHeadAttention& m, const std::vector<Named>& outputs) {
    const auto params = m.state_dict();  // the views the Named entries point at, alive for the check
    std::vector<Named> inputs;
    for (const auto& [name, view] : params) inputs.push_back({&view, name.c_str()});
    require_apart(op, inputs, outputs);
}

bool same_view(const TensorView& a, const TensorView& b) {
    return a.data() == b.data() && a.dtype() == b.dtype() && a.shape() == b.shape() && a.strides() == b.strides();
}

void require_output_in_place_or_apart(std::string_view op, const TensorView& output, const std::vector<Named>& inputs) {
    for (const Named& in : inputs) {
        if (in.t == nullptr || same_view(output, *in.t) || !share_memory(output, *in.t)) continue;
        fail(op, "output: must share no memory with ", in.name, " or be exactly ", in.name,
             " (the same data, dtype, shape and strides: the layer in place) but it overlaps ", in.name, " otherwise");
    }
}

void check_finite_sinks(const TensorView& sinks, const char* what) {
    for (std::int64_t h = 0; h < sinks.dim(0); ++h) {
        const double x = sinks.load_as_double(sinks.offset(h));
        if (!std::isfinite(x)) fail(kMha, what, ": values must be finite but entry ", h, " is ", x);
    }
}

MhaShapes check_inputs(const MhaConfig& c, const TensorView& query, const TensorView& key, const TensorView& value,
                       const MhaForwardOptions& options) {
    for (const auto& [t, name] : {std::pair{&query, "query"}, {&key, "key"}, {&value, "value"}}) {
        if (t->data() == nullptr) fail(kMha, name, ": data pointer is null");
        if (!is_floating(t->dtype())) fail_type(kMha, name, ": dtype must be floating but got ", dtype_name(t->dtype()));
        require_element_aligned(kMha, *t, name);
    }
    if (query.rank() != 2 && query.rank() != 3) {
        fail(kMha, "query: expected a rank-3 tensor (L, B, E) / (B, L, E) or rank-2 (L, E) but got shape ", query.shape());
    }
    MhaShapes s;
    s.batched = query.rank() == 3;
    s.layout = !s.batched ? "(L, E)" : (c.batch_first ? "(B, L, E)" : "(L, B, E)");
    if (key.rank() != query.rank() || value.rank() != query.rank()) {
        fail(kMha, "key and value must have the rank of query ", s.layout, " = ", query.rank(), " but got key ", key.shape(),
             ", value ", value.shape());
    }
    const int ld = s.batched && c.batch_first ? 1 : 0;  // the length dim
    s.B = s.batched ? query.dim(c.batch_first ? 0 : 1) : 1;
    s.Lq = query.dim(ld);
    s.Lk = key.dim(ld);
    if (query.dim(query.rank() - 1) != c.embed_dim) {
        fail(kMha, "query: expected ", s.layout, " with E = embed_dim = ", c.embed_dim, " but got shape ", query.shape());
    }
    auto expect_kv = [&](const TensorView& t, const char* name, std::int64_t feat, const char* featname) {
        const Shape want = !s.batched ? Shape{s.Lk, feat} : (c.batch_first ? Shape{s.B, s.Lk, feat} : Shape{s.Lk, s.B, feat});
        if (!(t.shape() == want)) {
            fail(kMha, name, ": expected shape ", s.layout, " = ", want, " (batch of query, length of key, ", featname,
                 ") but got ", t.shape());
        }
    };
    expect_kv(key, "key", c.kdim, "kdim");
    expect_kv(value, "value", c.vdim, "vdim");
    if (s.Lq < 1 || s.Lk < 1 || s.B < 1) {
        fail(kMha, "query and key must have at least one element in batch and length but got query ", query.shape(),
             ", key ", key.shape());
    }
    // add_bias_kv appends the key/value bias_k/bias_v, add_zero_attn then a zero key/value
    // (PyTorch's order); masks see them as allowed, weights have their columns.
    s.extra = (c.add_bias_kv ? 1 : 0) + (c.add_zero_attn ? 1 : 0);
    s.Lkx = s.Lk + s.extra;
    require_enum(kMha, "causal", options.causal, 3, "Causal::none, top_left, bottom_right");
    if (s.extra > 0 && options.causal != Causal::none) {
        fail(kMha, "causal: not supported together with add_bias_kv / add_zero_attn (the appended key has no position); "
                   "pass a causal attn_mask (Lq, Lk) instead");
    }
    s.rq = rows_of(s.batched, c.batch_first, s.B, s.Lq);
    s.rk = rows_of(s.batched, c.batch_first, s.B, s.Lk);
    return s;
}

}  // namespace attn::detail
