// The flash forward's per-thread scratch (Workspace): Qᵀ, Sᵀ, Oᵀ, the running statistics and
// the tile buffers, in one 64-byte-aligned block per thread, sized once per call.
// A part of the flash forward driver: flash_driver.hpp (which says what an Ops is) includes it
// after the definitions it uses (kLog2e, imin, the Ops traits), in each ISA file's namespace.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "../../sdpa/problem.hpp"
#include "flash.hpp"

#ifndef ATTN_FLASH_NS
#error "include flash_driver.hpp, not flash_workspace.hpp"
#endif

namespace attn::detail::ATTN_FLASH_NS {

struct KvAhead;  // flash_operands.hpp

// Rows at one stride, `per_row` cache lines each, asked for a few lines at a time (request):
// a task's O rows and the next task's Q rows into the L1 (Workspace::out_lines, next_q_lines;
// KvAhead shares them out over a key block's pair tiles).
struct RowLines {
    const char* row = nullptr;          // the next line's row
    std::int64_t step = 0;              // bytes from a row to the next
    int rows = 0, per_row = 0, at = 0;  // rows left (0: nothing to ask for), lines a row, the next line in `row`
    std::int64_t lines() const { return static_cast<std::int64_t>(rows) * per_row - at; }
    // Up to n lines; returns how many of n are left (the rows ran out).
    std::int64_t request(std::int64_t n) {
        for (; n > 0 && rows > 0; --n) {
            __builtin_prefetch(row + 64 * at, 0, 3);  // prefetcht0
            if (++at == per_row) {  // the next row, if any: never a step past the last (its stride may be anything)
                at = 0;
                if (--rows > 0) row += step;
            }
        }
        return n;
    }
};

// Per-thread scratch, sized once per call from the tile sizes and head dims.
struct Workspace {
    float* qt = nullptr;     // (Mb/16 panels, Dk, 16)  packed Qᵀ
    float* s = nullptr;      // (Nb, Mb)  Sᵀ then Pᵀ of one key block
    float* ot = nullptr;     // (Dv, Mb)  unnormalised Oᵀ
    float* kbuf = nullptr;   // (Nb, Dk)  only when K is 16-bit or its head dim is strided
    float* vbuf = nullptr;   // (Nb, Dv)  V packed: 16-bit, strided head dim, or non-finite entries zeroed
    float* bigot = nullptr;  // (Dv, Mb)  careful path: Oᵀ of V's large entries, scaled by 2^-64
    float* vbig = nullptr;   // (Nb, Dv)  careful path: V's large entries scaled by 2^-64, others 0
    float* m = nullptr;      // (Mb) running max (base 2)
    float* l = nullptr;      // (Mb) running sum
    float* alpha = nullptr;  // (Mb) rescale of this key block
    float* lse2 = nullptr;   // (Mb) log2(l), for the weights pass
    float* aslope = nullptr; // (Mb) ALiBi slope of each column
    float* abase = nullptr;  // (Mb) ALiBi: d(column) − j0 of the current key block
    float* colmax = nullptr; // (Mb) Sᵀ's column maxima from qk (kOpsColumnMax), for the softmax
    float* spec = nullptr;   // (3·Mb) a speculative block's U and two weight sums (kOpsSpeculate)
    bool speculate = false;    // whether this task's next key block may be speculative (key_block)
    bool spec_failed = false;  // a block of this task moved a max while speculating: no more
    KvAhead* kv_next = nullptr;  // the next key block's lines, asked for tile by tile (key_block), or null
    // Lines asked for during a task's last key blocks (key_block, with the next K/V block's: KvAhead::add):
    RowLines out_lines;     // its O rows, in the block before its last (accumulate_keys)
    RowLines next_q_lines;  // the Q rows of the task this thread runs next, in its last block (run_flash)
    bool last_block = false;  // key_block: the block is the task's last, and O is stored after it
    // The (problem, batch, KV head) of this thread's previous task in the call (run_flash: a task of
    // another head requests its next key blocks).
    const SdpaProblem* prev_p = nullptr;
    std::int64_t prev_b = -1, prev_hk = -1;
    std::int64_t* lo = nullptr;  // (Mb) visible key range of each column's query
    std::int64_t* hi = nullptr;
    std::int64_t* ch = nullptr;  // (Mb) query head of each column
    std::int64_t* ci = nullptr;  // (Mb) query index of each column
    float* drop = nullptr;       // (Nb + 8) dropout factors of one row segment (4-aligned)
    float* qrow = nullptr;       // (Dk) one 16-bit query row, widened, before it is transposed
    void* extra = nullptr;       // (extra_bytes, 64-aligned) an Ops' own scratch (operand hooks)
    float* gk = nullptr;         // (Nb, Dk) with group_tiles: a group's K tile, converted once for its
    float* gv = nullptr;         // (Nb, Dv)   tasks (run_group; the first workspace of a thread only)
    void* thread_extra = nullptr;  // (thread_bytes) an Ops' scratch for all of a thread's tasks
                                   // (Ops::thread_scratch_bytes): in the first workspace, zeroed once
                                   // per call; run_flash points the thread's other workspaces at it
    int tile_mb = 0, tile_nb = 0;  // the tiles it was sized for (the hooks lay out `extra` by them)
    void* block = nullptr;
    std::size_t bytes = 0;  // of block: what the out-of-memory error names when it is null

    Workspace(const SdpaProblem& p, const FlashTiles& t, bool pack_k, std::size_t extra_bytes = 0,
              bool group_tiles = false, std::size_t thread_bytes = 0) {
        tile_mb = t.Mb;
        tile_nb = t.Nb;
        const std::size_t Mb = static_cast<std::size_t>(t.Mb), Nb = static_cast<std::size_t>(t.Nb);
        auto round64 = [](std::size_t floats) { return (floats * sizeof(float) + 63) / 64 * 64; };
        const std::size_t sizes[] = {round64(Mb * static_cast<std::size_t>(p.Dk)),
                                     round64(Nb * Mb),
                                     round64(static_cast<std::size_t>(p.Dv) * Mb),
                                     pack_k ? round64(Nb * static_cast<std::size_t>(p.Dk)) : 0,
                                     round64(Nb * static_cast<std::size_t>(p.Dv)),
                                     round64(static_cast<std::size_t>(p.Dv) * Mb),
                                     round64(Nb * static_cast<std::size_t>(p.Dv)),
                                     round64(Mb), round64(Mb), round64(Mb), round64(Mb), round64(Mb), round64(Mb), round64(Mb),
                                     round64(3 * Mb),
                                     round64(2 * Mb), round64(2 * Mb), round64(2 * Mb), round64(2 * Mb),
                                     round64(Nb + 8), round64(static_cast<std::size_t>(p.Dk))};
        const std::size_t extra_size = (extra_bytes + 63) / 64 * 64;
        const std::size_t gk_size = group_tiles ? round64(Nb * static_cast<std::size_t>(p.Dk)) : 0,
                          gv_size = group_tiles ? round64(Nb * static_cast<std::size_t>(p.Dv)) : 0;
        const std::size_t thread_size = (thread_bytes + 63) / 64 * 64;
        std::size_t total = extra_size + gk_size + gv_size + thread_size;
        for (std::size_t sz : sizes) total += sz;
        bytes = total;
        block = std::aligned_alloc(64, total);
        if (block == nullptr) return;
        char* c = static_cast<char*>(block);
        float** floats[] = {&qt, &s, &ot, &kbuf, &vbuf, &bigot, &vbig, &m, &l, &alpha, &lse2, &aslope, &abase, &colmax, &spec};
        std::size_t i = 0;
        for (; i < sizeof floats / sizeof floats[0]; ++i) {
            *floats[i] = sizes[i] ? reinterpret_cast<float*>(c) : nullptr;
            c += sizes[i];
        }
        std::int64_t** ints[] = {&lo, &hi, &ch, &ci};
        for (std::int64_t** slot : ints) {
            *slot = reinterpret_cast<std::int64_t*>(c);
            c += sizes[i++];
        }
        drop = reinterpret_cast<float*>(c);
        qrow = reinterpret_cast<float*>(c + sizes[i]);
        c += sizes[i] + sizes[i + 1];
        if (extra_bytes > 0) extra = c;
        c += extra_size;
        if (group_tiles) {
            gk = reinterpret_cast<float*>(c);
            gv = reinterpret_cast<float*>(c + gk_size);
        }
        c += gk_size + gv_size;
        if (thread_bytes > 0) {
            thread_extra = c;
            std::memset(thread_extra, 0, thread_size);
        }
    }
    ~Workspace() { std::free(block); }
    Workspace(const Workspace&) = delete;
    Workspace& operator=(const Workspace&) = delete;
};

}  // namespace attn::detail::ATTN_FLASH_NS
