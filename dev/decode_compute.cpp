// dev/decode_compute: the decode kernel's compute cost per key, cache-resident and on one
// thread, timed by thread CPU time (robust on a shared machine). Tells whether a decode
// step can be bandwidth-bound: at ~30 GB/s on 2 threads a float16 key+value row of
// D = 128 (512 B) arrives every ~34 ns per thread, a float32 row every ~34 ns per 1 KiB.
#include <omp.h>
#include <time.h>

#include <algorithm>
#include <cstdlib>
#include <cstdio>
#include <vector>

#include "attn/decode.hpp"
#include "attn/kv_cache.hpp"

using namespace attn;

static double cpu_ns() {
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

int main(int argc, char** argv) {
    omp_set_num_threads(1);
    // One KV head of L keys: 512 KiB (f32, L = 1024) fits L2. argv: [L] [reps]
    const std::int64_t L = argc > 1 ? std::atoll(argv[1]) : 1024, D = 128;
    const int reps = argc > 2 ? std::atoi(argv[2]) : 200;
    for (DType st : {DType::f32, DType::f16, DType::bf16})
        for (std::int64_t G : {1, 4}) {
            KVCacheConfig cfg;
            cfg.kv_heads = 1;
            cfg.head_dim = D;
            cfg.capacity = L;
            cfg.storage = st;
            KVCache cache(cfg);
            Tensor k(DType::f32, Shape{1, 1, L, D}), v(DType::f32, Shape{1, 1, L, D});
            for (std::int64_t i = 0; i < k.numel(); ++i) k.data_as<float>()[i] = v.data_as<float>()[i] = (i % 97) * 0.01f;
            cache.append(k, v);
            Tensor q(DType::f32, Shape{1, G, 1, D}), o(DType::f32, Shape{1, G, 1, D});
            for (std::int64_t i = 0; i < q.numel(); ++i) q.data_as<float>()[i] = (i % 13) * 0.1f;
            std::vector<double> per;
            for (int r = 0; r < reps; ++r) {
                const double t0 = cpu_ns();
                decode_attention(q, cache, DecodeOptions{}, o);
                per.push_back((cpu_ns() - t0) / L);
            }
            std::sort(per.begin(), per.end());
            std::printf("%-8s group %lld: %.2f ns per key (all %lld query heads), %.2f ns per key-row\n",
                        std::string(dtype_name(st)).c_str(), (long long)G, per[per.size() / 2], (long long)G,
                        per[per.size() / 2] / G);
        }
}
