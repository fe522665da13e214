// The one thread setting (include/attn/threads.hpp) reaches every kernel: after a forward (flash
// and decode), a backward, decode_attention, paged_attention and an MHA layer (its GEMMs) on 1 thread, this
// process has never started a second thread. libgomp starts its pool threads the first time a
// parallel region asks for more than one, so /proc/self/task counts every thread a kernel used.
//
//   threads_check api    attn::set_num_threads(1), then every call: 1 thread; then
//                        set_num_threads(2): a second thread appears (the count can tell)
//   threads_check env    run with ATTN_NUM_THREADS=1: every call on 1 thread
// ctest sets OPENBLAS_NUM_THREADS=1 so that OpenBLAS's own pool (started when the library
// loads, before main) is not counted; attn's GEMM blocks are single-threaded BLAS calls anyway.
#include <dirent.h>
#include <omp.h>

#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "attn/attn.hpp"
#include "common/util.hpp"

namespace {

int thread_count() {
    DIR* d = opendir("/proc/self/task");
    if (d == nullptr) return -1;
    int n = 0;
    while (const dirent* e = readdir(d)) {
        if (e->d_name[0] != '.') ++n;
    }
    closedir(d);
    return n;
}

int failures = 0, passes = 0;

void expect_threads(const char* after, int expected_max, int expected_min = 1) {
    const int n = thread_count();
    if (n < expected_min || n > expected_max) {
        std::printf("FAIL after %s: %d threads in the process, expected %d..%d\n", after, n, expected_min, expected_max);
        ++failures;
    } else {
        std::printf("ok   after %s: %d thread(s)\n", after, n);
        ++passes;
    }
}

// Every compute entry point once, on shapes big enough that each kernel would split its work.
void run_everything(int allowed) {
    using namespace attn;
    std::mt19937 rng(7);
    const Shape s{2, 4, 256, 64};
    const Tensor q = test::randn(DType::f32, s, rng), k = test::randn(DType::f32, s, rng), v = test::randn(DType::f32, s, rng);
    Tensor out(DType::f32, s), lse(DType::f32, {2, 4, 256});
    const TensorView lv = lse;
    SdpaOptions opt;
    opt.causal = Causal::top_left;
    sdpa(q, k, v, opt, out, &lv);
    expect_threads("sdpa (flash)", allowed);
    const Tensor dO = test::randn(DType::f32, s, rng);
    Tensor dq(DType::f32, s), dk(DType::f32, s), dv(DType::f32, s);
    sdpa_backward(q, k, v, out, lse, dO, opt, dq, dk, dv);
    expect_threads("sdpa_backward", allowed);

    const Tensor q1 = test::randn(DType::f32, Shape{2, 4, 1, 64}, rng);
    Tensor o1(DType::f32, Shape{2, 4, 1, 64});
    SdpaOptions dopt;
    dopt.causal = Causal::bottom_right;
    sdpa(q1, k, v, dopt, o1);  // Lq = 1: the decode kernel
    expect_threads("sdpa (decode)", allowed);
    KVCache cache(KVCacheConfig{.batch = 2, .kv_heads = 4, .head_dim = 64, .capacity = 512});
    cache.append(k, v);
    decode_attention(q1, cache, dopt, o1);
    expect_threads("decode_attention", allowed);
    PagedKVCache paged(PagedKVCacheConfig{.kv_heads = 4, .head_dim = 64, .page_size = 16, .num_pages = 64});
    const std::vector<PagedKVCache::SeqId> seqs{paged.add_sequence(), paged.add_sequence()};
    const Tensor kp = test::randn(DType::f32, Shape{4, 256, 64}, rng), vp = test::randn(DType::f32, Shape{4, 256, 64}, rng);
    for (const PagedKVCache::SeqId sq : seqs) paged.append(sq, kp, vp);
    paged_attention(q1, paged, seqs, dopt, o1);
    expect_threads("paged_attention", allowed);

    MultiHeadAttention mha(MhaConfig{.embed_dim = 256, .num_heads = 4, .batch_first = true});
    const Tensor x = test::randn(DType::f32, Shape{2, 128, 256}, rng);
    MhaForwardOptions mo;
    mo.need_weights = false;
    (void)mha.forward(x, x, x, mo);
    expect_threads("MultiHeadAttention::forward", allowed);
}

}  // namespace

int main(int argc, char** argv) {
    const std::string mode = argc > 1 ? argv[1] : "";
    if (omp_get_num_procs() < 2) {
        std::printf("one CPU: a second thread would prove nothing; 0 passed, 0 failed, 1 skipped\n");
        return 0;
    }
    const int caller = omp_get_max_threads();
    if (mode == "api") {
        attn::set_num_threads(1);
        if (attn::num_threads() != 1) {
            std::printf("FAIL num_threads() = %d after set_num_threads(1)\n", attn::num_threads());
            ++failures;
        }
        run_everything(1);
        // The caller's own OpenMP setting is given back after every call.
        if (omp_get_max_threads() != caller) {
            std::printf("FAIL omp_get_max_threads() is %d after attn's calls, was %d\n", omp_get_max_threads(), caller);
            ++failures;
        }
        {
            const attn::ScopedNumThreads scoped(2);  // a call's own count (Python's threads=, the CLI's --threads)
            if (attn::num_threads() != 2) ++failures;
        }
        if (attn::num_threads() != 1) {
            std::printf("FAIL ScopedNumThreads did not restore 1 (got %d)\n", attn::num_threads());
            ++failures;
        }
        // The check itself can fail: with 2 threads allowed, a second thread does appear.
        attn::set_num_threads(2);
        run_everything(1 << 20);
        expect_threads("set_num_threads(2) (the count sees a second thread)", 1 << 20, 2);
    } else if (mode == "env") {
        const char* env = std::getenv("ATTN_NUM_THREADS");
        if (env == nullptr || std::strcmp(env, "1") != 0) {
            std::printf("FAIL run me with ATTN_NUM_THREADS=1\n");
            return 1;
        }
        if (attn::num_threads() != 1) ++failures;
        run_everything(1);
    } else {
        std::printf("usage: threads_check api|env\n");
        return 2;
    }
    std::printf("%d passed, %d failed\n", passes, failures);
    return failures == 0 ? 0 : 1;
}
