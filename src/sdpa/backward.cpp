// attn::sdpa_backward: validate once (the forward's checks plus the extra tensors),
// pick a backward kernel, run it.
#include "attn/sdpa_backward.hpp"

#include <cstdint>
#include <string>

#include "attn/error.hpp"
#include "../kernels/backward/backward.hpp"
#include "problem.hpp"

namespace attn {
namespace {

[[noreturn]] void fail(const std::string& msg) { throw Error("sdpa_backward: " + msg); }

bool is_float(DType t) { return t == DType::f32 || t == DType::f64; }

void require_like(const TensorView& t, const char* name, const Shape& expected, const char* what) {
    if (t.data() == nullptr) fail(std::string(name) + ": data pointer is null");
    if (!is_float(t.dtype())) {
        fail(std::string(name) + ": dtype must be float32 or float64 but got " + std::string(dtype_name(t.dtype())));
    }
    if (!(t.shape() == expected)) {
        fail(std::string(name) + ": expected the shape of " + what + " " + expected.str() + " but got " +
             t.shape().str());
    }
}

// An output whose stride is 0 along a dimension of size > 1 would receive several
// gradients in one element.
void require_writable(const TensorView& t, const char* name) {
    for (int d = 0; d < t.rank(); ++d) {
        if (t.dim(d) > 1 && t.stride(d) == 0) {
            fail(std::string(name) + ": stride 0 along dim " + std::to_string(d) + " of size " + std::to_string(t.dim(d)) +
                 " (a broadcast view) cannot hold one gradient per element");
        }
    }
}

// Byte interval [lo, hi) a view can touch (strides may be negative or zero).
struct Span {
    std::uintptr_t lo, hi;
};
Span span_of(const TensorView& t) {
    std::int64_t lo = 0, hi = 0;
    for (int d = 0; d < t.rank(); ++d) {
        const std::int64_t reach = (t.dim(d) - 1) * t.stride(d);
        (reach < 0 ? lo : hi) += reach;
    }
    const auto base = reinterpret_cast<std::uintptr_t>(t.data());
    const auto size = static_cast<std::int64_t>(dtype_size(t.dtype()));
    return {base + static_cast<std::uintptr_t>(lo * size), base + static_cast<std::uintptr_t>((hi + 1) * size)};
}

void require_disjoint(const TensorView& out, const char* out_name, const TensorView& other, const char* other_name) {
    const Span a = span_of(out), b = span_of(other);
    if (a.lo < b.hi && b.lo < a.hi) {
        fail(std::string(out_name) + ": must not share memory with " + other_name + " (the kernel writes " + out_name +
             " while it still reads " + other_name + ")");
    }
}

}  // namespace

void sdpa_backward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                   const TensorView& lse, const TensorView& grad_out, const SdpaOptions& options,
                   const TensorView& dq, const TensorView& dk, const TensorView& dv, SdpaReport* report) {
    detail::BackwardProblem p;
    p.fwd = detail::make_problem(q, k, v, options, out, &lse, nullptr);
    // make_problem admits float16/bfloat16 K/V for the forward decode path; gradients need
    // float32 or float64 inputs.
    if (!is_float(k.dtype())) fail("k: dtype must be float32 or float64 but got " + std::string(dtype_name(k.dtype())));
    if (!is_float(v.dtype())) fail("v: dtype must be float32 or float64 but got " + std::string(dtype_name(v.dtype())));
    require_like(grad_out, "grad_out", out.shape(), "out");
    require_like(dq, "dq", q.shape(), "q");
    require_like(dk, "dk", k.shape(), "k");
    require_like(dv, "dv", v.shape(), "v");
    const std::pair<const TensorView*, const char*> outs[] = {{&dq, "dq"}, {&dk, "dk"}, {&dv, "dv"}};
    const std::pair<const TensorView*, const char*> ins[] = {{&q, "q"},     {&k, "k"},   {&v, "v"},
                                                             {&out, "out"}, {&lse, "lse"}, {&grad_out, "grad_out"}};
    for (const auto& [o, oname] : outs) {
        require_writable(*o, oname);
        for (const auto& [i, iname] : ins) require_disjoint(*o, oname, *i, iname);
    }
    require_disjoint(dq, "dq", dk, "dk");
    require_disjoint(dq, "dq", dv, "dv");
    require_disjoint(dk, "dk", dv, "dv");
    p.grad_out = grad_out;
    p.dq = dq;
    p.dk = dk;
    p.dv = dv;

    // The fast kernel reads float32 inputs (the storage type it computes in); float64
    // inputs are the reference's, as in the forward.
    const bool all_f32 = q.dtype() == DType::f32 && k.dtype() == DType::f32 && v.dtype() == DType::f32 &&
                         out.dtype() == DType::f32 && lse.dtype() == DType::f32 && grad_out.dtype() == DType::f32;
    std::string why;
    bool use_flash = false;
    switch (options.impl) {
        case Impl::reference: why = "reference: requested\n"; break;
        case Impl::flash:
            if (!all_f32) {
                fail("impl: the flash backward needs float32 q, k, v, out, lse and grad_out; use auto or reference "
                     "for float64");
            }
            use_flash = true;
            break;
        case Impl::decode: fail("impl: decode is a forward-only kernel; use auto, reference or flash");
        case Impl::automatic:
            use_flash = all_f32;
            if (!all_f32) why = "flash: declined, an input is float64 → reference\n";
            break;
    }
    std::string ran;
    if (use_flash) {
        ran = std::string("flash-backward-") + detail::flash_backward(p);
    } else {
        detail::reference_backward(p);
        ran = "reference-backward";
    }
    if (report != nullptr) {
        report->kernel = ran;
        report->explanation = why + "ran: " + ran;
    }
}

}  // namespace attn
