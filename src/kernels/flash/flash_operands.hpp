// How the flash forward reads its operands: the Qᵀ pack (per task), K/V rows for a micro-kernel
// (in place, strided, 16-bit widened, or through a page table).
// A part of the flash forward driver: flash_driver.hpp (which says what an Ops is) includes it
// after the definitions it uses (kLog2e, imin, the Ops traits), in each ISA file's namespace.
#pragma once

#include <cstdint>
#include <cstring>
#include <limits>

#include "../../sdpa/problem.hpp"
#include "../paged_rows.hpp"
#include "flash_workspace.hpp"

#ifndef ATTN_FLASH_NS
#error "include flash_driver.hpp, not flash_operands.hpp"
#endif

namespace attn::detail::ATTN_FLASH_NS {

// ── 16-bit inputs ───────────────────────────────────────────────────────────────────
// A float16/bfloat16 Q, K or V is converted where it is read, tile by tile, never as a
// whole tensor: a query row while Qᵀ is packed, K/V rows into kbuf/vbuf (pack_rows). The
// conversion is exact (every 16-bit value is a float32) and is Ops::widen (F16C / AVX-512
// vcvtph2ps for float16, a 16-bit shift for bfloat16; portable: attn/half.hpp), so every
// later step — micro-kernels, the non-finite checks (finite.hpp), the careful path — sees
// the same float32 values as for a float32 tensor holding them.
inline bool is16(const TensorView& t) { return t.dtype() == DType::f16 || t.dtype() == DType::bf16; }

// Element `off` of a float32 or 16-bit tensor, as float32 (the scalar paths: non-finite V).
template <class Ops>
inline float load_elem(const TensorView& t, std::int64_t off) {
    if (!is16(t)) return t.data_as<const float>()[off];
    float x;
    Ops::widen(t.data_as<const std::uint16_t>() + off, 1, 1, t.dtype() == DType::f16, &x);
    return x;
}

// ── Per-task work: the Qᵀ pack and the O store ─────────────────────────────────────
// Both are transposes of Mb × D floats per task, against Mb·Lk·D FMAs: a term of 1/Lk, which
// the short shapes feel (docs/kernels-lab.md, "Short sequences": about 5 % of a task's time at
// Lk = 512 done one scalar at a time, the Q read included). An Ops may define
//   transpose16(in, out, scale)   out[r][c] = in[c][r] (· scale[r] when scale is not null),
//                                 16 × 16 floats, in/out: 16 row pointers (the avx2 and avx512 Ops do)
//   narrow16(x, y, n, is_f16)     (with transpose16) y = x rounded to float16/bfloat16, the
//                                 kernel table's narrow16 of this ISA (a 16-bit out's O store)
// and then a Q or out (float32 or 16-bit) whose head dim is contiguous moves 16 × 16 blocks at
// a time. The values are the same bits either way (a copy or an exact widening; the store's one
// multiply by 1/l, then one rounding to a 16-bit out).
template <class Ops>
inline constexpr bool kOpsTranspose = requires { &Ops::transpose16; };

// The fast Qᵀ pack: Q with a contiguous head dim and Dk a multiple of 16, 16 × 16 blocks at a
// time — a float32 block read in place, a 16-bit one widened into a stack tile first (Ops::widen,
// exact). Padding columns read zeros.
template <class Ops>
void pack_qt_blocks(const SdpaProblem& p, std::int64_t b, const std::int64_t* ch, const std::int64_t* ci, int nq,
                    int panels, int panel, float* qt) {
    const bool sixteen = is16(p.q), f16 = p.q.dtype() == DType::f16;
    alignas(64) static constexpr float zeros[16] = {};
    alignas(64) float tile[16][16];
    const float* in[16];
    float* out[16];
    std::int64_t at[16];  // element offset of each column's query row (any sign: strides may be negative)
    for (int c0 = 0; c0 < panels * panel; c0 += 16) {
        const int pn = c0 / panel, lane0 = c0 % panel;
        const int real = nq - c0 < 16 ? nq - c0 : 16;  // columns [real, 16) are padding
        for (int c = 0; c < real; ++c) at[c] = p.q.offset(b, ch[c0 + c], ci[c0 + c], 0);
        float* dst = qt + static_cast<std::int64_t>(pn) * p.Dk * panel + lane0;
        for (std::int64_t d0 = 0; d0 < p.Dk; d0 += 16) {
            for (int c = 0; c < 16; ++c) {
                if (c >= real) {
                    in[c] = zeros;
                } else if (sixteen) {
                    Ops::widen(p.q.data_as<const std::uint16_t>() + at[c] + d0, 1, 16, f16, tile[c]);
                    in[c] = tile[c];
                } else {
                    in[c] = p.q.data_as<const float>() + at[c] + d0;
                }
            }
            for (int r = 0; r < 16; ++r) out[r] = dst + (d0 + r) * panel;
            Ops::transpose16(in, out, nullptr);
        }
    }
}

// Qᵀ panels of `panel` queries of one block of columns (query head ch[c], query ci[c]),
// zero past the last.  q: (B, Hq, Lq, Dk) any strides  →  qt: (panels, Dk, panel)
// A 16-bit query row is widened into qrow (Dk floats) first.
template <class Ops>
void pack_qt(const SdpaProblem& p, std::int64_t b, const std::int64_t* ch, const std::int64_t* ci, int nq,
             int panels, int panel, float* qt, float* qrow) {
    const bool sixteen = is16(p.q), f16 = p.q.dtype() == DType::f16;
    const std::int64_t sd = p.q.stride(3);
    if constexpr (kOpsTranspose<Ops>) {
        if (sd == 1 && p.Dk % 16 == 0 && panel % 16 == 0) {
            pack_qt_blocks<Ops>(p, b, ch, ci, nq, panels, panel, qt);
            return;
        }
    }
    for (int pn = 0; pn < panels; ++pn) {
        float* dst = qt + static_cast<std::int64_t>(pn) * p.Dk * panel;
        for (int c = 0; c < panel; ++c) {
            const int qi = pn * panel + c;
            if (qi < nq && sixteen) {
                Ops::widen(p.q.data_as<const std::uint16_t>() + p.q.offset(b, ch[qi], ci[qi], 0), sd, p.Dk, f16, qrow);
                for (std::int64_t d = 0; d < p.Dk; ++d) dst[d * panel + c] = qrow[d];
            } else if (qi < nq) {
                const float* src = p.q.data_as<const float>() + p.q.offset(b, ch[qi], ci[qi], 0);
                for (std::int64_t d = 0; d < p.Dk; ++d) dst[d * panel + c] = src[d * sd];
            } else {
                for (std::int64_t d = 0; d < p.Dk; ++d) dst[d * panel + c] = 0.0f;
            }
        }
    }
}

// Rows [j0, j0+nk) of a (B, H, L, D) tensor, packed to (nk, D) float32: a 16-bit tensor
// (any strides) row by row through Ops::widen, a float32 one with a strided head dim, or with
// a contiguous one for a one-panel task (pack_tile_rows).
template <class Ops>
void pack_rows(const TensorView& t, std::int64_t b, std::int64_t h, std::int64_t j0, std::int64_t nk,
               std::int64_t D, float* dst) {
    if (is16(t)) {
        const std::uint16_t* src = t.data_as<const std::uint16_t>();
        const bool f16 = t.dtype() == DType::f16;
        for (std::int64_t j = 0; j < nk; ++j) Ops::widen(src + t.offset(b, h, j0 + j, 0), t.stride(3), D, f16, dst + j * D);
        return;
    }
    const float* src = t.data_as<const float>();
    if (t.stride(3) == 1) {  // a one-panel task's copy (pack_tile_rows): each row whole, in order
        for (std::int64_t j = 0; j < nk; ++j)
            std::memcpy(dst + j * D, src + t.offset(b, h, j0 + j, 0), sizeof(float) * static_cast<std::size_t>(D));
        return;
    }
    for (std::int64_t j = 0; j < nk; ++j)
        for (std::int64_t d = 0; d < D; ++d) dst[j * D + d] = src[t.offset(b, h, j0 + j, d)];
}

// True when a tile of t can be read in place (float32 with a contiguous head dim).
inline bool in_place(const TensorView& t, std::int64_t D) { return !is16(t) && (t.stride(3) == 1 || D == 1); }

// Whether a task converts or copies its K or V tiles (16-bit, strided head dim) instead of
// reading them in place: then a group of tasks makes each tile once for all (run_group).
inline bool converts_tiles(const SdpaProblem& p) { return !in_place(p.k, p.Dk) || !in_place(p.v, p.Dv); }

// Whether float32 K or V rows that a tile could read in place lie apart in memory (row stride
// past the head dim: a (B, L, H, D) tensor seen as (B, H, L, D), the MHA layer's seq-first
// head-major rows B·D apart, or its views of one (B·L, 3·H·D) QKV buffer before it stored Q, K,
// V head-major — rows 3·H·D floats apart, 9 KiB, a page each, at S6's H·D = 768). Read in
// place, a key block's 64 K and 64 V rows touch 128 pages (past the L1 TLB) and the hardware
// prefetchers find no stream in them; then a group of tasks copies each block's rows once into
// contiguous tiles (run_group) and
// every task reads those: S6's attention +5-10 % per CPU-second on Sapphire Rapids, L = 2048
// +39 % (docs/kernels-lab.md, fwd-12). Grouping alone, without the copy, measured no gain.
inline bool rows_apart(const SdpaProblem& p) {
    auto apart = [](const TensorView& t, std::int64_t D) { return !is16(t) && t.stride(3) == 1 && t.stride(2) > D; };
    return p.paged == nullptr && (apart(p.k, p.Dk) || apart(p.v, p.Dv));
}

// Bytes of a head's K and V rows (Lk keys): what flash_query_group, flash_kv_ahead and
// flash_pack_one_panel compare with the caches.
inline std::int64_t head_kv_bytes(const SdpaProblem& p) {
    return p.Lk * (p.Dk * static_cast<std::int64_t>(dtype_size(p.k.dtype())) +
                   p.Dv * static_cast<std::int64_t>(dtype_size(p.v.dtype())));
}

// Whether a task of `panels` panels copies float32 K/V tiles it could read in place
// (flash_pack_one_panel: one panel, a head past the L2). Paged tiles keep their own rule.
inline bool pack_tile_rows(const SdpaProblem& p, int panels) {
    return panels == 1 && p.paged == nullptr && flash_pack_one_panel(head_kv_bytes(p));
}

// Rows [j0, j0+nk) of K or V (kv head h) for a micro-kernel: in place when float32 with a
// contiguous head dim (unless `pack`), else packed (16-bit: converted) into buf. Returns the
// rows, their stride in ld.
template <class Ops>
const float* tile_rows(const TensorView& t, std::int64_t b, std::int64_t h, std::int64_t j0, std::int64_t nk,
                       std::int64_t D, float* buf, std::int64_t& ld, bool pack) {
    if (!pack && in_place(t, D)) {
        ld = t.stride(2);
        return t.data_as<const float>() + t.offset(b, h, j0, 0);
    }
    pack_rows<Ops>(t, b, h, j0, nk, D, buf);
    ld = D;
    return buf;
}

// ── Paged K/V (p.paged: paged_attention's chunked prefill) ──────────────────────────
// K/V row j of (b, h) is row j % page_size of page table[b][j / page_size] (paged_rows.hpp).
// A key tile of nk rows spans ⌈nk / page_size⌉ + 1 pages at most: a float32 tile is read in
// place when it lies inside one page (page_size ≥ Nb, tiles aligned) and copied page run by
// page run into buf otherwise; a float16/bfloat16 pool's rows are widened into buf run by run
// (Ops::widen, as pack_rows does for a contiguous 16-bit cache). The micro-kernels see the same
// values either way, so the result has the bits of the contiguous cache. Defined here (in the
// ISA namespace), not in paged_rows.hpp: an inline function shared by the ISA files could be
// linked as another ISA's copy.

// Element offset of K (value = false) or V row (b, h, j), element 0.
inline std::int64_t kv_row_offset(const SdpaProblem& p, bool value, std::int64_t b, std::int64_t h, std::int64_t j) {
    const TensorView& t = value ? p.v : p.k;
    if (p.paged == nullptr) return t.offset(b, h, j, 0);
    const PagedRows& pg = *p.paged;
    const std::int64_t page = pg.table[b * pg.table_stride + (j >> pg.page_shift)];
    return page * (value ? pg.v_page_stride : pg.k_page_stride) + h * t.stride(1) +
           (j & (pg.page_size - 1)) * t.stride(2);
}

// Rows [j0, j0+nk) lie in one run of consecutive memory rows: always for a view, for pages
// when they lie inside one page.
inline bool one_run(const SdpaProblem& p, std::int64_t j0, std::int64_t nk) {
    return p.paged == nullptr || j0 >> p.paged->page_shift == (j0 + nk - 1) >> p.paged->page_shift;
}

// tile_rows for paged K/V: rows [j0, j0+nk) in place or packed to (nk, D) float32 in buf.
template <class Ops>
const float* paged_tile_rows(const SdpaProblem& p, bool value, std::int64_t b, std::int64_t h, std::int64_t j0,
                             std::int64_t nk, std::int64_t D, float* buf, std::int64_t& ld) {
    const TensorView& t = value ? p.v : p.k;
    const std::int64_t ps = p.paged->page_size, sr = t.stride(2), sd = t.stride(3);
    const bool dense = sd == 1 || D == 1, sixteen = is16(t), f16 = t.dtype() == DType::f16;
    if (!sixteen && dense && one_run(p, j0, nk)) {
        ld = sr;
        return t.data_as<const float>() + kv_row_offset(p, value, b, h, j0);
    }
    for (std::int64_t j = 0; j < nk;) {  // one run of rows per page
        const std::int64_t len = imin(nk - j, ps - ((j0 + j) & (ps - 1)));
        const std::int64_t at = kv_row_offset(p, value, b, h, j0 + j);
        if (sixteen) {
            const std::uint16_t* src = t.data_as<const std::uint16_t>() + at;
            for (std::int64_t r = 0; r < len; ++r) Ops::widen(src + r * sr, sd, D, f16, buf + (j + r) * D);
        } else if (dense && sr == D) {
            std::memcpy(buf + j * D, t.data_as<const float>() + at, static_cast<std::size_t>(len * D) * sizeof(float));
        } else {
            const float* src = t.data_as<const float>() + at;
            for (std::int64_t r = 0; r < len; ++r)
                for (std::int64_t d = 0; d < D; ++d) buf[(j + r) * D + d] = src[r * sr + d * sd];
        }
        j += len;
    }
    ld = D;
    return buf;
}

// Asks for K and V rows [j0, j1) of kv head h in the L2 (a software prefetch of every line;
// rows with a strided head dim are left to the hardware). Called for a task of one panel, and
// for tasks of any width whose K/V come from the L3 or memory (flash_kv_ahead): the micro-kernels
// read a key block's 8 rows of a tile interleaved (8 streams of D·4 bytes each), which the hardware
// prefetchers do not follow, and one panel reuses each line too little to hide the wait; with
// a head's K/V past the caches the wait is there at any width — the next block's rows,
// requested a block ahead, arrive in time (docs/kernels.md, "Requesting the next key block").
// All at once only where no pair tile runs to spread them over (KvAhead, below: one-panel tasks,
// Ops with their own operands, the avx2 and portable rows). always_inline: out of line, GCC found
// the function free of side effects (a prefetch is none to it) and deleted every call.
__attribute__((always_inline)) inline void prefetch_kv_rows(const SdpaProblem& p, std::int64_t b, std::int64_t h,
                                                            std::int64_t j0, std::int64_t j1) {
    for (int value = 0; value < 2; ++value) {
        const TensorView& t = value ? p.v : p.k;
        if (t.stride(3) != 1) continue;
        const std::int64_t size = static_cast<std::int64_t>(dtype_size(t.dtype()));
        const std::int64_t bytes = (value ? p.Dv : p.Dk) * size;
        const char* base = static_cast<const char*>(t.data());
        for (std::int64_t j = j0; j < j1; ++j) {
            const char* row = base + kv_row_offset(p, value != 0, b, h, j) * size;
            for (std::int64_t o = 0; o < bytes; o += 64) __builtin_prefetch(row + o, 0, 2);
        }
    }
}

// The next key block's K and V lines (the set prefetch_kv_rows asks for, in the same order), asked
// for a few at a time between the tiles of this block's pair products (Ops::qk_pair and
// Ops::pv_pair call request() before each tile) instead of all at once. Each request holds a fill
// buffer until its line arrives from the L3 or memory: S4's 512 at once stalled the core, ≈ 4.6 %
// of its kernel time on Sapphire Rapids (docs/kernels-lab.md, fwd-24, fwd-28), while the rows still
// have to be asked for where they come from memory (Zen 5, fwd-10). key_block sets one up per key
// block (w.kv_next) and asks for whatever the tiles left (rest) after the block's products.
// Where the block asks for no next block, the same cursor can carry the first line of each of
// this block's V rows into the L1 instead (start_v_heads), shared out over qk_pair's tiles.
struct KvAhead {
    const SdpaProblem* p = nullptr;
    std::int64_t b = 0, h = 0, j0 = 0, j1 = 0;  // rows [j0, j1) of kv head h
    const char* base[2] = {};                   // K's and V's data
    std::int64_t size[2] = {}, bytes[2] = {};   // element and row bytes; 0 bytes: not requested
    std::int64_t per_call = 0;                  // lines per request()
    int value = 2;                              // the range being asked for: 0 K, 1 V, 2 none (done)
    std::int64_t j = 0, off = 0;                // its row and the next line's offset in it
    const char* row = nullptr;                  // row j's first byte, or null: not found yet
    bool into_l1 = false;                       // start_v_heads: row j's first line at row + (j - j0)·step
    std::int64_t step = 0;
    // Lines of other rows (Workspace::out_lines, next_q_lines), a few with each request() besides
    // the above: key_block's add.
    RowLines more[2];
    std::int64_t more_per_call = 0;

    // Rows [first, end) of kv head hh; tiles: the pair tiles of the block's products, which share
    // the lines out evenly.
    void start(const SdpaProblem& pr, std::int64_t bb, std::int64_t hh, std::int64_t first, std::int64_t end, int tiles) {
        p = &pr;
        b = bb;
        h = hh;
        j0 = j = first;
        j1 = end;
        value = 0;
        row = nullptr;
        std::int64_t lines = 0;
        for (int v = 0; v < 2; ++v) {
            const TensorView& t = v ? pr.v : pr.k;
            base[v] = static_cast<const char*>(t.data());
            size[v] = static_cast<std::int64_t>(dtype_size(t.dtype()));
            bytes[v] = t.stride(3) == 1 ? (v ? pr.Dv : pr.Dk) * size[v] : 0;  // strided: left to the hardware
            lines += (end - first) * ((bytes[v] + 63) / 64);
        }
        per_call = (lines + tiles - 1) / (tiles > 0 ? tiles : 1);
        into_l1 = false;
    }
    // The first line of V's rows [first, end) of kv head hh (float32, head dim contiguous), into
    // the L1, over `tiles` calls of request() — qk_pair's tiles, before pv_pair reads them. pv_pair's
    // first 6-row tile reads head-dim rows 0..5 of every key: one line of each of the block's 64 V
    // rows, which nothing had asked for (pv_tile requests each row's next line as it goes, and the
    // prefetchers do not follow 64 rows read 24 bytes each); the tile ran ≈ 16 % slower than the
    // others. Requested during qk where the head stays in the L2 (key_block): S1 +0.8 %, S6's
    // attention +1.8 % per CPU-second on Sapphire Rapids; past the L2 a group's later tasks (which
    // request nothing) lost 0.7 % on S2 (docs/kernels-lab.md, fwd-30). Rows at one stride (not
    // paged): the address is one add a line (with each row's kv_row_offset the requests cost more
    // than they gained: S1 −1.8 %).
    void start_v_heads(const SdpaProblem& pr, std::int64_t bb, std::int64_t hh, std::int64_t first, std::int64_t end,
                       int tiles) {
        j0 = j = first;
        j1 = end;
        value = 2;  // (request() takes the branch below)
        row = static_cast<const char*>(pr.v.data()) + pr.v.offset(bb, hh, first, 0) * std::int64_t{sizeof(float)};
        step = pr.v.stride(2) * std::int64_t{sizeof(float)};
        per_call = ((end - first) + tiles - 1) / (tiles > 0 ? tiles : 1);
        into_l1 = true;
    }
    // Also the lines of `first`, then `second`, shared out over the same `tiles` requests.
    void add(const RowLines& first, const RowLines& second, int tiles) {
        more[0] = first;
        more[1] = second;
        more_per_call = (first.lines() + second.lines() + tiles - 1) / (tiles > 0 ? tiles : 1);
    }
    void request_more(std::int64_t n) {
        for (int r = 0; r < 2 && n > 0; ++r) n = more[r].request(n);
    }
    // The next n lines (fewer at the end), each into the L1 (prefetcht0). Into the L2 (prefetcht1)
    // until 2026-12-07, the tiles then waited for each K/V line from there on Zen 5: into the L1,
    // S6's attention +1.5-2.5 %, S1 level to +2 %, S2, S3, S4 and S8's kind +1-3 % per CPU-second on
    // 1 and 2 threads (docs/kernels-lab.md, fwd-36). On Sapphire Rapids the first task's lines read level
    // either way (S1, S6's attention; fwd-34); its long heads were not measured with it.
    void request(std::int64_t n) {
        if (more_per_call > 0) request_more(n == std::numeric_limits<std::int64_t>::max() ? n : more_per_call);
        if (into_l1) {
            // Row j's address from the first row's, never a step past the last row: a size-1 dim may
            // carry any stride (a view's −2^61 made the step past it wrap the pointer: fuzz_array).
            for (const std::int64_t e = n < j1 - j ? j + n : j1; j < e; ++j) __builtin_prefetch(row + (j - j0) * step, 0, 3);
            return;
        }
        while (n > 0 && value < 2) {
            if (row == nullptr) {
                if (j >= j1 || bytes[value] == 0) {
                    ++value;
                    j = j0;
                    continue;
                }
                row = base[value] + kv_row_offset(*p, value != 0, b, h, j) * size[value];
                off = 0;
            }
            __builtin_prefetch(row + off, 0, 3);
            --n;
            if ((off += 64) >= bytes[value]) {
                row = nullptr;
                ++j;
            }
        }
    }
    void request() { request(per_call); }
    // (this block's V heads: none, too late once the products ran)
    void rest() {
        if (!into_l1) request(std::numeric_limits<std::int64_t>::max());
        else if (more_per_call > 0) request_more(std::numeric_limits<std::int64_t>::max());
    }
};

// Asks for the lines of the O rows of the block's columns (w.ch, w.ci: 0..nq) in the L1, one
// key block before finish_block stores them (called before a task's last key block). Strided rows
// (the MHA layer's (B, L, H·D) out: 256 B of each 3 KiB row at S6) give the prefetchers no
// stream, and transpose16's stores to 16 rows at a time waited on each line: finish_block took
// 6 % of S6's attention. Requested a key block ahead, the lines arrive while the products run:
// S6's attention +3 % per CPU-second on Sapphire Rapids, contiguous S1/S4 level to +0.7 %
// (docs/kernels-lab.md, fwd-14). A read request (prefetcht0: the ISA flags do not enable
// prefetchw), which brings a line no other core holds in the exclusive state, so the store
// needs no second request.
__attribute__((always_inline)) inline void prefetch_out_rows(const SdpaProblem& p, const Workspace& w, std::int64_t b,
                                                             int nq) {
    if (p.out.stride(3) != 1) return;
    const std::int64_t size = static_cast<std::int64_t>(dtype_size(p.out.dtype())), bytes = p.Dv * size;
    const char* base = static_cast<const char*>(p.out.data());
    for (int c = 0; c < nq; ++c) {
        const char* row = base + p.out.offset(b, w.ch[c], w.ci[c], 0) * size;
        for (std::int64_t o = 0; o < bytes; o += 64) __builtin_prefetch(row + o, 0, 3);
    }
}

// The same O rows as RowLines (into the L1), for the pair tiles of the block before the task's last
// to ask for a few at a time (key_block, KvAhead::add) — false where they do not lie at one stride
// (a block of several heads) or the head dim is strided. All 256 at once (S6: 64 rows, 4 lines each)
// held every fill buffer: 90 % of accumulate_keys' samples sat on that loop, ≈ 2 % of S6's attention;
// spread over the last block they came too late (S6 −1 %); over the one before it, S1 +1 %, S6's
// attention +1 % per CPU-second on Sapphire Rapids (docs/kernels-lab.md, fwd-32).
inline bool out_row_lines(const SdpaProblem& p, const Workspace& w, std::int64_t b, int nq, RowLines& rows) {
    rows.rows = 0;
    if (p.out.stride(3) != 1 || nq == 0 || w.ch[0] != w.ch[nq - 1]) return false;
    const std::int64_t size = static_cast<std::int64_t>(dtype_size(p.out.dtype()));
    rows.row = static_cast<const char*>(p.out.data()) + p.out.offset(b, w.ch[0], w.ci[0], 0) * size;
    rows.step = p.out.stride(2) * size;
    rows.per_row = static_cast<int>((p.Dv * size + 63) / 64);
    rows.at = 0;
    rows.rows = nq;
    return true;
}

// A key block's K and V rows as float32, read once for all the tasks of a group (run_group):
// converted (16-bit), copied (strided head dim, pages) or in place, as kv_tile_rows gives them.
// Each task reads the same values it would have read itself, so its bits do not change; a task
// that must zero non-finite V entries does so in its own vbuf (key_block), never here.
struct KvTile {
    const float* k = nullptr;
    const float* v = nullptr;
    std::int64_t ldk = 0, ldv = 0;
};

// K (value = false) or V rows [j0, j0+nk) of kv head h for a micro-kernel of a task of
// `panels` panels, as float32: through the page table when the problem is paged, else through
// the view (16-bit rows widened into buf either way; float32 ones copied for pack_tile_rows,
// or when `pack`: a group's shared tiles of rows that lie apart, rows_apart).
template <class Ops>
const float* kv_tile_rows(const SdpaProblem& p, bool value, std::int64_t b, std::int64_t h, std::int64_t j0,
                          std::int64_t nk, std::int64_t D, float* buf, std::int64_t& ld, int panels, bool pack = false) {
    if (p.paged != nullptr) return paged_tile_rows<Ops>(p, value, b, h, j0, nk, D, buf, ld);
    return tile_rows<Ops>(value ? p.v : p.k, b, h, j0, nk, D, buf, ld, pack || pack_tile_rows(p, panels));
}

}  // namespace attn::detail::ATTN_FLASH_NS
