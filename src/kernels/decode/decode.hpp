// The decode kernel: Lq = 1..16 new queries per sequence against a long K/V (a KV cache),
// bandwidth-bound. Internal interface shared by the sdpa dispatch, KVCache's
// decode_attention and the tests.
//
// Work decomposition (results never depend on the thread count):
//   item = (b, kv head hk, key chunk c). One item reads K[b, hk, chunk] and V[b, hk, chunk]
//   once and computes all M = group·Lq query rows that read KV head hk (GQA/MQA: the
//   `group` query heads hk·group .. hk·group+group−1, each with its Lq queries).
//   When B·Hkv alone gives too few items to keep the cores busy, the keys are split into
//   `nsplit` chunks (flash-decoding); each chunk leaves an unnormalised partial
//   (o_c, m_c, l_c) and a merge pass combines them by their log-sum-exp:
//       M = max_c m_c,   w_c = exp(m_c − M),   l = Σ_c w_c·l_c,
//       out = Σ_c w_c·o_c / l,   lse = M + log l
//   The split depends only on the shape and the machine's core count, never on the
//   number of threads that run it; the merge order is fixed (c = 0, 1, ...).
#pragma once

#include <cstdint>
#include <string>

#include "attn/dtype.hpp"
#include "attn/tensor.hpp"
#include "../paged_rows.hpp"
#include "../../core/interrupt.hpp"

namespace attn::detail {

struct SdpaProblem;
struct KernelSet;

// The plan and the caller-owned scratch of one decode call (decode.cpp fills it; the
// kernel table's decode reads the problem itself). Plain data: it crosses into the ISA
// translation units.
struct DecodeWork {
    std::int64_t nsplit = 1, chunk = 0;  // key chunks per (b, KV head) and their length
    // Visible keys [range[2·(b·Lq+i)], range[2·(b·Lq+i)+1]) of query i of sequence b:
    // SdpaProblem::key_range, computed once per call.
    const std::int64_t* range = nullptr;
    float* work = nullptr;           // per-thread scratch, work_per_thread floats each
    std::int64_t work_per_thread = 0;
    int max_threads = 1;             // threads the scratch was sized for
    float* partial = nullptr;        // B·Hkv·nsplit·(M·Dv + 2·M) floats when nsplit > 1
    const PagedRows* paged = nullptr;  // null: K/V rows are the problem's views
    // The caller's flag (core/interrupt.hpp): once set, the items and merges left are skipped and
    // decode_forward throws after the region.
    const Interrupt* interrupt = nullptr;
};

// Keys processed per block (K block then V block, each read once from memory). A block
// reads one stream of K rows, then one of V rows: every switch between the two restarts
// the hardware prefetchers' ramp, so the block is long — 256 keys are 128 KiB of each at
// D = 128 float32, still inside every L2 we run on (Zen 3: 512 KiB). On a Zen 4 core the
// 64-key block (32 KiB per stream) read S5's float32 cache at ≈ 19 GB/s against 28 for a
// plain stream; 256 keys ≈ 24–26 (docs/kernels-lab.md, "Decode: a longer block").
inline constexpr std::int64_t kDecodeBlock = 256;

// The block of a work item with M query rows (group × Lq), at most kDecodeBlock (the scratch
// is sized for that). Each pass of a row group (up to 4 rows: decode_core.hpp's
// for_row_groups) rereads the block, from L2 at 256 keys (128 KiB of K at float32) and from
// L1 at 64 (32 KiB): with many rows the rereads, not the stream from memory, are the cost —
// chunked prefill through decode in blocks of 16 queries (bench P2, M = 64 rows) took 1.5×
// longer with 256 keys than with 64. Measured: M = 1 and 4 faster with 256; M = 8, 16 and 64
// faster with 64 at float32, the same at float16 (docs/kernels-lab.md, "Decode: a longer block").
// Since float32 groups run together the avx512 row no longer cares (256 keys within 0–5 % of
// 64 at M = 8 to 64), but the avx2 row, whose P·V still runs the rows one at a time, does:
// P2's decode row 1.1–1.2× faster with 64 (docs/kernels-lab.md, "Decode: the many-rows block again").
inline constexpr std::int64_t kDecodeBlockManyRows = 64;
inline constexpr std::int64_t decode_block(std::int64_t M) { return M <= 4 ? kDecodeBlock : kDecodeBlockManyRows; }

struct DecodePlan {
    std::int64_t nsplit = 1, chunk = 0;
    std::int64_t work_per_thread = 0;  // floats
    std::int64_t partial_floats = 0;
};

// forced_split: 0 = automatic, 1 = no split, n > 1 = n chunks (tests).
DecodePlan plan_decode(std::int64_t B, std::int64_t Hkv, std::int64_t group, std::int64_t Lq, std::int64_t Lk,
                       std::int64_t Dk, std::int64_t Dv, std::int64_t forced_split);

// sdpa path. decode_declines: empty when the decode kernel can run the problem,
// otherwise why not (one short clause, for SdpaReport and error messages). Its reasons are of
// two kinds, so that a call made of parts (sdpa_varlen's sequences, paged_attention's query
// blocks) is refused alike whether or not its parts hold work (docs/conventions.md, "Errors"):
std::string decode_declines(const SdpaProblem& p);
// - the call's: what it asks for (weights, scores, dropout), the dtypes of Q, K and V, their
//   stride along the head dim and the head dims — shared by every part, checked once per call
//   even when no part runs. q, k, v: the call's views, head dim last, of any rank (a problem's
//   (B, H, L, D), a packed (T, H, D)); never read.
std::string decode_call_declines(const TensorView& q, const TensorView& k, const TensorView& v, double dropout_p,
                                 bool weights = false, bool scores = false);
// - a part's: its Lq new queries (at most kMaxDecodeQueries).
std::string decode_rows_declines(std::int64_t Lq);

// The automatic choice between decode and flash, for every entry point (run_forward,
// runs_flash, paged_attention): empty when `auto` runs the decode kernel on p with kernel
// table row k, else why not. Decode runs when it accepts p and the rows it computes per KV
// head (group·Lq) are fewer than auto_decode_panels(p) flash panels (k.flash_panel queries:
// 32 on the avx512 row, 16 on the others). Below that, decode reads K and V once at the
// memory's pace while flash would spend whole panels' FMAs on the few rows. Past it flash
// computes the rows faster: from one panel on with 16-bit K/V, from two with float32 K/V (a
// one-panel flash task waits on memory, so its time follows the bytes, while decode at these
// rows is bound by its compute, which 16-bit storage does not shrink: with float32 decode stays
// 0–24 % faster up to two panels).
// docs/kernels.md, "Decode or flash"; measured on both rows, float32 and 16-bit K/V (docs/kernels-lab.md).
std::string auto_decode_declines(const SdpaProblem& p, const KernelSet& k);
// Flash panels of rows per KV head below which `auto` runs decode: 2 with float32 K and V, 1
// with 16-bit K or V.
int auto_decode_panels(const SdpaProblem& p);

// Plans the call (forced_split as in plan_decode), allocates the scratch and runs the
// kernel table row's decode. Precondition: decode_declines(p) is empty.
// `paged`: K/V rows live in pages (PagedRows); null for the problem's own K/V views.
void decode_forward(const SdpaProblem& p, const KernelSet& kernels, std::int64_t forced_split = 0,
                    const PagedRows* paged = nullptr);

}  // namespace attn::detail

namespace attn { enum class Impl; struct SdpaReport; }

namespace attn::detail {

// The decode branch of choose_forward (kernels/dispatch.cpp), taken before any other choice:
// true when decode runs p — impl = decode (checked already: require_requested_kernel_runs), or
// auto where auto_decode_declines is empty on the row `kernels` (chosen because `why_isa`) —
// with the report's text in `text` when it is not null; false to let the other kernels choose,
// after adding a line to `explanation`. Runs nothing: the kernel is decode_forward.
bool decode_chosen(const SdpaProblem& p, Impl requested, const KernelSet& kernels, const std::string& why_isa,
                   std::string& explanation, SdpaReport* text);

}  // namespace attn::detail
