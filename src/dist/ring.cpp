// Ring attention over MPI. docs/ring.md has the pictures (layouts, block kinds, the ring).
//
// Per rank, in three phases:
//   1. checks, all inside run_collectively so every rank agrees before anything is written:
//      local arguments, then the local descriptors of all ranks (shapes, options, lengths);
//      the K/V ring buffers and accumulators are allocated here too (an allocation failure
//      is an argument problem for the caller, not a hang for the other ranks);
//   2. the ring: P steps; at step s the rank holds the K/V block of rank (r − s) mod P, posts
//      MPI_Irecv (next block, from the left) and MPI_Isend (this block, to the right) into
//      the other of two buffers, computes this block with attn::sdpa per (query segment,
//      key segment) pair, merges by log-sum-exp, then waits for the transfer;
//   3. writes out (and lse) from the accumulators.
#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <limits>
#include <new>
#include <string>

#include "../core/check.hpp"
#include "../sdpa/problem.hpp"
#include "attn/error.hpp"
#include "attn/ring.hpp"
#include "block_plan.hpp"
#include "../core/threads.hpp"

namespace attn::dist {
namespace {

using attn::detail::fail;

using Clock = std::chrono::steady_clock;
constexpr double kNegInf = -std::numeric_limits<double>::infinity();
constexpr int kTagKV = 7101;

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }
double cpu_now() {
    timespec ts{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}
constexpr std::string_view kOp = "ring_attention";

// What every rank must agree on, plus its local lengths. Gathered from all ranks.
struct Descriptor {
    std::int64_t B, Hq, Hkv, Dk, Dv, nq, nk;
    std::int64_t causal, window_left, window_right, window_align, has_offset, offset_per_sequence, offset_value;
    std::int64_t layout, impl, has_key_lengths, has_scale;
    double scale;
};
constexpr int kDescriptorWords = 19;
static_assert(sizeof(Descriptor) == kDescriptorWords * sizeof(std::int64_t));

// make_problem wants every length >= 1, but a rank may hold no rows (L < chunks): its checks
// then run on a zero-filled one-row stand-in with the same dtype and other sizes.
TensorView one_row_if_empty(const TensorView& t, Tensor& storage) {
    if (t.dim(2) != 0) return t;
    Shape s = t.shape();
    s.dims[2] = 1;
    storage = Tensor(t.dtype(), s, true);
    return storage.view();
}

// Phase 1a: this rank's arguments on their own (no communication): the local problem's checks
// are sdpa's (make_problem), plus what only the ring requires. key_lengths are global
// positions, checked against the global Lk once the ranks have agreed on it.
Descriptor check_local(const TensorView& q, const TensorView& k, const TensorView& v, const RingOptions& o,
                       const TensorView& out, const TensorView* lse) {
    const struct {
        const TensorView* t;
        const char* name;
        const char* layout;
    } floats[] = {{&q, "Q", "(B, Hq, Lq_local, Dk)"}, {&k, "K", "(B, Hkv, Lk_local, Dk)"},
                  {&v, "V", "(B, Hkv, Lk_local, Dv)"}, {&out, "out", "(B, Hq, Lq_local, Dv)"}};
    for (const auto& f : floats) {
        attn::detail::require_rank(kOp, *f.t, f.name, 4, f.layout);
        if (f.t->dtype() != DType::f32) {
            fail(kOp, f.name, ": dtype must be float32 (ring attention computes in float32) but got ",
                               dtype_name(f.t->dtype()));
        }
    }
    if (o.impl == Impl::decode) {
        fail(kOp, "impl: must be automatic, reference or flash (a block may hold more rows than the "
                                "decode kernel takes) but got decode");
    }
    SdpaOptions local;
    local.scale = o.scale;
    local.causal = o.causal;
    local.window = o.window;
    local.query_offset = o.query_offset;
    Tensor stand_in[5];
    const TensorView lse_view = lse != nullptr ? one_row_if_empty(*lse, stand_in[4]) : TensorView();
    attn::detail::make_problem(one_row_if_empty(q, stand_in[0]), one_row_if_empty(k, stand_in[1]),
                               one_row_if_empty(v, stand_in[2]), local, one_row_if_empty(out, stand_in[3]),
                               lse != nullptr ? &lse_view : nullptr, nullptr, kOp);
    // key_lengths are global positions: their values are checked once the global Lk is known.
    if (o.key_lengths) attn::detail::require_per_sequence(kOp, *o.key_lengths, "key_lengths", q.dim(0));
    // The local kernel must accept these calls (Impl::flash may be missing or decline): probe it
    // on one zero row now, so that it cannot refuse inside the ring, where no rank can back out.
    {
        Tensor pq(DType::f32, Shape{1, 1, 1, q.dim(3)}, true), pv(DType::f32, Shape{1, 1, 1, v.dim(3)}, true);
        Tensor po(DType::f32, Shape{1, 1, 1, v.dim(3)}), pl(DType::f32, Shape{1, 1, 1});
        const TensorView plv = pl.view();
        SdpaOptions so;
        so.impl = o.impl;
        try {
            sdpa(pq, pq, pv, so, po, &plv);
        } catch (const Error& e) {
            fail(kOp, e.what());
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
    return d;
}

// Phase 1b: the descriptors of all ranks, checked identically on every rank.
void check_across(const std::vector<Descriptor>& all, int P, std::int64_t& Lq, std::int64_t& Lk) {
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
        const bool same_options =
            d.causal == d0.causal && d.window_left == d0.window_left && d.window_right == d0.window_right &&
            d.window_align == d0.window_align && d.has_offset == d0.has_offset &&
            d.offset_per_sequence == d0.offset_per_sequence && d.offset_value == d0.offset_value &&
            d.layout == d0.layout && d.impl == d0.impl && d.has_key_lengths == d0.has_key_lengths &&
            d.has_scale == d0.has_scale && (!d.has_scale || d.scale == d0.scale);
        if (!same_options) {
            fail(kOp, who, "was called with other options (causal, window, query_offset, layout, impl, scale or "
                           "key_lengths) than rank 0");
        }
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
        // One K/V block travels as one message of floats; MPI counts are int.
        const std::int64_t words = d.B * d.Hkv * d.nk * (d.Dk + d.Dv);
        if (words > INT_MAX) {
            fail(kOp, "rank ", r, "'s K/V block has ", words, " floats, more than one MPI message holds (", INT_MAX,
                 "); use more ranks");
        }
    }
}

// A duplicate of the caller's communicator for the duration of one call (collective).
struct PrivateComm {
    MPI_Comm comm = MPI_COMM_NULL;
    explicit PrivateComm(MPI_Comm c) { MPI_Comm_dup(c, &comm); }
    ~PrivateComm() { MPI_Comm_free(&comm); }
    PrivateComm(const PrivateComm&) = delete;
    PrivateComm& operator=(const PrivateComm&) = delete;
};

// A segment with where it starts in the rank's local rows.
struct Placed {
    Segment g;
    std::int64_t local = 0;
};

std::vector<Placed> place(const std::vector<Segment>& segs) {
    std::vector<Placed> out;
    std::int64_t at = 0;
    for (const Segment& s : segs) {
        out.push_back({s, at});
        at += s.length;
    }
    return out;
}

// Copy a (B, H, n, D) float32 view (any strides) into contiguous memory at dst.
void pack(const TensorView& src, float* dst) {
    const std::int64_t B = src.dim(0), H = src.dim(1), n = src.dim(2), D = src.dim(3);
    const float* s = src.data_as<const float>();
    for (std::int64_t b = 0; b < B; ++b)
        for (std::int64_t h = 0; h < H; ++h)
            for (std::int64_t i = 0; i < n; ++i)
                for (std::int64_t d = 0; d < D; ++d) *dst++ = s[src.offset(b, h, i, d)];
}

// run_collectively, optionally naming the failing rank when not every rank failed (a problem
// only one rank has is found faster with its number): "ring_attention: rank 2: Q: …", the
// rank inserted after `op` ("ring_attention: ") when the message starts with it.
void agree(MPI_Comm comm, const std::function<void()>& fn, const std::string& op = {}, bool name_rank = false) {
    int P = 1, rank = 0;
    MPI_Comm_size(comm, &P);
    MPI_Comm_rank(comm, &rank);
    bool failed = true;
    std::string message;
    try {
        fn();
        failed = false;
    } catch (const std::bad_alloc&) {
        message = "out of memory";
    } catch (const std::exception& e) {
        message = e.what();
    } catch (...) {
        message = "unknown exception";
    }
    // {lowest failing rank, number of failing ranks}
    int mine[2] = {failed ? rank : P, failed ? 1 : 0}, first = P, count = 0;
    MPI_Allreduce(&mine[0], &first, 1, MPI_INT, MPI_MIN, comm);
    if (first == P) return;
    MPI_Allreduce(&mine[1], &count, 1, MPI_INT, MPI_SUM, comm);
    // Every rank throws the message of the lowest failing rank.
    long long length = rank == first ? static_cast<long long>(message.size()) : 0;
    MPI_Bcast(&length, 1, MPI_LONG_LONG, first, comm);
    message.resize(static_cast<std::size_t>(length));
    MPI_Bcast(message.data(), static_cast<int>(length), MPI_CHAR, first, comm);
    if (name_rank && count < P) {
        const std::size_t at = message.rfind(op, 0) == 0 ? op.size() : 0;
        message.insert(at, "rank " + std::to_string(first) + ": ");
    }
    throw Error(message);
}

}  // namespace

void run_collectively(MPI_Comm comm, const std::function<void()>& fn) { agree(comm, fn); }

namespace {

// A (B,) option every rank passes: returns rank 0's values; every rank checks its own with
// `check(b, value)` and against rank 0's, collectively.
std::vector<std::int64_t> agreed_per_sequence(MPI_Comm comm, int rank, const TensorView& t, const char* name,
                                              const std::function<void(std::int64_t, std::int64_t)>& check) {
    const std::int64_t B = t.dim(0);
    std::vector<std::int64_t> own(static_cast<std::size_t>(B));
    for (std::int64_t b = 0; b < B; ++b) own[static_cast<std::size_t>(b)] = attn::detail::load_int(t, t.offset(b));
    std::vector<std::int64_t> first = own;
    MPI_Bcast(first.data(), static_cast<int>(B), MPI_INT64_T, 0, comm);
    run_collectively(comm, [&] {
        for (std::int64_t b = 0; b < B; ++b) {
            const std::int64_t mine = own[static_cast<std::size_t>(b)], zero = first[static_cast<std::size_t>(b)];
            check(b, mine);
            if (mine != zero) fail(kOp, name, ": rank ", rank, " has entry ", b, " = ", mine, " but rank 0 has ", zero);
        }
    });
    return first;
}

}  // namespace

void ring_attention(MPI_Comm user_comm, const TensorView& q, const TensorView& k, const TensorView& v,
                    const RingOptions& options, const TensorView& out, const TensorView* lse, RingStats* stats) {
    const attn::detail::ComputeThreads compute_threads;  // attn::num_threads() for every kernel below
    const auto t_start = Clock::now();
    // Our own communicator, so that no message of ours can match one of the caller's.
    const PrivateComm private_comm(user_comm);
    const MPI_Comm comm = private_comm.comm;
    int P = 1, rank = 0;
    MPI_Comm_size(comm, &P);
    MPI_Comm_rank(comm, &rank);

    // ---- phase 1: checks and allocations, agreed by all ranks ----
    Descriptor mine{};
    agree(comm, [&] { mine = check_local(q, k, v, options, out, lse); }, "ring_attention: ", true);
    std::vector<Descriptor> all(static_cast<std::size_t>(P));
    MPI_Allgather(&mine, kDescriptorWords, MPI_INT64_T, all.data(), kDescriptorWords, MPI_INT64_T, comm);
    std::int64_t Lq = 0, Lk = 0;
    run_collectively(comm, [&] { check_across(all, P, Lq, Lk); });

    const std::int64_t B = mine.B, Hq = mine.Hq, Hkv = mine.Hkv, Dk = mine.Dk, Dv = mine.Dv, nq = mine.nq;
    // The global problem's per-sequence values: rank 0's go to everyone, each rank checks its own
    // against them (a rank with other values would compute another problem).
    std::vector<std::int64_t> key_len(static_cast<std::size_t>(B), Lk), offsets;
    if (options.key_lengths) {
        key_len = agreed_per_sequence(comm, rank, *options.key_lengths, "key_lengths", [&](std::int64_t b, std::int64_t len) {
            if (len < 0 || len > Lk) fail(kOp, "key_lengths: entry ", b, " must be in [0, Lk=", Lk, "] but got ", len);
        });
    }
    if (options.query_offset && options.query_offset->per_sequence) {
        offsets = agreed_per_sequence(comm, rank, *options.query_offset->per_sequence, "query_offset",
                                      [](std::int64_t, std::int64_t) {});  // range: make_problem above
    }
    // The global problem, without tensors: its alignment rule (diagonal_offset) places the bands.
    attn::detail::SdpaProblem global;
    global.B = B;
    global.Lq = Lq;
    global.Lk = Lk;
    global.causal = options.causal;
    global.window = options.window;
    if (options.key_lengths) global.key_lengths = TensorView(key_len.data(), DType::i64, Shape{B});
    if (options.query_offset) {
        global.has_query_offset = true;
        global.query_offset_value = options.query_offset->value;
        if (!offsets.empty()) global.query_offsets = TensorView(offsets.data(), DType::i64, Shape{B});
    }
    const std::vector<detail::Band> bands = detail::global_bands(global);

    const Layout layout = options.layout;
    const std::vector<Placed> q_segs = place(rank_segments(Lq, P, rank, layout));
    std::int64_t nk_max = 0, q_seg_max = 0;
    for (int r = 0; r < P; ++r) nk_max = std::max(nk_max, all[static_cast<std::size_t>(r)].nk);
    for (const Placed& s : q_segs) q_seg_max = std::max(q_seg_max, s.g.length);
    const std::int64_t k_words_per_row = B * Hkv * Dk, v_words_per_row = B * Hkv * Dv;
    auto block_words = [&](int origin) { return all[static_cast<std::size_t>(origin)].nk * (k_words_per_row + v_words_per_row); };

    Tensor buf[2];
    std::vector<double> acc_o, acc_lse;
    Tensor tmp_o, tmp_lse;
    run_collectively(comm, [&] {
        for (Tensor& t : buf) t = Tensor(DType::f32, Shape{std::max<std::int64_t>(1, nk_max * (k_words_per_row + v_words_per_row))});
        acc_o.assign(static_cast<std::size_t>(B * Hq * nq * Dv), 0.0);
        acc_lse.assign(static_cast<std::size_t>(B * Hq * nq), kNegInf);
        tmp_o = Tensor(DType::f32, Shape{std::max<std::int64_t>(1, B * Hq * q_seg_max * Dv)});
        tmp_lse = Tensor(DType::f32, Shape{std::max<std::int64_t>(1, B * Hq * q_seg_max)});
    });

    // ---- phase 2: the ring ----
    // A buffer holds one rank's block: K (B, Hkv, nk, Dk) then V (B, Hkv, nk, Dv), contiguous.
    auto k_view = [&](const Tensor& t, std::int64_t n) { return TensorView(t.data(), DType::f32, Shape{B, Hkv, n, Dk}); };
    auto v_view = [&](const Tensor& t, std::int64_t n) {
        return TensorView(t.data_as<float>() + n * k_words_per_row, DType::f32, Shape{B, Hkv, n, Dv});
    };
    pack(k, buf[0].data_as<float>());
    pack(v, buf[0].data_as<float>() + mine.nk * k_words_per_row);

    // From here on every rank is inside the ring: a failure on one rank cannot be agreed on
    // (its peers wait in MPI calls), so it aborts the job. The checks above make this a
    // should-not-happen path.
    try {
        SdpaOptions sopt;
        sopt.scale = options.scale;
        sopt.impl = options.impl;
        RingStats st;
        st.steps = P;
        const int right = (rank + 1) % P, left = (rank - 1 + P) % P;
        int cur = 0;
        for (int s = 0; s < P; ++s) {
            const int origin = (rank - s + P) % P;  // whose K/V block this rank holds at step s
            MPI_Request req[2];
            int nreq = 0;
            if (s + 1 < P) {
                const int next_origin = (rank - s - 1 + P) % P;  // = the left neighbour's block now
                MPI_Irecv(buf[1 - cur].data(), static_cast<int>(block_words(next_origin)), MPI_FLOAT, left, kTagKV, comm, &req[nreq++]);
                MPI_Isend(buf[cur].data(), static_cast<int>(block_words(origin)), MPI_FLOAT, right, kTagKV, comm, &req[nreq++]);
                st.bytes_sent += block_words(origin) * static_cast<std::int64_t>(sizeof(float));
            }
            const auto t_compute = Clock::now();
            const double cpu_compute = cpu_now();
            const std::int64_t nk_o = all[static_cast<std::size_t>(origin)].nk;
            const TensorView kb = k_view(buf[cur], nk_o), vb = v_view(buf[cur], nk_o);
            for (const Placed& qs : q_segs) {
                if (qs.g.length == 0) continue;
                for (const Placed& ks : place(rank_segments(Lk, P, origin, layout))) {
                    if (ks.g.length == 0) continue;
                    for (detail::BlockCall& c : detail::plan_block(bands, qs.g, ks.g)) {
                        SdpaOptions o = sopt;
                        o.causal = c.causal;
                        o.window.left = c.window_left;
                        if (c.has_offset) o.query_offset = TensorView(c.offset.data(), DType::i64, Shape{c.nb});
                        if (c.has_key_lengths) o.key_lengths = TensorView(c.key_lengths.data(), DType::i64, Shape{c.nb});
                        const TensorView qv = q.slice(0, c.b0, c.nb).slice(2, qs.local + c.row0, c.rows);
                        const TensorView kv = kb.slice(0, c.b0, c.nb).slice(2, ks.local + c.key0, c.keys);
                        const TensorView vv = vb.slice(0, c.b0, c.nb).slice(2, ks.local + c.key0, c.keys);
                        const TensorView ov(tmp_o.data(), DType::f32, Shape{c.nb, Hq, c.rows, Dv});
                        const TensorView lv(tmp_lse.data(), DType::f32, Shape{c.nb, Hq, c.rows});
                        SdpaReport report;
                        sdpa(qv, kv, vv, o, ov, &lv, nullptr, &report);
                        st.kernel = report.kernel;
                        ++st.sdpa_calls;
                        st.score_entries += Hq * c.visible;

                        // Merge by log-sum-exp: with m = max(ℓ, ℓ'),
                        //   O ← (e^{ℓ−m}·O + e^{ℓ'−m}·O') / (e^{ℓ−m} + e^{ℓ'−m}),  ℓ ← m + log(e^{ℓ−m} + e^{ℓ'−m}).
                        // A row that saw no key here has ℓ' = −inf and changes nothing.
                        const float* po = tmp_o.data_as<const float>();
                        const float* pl = tmp_lse.data_as<const float>();
                        for (std::int64_t bh = 0; bh < c.nb * Hq; ++bh) {
                            for (std::int64_t a = 0; a < c.rows; ++a) {
                                const double l_new = pl[bh * c.rows + a];
                                if (l_new == kNegInf) continue;
                                const std::int64_t row = (c.b0 * Hq + bh) * nq + qs.local + c.row0 + a;
                                double& l_acc = acc_lse[static_cast<std::size_t>(row)];
                                double* o_acc = acc_o.data() + row * Dv;
                                const float* o_new = po + (bh * c.rows + a) * Dv;
                                if (l_acc == kNegInf) {
                                    for (std::int64_t d = 0; d < Dv; ++d) o_acc[d] = o_new[d];
                                    l_acc = l_new;
                                    continue;
                                }
                                const double m = std::max(l_acc, l_new);
                                const double wa = std::exp(l_acc - m), wn = std::exp(l_new - m), sum = wa + wn;
                                for (std::int64_t d = 0; d < Dv; ++d) o_acc[d] = (wa * o_acc[d] + wn * o_new[d]) / sum;
                                l_acc = m + std::log(sum);
                            }
                        }
                    }
                    // Without a progress thread, MPI moves a large message only inside MPI calls:
                    // poke it between blocks so the transfer overlaps this step's compute.
                    if (nreq > 0) {
                        int done = 0;
                        MPI_Testall(nreq, req, &done, MPI_STATUSES_IGNORE);
                        if (done) nreq = 0;
                    }
                }
            }
            st.compute_seconds += since(t_compute);
            st.compute_cpu_seconds += cpu_now() - cpu_compute;
            if (nreq > 0) {
                const auto t_wait = Clock::now();
                MPI_Waitall(nreq, req, MPI_STATUSES_IGNORE);
                st.wait_seconds += since(t_wait);
            }
            cur = 1 - cur;
        }

        // ---- phase 3: results ----
        for (std::int64_t b = 0; b < B; ++b)
            for (std::int64_t h = 0; h < Hq; ++h)
                for (std::int64_t i = 0; i < nq; ++i) {
                    const std::int64_t row = (b * Hq + h) * nq + i;
                    const double* o = acc_o.data() + row * Dv;
                    float* dst = out.data_as<float>();
                    for (std::int64_t d = 0; d < Dv; ++d) dst[out.offset(b, h, i, d)] = static_cast<float>(o[d]);
                    if (lse != nullptr) {
                        const double l = acc_lse[static_cast<std::size_t>(row)];
                        if (lse->dtype() == DType::f32) lse->data_as<float>()[lse->offset(b, h, i)] = static_cast<float>(l);
                        else lse->data_as<double>()[lse->offset(b, h, i)] = l;
                    }
                }
        st.total_seconds = since(t_start);
        if (stats != nullptr) *stats = st;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "attn: error: ring_attention: rank %d failed inside the ring: %s (aborting all ranks)\n", rank,
                     e.what());
        MPI_Abort(comm, 2);
    }
}

}  // namespace attn::dist
