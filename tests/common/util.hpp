// The helpers every C++ test shares: random tensors, poison, element access and one comparison
// (atol + rtol·|want|) whose message names the count of bad elements and the worst one.
//
// Written against the public tensor API only (plus attn/half.hpp's scalar conversions, which
// unit_half tests bit by bit): element access is explicit stride arithmetic, so an oracle
// built on these helpers cannot inherit a bug from src/. Area-specific helpers (the naive
// oracle, gradient cases, MHA parameters) live in their area's header, which includes this one.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "attn/half.hpp"
#include "attn/tensor.hpp"

namespace attn::test {

// ---- element access ------------------------------------------------------------------------

using Index = std::array<std::int64_t, kMaxRank>;

// Calls fn(idx) for every multi-index of `s` in C order (indices past the rank stay 0).
template <class Fn>
void for_each_index(const Shape& s, Fn&& fn) {
    Index n{1, 1, 1, 1}, i{};
    for (int a = 0; a < s.rank; ++a) n[a] = s[a];
    for (i[0] = 0; i[0] < n[0]; ++i[0])
        for (i[1] = 0; i[1] < n[1]; ++i[1])
            for (i[2] = 0; i[2] < n[2]; ++i[2])
                for (i[3] = 0; i[3] < n[3]; ++i[3]) fn(static_cast<const Index&>(i));
}

// Element offset of a multi-index, by the view's strides.
inline std::int64_t offset_of(const TensorView& t, const Index& i) {
    std::int64_t off = 0;
    for (int a = 0; a < t.rank(); ++a) off += i[static_cast<std::size_t>(a)] * t.stride(a);
    return off;
}

// A view of t with dims `dims` reversed: negative strides, the data pointer at the last element
// along them (numpy's t[:, ::-1, ::-1] — the Python module passes such views on uncopied).
// (test_flash.cpp's Layout::reversed builds its own, inside a buffer it checks for stray writes.)
inline TensorView reversed_dims(const TensorView& t, std::initializer_list<int> dims) {
    Strides s = t.strides();
    std::int64_t last = 0;
    for (const int d : dims) {
        last += (t.dim(d) - 1) * s[static_cast<std::size_t>(d)];
        s[static_cast<std::size_t>(d)] = -s[static_cast<std::size_t>(d)];
    }
    return TensorView(static_cast<char*>(t.data()) + last * static_cast<std::int64_t>(dtype_size(t.dtype())), t.dtype(),
                      t.shape(), s);
}

// Calls fn(offset) for every element of `t` in C order (offset in elements, from t.data()).
template <class Fn>
void for_each_offset(const TensorView& t, Fn&& fn) {
    for_each_index(t.shape(), [&](const Index& i) { fn(offset_of(t, i)); });
}

// The element at `offset` of a float view (f32, f64, f16, bf16), as double.
inline double load(const TensorView& t, std::int64_t offset) {
    switch (t.dtype()) {
        case DType::f32: return static_cast<const float*>(t.data())[offset];
        case DType::f64: return static_cast<const double*>(t.data())[offset];
        case DType::f16: return f16_to_float(static_cast<const std::uint16_t*>(t.data())[offset]);
        case DType::bf16: return bf16_to_float(static_cast<const std::uint16_t*>(t.data())[offset]);
        default: ADD_FAILURE() << "test helper: not a float dtype"; return std::nan("");
    }
}

// Stores x at `offset`, rounded to the view's float dtype (16-bit: round to nearest even).
inline void store(const TensorView& t, std::int64_t offset, double x) {
    switch (t.dtype()) {
        case DType::f32: static_cast<float*>(t.data())[offset] = static_cast<float>(x); break;
        case DType::f64: static_cast<double*>(t.data())[offset] = x; break;
        case DType::f16: static_cast<std::uint16_t*>(t.data())[offset] = float_to_f16(static_cast<float>(x)); break;
        case DType::bf16: static_cast<std::uint16_t*>(t.data())[offset] = float_to_bf16(static_cast<float>(x)); break;
        default: ADD_FAILURE() << "test helper: not a float dtype";
    }
}

// Element (i0, i1, i2, i3) of a float view; indices past the view's rank must be 0.
inline double at(const TensorView& t, std::int64_t i0, std::int64_t i1 = 0, std::int64_t i2 = 0,
                 std::int64_t i3 = 0) {
    return load(t, offset_of(t, Index{i0, i1, i2, i3}));
}

// ---- random tensors ------------------------------------------------------------------------
// Contiguous tensors of any float dtype, values drawn in C order from `rng` (any standard
// engine). `Real` is the precision the distribution draws in: double by default; float keeps
// the random streams the decode and MHA tests were written (and their bounds measured) with.

template <class Real = double, class Rng>
Tensor randn(DType dt, const Shape& s, Rng& rng, double sd = 1.0, double mean = 0.0) {
    Tensor t(dt, s);
    std::normal_distribution<Real> d(static_cast<Real>(mean), static_cast<Real>(sd));
    for (std::int64_t i = 0; i < t.numel(); ++i) store(t, i, d(rng));
    return t;
}

template <class Real = double, class Rng>
Tensor rand_uniform(DType dt, const Shape& s, Rng& rng, double lo = -1.0, double hi = 1.0) {
    Tensor t(dt, s);
    std::uniform_real_distribution<Real> d(static_cast<Real>(lo), static_cast<Real>(hi));
    for (std::int64_t i = 0; i < t.numel(); ++i) store(t, i, d(rng));
    return t;
}

// A bool tensor, each element true with probability p_true.
template <class Rng>
Tensor random_bool(const Shape& s, Rng& rng, double p_true) {
    Tensor t(DType::boolean, s);
    std::bernoulli_distribution d(p_true);
    for (std::int64_t i = 0; i < t.numel(); ++i) t.data_as<std::uint8_t>()[i] = d(rng) ? 1 : 0;
    return t;
}

// A contiguous copy of a float tensor in float dtype `dt`, rounded as half.hpp rounds.
inline Tensor to_storage(const TensorView& src, DType dt) {
    Tensor out(dt, src.shape());
    std::int64_t i = 0;
    for_each_offset(src, [&](std::int64_t off) { store(out, i++, load(src, off)); });
    return out;
}

// Unit roundoff of a float dtype.
inline double unit_roundoff(DType dt) {
    return dt == DType::f16 ? std::ldexp(1.0, -11)
         : dt == DType::bf16 ? std::ldexp(1.0, -8)
         : dt == DType::f64  ? std::ldexp(1.0, -53)
                             : std::ldexp(1.0, -24);
}

// ---- poison --------------------------------------------------------------------------------
// Outputs are poisoned before a kernel runs, so an element it forgot to write cannot pass.
// The poison is one quiet NaN, exactly representable in f32, f64, f16 and bf16, with a payload
// arithmetic does not produce (x86's generated NaN is 0xffc00000; NaN inputs propagate their
// own payload): so is_poison() tells "never written" apart from "a NaN the kernel computed".
// Other dtypes get 0x7f in every byte.

inline constexpr std::uint32_t kPoisonF32 = 0x7fd50000u;  // quiet, payload 0x150000
inline constexpr std::uint16_t kPoisonF16 = 0x7ea8u;      // the same NaN: f16_to_float gives kPoisonF32
inline constexpr std::uint16_t kPoisonBF16 = 0x7fd5u;

inline double poison_value() {
    float f;
    std::memcpy(&f, &kPoisonF32, 4);
    return f;  // widening keeps the payload
}

// True when x is the poison (as read by at()/load(), from any float dtype).
inline bool is_poison(double x) {
    const double p = poison_value();
    return std::memcmp(&x, &p, sizeof x) == 0;
}

// A NaN the kernel wrote (a NaN-propagation check must not pass on an unwritten element).
inline bool written_nan(double x) { return std::isnan(x) && !is_poison(x); }

// Poisons every element the view spans (strides respected; bytes outside the view untouched).
inline void poison(const TensorView& t) {
    const std::size_t size = dtype_size(t.dtype());
    for_each_offset(t, [&](std::int64_t off) {
        auto* p = static_cast<unsigned char*>(t.data()) + off * static_cast<std::int64_t>(size);
        const double pv = poison_value();
        switch (t.dtype()) {
            case DType::f32: std::memcpy(p, &kPoisonF32, 4); break;
            case DType::f64: std::memcpy(p, &pv, 8); break;
            case DType::f16: std::memcpy(p, &kPoisonF16, 2); break;
            case DType::bf16: std::memcpy(p, &kPoisonBF16, 2); break;
            default: std::memset(p, 0x7f, size);
        }
    });
}

inline Tensor poisoned(DType dt, const Shape& s) {
    Tensor t(dt, s);
    poison(t);
    return t;
}

// True when no element of the view has been written since poison().
inline bool still_poisoned(const TensorView& t) {
    bool all = true;
    if (t.dtype() == DType::f32 || t.dtype() == DType::f64 || t.dtype() == DType::f16 || t.dtype() == DType::bf16) {
        for_each_offset(t, [&](std::int64_t off) { all = all && is_poison(load(t, off)); });
        return all;
    }
    const std::size_t size = dtype_size(t.dtype());
    for_each_offset(t, [&](std::int64_t off) {
        const auto* p = static_cast<const unsigned char*>(t.data()) + off * static_cast<std::int64_t>(size);
        for (std::size_t b = 0; b < size; ++b) all = all && p[b] == 0x7f;
    });
    return all;
}

// ---- comparison ----------------------------------------------------------------------------

struct Diff {
    std::int64_t n = 0;      // elements compared
    std::int64_t bad = 0;    // elements beyond tolerance (NaN, a mismatched infinity, a shape mismatch)
    double max_abs = 0;      // worst |got − want| (inf when a NaN or a mismatched infinity is seen)
    double worst_ratio = 0;  // worst |got − want| / (atol + rtol·|want|)
    std::int64_t at = -1;    // C-order index of the worst element
    double got = 0, want = 0;  // that element
    Shape shape;
    double atol = 0, rtol = 0;
    std::string mismatch;    // set when the shapes differ

    // "3 of 120 elements beyond atol 1e-06 + rtol 1e-05·|want|; worst [0, 1, 4, 2]: got …, want …, error … = 12 × tolerance"
    std::string message() const {
        std::ostringstream m;
        m.precision(9);
        if (!mismatch.empty()) return mismatch;
        m << bad << " of " << n << " elements beyond atol " << atol << " + rtol " << rtol << "·|want|";
        if (at < 0) return m.str();
        std::int64_t idx[kMaxRank] = {0, 0, 0, 0}, rest = at;
        for (int a = shape.rank - 1; a >= 0; --a) idx[a] = rest % shape[a], rest /= shape[a];
        m << "; worst [";
        for (int a = 0; a < shape.rank; ++a) m << (a ? ", " : "") << idx[a];
        m << "]: got " << got << ", want " << want << ", error " << std::fabs(got - want) << " = " << worst_ratio
          << " × tolerance";
        return m.str();
    }
};

// Element-wise |got − want| <= atol + rtol·|want| over two same-shape float views (any float
// dtypes and strides); an infinity must match exactly; NaN anywhere is bad.
inline Diff compare(const TensorView& got, const TensorView& want, double atol, double rtol) {
    Diff d;
    d.shape = want.shape(), d.atol = atol, d.rtol = rtol;
    if (!(got.shape() == want.shape())) {
        d.bad = d.n = want.numel();
        d.max_abs = d.worst_ratio = INFINITY;
        d.mismatch = "shape " + got.shape().str() + " does not match the reference's " + want.shape().str();
        return d;
    }
    for_each_index(want.shape(), [&](const Index& i) {
        const double g = load(got, offset_of(got, i)), w = load(want, offset_of(want, i));
        double e, ratio;
        bool bad;
        if (std::isinf(w) || std::isinf(g)) {
            bad = g != w;
            e = ratio = bad ? INFINITY : 0.0;
        } else {
            e = std::fabs(g - w);
            const double tol = atol + rtol * std::fabs(w);
            bad = !(e <= tol);
            ratio = std::isnan(e) ? INFINITY : e == 0 ? 0.0 : e / tol;  // e > 0 = tol: inf
            if (std::isnan(e)) e = INFINITY;
        }
        d.bad += bad;
        d.max_abs = std::max(d.max_abs, e);
        if (ratio > d.worst_ratio || d.at < 0) d.worst_ratio = ratio, d.at = d.n, d.got = g, d.want = w;
        ++d.n;
    });
    return d;
}

// For EXPECT_TRUE(all_close(got, want, atol, rtol)) << "context": fails with Diff::message().
inline ::testing::AssertionResult all_close(const TensorView& got, const TensorView& want, double atol, double rtol) {
    const Diff d = compare(got, want, atol, rtol);
    if (d.bad == 0) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << d.message();
}

// ---- error measures ------------------------------------------------------------------------

// max |a − b| over b's shape (and max |b| into *max_b); a non-finite a or a NaN difference
// counts as +inf, so a poisoned or NaN result can never look small.
inline double max_abs_diff(const TensorView& a, const TensorView& b, double* max_b = nullptr) {
    double num = 0.0, den = 0.0;
    bool finite = true;
    for_each_index(b.shape(), [&](const Index& i) {
        const double x = load(a, offset_of(a, i)), y = load(b, offset_of(b, i)), e = std::fabs(x - y);
        finite = finite && std::isfinite(x) && !std::isnan(e);
        num = std::max(num, e);
        den = std::max(den, std::fabs(y));
    });
    if (max_b) *max_b = den;
    return finite ? num : std::numeric_limits<double>::infinity();
}

// The larger of two errors, a NaN error counting as +inf: std::max(worst, NaN) keeps worst, so
// an unwritten (NaN-poisoned) output would look exact.
inline double worse(double worst, double err) {
    return std::isnan(err) ? std::numeric_limits<double>::infinity() : std::max(worst, err);
}

inline double max_abs(const TensorView& a) {
    double m = 0.0;
    max_abs_diff(a, a, &m);
    return m;
}

// True when some element of the view (a float dtype) has not been written since poison().
inline bool any_poisoned(const TensorView& t) {
    bool any = false;
    for_each_offset(t, [&](std::int64_t off) { any = any || is_poison(load(t, off)); });
    return any;
}

// Same dtype, shape and bytes (contiguous tensors).
inline bool bit_equal(const Tensor& a, const Tensor& b) {
    return a.dtype() == b.dtype() && a.shape() == b.shape() && std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

// As many tensors, each bit_equal to its counterpart (a call's outputs, run two ways).
inline bool all_bit_equal(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
    if (a.size() != b.size()) return false;
    for (std::size_t i = 0; i < a.size(); ++i)
        if (!bit_equal(a[i], b[i])) return false;
    return true;
}

}  // namespace attn::test
