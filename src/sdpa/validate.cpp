// Argument checks for attn::sdpa, in one place. Every message names the argument,
// what was expected and what was given; nothing is written before they all pass.
#include <cmath>
#include <string>

#include "attn/error.hpp"
#include "problem.hpp"

namespace attn::detail {
namespace {

std::string num(std::int64_t v) { return std::to_string(v); }

[[noreturn]] void fail(const std::string& msg) { throw Error("sdpa: " + msg); }

void require_rank(const TensorView& t, const char* name, int rank, const char* layout) {
    if (t.data() == nullptr) fail(std::string(name) + ": data pointer is null");
    if (t.rank() != rank) {
        fail(std::string(name) + ": expected a rank-" + num(rank) + " tensor " + layout + " but got shape " +
             t.shape().str());
    }
}

bool is_compute_float(DType t) { return t == DType::f32 || t == DType::f64; }

// K and V may also be stored in 16 bits: the decode kernel (Lq <= 16) and the reference
// read them directly; kernels/dispatch.cpp refuses them for any other kernel, saying why.
void require_kv_float(const TensorView& t, const char* name) {
    if (!is_floating(t.dtype())) {
        fail(std::string(name) + ": dtype must be float32, float64, float16 or bfloat16 but got " +
             std::string(dtype_name(t.dtype())));
    }
}

void require_float(const TensorView& t, const char* name) {
    if (!is_compute_float(t.dtype())) {
        fail(std::string(name) + ": dtype must be float32 or float64 but got " + std::string(dtype_name(t.dtype())));
    }
}

// An output needs its own memory for every element: a stride-0 (broadcast) dimension of size
// > 1 would make several results land on one address.
void require_distinct_elements(const TensorView& t, const char* name) {
    for (int d = 0; d < t.rank(); ++d) {
        if (t.dim(d) > 1 && t.stride(d) == 0) {
            fail(std::string(name) + ": dimension " + num(d) + " has stride 0 but size " + num(t.dim(d)) +
                 "; an output cannot be a broadcast view");
        }
    }
}

// An int32/int64 element exactly (a double would round values above 2^53).
std::int64_t load_int(const TensorView& t, std::int64_t i) {
    if (t.dtype() == DType::i32) return t.data_as<const std::int32_t>()[t.offset(i)];
    return t.data_as<const std::int64_t>()[t.offset(i)];
}

void require_shape(const TensorView& t, const char* name, const Shape& expected, const char* layout) {
    if (!(t.shape() == expected)) {
        fail(std::string(name) + ": expected shape " + layout + " = " + expected.str() + " but got " +
             t.shape().str());
    }
}

}  // namespace

SdpaProblem make_problem(const TensorView& q, const TensorView& k, const TensorView& v,
                         const SdpaOptions& options, const TensorView& out, const TensorView* lse,
                         const TensorView* weights) {
    require_rank(q, "Q", 4, "(B, Hq, Lq, Dk)");
    require_rank(k, "K", 4, "(B, Hkv, Lk, Dk)");
    require_rank(v, "V", 4, "(B, Hkv, Lk, Dv)");
    require_float(q, "Q");
    require_kv_float(k, "K");
    require_kv_float(v, "V");

    SdpaProblem p;
    p.B = q.dim(0);
    p.Hq = q.dim(1);
    p.Lq = q.dim(2);
    p.Dk = q.dim(3);
    p.Hkv = k.dim(1);
    p.Lk = k.dim(2);
    p.Dv = v.dim(3);

    const char* names[] = {"batch", "heads", "length", "head dim"};
    for (int i = 0; i < 4; ++i) {
        if (q.dim(i) < 1) fail("Q: " + std::string(names[i]) + " must be >= 1 but got " + num(q.dim(i)));
        if (k.dim(i) < 1) fail("K: " + std::string(names[i]) + " must be >= 1 but got " + num(k.dim(i)));
        if (v.dim(i) < 1) fail("V: " + std::string(names[i]) + " must be >= 1 but got " + num(v.dim(i)));
    }
    if (k.dim(0) != p.B) fail("K: batch " + num(k.dim(0)) + " does not match Q's batch " + num(p.B));
    if (v.dim(0) != p.B) fail("V: batch " + num(v.dim(0)) + " does not match Q's batch " + num(p.B));
    if (k.dim(3) != p.Dk) fail("K: head dim " + num(k.dim(3)) + " does not match Q's head dim " + num(p.Dk));
    if (v.dim(1) != p.Hkv) fail("V: heads " + num(v.dim(1)) + " do not match K's heads " + num(p.Hkv));
    if (v.dim(2) != p.Lk) fail("V: length " + num(v.dim(2)) + " does not match K's length " + num(p.Lk));
    if (p.Hq % p.Hkv != 0) {
        fail("Q: heads " + num(p.Hq) + " must be a multiple of K/V's heads " + num(p.Hkv) + " (grouped-query attention)");
    }
    p.group = p.Hq / p.Hkv;

    require_rank(out, "out", 4, "(B, Hq, Lq, Dv)");
    require_float(out, "out");
    require_shape(out, "out", Shape{p.B, p.Hq, p.Lq, p.Dv}, "(B, Hq, Lq, Dv)");
    require_distinct_elements(out, "out");
    if (lse != nullptr) {
        require_rank(*lse, "lse", 3, "(B, Hq, Lq)");
        require_float(*lse, "lse");
        require_shape(*lse, "lse", Shape{p.B, p.Hq, p.Lq}, "(B, Hq, Lq)");
        require_distinct_elements(*lse, "lse");
        p.lse = *lse;
    }
    if (weights != nullptr) {
        require_rank(*weights, "weights", 4, "(B, Hq, Lq, Lk)");
        require_float(*weights, "weights");
        require_shape(*weights, "weights", Shape{p.B, p.Hq, p.Lq, p.Lk}, "(B, Hq, Lq, Lk)");
        require_distinct_elements(*weights, "weights");
        p.weights = *weights;
    }

    if (options.scale) {
        if (!std::isfinite(*options.scale)) fail("scale: must be finite but got " + std::to_string(*options.scale));
        p.scale = *options.scale;
    } else {
        p.scale = 1.0 / std::sqrt(static_cast<double>(p.Dk));
    }

    const Shape full{p.B, p.Hq, p.Lq, p.Lk};
    if (options.bool_mask) {
        const TensorView& m = *options.bool_mask;
        if (m.data() == nullptr) fail("bool_mask: data pointer is null");
        if (m.dtype() != DType::boolean) {
            fail("bool_mask: dtype must be bool (true = may attend) but got " + std::string(dtype_name(m.dtype())));
        }
        p.bool_mask = m.broadcast_to(full, "sdpa: bool_mask");
    }
    if (options.additive_mask) {
        const TensorView& m = *options.additive_mask;
        if (m.data() == nullptr) fail("additive_mask: data pointer is null");
        if (!is_compute_float(m.dtype())) {
            fail("additive_mask: dtype must be float32 or float64 but got " + std::string(dtype_name(m.dtype())));
        }
        p.additive_mask = m.broadcast_to(full, "sdpa: additive_mask");
    }
    if (options.key_lengths) {
        const TensorView& kl = *options.key_lengths;
        if (kl.data() == nullptr) fail("key_lengths: data pointer is null");
        if (kl.dtype() != DType::i32 && kl.dtype() != DType::i64) {
            fail("key_lengths: dtype must be int32 or int64 but got " + std::string(dtype_name(kl.dtype())));
        }
        if (kl.rank() != 1 || kl.dim(0) != p.B) {
            fail("key_lengths: expected shape (B,) = (" + num(p.B) + ",) but got " + kl.shape().str());
        }
        for (std::int64_t b = 0; b < p.B; ++b) {
            const std::int64_t len = load_int(kl, b);
            if (len < 0 || len > p.Lk) {
                fail("key_lengths: entry " + num(b) + " must be in [0, Lk=" + num(p.Lk) + "] but got " + num(len));
            }
        }
        p.key_lengths = kl;
    }
    if (options.window.left < -1 || options.window.right < -1) {
        fail("window: left and right must be >= 0, or -1 for unbounded, but got left=" + num(options.window.left) +
             " right=" + num(options.window.right));
    }
    if (!(options.dropout_p >= 0.0 && options.dropout_p < 1.0)) {
        fail("dropout_p: must be in [0, 1) but got " + std::to_string(options.dropout_p));
    }
    p.dropout_p = options.dropout_p;
    p.dropout_seed = options.dropout_seed;
    p.causal = options.causal;
    p.window = options.window;
    // A bound of Lq + Lk or more excludes no key (|j − d| < Lq + Lk for every query i, key j and
    // either diagonal d), so it is stored as unbounded: key_range then never computes
    // d + right + 1 or d − left near the int64 limits.
    if (p.window.left >= p.Lq + p.Lk) p.window.left = -1;
    if (p.window.right >= p.Lq + p.Lk) p.window.right = -1;
    p.q = q;
    p.k = k;
    p.v = v;
    p.out = out;
    return p;
}

}  // namespace attn::detail
