// dev/decode_stream: decode steps from memory, the four bench caches in turn. S5 and S7 of
// bench/shapes.md (B = 1, Hq = 32, Lk = 16384, D = 128; Hkv 32 and 8), float32 and float16:
// 960 MiB together, more than any L3 here, so each step reads its cache from DRAM. One step of
// each per round, so a change of the machine's load hits all four alike; to A/B a kernel change,
// build this against each library and run the binaries in turn (docs/kernels-lab.md, "Decode: a
// longer block"). Prints min and median wall ms per step and the GB/s of the min.
// Usage: decode_stream [threads=2] [rounds=5]
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "attn/decode.hpp"
#include "attn/kv_cache.hpp"
#include "attn/threads.hpp"
#include "lab_util.hpp"

using namespace attn;

namespace {

struct Step {
    std::string name;
    std::unique_ptr<KVCache> cache;
    Tensor q, out;
    double bytes = 0;
    std::vector<double> ms;
};

}  // namespace

int main(int argc, char** argv) {
    const int threads = argc > 1 ? std::atoi(argv[1]) : 2, rounds = argc > 2 ? std::atoi(argv[2]) : 5;
    if (threads < 1 || rounds < 1) {
        std::fprintf(stderr, "usage: decode_stream [threads >= 1] [rounds >= 1]\n");
        return 2;
    }
    set_num_threads(threads);
    SdpaOptions opt;  // a generation step: causal, bottom-right
    opt.causal = Causal::bottom_right;
    constexpr std::int64_t Lk = 16384, D = 128, Hq = 32;
    std::mt19937 rng(1);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<Step> steps;
    for (std::int64_t hkv : {32, 8})
        for (DType st : {DType::f32, DType::f16}) {
            Step s;
            s.name = std::string(hkv == 32 ? "S5 " : "S7 ") + std::string(dtype_name(st));
            KVCacheConfig cfg;
            cfg.kv_heads = hkv;
            cfg.head_dim = D;
            cfg.capacity = Lk;
            cfg.storage = st;
            s.cache = std::make_unique<KVCache>(cfg);
            Tensor k(DType::f32, Shape{1, hkv, Lk, D}), v(DType::f32, Shape{1, hkv, Lk, D});
            for (std::int64_t i = 0; i < k.numel(); ++i) {
                k.data_as<float>()[i] = u(rng);
                v.data_as<float>()[i] = u(rng);
            }
            s.cache->append(k, v);
            s.q = Tensor(DType::f32, Shape{1, Hq, 1, D});
            s.out = Tensor(DType::f32, Shape{1, Hq, 1, D});
            for (std::int64_t i = 0; i < s.q.numel(); ++i) s.q.data_as<float>()[i] = u(rng);
            s.bytes = 2.0 * static_cast<double>(hkv * Lk * D) * static_cast<double>(dtype_size(st));
            steps.push_back(std::move(s));
        }
    for (Step& s : steps) decode_attention(s.q, *s.cache, opt, s.out);  // warm-up
    for (int r = 0; r < rounds; ++r)
        for (Step& s : steps) {
            const double t0 = lab::now();
            decode_attention(s.q, *s.cache, opt, s.out);
            s.ms.push_back(1e3 * (lab::now() - t0));
        }
    for (Step& s : steps) {
        std::sort(s.ms.begin(), s.ms.end());
        std::printf("%-8s min %7.2f  median %7.2f ms  (%.1f GB/s at the min)\n", s.name.c_str(), s.ms.front(),
                    s.ms[s.ms.size() / 2], s.bytes / (s.ms.front() * 1e6));
    }
    return 0;
}
