// Phase 1 of the ring, shared by the forward (ring.cpp) and the backward (ring_backward.cpp):
// checks, all inside run_collectively so every rank agrees before anything is written — local
// arguments, then the local descriptors of all ranks (shapes, options, lengths) and the
// per-sequence options — and the global problem's bands.
#include "ring_setup.hpp"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <ctime>
#include <new>
#include <optional>
#include <string>

#include "../core/check.hpp"
#include "../core/checked_size.hpp"
#include "../sdpa/problem.hpp"
#include "attn/error.hpp"

namespace attn::dist::detail {

using attn::detail::fail;
using attn::detail::fail_type;

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }
double cpu_now() {
    timespec ts{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

std::vector<Placed> place(const std::vector<Segment>& segs) {
    std::vector<Placed> out;
    std::int64_t at = 0;
    for (const Segment& s : segs) {
        out.push_back({s, at});
        at += s.length;
    }
    return out;
}

std::int64_t pack(const TensorView& src, void* dst) {
    const std::int64_t B = src.dim(0), H = src.dim(1), n = src.dim(2), D = src.dim(3);
    const std::size_t size = dtype_size(src.dtype());
    const char* s = static_cast<const char*>(src.data());
    char* d = static_cast<char*>(dst);
    for (std::int64_t b = 0; b < B; ++b)
        for (std::int64_t h = 0; h < H; ++h)
            for (std::int64_t i = 0; i < n; ++i)
                for (std::int64_t e = 0; e < D; ++e, d += size)
                    std::memcpy(d, s + src.offset(b, h, i, e) * static_cast<std::int64_t>(size), size);
    return d - static_cast<char*>(dst);
}

WireUnit wire_unit(DType k, DType v) {
    if (k == DType::f32 && v == DType::f32) return {MPI_FLOAT, 4};
    return {MPI_UINT16_T, 2};
}

std::int64_t RingContext::buffer_bytes() const {
    std::int64_t most = 1;
    for (int r = 0; r < P; ++r) most = std::max(most, block_bytes(r));
    return most;
}

namespace {

// make_problem wants every length >= 1, but a rank may hold no rows (L < chunks): its checks
// then run on a zero-filled one-row stand-in with the same dtype and other sizes.
TensorView one_row_if_empty(const TensorView& t, Tensor& storage) {
    if (t.dim(2) != 0) return t;
    Shape s = t.shape();
    s.dims[2] = 1;
    storage = Tensor(t.dtype(), s, true);
    return storage.view();
}

}  // namespace

void require_intracommunicator(MPI_Comm c, std::string_view op) {
    if (c == MPI_COMM_NULL) fail(op, "comm: MPI_COMM_NULL is not a communicator (pass MPI_COMM_WORLD or one of its splits)");
    int inter = 0;
    MPI_Comm_test_inter(c, &inter);
    if (inter) {
        fail(op, "comm: an intercommunicator (its messages go to the other group): ", op, " runs on one group of "
                 "ranks; pass an intracommunicator (MPI_COMM_WORLD or one of its splits)");
    }
}

PrivateComm::PrivateComm(MPI_Comm c, std::string_view op) {
    require_intracommunicator(c, op);
    MPI_Comm_dup(c, &comm);
}

SdpaOptions sdpa_options_of(const RingOptions& o) {
    SdpaOptions s;
    s.scale = o.scale;
    s.causal = o.causal;
    s.window = o.window;
    s.query_offset = o.query_offset;
    s.softcap = o.softcap;
    s.sinks = o.sinks;
    s.alibi_slopes = o.alibi_slopes;
    s.dropout_p = o.dropout_p;
    s.dropout_seed = o.dropout_seed;
    return s;
}

namespace {

// Phase 1a: this rank's arguments on their own (no communication): the local problem's checks
// are sdpa's (make_problem), plus what only the ring requires. key_lengths are global
// positions, checked against the global Lk once the ranks have agreed on it.
Descriptor check_local(std::string_view kOp, const TensorView& q, const TensorView& k, const TensorView& v, const RingOptions& o,
                       const TensorView& out, const TensorView* lse, attn::detail::OutLse out_lse) {
    const struct {
        const TensorView* t;
        const char* name;
        const char* layout;
    } floats[] = {{&q, "Q", "(B, Hq, Lq_local, Dk)"}, {&k, "K", "(B, Hkv, Lk_local, Dk)"},
                  {&v, "V", "(B, Hkv, Lk_local, Dv)"}, {&out, "out", "(B, Hq, Lq_local, Dv)"}};
    for (const auto& f : floats) {
        attn::detail::require_rank(kOp, *f.t, f.name, 4, f.layout);
        const DType t = f.t->dtype();
        if (t != DType::f32 && t != DType::f16 && t != DType::bf16) {
            fail_type(kOp, f.name, ": dtype must be float32, float16 or bfloat16 (ring attention computes in float32; "
                              "16-bit K/V travel as they are) but got ", dtype_name(t));
        }
    }
    attn::detail::require_enum(kOp, "layout", o.layout, 2, "Layout::contiguous, zigzag");
    attn::detail::require_enum(kOp, "impl", o.impl, 4, "Impl::automatic, reference, flash, decode");
    if (o.impl == Impl::decode) {
        // The backward refuses reference too (ring_backward.cpp): each says what it takes.
        fail(kOp, "impl: must be ", kOp == "ring_attention_backward" ? "automatic or flash" : "automatic, reference or flash",
             " (a block may hold more rows than the decode kernel takes) but got decode");
    }
    SdpaOptions local = sdpa_options_of(o);  // make_problem checks them as sdpa does
    Tensor stand_in[5];
    const TensorView lse_view = lse != nullptr ? one_row_if_empty(*lse, stand_in[4]) : TensorView();
    attn::detail::make_problem(one_row_if_empty(q, stand_in[0]), one_row_if_empty(k, stand_in[1]),
                               one_row_if_empty(v, stand_in[2]), local, one_row_if_empty(out, stand_in[3]),
                               lse != nullptr ? &lse_view : nullptr, nullptr, kOp, out_lse);
    // key_lengths are global positions: their values are checked once the global Lk is known.
    if (o.key_lengths) attn::detail::require_per_sequence(kOp, *o.key_lengths, "key_lengths", q.dim(0));
    local.key_lengths = o.key_lengths;  // for the overlap check: sdpa's rule, on the local tensors
    if (out_lse == attn::detail::OutLse::written)  // the backward's inputs: its gradients are kept apart from them
        attn::detail::require_outputs_apart(kOp, {{&q, "Q"}, {&k, "K"}, {&v, "V"}}, local, {{&out, "out"}, {lse, "lse"}});
    // The local kernel must accept these calls (Impl::flash may be missing or decline): probe it
    // on one zero row now, so that it cannot refuse inside the ring, where no rank can back out.
    {
        // The blocks' own dtypes, and float32 out/lse as the ring's block calls write them.
        Tensor pq(q.dtype(), Shape{1, 1, 1, q.dim(3)}, true), pk(k.dtype(), Shape{1, 1, 1, q.dim(3)}, true),
            pv(v.dtype(), Shape{1, 1, 1, v.dim(3)}, true);
        Tensor po(DType::f32, Shape{1, 1, 1, v.dim(3)}), pl(DType::f32, Shape{1, 1, 1});
        const TensorView plv = pl.view();
        SdpaOptions so;
        so.impl = o.impl;
        try {
            sdpa(pq, pk, pv, so, po, &plv);
        } catch (const Error& e) {
            attn::detail::fail_as(e.kind(), kOp, e.what());
        }
    }
    Descriptor d{};
    d.B = q.dim(0);
    d.Hq = q.dim(1);
    d.nq = q.dim(2);
    d.Dk = q.dim(3);
    d.Hkv = k.dim(1);
    d.nk = k.dim(2);
    d.Dv = v.dim(3);
    d.causal = static_cast<std::int64_t>(o.causal);
    d.window_left = o.window.left;
    d.window_right = o.window.right;
    d.window_align = static_cast<std::int64_t>(o.window.align);
    d.has_offset = o.query_offset ? 1 : 0;
    d.offset_per_sequence = o.query_offset && o.query_offset->per_sequence ? 1 : 0;
    d.offset_value = o.query_offset && !o.query_offset->per_sequence ? o.query_offset->value : 0;
    d.layout = static_cast<std::int64_t>(o.layout);
    d.impl = static_cast<std::int64_t>(o.impl);
    d.has_key_lengths = o.key_lengths ? 1 : 0;
    d.has_scale = o.scale ? 1 : 0;
    d.scale = o.scale.value_or(0.0);
    d.tensor_modifiers = (o.sinks ? 1 : 0) | (o.alibi_slopes ? 2 : 0);
    d.softcap = o.softcap;
    d.dropout_p = o.dropout_p;
    d.dropout_seed = static_cast<std::int64_t>(o.dropout_seed.value_or(0));  // given when dropout_p > 0 (make_problem)
    d.k_dtype = static_cast<std::int64_t>(k.dtype());
    d.v_dtype = static_cast<std::int64_t>(v.dtype());
    return d;
}

// B·Hkv·nk·(k + v) of a rank's K/V block (k, v: per row of K and of V), or nullopt when it
// cannot be counted in 64 bits.
std::optional<std::int64_t> block_count(const Descriptor& d, std::int64_t k, std::int64_t v) {
    const auto heads = attn::detail::size_mul(d.B, d.Hkv);
    const auto rows = heads ? attn::detail::size_mul(*heads, d.nk) : std::nullopt;
    const auto row = attn::detail::size_add(k, v);
    return rows && row ? attn::detail::size_mul(*rows, *row) : std::nullopt;
}

// The options every rank must pass alike, named with both ranks' values: "rank 1 was called with
// causal top_left but rank 0 with causal none". What the call computes is compared, not how it
// was spelt: the scale as used (an explicit 1/sqrt(Dk) is the default), the seed only with dropout.
void check_same_options(std::string_view kOp, const std::string& who, const Descriptor& d, const Descriptor& d0) {
    const auto differ = [&](bool differs, const std::string& name, const std::string& value, const std::string& value0) {
        if (differs) {
            fail(kOp, who, "was called with ", name, " ", value, " but rank 0 with ", name, " ", value0,
                 " (every rank must pass the same options)");
        }
    };
    const auto num = [](auto x) { return attn::detail::shortest(static_cast<double>(x)); };
    const auto causal = [](std::int64_t c) { return c == 0 ? std::string("none") : c == 1 ? "top_left" : "bottom_right"; };
    const auto align = [](std::int64_t a) { return a == 0 ? std::string("top_left") : "bottom_right"; };
    const auto offset = [&](const Descriptor& x) {
        return !x.has_offset ? std::string("none") : x.offset_per_sequence ? "per sequence" : std::to_string(x.offset_value);
    };
    const auto given = [](std::int64_t bits, std::int64_t bit) { return std::string(bits & bit ? "given" : "not given"); };
    const auto scale_used = [](const Descriptor& x) { return x.has_scale ? x.scale : 1.0 / std::sqrt(static_cast<double>(x.Dk)); };
    differ(d.causal != d0.causal, "causal", causal(d.causal), causal(d0.causal));
    differ(d.window_left != d0.window_left || d.window_right != d0.window_right, "window",
           "(" + num(d.window_left) + ", " + num(d.window_right) + ")", "(" + num(d0.window_left) + ", " + num(d0.window_right) + ")");
    differ(d.window_align != d0.window_align, "window align", align(d.window_align), align(d0.window_align));
    differ(offset(d) != offset(d0), "query_offset", offset(d), offset(d0));
    differ(d.layout != d0.layout, "layout", std::string(layout_name(static_cast<Layout>(d.layout))),
           std::string(layout_name(static_cast<Layout>(d0.layout))));
    differ(d.impl != d0.impl, "impl", std::string(impl_name(static_cast<Impl>(d.impl))), std::string(impl_name(static_cast<Impl>(d0.impl))));
    differ(d.has_key_lengths != d0.has_key_lengths, "key_lengths", d.has_key_lengths ? "given" : "not given",
           d0.has_key_lengths ? "given" : "not given");
    differ(scale_used(d) != scale_used(d0), "scale", num(scale_used(d)), num(scale_used(d0)));
    differ(d.softcap != d0.softcap, "softcap", num(d.softcap), num(d0.softcap));
    differ((d.tensor_modifiers ^ d0.tensor_modifiers) & 1, "sinks", given(d.tensor_modifiers, 1), given(d0.tensor_modifiers, 1));
    differ((d.tensor_modifiers ^ d0.tensor_modifiers) & 2, "alibi_slopes", given(d.tensor_modifiers, 2), given(d0.tensor_modifiers, 2));
    differ((d.tensor_modifiers ^ d0.tensor_modifiers) & kWantsDsinks, "dsinks", given(d.tensor_modifiers, kWantsDsinks),
           given(d0.tensor_modifiers, kWantsDsinks));
    differ(d.dropout_p != d0.dropout_p, "dropout_p", num(d.dropout_p), num(d0.dropout_p));
    differ(d.dropout_p > 0.0 && d.dropout_seed != d0.dropout_seed, "dropout_seed",
           std::to_string(static_cast<std::uint64_t>(d.dropout_seed)), std::to_string(static_cast<std::uint64_t>(d0.dropout_seed)));
}

// Phase 1b: the descriptors of all ranks, checked identically on every rank.
void check_across(std::string_view kOp, const std::vector<Descriptor>& all, int P, std::int64_t& Lq, std::int64_t& Lk) {
    const Descriptor& d0 = all[0];
    Lq = 0;
    Lk = 0;
    for (int r = 0; r < P; ++r) {
        const Descriptor& d = all[static_cast<std::size_t>(r)];
        const std::string who = "rank " + std::to_string(r) + " ";
        auto same = [&](std::int64_t a, std::int64_t b, const char* what) {
            if (a != b) fail(kOp, who, "has ", what, " ", a, " but rank 0 has ", b);
        };
        same(d.B, d0.B, "batch");
        same(d.Hq, d0.Hq, "query heads");
        same(d.Hkv, d0.Hkv, "K/V heads");
        same(d.Dk, d0.Dk, "head dim Dk");
        same(d.Dv, d0.Dv, "head dim Dv");
        if (d.k_dtype != d0.k_dtype || d.v_dtype != d0.v_dtype) {
            fail_type(kOp, who, "has K/V dtypes ", dtype_name(static_cast<DType>(d.k_dtype)), "/",
                 dtype_name(static_cast<DType>(d.v_dtype)), " but rank 0 has ", dtype_name(static_cast<DType>(d0.k_dtype)),
                 "/", dtype_name(static_cast<DType>(d0.v_dtype)), " (the K/V blocks travel between them as they are)");
        }
        if (d.backward != d0.backward) {
            const auto name = [](std::int64_t b) { return b ? "ring_attention_backward" : "ring_attention"; };
            fail(kOp, who, "called ", name(d.backward), " but rank 0 called ", name(d0.backward),
                 " (every rank must make the same call)");
        }
        check_same_options(kOp, who, d, d0);
        Lq += d.nq;
        Lk += d.nk;
    }
    if (Lq < 1) fail(kOp, "the global query length (sum of the ranks' Q lengths) must be >= 1 but is 0");
    if (Lk < 1) fail(kOp, "the global key length (sum of the ranks' K lengths) must be >= 1 but is 0");
    const Layout layout = static_cast<Layout>(d0.layout);
    // Local lengths must be the layout's; name all of them, since one wrong rank also
    // shifts the global length and so what every other rank should hold.
    auto list = [&](auto value) {
        std::string out = "(";
        for (int r = 0; r < P; ++r) out += (r ? ", " : "") + std::to_string(value(r));
        return out + ")";
    };
    const std::string cut = std::string(layout_name(layout)) + " layout over " + std::to_string(P) + " ranks";
    for (int r = 0; r < P; ++r) {
        const Descriptor& d = all[static_cast<std::size_t>(r)];
        if (d.nq != rank_length(Lq, P, r, layout)) {
            fail(kOp, "the ranks hold ", list([&](int i) { return all[static_cast<std::size_t>(i)].nq; }),
                 " rows of Q (Lq = ", Lq, ") but the ", cut, " gives ", list([&](int i) { return rank_length(Lq, P, i, layout); }));
        }
        if (d.nk != rank_length(Lk, P, r, layout)) {
            fail(kOp, "the ranks hold ", list([&](int i) { return all[static_cast<std::size_t>(i)].nk; }),
                 " rows of K/V (Lk = ", Lk, ") but the ", cut, " gives ", list([&](int i) { return rank_length(Lk, P, i, layout); }));
        }
        // One K/V block travels as one message (of wire units: wire_unit); MPI counts are int.
        // The dK/dV accumulators travel as float32 words: the same count or fewer.
        // Counted in 64 bits first: broadcast K/V (stride 0) can have more elements than that.
        const WireUnit unit = wire_unit(static_cast<DType>(d.k_dtype), static_cast<DType>(d.v_dtype));
        const auto k_size = static_cast<std::int64_t>(dtype_size(static_cast<DType>(d.k_dtype)));
        const auto v_size = static_cast<std::int64_t>(dtype_size(static_cast<DType>(d.v_dtype)));
        const auto kb = attn::detail::size_mul(d.Dk, k_size), vb = attn::detail::size_mul(d.Dv, v_size);
        // V starts at K's end rounded up to its element size (RingContext::v_offset).
        std::optional<std::int64_t> bytes;
        if (const auto k_bytes = kb ? block_count(d, *kb, 0) : std::nullopt; k_bytes) {
            const auto k_padded = attn::detail::size_add(*k_bytes, (v_size - *k_bytes % v_size) % v_size);
            const auto v_bytes = vb ? block_count(d, 0, *vb) : std::nullopt;
            if (k_padded && v_bytes) bytes = attn::detail::size_add(*k_padded, *v_bytes);
        }
        const auto words = block_count(d, d.Dk, d.Dv);
        const auto too_many = [&](const std::string& count) {
            fail(kOp, "rank ", r, "'s K/V block has ", count, " elements, more than one MPI message holds (", INT_MAX,
                 "); use more ranks");
        };
        if (!bytes || !words) too_many("more than 2^63");
        const std::int64_t count = std::max(bytes.value() / unit.bytes, words.value());
        if (count > INT_MAX) too_many(std::to_string(count));
    }
}

// run_collectively, optionally naming the failing rank when not every rank failed (a problem
// only one rank has is found faster with its number): "ring_attention: rank 2: Q: …", the
// rank inserted after `op` ("ring_attention: ") when the message starts with it.
}  // namespace

void agree(MPI_Comm comm, const std::function<void()>& fn, const std::string& op, bool name_rank) {
    int P = 1, rank = 0;
    MPI_Comm_size(comm, &P);
    MPI_Comm_rank(comm, &rank);
    bool failed = true, out_of_memory = false, interrupted = false;
    ErrorKind kind = ErrorKind::value;
    std::string message;
    try {
        fn();
        failed = false;
    } catch (const Interrupted&) {  // a std::runtime_error, not an argument error: caught first
        interrupted = true;
    } catch (const std::bad_alloc& e) {
        // attn::OutOfMemory names the buffer and the bytes; a bare std::bad_alloc names nothing.
        message = dynamic_cast<const OutOfMemory*>(&e) != nullptr ? e.what() : "out of memory";
        out_of_memory = true;
    } catch (const Error& e) {
        message = e.what();
        kind = e.kind();
    } catch (const std::exception& e) {
        message = e.what();
    } catch (...) {
        message = "unknown exception";
    }
    // Which rank's outcome every rank takes, in one reduction: the lowest interrupted rank (rank),
    // else the lowest failing one (P + rank); 2P when every rank succeeded. An interrupt comes
    // first: its rank's caller asked to stop (Python's Ctrl-C), which must stay attn::Interrupted
    // there whatever a peer's error, and every rank must take the same branch afterwards.
    int key = interrupted ? rank : failed ? P + rank : 2 * P, lowest = 2 * P;
    MPI_Allreduce(&key, &lowest, 1, MPI_INT, MPI_MIN, comm);
    if (lowest == 2 * P) return;
    if (lowest < P) {
        throw Interrupted("interrupted: rank " + std::to_string(lowest) +
                          " was interrupted (its caller's interrupt flag was set), so the collective call stopped on every "
                          "rank (outputs may be partially written)");
    }
    const int first = lowest - P;
    int mine = failed ? 1 : 0, count = 0;  // the number of failing ranks
    MPI_Allreduce(&mine, &count, 1, MPI_INT, MPI_SUM, comm);
    // Every rank throws the message of the lowest failing rank, and its kind: running out of
    // memory stays attn::OutOfMemory (Python's MemoryError), not an argument error, and an
    // Error keeps its ErrorKind (a dtype one is Python's TypeError on every rank).
    const bool sender = rank == first;
    long long head[3] = {sender ? static_cast<long long>(message.size()) : 0, sender && out_of_memory ? 1 : 0,
                         sender ? static_cast<long long>(kind) : 0};
    MPI_Bcast(head, 3, MPI_LONG_LONG, first, comm);
    message.resize(static_cast<std::size_t>(head[0]));
    MPI_Bcast(message.data(), static_cast<int>(head[0]), MPI_CHAR, first, comm);
    if (name_rank && count < P) {
        const std::size_t at = message.rfind(op, 0) == 0 ? op.size() : 0;
        message.insert(at, "rank " + std::to_string(first) + ": ");
    }
    if (head[1] != 0) throw OutOfMemory(message);
    throw Error(message, static_cast<ErrorKind>(head[2]));
}

namespace {

// A (B,) option every rank passes: returns rank 0's values; every rank checks its own with
// `check(b, value)` and against rank 0's, collectively.
std::vector<std::int64_t> agreed_per_sequence(std::string_view kOp, MPI_Comm comm, int rank, const TensorView& t, const char* name,
                                              const std::function<void(std::int64_t, std::int64_t)>& check) {
    const std::int64_t B = t.dim(0);
    std::vector<std::int64_t> own(static_cast<std::size_t>(B));
    for (std::int64_t b = 0; b < B; ++b) own[static_cast<std::size_t>(b)] = attn::detail::load_int(t, t.offset(b));
    std::vector<std::int64_t> first = own;
    MPI_Bcast(first.data(), static_cast<int>(B), MPI_INT64_T, 0, comm);
    agree(comm, [&] {
        for (std::int64_t b = 0; b < B; ++b) {
            const std::int64_t mine = own[static_cast<std::size_t>(b)], zero = first[static_cast<std::size_t>(b)];
            check(b, mine);
            if (mine != zero) fail(kOp, name, ": rank ", rank, " has entry ", b, " = ", mine, " but rank 0 has ", zero);
        }
    });
    return first;
}

}  // namespace

void setup_ring(RingContext& ctx, std::string_view op, const TensorView& q, const TensorView& k, const TensorView& v,
                const RingOptions& options, const TensorView& out, const TensorView* lse, attn::detail::OutLse out_lse,
                const std::function<void()>& extra) {
    const std::string kOp(op);
    MPI_Comm comm = ctx.comm;
    MPI_Comm_size(comm, &ctx.P);
    MPI_Comm_rank(comm, &ctx.rank);
    const int P = ctx.P, rank = ctx.rank;
    agree(
        comm,
        [&] {
            ctx.mine = check_local(op, q, k, v, options, out, lse, out_lse);
            if (extra) extra();
        },
        kOp + ": ", true);
    ctx.all.assign(static_cast<std::size_t>(P), Descriptor{});
    MPI_Allgather(&ctx.mine, kDescriptorWords, MPI_INT64_T, ctx.all.data(), kDescriptorWords, MPI_INT64_T, comm);
    agree(comm, [&] { check_across(op, ctx.all, P, ctx.Lq, ctx.Lk); });

    const std::int64_t B = ctx.mine.B, Lk = ctx.Lk;
    // The global problem's per-sequence values: rank 0's go to everyone, each rank checks its own
    // against them (a rank with other values would compute another problem).
    ctx.key_len.assign(static_cast<std::size_t>(B), Lk);
    if (options.key_lengths) {
        ctx.key_len = agreed_per_sequence(op, comm, rank, *options.key_lengths, "key_lengths", [&](std::int64_t b, std::int64_t len) {
            if (len < 0 || len > Lk) fail(op, "key_lengths: entry ", b, " must be in [0, Lk=", Lk, "] but got ", len);
        });
    }
    if (options.query_offset && options.query_offset->per_sequence) {
        ctx.offsets = agreed_per_sequence(op, comm, rank, *options.query_offset->per_sequence, "query_offset",
                                          [](std::int64_t, std::int64_t) {});  // range: make_problem above
    }
    if (options.sinks) {
        // The sinks' values, like the per-sequence options: rank 0's go to everyone.
        const TensorView& t = *options.sinks;
        const std::int64_t Hq = ctx.mine.Hq;
        std::vector<double> own(static_cast<std::size_t>(Hq));
        for (std::int64_t h = 0; h < Hq; ++h) own[static_cast<std::size_t>(h)] = t.load_as_double(t.offset(h));
        ctx.sinks = own;
        MPI_Bcast(ctx.sinks.data(), static_cast<int>(Hq), MPI_DOUBLE, 0, comm);
        agree(comm, [&] {
            for (std::int64_t h = 0; h < Hq; ++h) {
                const double mine = own[static_cast<std::size_t>(h)], zero = ctx.sinks[static_cast<std::size_t>(h)];
                if (mine != zero) fail(op, "sinks: rank ", rank, " has entry ", h, " = ", mine, " but rank 0 has ", zero);
            }
        });
    }
    if (options.alibi_slopes) {
        // The slopes broadcast to (B, Hq), rank 0's to everyone, checked like the sinks.
        const TensorView& t = *options.alibi_slopes;
        const std::int64_t Hq = ctx.mine.Hq;
        std::vector<float> own(static_cast<std::size_t>(B * Hq));
        for (std::int64_t b = 0; b < B; ++b)
            for (std::int64_t h = 0; h < Hq; ++h)
                own[static_cast<std::size_t>(b * Hq + h)] =
                    t.data_as<const float>()[t.shape().rank == 1 ? t.offset(h) : t.offset(b, h)];
        ctx.slopes = own;
        MPI_Bcast(ctx.slopes.data(), static_cast<int>(B * Hq), MPI_FLOAT, 0, comm);
        agree(comm, [&] {
            for (std::size_t x = 0; x < own.size(); ++x)
                if (own[x] != ctx.slopes[x]) {
                    fail(op, "alibi_slopes: rank ", rank, " has slope ", own[x], " for (b, h) = (", x / Hq, ", ", x % Hq,
                         ") but rank 0 has ", ctx.slopes[x]);
                }
        });
    }
    // The global problem, without tensors: its alignment rule (diagonal_offset) places the bands.
    attn::detail::SdpaProblem global;
    global.B = B;
    global.Lq = ctx.Lq;
    global.Lk = Lk;
    global.causal = options.causal;
    global.window = options.window;
    if (options.key_lengths) global.key_lengths = TensorView(ctx.key_len.data(), DType::i64, Shape{B});
    if (options.query_offset) {
        global.has_query_offset = true;
        global.query_offset_value = options.query_offset->value;
        if (!ctx.offsets.empty()) global.query_offsets = TensorView(ctx.offsets.data(), DType::i64, Shape{B});
    }
    ctx.bands = global_bands(global, options.alibi_slopes.has_value());

    ctx.q_segs = place(rank_segments(ctx.Lq, P, rank, options.layout));
    ctx.nk_max = 0;
    ctx.q_seg_max = 0;
    for (int r = 0; r < P; ++r) ctx.nk_max = std::max(ctx.nk_max, ctx.nk(r));
    for (const Placed& s : ctx.q_segs) ctx.q_seg_max = std::max(ctx.q_seg_max, s.g.length);
    ctx.steps = 1;
    for (int r = 0; r < P; ++r) {
        const std::vector<Segment> qs = rank_segments(ctx.Lq, P, r, options.layout);
        for (int s = ctx.steps; s < P; ++s)
            for (const Segment& q_seg : qs)
                for (const Segment& k_seg : rank_segments(Lk, P, (r - s + P) % P, options.layout))
                    if (!plan_block(ctx.bands, q_seg, k_seg).empty()) ctx.steps = s + 1;
    }
    ctx.k_dtype = static_cast<DType>(ctx.mine.k_dtype);
    ctx.v_dtype = static_cast<DType>(ctx.mine.v_dtype);
    ctx.unit = wire_unit(ctx.k_dtype, ctx.v_dtype);
    ctx.k_words_per_row = B * ctx.mine.Hkv * ctx.mine.Dk;
    ctx.v_words_per_row = B * ctx.mine.Hkv * ctx.mine.Dv;
}

SdpaOptions block_base_options(const RingOptions& o, const RingContext& ctx) {
    SdpaOptions base;
    base.scale = o.scale;
    base.impl = o.impl;
    base.softcap = o.softcap;
    base.dropout_p = o.dropout_p;
    base.dropout_seed = o.dropout_seed;
    base.alibi_slopes = ctx.slopes_view();
    return base;
}

SdpaOptions block_options(const SdpaOptions& base, const BlockCall& c) {
    SdpaOptions o = base;
    o.causal = c.causal;
    o.window.left = c.window_left;
    o.window.right = c.window_right;
    // base carries the agreed (B, Hq) slopes: the call's sequences, measured from its offset.
    if (base.alibi_slopes) o.alibi_slopes = base.alibi_slopes->slice(0, c.b0, c.nb);
    if (c.has_offset) o.query_offset = TensorView(const_cast<std::int64_t*>(c.offset.data()), DType::i64, Shape{c.nb});
    if (c.has_key_lengths) o.key_lengths = TensorView(const_cast<std::int64_t*>(c.key_lengths.data()), DType::i64, Shape{c.nb});
    o.dropout_origin = {c.b0, 0, c.global_row0, c.global_key0};
    return o;
}

}  // namespace attn::dist::detail
