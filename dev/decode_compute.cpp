// dev/decode_compute: the decode kernel's compute cost per key, cache-resident and on one
// thread, timed by thread CPU time (robust on a shared machine). Tells whether a decode
// step can be bandwidth-bound: at ~30 GB/s on 2 threads a float16 key+value row of
// D = 128 (512 B) arrives every ~34 ns per thread, a float32 row every ~34 ns per 1 KiB.
#include <immintrin.h>
#include <omp.h>
#include <time.h>

#include <algorithm>
#include <cstdlib>
#include <cstdio>
#include <vector>

#include "attn/decode.hpp"
#include "attn/kv_cache.hpp"

using namespace attn;

// Thread CPU time of one vector FMA at full throughput (8 independent chains), measured
// next to each kernel run: on a shared machine both slow down together, the ratio holds.
__attribute__((target("avx2,fma"))) static double fma_ns() {
    __m256 a[8];
    for (int i = 0; i < 8; ++i) a[i] = _mm256_set1_ps(i * 0.001f);
    const __m256 x = _mm256_set1_ps(0.999f), y = _mm256_set1_ps(0.0001f);
    const long n = 2000000;
    timespec t0, t1;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t0);
    for (long k = 0; k < n; ++k) {
        for (int i = 0; i < 8; ++i) a[i] = _mm256_fmadd_ps(a[i], x, y);
        __asm__ volatile("" : "+x"(a[0]), "+x"(a[1]), "+x"(a[2]), "+x"(a[3]), "+x"(a[4]), "+x"(a[5]), "+x"(a[6]), "+x"(a[7]));
    }
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t1);
    return ((t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec)) / (8.0 * n);
}

static double cpu_ns() {
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

int main(int argc, char** argv) {
    attn::SdpaOptions step;  // a generation step: causal, bottom-right per sequence
    step.causal = attn::Causal::bottom_right;
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
            std::vector<double> per, slots;
            for (int r = 0; r < reps; ++r) {
                const double f = fma_ns();
                const double t0 = cpu_ns();
                decode_attention(q, cache, step, o);
                per.push_back((cpu_ns() - t0) / L);
                slots.push_back(per.back() / G / f);
            }
            std::sort(per.begin(), per.end());
            std::sort(slots.begin(), slots.end());
            // Minimum per key-row: D/8 vector FMAs for the score and D/8 for the value update.
            std::printf("%-8s group %lld: %.2f ns per key (min %.2f), %.1f vector-FMA times per key-row "
                        "(min %.1f; ideal %lld)\n",
                        std::string(dtype_name(st)).c_str(), (long long)G, per[per.size() / 2], per[0],
                        slots[slots.size() / 2], slots[0], (long long)(2 * D / 8));
        }
}
