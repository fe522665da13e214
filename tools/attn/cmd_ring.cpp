// mpirun -np P attn ring --q Q.npy --k K.npy --v V.npy --out O.npy [--causal [none|top-left|bottom-right]]
//                       [--window-left N] [--window-right N] [--window-align A] [--query-offset N]
//                       [--scale S] [--key-lengths KL.npy] [--layout zigzag|contiguous] [--impl ...] [--stats] [--out-dtype T]
//                       [--grad-out dO.npy --dq dQ.npy --dk dK.npy --dv dV.npy [--dsinks dS.npy]] [--shard-outputs]
//                       [--softcap C] [--alibi-slopes A.npy | --alibi] [--sinks S.npy] [--dropout P --seed N]
//
// Rank 0 reads the whole arrays, sends every rank its rows (the layout's segments), all ranks
// run attn::dist::ring_attention, rank 0 gathers O and writes it atomically. The result equals
// `attn sdpa` on the same inputs (with --causal top-left). With --grad-out, every rank then runs
// ring_attention_backward on its rows of dO and rank 0 gathers and writes dQ, dK, dV too (all
// outputs together, after everything is computed). Every fallible step runs inside
// run_collectively, so on an error every rank takes the same branch: rank 0 alone prints
// `attn: error: <message>` (as main does for other commands), all ranks finalize MPI and exit
// with status 2, and no output file appears. `mpirun -q` keeps mpirun's own exit summary quiet.
#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "attn/error.hpp"
#include "causal_option.hpp"
#include "commands.hpp"
#include "core/check.hpp"
#include "gradient_outputs.hpp"
#include "scale_option.hpp"
#include "threads_option.hpp"

#if ATTN_WITH_MPI
#include <mpi.h>

#include "attn/npy.hpp"
#include "attn/ring.hpp"
#include "dist/ring_setup.hpp"
#include "flag_names.hpp"
#include "output_files.hpp"
#include "sdpa/option_values.hpp"
#include "strict_options.hpp"
#include "tensor_args.hpp"
#endif

namespace attn::cli {
namespace {

struct RingArgs {
    std::string q, k, v, out, key_lengths, layout = "zigzag", impl = "auto", causal = "none";
    GradientOutputs grad;                      // backward: --grad-out, --dq, --dk, --dv, --dsinks
    double softcap = 0.0;                      // score modifiers, as `attn sdpa`
    std::string sinks, alibi_slopes;
    bool alibi = false;  // the standard slopes (attn::alibi_slopes) for Hq heads
    double dropout = 0.0;    // as `attn sdpa`: the same keep mask on global positions
    std::optional<std::uint64_t> seed;
    std::int64_t window_left = -1, window_right = -1;
    std::optional<std::string> window_align;  // --window-align (default top-left; only with a window)
    std::optional<std::int64_t> query_offset;
    std::string query_offsets;  // --query-offsets: a (B,) file, one offset per sequence
    std::optional<double> scale;
    bool stats = false;
    bool shard_outputs = false;  // each rank writes its own rows (shard_path) instead of rank 0 gathering
    std::string out_dtype;       // --out-dtype: O and dQ/dK/dV ("" = O in a 16-bit Q's dtype, else float32;
                                 // each gradient in its input's dtype as the ring reads it)
};

#if ATTN_WITH_MPI

constexpr int kTagRows = 7201;

// --shard-outputs: rank r's file for `path`: "o.npy" → "o.rank<r>.npy", "o.safetensors" →
// "o.rank<r>.safetensors" (else "<path>.rank<r>").
std::string shard_path(const std::string& path, int rank) {
    const std::string tag = ".rank" + std::to_string(rank);
    for (const std::string ext : {".npy", ".safetensors"}) {
        if (path.size() > ext.size() && path.compare(path.size() - ext.size(), ext.size(), ext) == 0)
            return path.substr(0, path.size() - ext.size()) + tag + ext;
    }
    return path + tag;
}

// A .npy or FILE.safetensors:NAME (tensor_args.hpp): float32, float64, float16 or bfloat16.
Tensor read_input(const std::string& flag, const std::string& path) {
    Tensor t = read_tensor_arg(flag, path, {DType::f32, DType::f64, DType::f16, DType::bf16});
    if (t.shape().rank != 4) {
        throw Error(flag + ": " + detail::quoted_path(path) + " must hold a rank-4 array (B, H, L, D) but holds shape " + t.shape().str());
    }
    return t;
}

// What rank 0 learned from the files; broadcast so every rank can size its buffers. Each
// tensor's sizes come from its own file (Dk of Q and of K may differ: ring_attention says so).
struct Header {
    std::int64_t B = 0, Hq = 0, Hkv = 0, Lq = 0, Lk = 0, Dq = 0, Dk = 0, Dv = 0;
    // The dtypes the rows travel and are written in: Q, K, V, dO as read (float64 → float32),
    // out for O (--out-dtype), dq/dk/dv for the gradients (gradient_dtypes).
    std::int64_t q_dtype = 0, k_dtype = 0, v_dtype = 0, do_dtype = 0, out_dtype = 0, dq_dtype = 0, dk_dtype = 0, dv_dtype = 0;
};
constexpr int kHeaderWords = sizeof(Header) / sizeof(std::int64_t);

// A tensor's rows as one MPI message: float32 words or 16-bit halfwords.
MPI_Datatype mpi_type(DType t) { return t == DType::f32 ? MPI_FLOAT : MPI_UINT16_T; }

// The options that decide which collectives a rank runs — whether there is a backward, ALiBi
// slopes to compute, stats to gather, shards instead of a gather — and the layout the scatter
// counts rows by: a rank whose differ would wait for ever in a collective the others never
// enter (or read a message of another length). Each rank compares its own with rank 0's,
// collectively, before anything else. The other options are checked by ring_attention (its
// own agreement) or are rank 0's alone (the files).
void agree_on_flow(MPI_Comm comm, int rank, const RingArgs& a) {
    // One int64 per option: given or not, and the layout parsed (-1: not a layout; the flag
    // check below names it on every rank).
    const char* const flags[] = {"--grad-out", "--dsinks", "--alibi", "--stats", "--shard-outputs", "--layout"};
    std::int64_t layout = -1;
    try {
        layout = static_cast<std::int64_t>(dist::parse_layout(a.layout));
    } catch (const Error&) {
    }
    const std::int64_t mine[] = {!a.grad.grad_out.empty(), !a.grad.dsinks.empty(), a.alibi, a.stats, a.shard_outputs, layout};
    std::int64_t zero[std::size(mine)];
    std::copy(std::begin(mine), std::end(mine), zero);
    MPI_Bcast(zero, static_cast<int>(std::size(zero)), MPI_INT64_T, 0, comm);
    dist::run_collectively(comm, [&] {
        for (std::size_t i = 0; i < std::size(mine); ++i) {
            if (mine[i] == zero[i]) continue;
            const std::string flag = flags[i], r = std::to_string(rank);
            const auto given = [&](std::int64_t x) { return std::string(x != 0 ? "with " : "without ") + flag; };
            if (flag != "--layout") {  // "rank 1 was called with --stats but rank 0 without it"
                throw Error(flag + ": rank " + r + " was called " + given(mine[i]) + " but rank 0 " +
                            (zero[i] != 0 ? "with" : "without") + " it (every rank must pass the same options)");
            }
            if (mine[i] < 0 || zero[i] < 0) continue;  // not a layout: the flag check says so
            throw Error(flag + ": rank " + r + " was called with --layout " +
                        std::string(dist::layout_name(static_cast<dist::Layout>(mine[i]))) + " but rank 0 with --layout " +
                        std::string(dist::layout_name(static_cast<dist::Layout>(zero[i]))) +
                        " (every rank must pass the same options)");
        }
    });
}

// Ring attention computes in float32: a float64 input becomes float32, a 16-bit one stays
// (its K/V rows travel the ring in 16 bits).
Tensor ring_dtype(Tensor t) { return t.dtype() == DType::f64 ? to_dtype(t, DType::f32) : std::move(t); }

void run_ring(MPI_Comm comm, const RingArgs& a) {
    int P = 1, rank = 0;
    MPI_Comm_size(comm, &P);
    MPI_Comm_rank(comm, &rank);

    dist::RingOptions opt;
    opt.scale = a.scale;
    opt.window.left = a.window_left;
    opt.window.right = a.window_right;
    if (a.query_offset) opt.query_offset = *a.query_offset;
    opt.softcap = a.softcap;    // 0 = off; checked below with the other values, collectively
    opt.dropout_p = a.dropout;  // checked with the seed below
    const bool backward = a.grad.backward();
    Header h;
    Tensor q, k, v, dO, lengths, offsets, sinks, slopes;
    std::optional<DType> out_dtype_given;  // --out-dtype, parsed before any file is read
    OutputFiles outputs;
    agree_on_flow(comm, rank, a);
    // Rank 0: flags, output path, files and their global shapes.
    dist::run_collectively(comm, [&] {
        opt.layout = with_flag("--layout", [&] { return dist::parse_layout(a.layout); });
        opt.impl = with_flag("--impl", [&] { return parse_impl(a.impl); });
        opt.causal = causal_option(a.causal);
        opt.dropout_seed = dropout_seed("ring_attention", "--dropout", a.dropout, "--seed", a.seed);
        opt.window.align = window_align_option(a.window_align, a.window_left, a.window_right);
        // sdpa's check of every value that needs no tensor, before any file is read.
        detail::check_option_values(dist::detail::sdpa_options_of(opt), "ring_attention");
        // After the values' checks: a value out of range is named first.
        require_query_offset_use(a.query_offset, a.query_offsets, opt.causal, a.window_left, a.window_right,
                                 a.alibi || !a.alibi_slopes.empty());
        a.grad.check_flags(!a.sinks.empty());
        out_dtype_given = parse_out_dtype(a.out_dtype);
        // Every rank reads the (Hq,) sinks itself; ring_attention checks them and that the ranks agree.
        read_optional_float32_arg("--sinks", a.sinks, sinks, opt.sinks);
        if (a.alibi && !a.alibi_slopes.empty()) throw Error("--alibi: give either --alibi or --alibi-slopes, not both");
        read_optional_float32_arg("--alibi-slopes", a.alibi_slopes, slopes, opt.alibi_slopes);
        // Every rank checks the files it will write: rank 0 all of them, or each rank its shards
        // beside --dsinks, which rank 0 writes (--dsinks o.rank1.npy is rank 1's shard of --out
        // o.npy: the last rename won, and the run exited 0). Two ranks' shards are never one name
        // (shard_path ends in the rank), and the check is collective.
        if (rank != 0 && !a.shard_outputs) return;
        for (const auto& [flag, path] : {std::pair{"--out", &a.out}, {"--dq", &a.grad.dq}, {"--dk", &a.grad.dk}, {"--dv", &a.grad.dv}}) {
            if (!a.shard_outputs) outputs.add(flag, *path);
            else if (!path->empty()) outputs.add(std::string(flag) + " (rank " + std::to_string(rank) + "'s shard)", shard_path(*path, rank));
        }
        outputs.add("--dsinks", a.grad.dsinks);
        for (const auto& [flag, spec] : {std::pair{"--q", &a.q}, {"--k", &a.k}, {"--v", &a.v}, {"--grad-out", &a.grad.grad_out},
                                         {"--key-lengths", &a.key_lengths}, {"--query-offsets", &a.query_offsets},
                                         {"--sinks", &a.sinks}, {"--alibi-slopes", &a.alibi_slopes}})
            outputs.add_input(flag, tensor_arg_file(*spec));
        outputs.check();
        if (rank != 0) return;
        q = read_input("--q", a.q);
        k = read_input("--k", a.k);
        v = read_input("--v", a.v);
        // What the scatter relies on; ring_attention checks everything else (heads, head dims, …).
        if (v.shape()[2] != k.shape()[2]) {
            throw Error("--v: " + detail::quoted_path(a.v) + " has length " + std::to_string(v.shape()[2]) + " but --k " +
                        detail::quoted_path(a.k) + " has length " +
                        std::to_string(k.shape()[2]));
        }
        if (k.shape()[0] != q.shape()[0] || v.shape()[0] != q.shape()[0]) {
            throw Error("--k/--v: batch " + std::to_string(k.shape()[0]) + "/" + std::to_string(v.shape()[0]) +
                        " does not match --q's batch " + std::to_string(q.shape()[0]));
        }
        if (v.shape()[1] != k.shape()[1]) {
            throw Error("--v: " + detail::quoted_path(a.v) + " has " + std::to_string(v.shape()[1]) + " heads but --k " +
                        detail::quoted_path(a.k) + " has " +
                        std::to_string(k.shape()[1]));
        }
        // (B,) integers, one per sequence: rank 0 reads them, every rank gets them below.
        const auto per_sequence = [&](const char* flag, const std::string& spec) {
            if (spec.empty()) return Tensor();
            Tensor t = read_tensor_arg(flag, spec);
            if ((t.dtype() != DType::i32 && t.dtype() != DType::i64) || t.shape().rank != 1 || t.shape()[0] != q.shape()[0]) {
                throw Error(std::string(flag) + ": " + detail::quoted_path(spec) + " must hold int32/int64 of shape (B,) = (" +
                            std::to_string(q.shape()[0]) + ",) but holds " + std::string(dtype_name(t.dtype())) + " " +
                            t.shape().str());
            }
            return t;
        };
        lengths = per_sequence("--key-lengths", a.key_lengths);
        offsets = per_sequence("--query-offsets", a.query_offsets);
        if (backward) {
            dO = read_input("--grad-out", a.grad.grad_out);
            const Shape want{q.shape()[0], q.shape()[1], q.shape()[2], v.shape()[3]};
            if (!(dO.shape() == want)) {
                throw Error("--grad-out: " + a.grad.grad_out + " must have O's shape (B, Hq, Lq, Dv) = " + want.str() +
                            " but has " + dO.shape().str());
            }
            dO = ring_dtype(std::move(dO));
        }
        // O: --out-dtype, default a 16-bit Q's dtype, else float32 (as `attn sdpa`). The gradients:
        // --out-dtype, default each its input's dtype as the ring reads it (float64 → float32).
        const DType out_dtype = out_dtype_for(out_dtype_given, q.dtype());
        q = ring_dtype(std::move(q));
        k = ring_dtype(std::move(k));
        v = ring_dtype(std::move(v));
        const GradientDtypes gdt =
            gradient_dtypes(out_dtype_given, q.dtype(), k.dtype(), v.dtype());
        h = Header{q.shape()[0], q.shape()[1], k.shape()[1], q.shape()[2], k.shape()[2], q.shape()[3], k.shape()[3], v.shape()[3]};
        h.q_dtype = static_cast<std::int64_t>(q.dtype());
        h.k_dtype = static_cast<std::int64_t>(k.dtype());
        h.v_dtype = static_cast<std::int64_t>(v.dtype());
        h.do_dtype = static_cast<std::int64_t>(backward ? dO.dtype() : DType::f32);
        h.out_dtype = static_cast<std::int64_t>(out_dtype);
        h.dq_dtype = static_cast<std::int64_t>(gdt.dq);
        h.dk_dtype = static_cast<std::int64_t>(gdt.dk);
        h.dv_dtype = static_cast<std::int64_t>(gdt.dv);
        // Each rank's share of a tensor moves as one MPI message, whose count is an int.
        const std::int64_t most_q = dist::rank_length(h.Lq, P, 0, opt.layout) + 2, most_k = dist::rank_length(h.Lk, P, 0, opt.layout) + 2;
        const std::int64_t words = std::max({h.B * h.Hq * most_q * std::max(h.Dq, h.Dv), h.B * h.Hkv * most_k * std::max(h.Dk, h.Dv)});
        if (words > INT_MAX) {
            throw Error("ring: a rank's share of Q, K, V or O would have " + std::to_string(words) +
                        " floats, more than one MPI message holds (" + std::to_string(INT_MAX) + "); use more ranks");
        }
    });
    MPI_Bcast(&h, kHeaderWords, MPI_INT64_T, 0, comm);
    const DType odt = static_cast<DType>(h.out_dtype);
    const GradientDtypes gdt{static_cast<DType>(h.dq_dtype), static_cast<DType>(h.dk_dtype), static_cast<DType>(h.dv_dtype)};
    // The files this rank writes: rank 0 all of them; with --shard-outputs every rank its own
    // rows of O, dQ, dK, dV (shard_path), and rank 0 dsinks.
    const auto out_path = [&](const std::string& p) { return a.shard_outputs && !p.empty() ? shard_path(p, rank) : p; };
    const std::string my_out = out_path(a.out);
    const GradientOutputs my_grad{a.grad.grad_out, out_path(a.grad.dq), out_path(a.grad.dk), out_path(a.grad.dv),
                                  rank == 0 ? a.grad.dsinks : ""};
    // The output files' formats against their dtypes (bfloat16 only into .safetensors), by the
    // ranks that write them, before any compute.
    dist::run_collectively(comm, [&] {
        if (rank != 0 && !a.shard_outputs) return;
        OutputFiles::check_dtype("--out", my_out, odt, float_dtypes(/*with_float64=*/false));
        my_grad.check_dtypes(gdt, float_dtypes(/*with_float64=*/false));
    });
    if (a.alibi) {
        dist::run_collectively(comm, [&] { slopes = alibi_slopes(h.Hq); });
        opt.alibi_slopes = slopes.view();
    }
    // Rank 0's (B,) files (--key-lengths, --query-offsets) on every rank: empty when not given.
    const auto on_every_rank = [&](const Tensor& mine_on_rank0) {
        std::int64_t given = rank == 0 && mine_on_rank0.data() != nullptr ? 1 : 0;
        MPI_Bcast(&given, 1, MPI_INT64_T, 0, comm);
        std::vector<std::int64_t> values;
        if (given == 0) return values;
        values.resize(static_cast<std::size_t>(h.B));
        if (rank == 0)
            for (std::int64_t b = 0; b < h.B; ++b)
                values[static_cast<std::size_t>(b)] = static_cast<std::int64_t>(mine_on_rank0.view().load_as_double(b));
        MPI_Bcast(values.data(), static_cast<int>(h.B), MPI_INT64_T, 0, comm);
        return values;
    };
    std::vector<std::int64_t> kl = on_every_rank(lengths), qo = on_every_rank(offsets);
    if (!kl.empty()) opt.key_lengths = TensorView(kl.data(), DType::i64, Shape{h.B});
    if (!qo.empty()) opt.query_offset = QueryOffset(TensorView(qo.data(), DType::i64, Shape{h.B}));

    // Every rank allocates its rows (collectively: a failed allocation stops all ranks), then
    // rank 0 sends them.
    Tensor q_mine, k_mine, v_mine, o_mine, do_mine, lse_mine, dq_mine, dk_mine, dv_mine, dsinks;
    const std::int64_t nq = dist::rank_length(h.Lq, P, rank, opt.layout), nk = dist::rank_length(h.Lk, P, rank, opt.layout);
    dist::run_collectively(comm, [&] {
        q_mine = Tensor(static_cast<DType>(h.q_dtype), Shape{h.B, h.Hq, nq, h.Dq});
        k_mine = Tensor(static_cast<DType>(h.k_dtype), Shape{h.B, h.Hkv, nk, h.Dk});
        v_mine = Tensor(static_cast<DType>(h.v_dtype), Shape{h.B, h.Hkv, nk, h.Dv});
        o_mine = Tensor(odt, Shape{h.B, h.Hq, nq, h.Dv});
        if (backward) {
            do_mine = Tensor(static_cast<DType>(h.do_dtype), Shape{h.B, h.Hq, nq, h.Dv});
            lse_mine = Tensor(DType::f32, Shape{h.B, h.Hq, nq});
            dq_mine = Tensor(gdt.dq, Shape{h.B, h.Hq, nq, h.Dq});
            dk_mine = Tensor(gdt.dk, Shape{h.B, h.Hkv, nk, h.Dk});
            dv_mine = Tensor(gdt.dv, Shape{h.B, h.Hkv, nk, h.Dv});
            if (!a.grad.dsinks.empty()) dsinks = Tensor(DType::f32, Shape{h.Hq});
        }
    });
    const struct {
        const Tensor* global;
        Tensor* mine;
        std::int64_t H, L, D;
    } pieces[] = {{&q, &q_mine, h.Hq, h.Lq, h.Dq},
                  {&k, &k_mine, h.Hkv, h.Lk, h.Dk},
                  {&v, &v_mine, h.Hkv, h.Lk, h.Dv},
                  {&dO, &do_mine, h.Hq, h.Lq, h.Dv}};
    // Rank 0's copies of the other ranks' rows are allocated while those ranks wait in MPI_Recv:
    // a failure there cannot be agreed on, so it aborts the job (they would wait for ever).
    const auto or_abort = [&](const auto& step) {
        try {
            step();
        } catch (const std::exception& e) {
            print_error_line(e.what(), " (rank " + std::to_string(rank) + ", while the other ranks wait for their rows: aborting)");
            std::fflush(stderr);
            MPI_Abort(comm, 2);
        }
    };
    for (const auto& p : pieces) {
        if (p.mine == &do_mine && !backward) continue;
        if (rank == 0) {
            or_abort([&] {
                for (int r = 1; r < P; ++r) {
                    const Tensor part = dist::take_rows(*p.global, dist::rank_segments(p.L, P, r, opt.layout));
                    MPI_Send(part.data(), static_cast<int>(part.numel()), mpi_type(part.dtype()), r, kTagRows, comm);
                }
                *p.mine = dist::take_rows(*p.global, dist::rank_segments(p.L, P, 0, opt.layout));
            });
        } else {
            MPI_Recv(p.mine->data(), static_cast<int>(p.mine->numel()), mpi_type(p.mine->dtype()), 0, kTagRows, comm,
                     MPI_STATUS_IGNORE);
        }
    }
    q = Tensor();  // rank 0 no longer needs the global inputs
    k = Tensor();
    v = Tensor();
    dO = Tensor();

    dist::RingStats st, st_back;
    TensorView lse_view;  // the backward needs the forward's lse
    if (backward) lse_view = lse_mine.view();
    dist::ring_attention(comm, q_mine, k_mine, v_mine, opt, o_mine, backward ? &lse_view : nullptr, &st);
    if (backward) {
        const TensorView dsinks_view = !a.grad.dsinks.empty() ? dsinks.view() : TensorView();
        dist::ring_attention_backward(comm, q_mine, k_mine, v_mine, o_mine, lse_mine, do_mine, opt, dq_mine, dk_mine, dv_mine,
                                      &st_back, a.grad.dsinks.empty() ? nullptr : &dsinks_view);
    }

    // One line per rank, printed by rank 0 in rank order.
    auto print_stats = [&](const dist::RingStats& r_st, const char* what) {
        double mine_stats[6] = {r_st.compute_seconds, r_st.wait_seconds, r_st.total_seconds, static_cast<double>(r_st.score_entries),
                                static_cast<double>(r_st.bytes_sent), r_st.compute_cpu_seconds};
        std::vector<double> every(static_cast<std::size_t>(6 * P));
        MPI_Gather(mine_stats, 6, MPI_DOUBLE, every.data(), 6, MPI_DOUBLE, 0, comm);
        if (rank == 0) {
            // The balance is among the ranks that computed scores: a rank with no rows (L < P)
            // spends microseconds, and a ratio against it says nothing about the layout.
            double lo = 1e300, hi = 0, lo_cpu = 1e300, hi_cpu = 0;
            int idle = 0;
            for (int r = 0; r < P; ++r) {
                const double* s = &every[static_cast<std::size_t>(6 * r)];
                std::fprintf(stderr,
                             "ring%s: rank %d: compute %.4f s (cpu %.4f s), wait %.4f s, total %.4f s, score entries %.0f, sent %.0f bytes\n",
                             what, r, s[0], s[5], s[1], s[2], s[3], s[4]);
                if (s[3] == 0) {
                    ++idle;
                    continue;
                }
                lo = std::min(lo, s[0]), hi = std::max(hi, s[0]);
                lo_cpu = std::min(lo_cpu, s[5]), hi_cpu = std::max(hi_cpu, s[5]);
            }
            const std::string idle_note = idle > 0 ? " over the " + std::to_string(P - idle) + " ranks with score entries" : "";
            std::fprintf(stderr, "ring%s: P = %d, layout %s, kernel %s, compute max/min = %.3f (cpu %.3f)%s\n", what, P,
                         std::string(dist::layout_name(opt.layout)).c_str(), r_st.kernel.c_str(), lo < 1e300 && lo > 0 ? hi / lo : 0.0,
                         lo_cpu < 1e300 && lo_cpu > 0 ? hi_cpu / lo_cpu : 0.0, idle_note.c_str());
        }
    };
    if (a.stats) {
        print_stats(st, "");
        if (backward) print_stats(st_back, " backward");
    }

    // --shard-outputs: every rank writes its own rows (its segments, concatenated in local order).
    // Every rank stages its files, and publishes them only once all ranks have: a rank whose write
    // failed (a full disk, EFBIG) left the other ranks' shards behind, published, after exit 2.
    if (a.shard_outputs) {
        OutputFiles::Staged staged;
        dist::run_collectively(comm, [&] {
            std::vector<OutputFiles::Output> files{{"--out", my_out, o_mine.view()}};
            my_grad.add_files(files, dq_mine, dk_mine, dv_mine, dsinks);
            staged = outputs.stage(files);
        });
        dist::run_collectively(comm, [&] { staged.publish(); });
        return;
    }
    // Rank 0 gathers O (B, Hq, Lq, Dv) and the gradients, then writes them all; an allocation
    // or write failure is every rank's failure.
    auto gather = [&](const Tensor& mine, std::int64_t H, std::int64_t L, std::int64_t D) {
        Tensor whole;
        dist::run_collectively(comm, [&] {
            if (rank == 0) whole = Tensor(mine.dtype(), Shape{h.B, H, L, D});
        });
        if (rank == 0) {
            or_abort([&] {  // the other ranks are in MPI_Send to rank 0
                dist::put_rows(mine, dist::rank_segments(L, P, 0, opt.layout), whole);
                for (int r = 1; r < P; ++r) {
                    const std::int64_t n = dist::rank_length(L, P, r, opt.layout);
                    Tensor part(mine.dtype(), Shape{h.B, H, n, D});
                    MPI_Recv(part.data(), static_cast<int>(part.numel()), mpi_type(part.dtype()), r, kTagRows, comm,
                             MPI_STATUS_IGNORE);
                    dist::put_rows(part, dist::rank_segments(L, P, r, opt.layout), whole);
                }
            });
        } else {
            MPI_Send(mine.data(), static_cast<int>(mine.numel()), mpi_type(mine.dtype()), 0, kTagRows, comm);
        }
        return whole;
    };
    const Tensor o = gather(o_mine, h.Hq, h.Lq, h.Dv);
    Tensor dq, dk, dv;
    if (backward) {
        dq = gather(dq_mine, h.Hq, h.Lq, h.Dq);
        dk = gather(dk_mine, h.Hkv, h.Lk, h.Dk);
        dv = gather(dv_mine, h.Hkv, h.Lk, h.Dv);
    }
    dist::run_collectively(comm, [&] {
        if (rank != 0) return;
        std::vector<OutputFiles::Output> files{{"--out", a.out, o.view()}};
        a.grad.add_files(files, dq, dk, dv, dsinks);
        outputs.write_all(files);
    });
}

void run(const RingArgs& a) {
    int already = 0;
    MPI_Initialized(&already);
    if (!already) {
        int provided = 0;
        // OpenMP threads compute; only the main thread calls MPI.
        MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
    }
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    std::string failure;
    try {
        naming_flags([&] { run_ring(MPI_COMM_WORLD, a); }, {"ring_attention_backward", "ring_attention"},
                     attention_flag_names(!a.query_offsets.empty(), a.alibi));
    } catch (const std::exception& e) {
        failure = e.what();  // the same message on every rank (run_collectively)
    }
    if (failure.empty()) {
        MPI_Finalize();
        return;
    }
    // Rank 0 prints main's `attn: error: …` line itself, before MPI_Finalize: once one rank
    // exits non-zero, mpirun kills the others, so a message printed after the finalize
    // (on the way back through main) could be lost. Then every rank exits 2.
    if (rank == 0) {
        print_error_line(failure);
        std::fflush(stderr);
    }
    MPI_Finalize();
    std::exit(2);
}

#else

void run(const RingArgs&) {
    throw Error("ring: this attn was built without MPI (configure with -DATTN_WITH_MPI=ON and libopenmpi-dev installed)");
}

#endif

}  // namespace

void add_ring_command(CLI::App& app) {
    auto args = std::make_shared<RingArgs>();
    CLI::App* cmd = app.add_subcommand(
        "ring", "Ring attention over MPI (run under mpirun -np P): the same O as `attn sdpa`, sequence split over P ranks");
    cmd->add_option("--q", args->q, "queries (B, Hq, Lq, Dk): float32, float64 (read as float32), float16 (.npy) or bfloat16 "
                    "(FILE.safetensors:NAME, which every tensor option accepts); computed in float32")->required();
    cmd->add_option("--k", args->k, "keys (B, Hkv, Lk, Dk); Hq must be a multiple of Hkv; 16-bit K/V travel the ring in 16 bits")->required();
    cmd->add_option("--v", args->v, "values (B, Hkv, Lk, Dv)")->required();
    // Who writes O, dQ, dK and dV: rank 0 gathers them, unless --shard-outputs.
    const std::string written = "; rank 0 writes it, or with --shard-outputs each rank its own rows (file names: --shard-outputs)";
    cmd->add_option("--out", args->out, "output O (B, Hq, Lq, Dv) in --out-dtype" + written)->required();
    cmd->add_option("--out-dtype", args->out_dtype,
                    "dtype of O and dQ/dK/dV: float16, bfloat16 (only into .safetensors) or float32 (default: O in a "
                    "16-bit Q's dtype, else float32; each gradient in its input's dtype if 16-bit, else float32)");
    add_causal_option(cmd, args->causal,
                      "causal mask on global positions: top-left: query i sees keys 0..i; bottom-right: keys "
                      "0..i+n-Lq (n = the sequence's key length, else Lk); none: no causal mask");
    cmd->add_option("--window-left", args->window_left, "sliding window: keys a query sees before its diagonal (-1 = all)");
    cmd->add_option("--window-right", args->window_right, "sliding window: keys a query sees after its diagonal (-1 = all)");
    cmd->add_option("--window-align", args->window_align,
                    "diagonal of the window: top-left (default) or bottom-right (only with --window-left/--window-right)");
    CLI::Option* one_offset = cmd->add_option(
        "--query-offset", args->query_offset, "position of query 0 among the keys: causal and the window align to i + N for every sequence");
    cmd->add_option("--query-offsets", args->query_offsets, "int32/int64 (B,): --query-offset per sequence (read by rank 0)")
        ->excludes(one_offset);
    add_scale_option(cmd, args->scale);
    cmd->add_option("--key-lengths", args->key_lengths, "int32/int64 (B,): valid keys per sequence (padding at the end)");
    cmd->add_option("--layout", args->layout, "how the sequence is cut over ranks: zigzag (default, balanced) or contiguous");
    cmd->add_option("--impl", args->impl,
                    "local kernel of each block: auto (what attn::sdpa picks: flash, or decode for a block of a few "
                    "rows per KV head), reference or flash (with --grad-out: auto or flash; the reference backward cannot take the "
                    "global lse)");
    args->grad.add_options(cmd, " through the ring", "'s dtype if 16-bit, else float32", written,
                           ", written by rank 0 (also with --shard-outputs: every rank has the whole sum)");
    cmd->add_option("--softcap", args->softcap, "logit soft-capping: s = C*tanh(s/C) in every block (0 = off)");
    cmd->add_option("--alibi-slopes", args->alibi_slopes,
                    "float32 (Hq,) or (B, Hq): ALiBi slopes m_h, s -= m_h*|d(i) - j| on global positions (d: the "
                    "bottom-right diagonal, or --query-offset)");
    cmd->add_flag("--alibi", args->alibi, "ALiBi with the paper's slopes for Hq heads (attn::alibi_slopes)");
    cmd->add_option("--sinks", args->sinks,
                    "float32 (Hq,): one attention-sink logit per head, counted once per row over the whole sequence");
    cmd->add_option("--dropout,--dropout-p", args->dropout,
                    "dropout probability on the attention weights, 0 <= P < 1 (training): the keep mask of `attn sdpa "
                    "--dropout P --seed N` on global positions, whatever the number of ranks");
    cmd->add_option("--seed,--dropout-seed", args->seed, "dropout seed (the same seed gives the same dropout mask)");
    cmd->add_flag("--shard-outputs", args->shard_outputs,
                  "each rank r writes its own rows of every output to <name>.rank<r>.npy or .safetensors (its layout segments, "
                  "concatenated) instead of rank 0 gathering the whole arrays");
    cmd->add_flag("--stats", args->stats, "print per-rank compute/wait times and the compute max/min ratio on stderr");
    add_threads_option(cmd);
    cmd->callback([args] { run(*args); });
}

}  // namespace attn::cli
