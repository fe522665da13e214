// The sdpa-forward shapes (S1–S4, S8 and --shape-custom): attn's kernels and the PyTorch
// hand-written attention on the same sizes, each timed, with its peak memory, and the fast
// kernels checked against the reference output when the reference ran.
#include <omp.h>

#include <cmath>
#include <limits>
#include <sstream>

#include "attn/error.hpp"
#include "attn/half.hpp"
#include "harness.hpp"
#include "visible_pairs.hpp"

namespace attn::bench {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;
constexpr double kGiB = 1024.0 * kMiB;

}  // namespace

std::string causal_word(Causal c) {
    return c == Causal::none ? "none" : c == Causal::top_left ? "top-left" : "bottom-right";
}

// t: any shape, contiguous float32. Uniform in [-1, 1), a pure function of (seed, index), so
// the contents do not depend on the thread count.
void fill_uniform(const Tensor& t, std::uint64_t seed) {
    float* p = t.data_as<float>();
    const std::int64_t n = t.numel();
#pragma omp parallel for schedule(static)
    for (std::int64_t i = 0; i < n; ++i) {
        std::uint64_t z = seed * 0x9E3779B97F4A7C15ull + static_cast<std::uint64_t>(i);  // splitmix64
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        p[i] = static_cast<float>(static_cast<double>(z >> 40) * (1.0 / 8388608.0) - 1.0);
    }
}

void poison(const Tensor& t) {
    float* p = t.data_as<float>();
    const std::int64_t n = t.numel();
#pragma omp parallel for schedule(static)
    for (std::int64_t i = 0; i < n; ++i) p[i] = std::numeric_limits<float>::quiet_NaN();
}

// Max |a − b| over two outputs of the same shape; NaN when either holds a NaN (an element a
// kernel did not write stays NaN from the poison).
double max_abs_diff(const Tensor& a, const Tensor& b) {
    const float* x = a.data_as<float>();
    const float* y = b.data_as<float>();
    double m = 0.0;
    bool nan = false;
    for (std::int64_t i = 0; i < a.numel(); ++i) {
        const double d = std::fabs(static_cast<double>(x[i]) - static_cast<double>(y[i]));
        if (std::isnan(d)) nan = true;
        else if (d > m) m = d;
    }
    return nan ? std::numeric_limits<double>::quiet_NaN() : m;
}

std::string gib(double bytes) { return format_double("%.1f GiB", bytes / kGiB); }

// The variant of a 16-bit row ("Q/out bfloat16, K/V bfloat16"); "" for float32.
std::string storage_variant(const SdpaShape& s) {
    if (s.q_dtype == DType::f32 && s.kv_dtype == DType::f32) return "";
    return "Q/out " + std::string(dtype_name(s.q_dtype)) + ", K/V " + std::string(dtype_name(s.kv_dtype));
}

std::string sdpa_shape_text(const SdpaShape& s) {
    std::ostringstream os;
    os << "B=" << s.B << " Hq=" << s.Hq << " Hkv=" << s.Hkv << " Lq=" << s.Lq << " Lk=" << s.Lk << " D=" << s.Dk
       << " causal=" << causal_word(s.causal);
    return os.str();
}

Row torch_sdpa_row(const Context& ctx, const SdpaShape& s, const std::string& mode, double torch_bytes,
                   const std::string& who, const std::string& for_what) {
    const double avail = static_cast<double>(mem_available());
    if (ctx.cfg.torch && !ctx.torch_version.empty() && avail > 0 && torch_bytes > ctx.cfg.memory_fraction * avail) {
        Row t;
        t.impl = "torch";
        t.status = "skipped";
        t.note = who + " needs ~" + gib(torch_bytes) + for_what + "; MemAvailable is " + gib(avail);
        return t;
    }
    return run_torch(ctx, {{"mode", mode},
                           {"B", std::to_string(s.B)},
                           {"Hq", std::to_string(s.Hq)},
                           {"Hkv", std::to_string(s.Hkv)},
                           {"Lq", std::to_string(s.Lq)},
                           {"Lk", std::to_string(s.Lk)},
                           {"Dk", std::to_string(s.Dk)},
                           {"Dv", std::to_string(s.Dv)},
                           {"causal", causal_word(s.causal)}});
}

namespace {

// The indices of `impls` with the reference's first.
std::vector<std::size_t> reference_first(const std::vector<Impl>& impls) {
    std::vector<std::size_t> order;
    for (std::size_t i = 0; i < impls.size(); ++i)
        if (impls[i] == Impl::reference) order.push_back(i);
    for (std::size_t i = 0; i < impls.size(); ++i)
        if (impls[i] != Impl::reference) order.push_back(i);
    return order;
}

// Marks the reference's row r skipped, and returns true, when it would cost more than the
// limits allow (impl_rows).
bool skip_costly_reference(const Config& cfg, Row& r, const ReferenceCost& c) {
    if (c.flop > cfg.reference_max_gflop * 1e9) {
        r.status = "skipped";
        r.note = "the reference computes " + format_double("%.0f", c.flop / 1e9) +
                 " GFLOP here (all scores, in double), above --reference-max-gflop " + format_double("%g", cfg.reference_max_gflop);
        return true;
    }
    if (c.avail > 0 && c.bytes + static_cast<double>(c.io_bytes) > cfg.memory_fraction * c.avail) {
        r.status = "skipped";
        r.note = "the reference would hold " + gib(c.bytes) + " of score matrices";
        return true;
    }
    return false;
}

}  // namespace

std::vector<Row> impl_rows(const Config& cfg, double flop, const ReferenceCost& reference,
                           const std::function<void(Impl, Row&)>& time, const std::function<void(Row&)>& compare,
                           bool* reference_ran) {
    std::vector<Row> rows(cfg.impls.size());
    bool have_ref = false;
    for (std::size_t i : reference_first(cfg.impls)) {
        const Impl impl = cfg.impls[i];
        Row& r = rows[i];
        r.impl = std::string(impl_name(impl));
        r.flop = flop;
        if (impl == Impl::reference && skip_costly_reference(cfg, r, reference)) continue;
        time(impl, r);
        if (r.status != "ok") continue;
        if (r.timing.warmup_counted) r.note = "one call: the warm-up alone exceeded --max-seconds";
        if (impl == Impl::reference) have_ref = true;
        else if (have_ref) compare(r);
    }
    if (reference_ran != nullptr) *reference_ran = have_ref;
    return rows;
}

void add_modifier_rows(const Config& cfg, const SdpaShape& s, double flop, std::vector<Row>& rows,
                       const std::function<void(const SdpaOptions&, Row&)>& time) {
    const Row* plain = nullptr;
    for (std::size_t i = 0; i < cfg.impls.size() && plain == nullptr; ++i)
        if (cfg.impls[i] != Impl::reference && rows[i].status == "ok") plain = &rows[i];
    if (plain == nullptr) return;
    const std::string plain_impl = plain->impl;  // rows grows below: plain may dangle
    const Impl impl = parse_impl(plain_impl);
    for (const ModifierRow& m : s.modifier_rows) {
        Row r;
        r.impl = plain_impl + "+" + m.name;
        r.flop = flop;
        r.ratio_to = plain_impl;
        r.ratio_target = m.target;
        SdpaOptions opt;
        opt.impl = impl;
        opt.causal = s.causal;
        ModifierTensors keep;
        set_modifiers(m.name, s.Hq, opt, keep);
        time(opt, r);
        rows.push_back(std::move(r));
    }
}

// 2·(Dk + Dv) per visible (query, key) pair, the pairs counted exactly (visible_pairs.hpp): a
// causal mask leaves L(L+1)/2 per head of a square shape, and with Lq ≠ Lk its alignment decides.
double sdpa_forward_flop(const SdpaShape& s) {
    return 2.0 * static_cast<double>(s.Dk + s.Dv) * visible_pairs(s.B, s.Hq, s.Lq, s.Lk, s.causal);
}

void run_sdpa_forward(const Context& ctx, const SdpaShape& s, std::vector<CaseResult>& out) {
    const Config& cfg = ctx.cfg;
    CaseResult c;
    c.id = s.id;
    c.what = s.what;
    const bool sixteen = s.q_dtype != DType::f32 || s.kv_dtype != DType::f32;
    {
        std::ostringstream os;
        os << "B=" << s.B << " Hq=" << s.Hq << " Hkv=" << s.Hkv << " Lq=" << s.Lq << " Lk=" << s.Lk;
        if (s.Dk == s.Dv) os << " D=" << s.Dk;
        else os << " Dk=" << s.Dk << " Dv=" << s.Dv;
        os << " causal=" << causal_word(s.causal);
        if (!sixteen) os << " fp32";
        c.shape = os.str();
    }
    c.variant = storage_variant(s);
    c.params = {{"B", s.B},   {"Hq", s.Hq}, {"Hkv", s.Hkv}, {"Lq", s.Lq},
                {"Lk", s.Lk}, {"Dk", s.Dk}, {"Dv", s.Dv},   {"causal", causal_word(s.causal)},
                {"dtype", dtype_name(s.q_dtype)}, {"kv_dtype", dtype_name(s.kv_dtype)}};
    c.flop = sdpa_forward_flop(s);
    c.flop_formula = s.causal == Causal::none ? "2*B*Hq*Lq*Lk*(Dk+Dv)  (= 4*B*H*Lq*Lk*D)"
                                              : "2*(Dk+Dv)*(visible pairs: B*Hq*sum_i keys query i sees)  (causal)";
    const std::int64_t q_n = s.B * s.Hq * s.Lq * s.Dk, k_n = s.B * s.Hkv * s.Lk * s.Dk;
    const std::int64_t v_n = s.B * s.Hkv * s.Lk * s.Dv, o_n = s.B * s.Hq * s.Lq * s.Dv;
    const auto qsz = static_cast<std::int64_t>(dtype_size(s.q_dtype)), kvsz = static_cast<std::int64_t>(dtype_size(s.kv_dtype));
    c.io_bytes = qsz * (q_n + o_n) + kvsz * (k_n + v_n);
    if (s.report_rss_target) {
        c.rss_limit = static_cast<std::int64_t>(1.25 * static_cast<double>(c.io_bytes) + 100.0 * kMiB);
        c.rss_limit_formula = "1.25 x bytes(Q,K,V,O) + 100 MiB";
    }

    const double avail = static_cast<double>(mem_available());
    if (avail > 0 && static_cast<double>(c.io_bytes) > cfg.memory_fraction * avail) {
        c.status = "skipped";
        c.note = "Q, K, V and O need " + gib(static_cast<double>(c.io_bytes)) + ", more than " +
                 format_double("%.0f%%", 100 * cfg.memory_fraction) + " of MemAvailable (" + gib(avail) + ")";
        out.push_back(std::move(c));
        return;
    }
    // 16-bit rows: the same uniform values, rounded once to the row's storage.
    auto input = [](DType dt, Shape sh, std::uint64_t seed) {
        Tensor t(DType::f32, sh);
        fill_uniform(t, seed);
        if (dt == DType::f32) return t;
        Tensor h(dt, sh);  // round to nearest even (attn/half.hpp), as every 16-bit conversion of attn
        const float* src = t.data_as<const float>();
        std::uint16_t* dst = h.data_as<std::uint16_t>();
        for (std::int64_t i = 0; i < t.numel(); ++i)
            dst[i] = dt == DType::f16 ? float_to_f16(src[i]) : float_to_bf16(src[i]);
        return h;
    };
    const Tensor q = input(s.q_dtype, Shape{s.B, s.Hq, s.Lq, s.Dk}, 1);
    const Tensor k = input(s.kv_dtype, Shape{s.B, s.Hkv, s.Lk, s.Dk}, 2);
    const Tensor v = input(s.kv_dtype, Shape{s.B, s.Hkv, s.Lk, s.Dv}, 3);
    Tensor o(s.q_dtype, Shape{s.B, s.Hq, s.Lq, s.Dv});
    Tensor o_ref;  // allocated only when the reference runs, so it is not in the others' peak RSS

    // The reference computes every score (no causal skipping) in double and keeps three
    // Lq x Lk double matrices per head in flight per thread.
    ReferenceCost ref_cost;
    ref_cost.flop = 2.0 * static_cast<double>(s.B * s.Hq) * static_cast<double>(s.Lq) * static_cast<double>(s.Lk) *
                    static_cast<double>(s.Dk + s.Dv);
    ref_cost.bytes = 3.0 * 8.0 * static_cast<double>(s.Lq) * static_cast<double>(s.Lk) * cfg.threads;
    ref_cost.io_bytes = c.io_bytes;
    ref_cost.avail = avail;
    auto time_impl = [&](Impl impl, Row& r) {
        const Tensor* dst = &o;
        if (impl == Impl::reference) {
            o_ref = Tensor(o.dtype(), o.shape());
            dst = &o_ref;
        }
        if (dst->dtype() == DType::f32) poison(*dst);
        SdpaOptions opt;
        opt.impl = impl;
        opt.causal = s.causal;
        SdpaReport rep;
        const TensorView dst_view = dst->view();
        if (time_calls_into(cfg, r, [&] { sdpa(q, k, v, opt, dst_view, nullptr, nullptr, &rep); })) r.kernel = rep.kernel;
    };
    auto compare = [&](Row& r) {
        if (o.dtype() != DType::f32) return;
        r.max_abs_diff = max_abs_diff(o, o_ref);
        if (std::isnan(*r.max_abs_diff)) r.note = "output holds NaN where the reference does not";
    };
    std::vector<Row> rows = impl_rows(cfg, c.flop, ref_cost, time_impl, compare);  // in the order of --impl
    o_ref = Tensor();

    // Score-modifier rows: the first fast impl that ran, again with each modifier set.
    add_modifier_rows(cfg, s, c.flop, rows, [&](const SdpaOptions& opt, Row& r) {
        SdpaReport rep;
        const TensorView dst_view = o.view();
        poison(o);
        if (time_calls_into(cfg, r, [&] { sdpa(q, k, v, opt, dst_view, nullptr, nullptr, &rep); })) r.kernel = rep.kernel;
    });

    // PyTorch's hand-written attention holds about three B·Hq·Lq·Lk fp32 matrices at once
    // (scores, scores + mask, softmax) plus its inputs.
    const double torch_bytes = 3.0 * 4.0 * static_cast<double>(s.B * s.Hq) * static_cast<double>(s.Lq) *
                                   static_cast<double>(s.Lk) + 2.0 * static_cast<double>(c.io_bytes);
    if (!sixteen) {  // torch's hand-written attention is float32 (a 16-bit row compares with the f32 one)
        Row t = torch_sdpa_row(ctx, s, "sdpa", torch_bytes, "hand-written attention", " for its Lq x Lk matrices");
        t.flop = c.flop;
        rows.push_back(std::move(t));
    }
    c.rows = std::move(rows);
    out.push_back(std::move(c));
}

BenchCase sdpa_forward_case(const SdpaShape& s) {
    BenchCase bc;
    bc.id = s.id;
    bc.variant = storage_variant(s);
    bc.what = s.what;
    bc.shape = sdpa_shape_text(s);
    bc.run = [s](const Context& ctx, std::vector<CaseResult>& out) { run_sdpa_forward(ctx, s, out); };
    return bc;
}

SdpaShape parse_custom_shape(const std::string& text) {
    const std::string expect = "--shape-custom: expected B,Hq,Hkv,Lq,Lk,D,causal (D may be Dk:Dv; causal 0/1/none/top-left/bottom-right), e.g. 1,2,2,16,16,8,0, but got '" + text + "'";
    std::vector<std::string> f;
    std::string cur;
    for (char ch : text) {
        if (ch == ',') {
            f.push_back(cur);
            cur.clear();
        } else {
            cur += ch;
        }
    }
    f.push_back(cur);
    if (f.size() != 7) throw Error(expect);
    auto num = [&](const std::string& w, const char* name) {
        std::size_t used = 0;
        long long x = 0;
        try {
            x = std::stoll(w, &used);
        } catch (...) {
            used = 0;
        }
        if (used != w.size() || w.empty() || x < 1)
            throw Error("--shape-custom: " + std::string(name) + " must be a positive integer but got '" + w + "'");
        return static_cast<std::int64_t>(x);
    };
    SdpaShape s;
    s.id = "custom";
    s.what = "custom shape";
    s.B = num(f[0], "B");
    s.Hq = num(f[1], "Hq");
    s.Hkv = num(f[2], "Hkv");
    s.Lq = num(f[3], "Lq");
    s.Lk = num(f[4], "Lk");
    const auto colon = f[5].find(':');
    s.Dk = num(f[5].substr(0, colon), "Dk");
    s.Dv = colon == std::string::npos ? s.Dk : num(f[5].substr(colon + 1), "Dv");
    const std::string& cz = f[6];
    if (cz == "0" || cz == "no" || cz == "none") s.causal = Causal::none;
    else if (cz == "1" || cz == "yes" || cz == "top-left") s.causal = Causal::top_left;
    else if (cz == "bottom-right") s.causal = Causal::bottom_right;
    else throw Error("--shape-custom: causal must be 0, 1, none, top-left or bottom-right but got '" + cz + "'");
    if (s.Hq % s.Hkv != 0)
        throw Error("--shape-custom: Hq (" + std::to_string(s.Hq) + ") must be a multiple of Hkv (" + std::to_string(s.Hkv) + ")");
    // The cases size Q, K, V, O (and dQ, dK, dV, dO) in int64 bytes: a shape whose count wraps
    // would pass their "too big for this machine" checks as a small one.
    std::int64_t total = 0;
    bool wraps = false;
    const auto elements = [&](std::int64_t h, std::int64_t l, std::int64_t d) {
        std::int64_t n = 0;
        wraps |= __builtin_mul_overflow(s.B, h, &n) || __builtin_mul_overflow(n, l, &n) || __builtin_mul_overflow(n, d, &n);
        return n;
    };
    for (const std::int64_t n : {elements(s.Hq, s.Lq, s.Dk), elements(s.Hkv, s.Lk, s.Dk), elements(s.Hkv, s.Lk, s.Dv),
                                 elements(s.Hq, s.Lq, s.Dv)})
        wraps |= __builtin_add_overflow(total, n, &total);
    constexpr std::int64_t kMaxBytesPerElement = 16;  // float64, or float32 with its gradient
    if (wraps || total > std::numeric_limits<std::int64_t>::max() / kMaxBytesPerElement)
        throw Error("--shape-custom: Q, K, V and O of '" + text + "' hold more elements than a 64-bit byte count can size");
    return s;
}

}  // namespace attn::bench
