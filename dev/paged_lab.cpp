// paged lab: is paged decode at page 32 really slower than contiguous (bench P5/P7), or noise?
// The bench times each row's calls in one block (contiguous, then page 16, then page 32), so a
// load change between blocks moves a ratio. Here the three caches of the bench's P5/P7 shape
// (B = 1, Hq = 32, Lk = 16384, D = 128, float32) are called round-robin, one call each per
// round, and the per-round ratios paged / contiguous are reported (min, median, max).
// Usage: paged_lab [Hkv=32] [rounds=40] [threads=2]
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "attn/decode.hpp"
#include "attn/kv_cache.hpp"
#include "attn/paged_kv_cache.hpp"
#include "attn/threads.hpp"
#include "lab_util.hpp"

using namespace attn;

namespace {

using lab::fill;
using lab::now;

void summary(const char* name, std::vector<double> x) {
    std::sort(x.begin(), x.end());
    std::printf("%-22s min %.3f  median %.3f  max %.3f\n", name, x.front(), x[x.size() / 2], x.back());
}

}  // namespace

int main(int argc, char** argv) {
    const std::int64_t Hkv = argc > 1 ? std::atoll(argv[1]) : 32;
    const int rounds = argc > 2 ? std::atoi(argv[2]) : 40;
    set_num_threads(argc > 3 ? std::atoi(argv[3]) : 2);
    constexpr std::int64_t Hq = 32, Lk = 16384, D = 128, chunk = 1024;
    const Tensor q(DType::f32, Shape{1, Hq, 1, D}), o(DType::f32, Shape{1, Hq, 1, D});
    fill(q, 7);
    SdpaOptions opt;
    opt.causal = Causal::bottom_right;
    const Tensor kc(DType::f32, Shape{Hkv, chunk, D}), vc(DType::f32, Shape{Hkv, chunk, D});
    fill(kc, 8);
    fill(vc, 9);
    KVCacheConfig cc;
    cc.kv_heads = Hkv;
    cc.head_dim = D;
    cc.capacity = Lk;
    KVCache kv(cc);
    for (std::int64_t t = 0; t < Lk; t += chunk) kv.append(0, kc, vc);
    auto paged = [&](std::int64_t ps) {
        PagedKVCacheConfig pc;
        pc.kv_heads = Hkv;
        pc.head_dim = D;
        pc.page_size = ps;
        pc.num_pages = Lk / ps;
        return pc;
    };
    PagedKVCache c16(paged(16)), c32(paged(32));
    const auto s16 = c16.add_sequence(), s32 = c32.add_sequence();
    for (std::int64_t t = 0; t < Lk; t += chunk) c16.append(s16, kc, vc), c32.append(s32, kc, vc);
    std::vector<double> tc, t16, t32, r16, r32;
    for (int r = 0; r < rounds + 1; ++r) {  // round 0 warms up
        double t0 = now();
        decode_attention(q, kv, opt, o);
        const double a = now() - t0;
        t0 = now();
        paged_attention(q, c16, {s16}, opt, o);
        const double b = now() - t0;
        t0 = now();
        paged_attention(q, c32, {s32}, opt, o);
        const double c = now() - t0;
        if (r == 0) continue;
        tc.push_back(1e3 * a), t16.push_back(1e3 * b), t32.push_back(1e3 * c);
        r16.push_back(b / a), r32.push_back(c / a);
    }
    std::printf("Hkv %lld, %d rounds (ms, then per-round ratios)\n", static_cast<long long>(Hkv), rounds);
    summary("contiguous ms", tc);
    summary("page 16 ms", t16);
    summary("page 32 ms", t32);
    summary("page 16 / contiguous", r16);
    summary("page 32 / contiguous", r32);
    return 0;
}
