// ggml CPU flash-attention decode-step benchmark (peer figure for the attn project).
// Links directly against the prebuilt libggml-base.so + libggml-cpu-zen4.so from
// @node-llama-cpp/linux-x64 3.22.1. See ggml_min.h for the declarations; run.sh fetches the libraries and builds this.
//
// usage: fa_decode_bench <S5|S7> <f16|f32> <check|time> [timed_iters=15] [threads=2]
#include "ggml_min.h"
#include <dlfcn.h>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;   // fixed seed
static inline uint64_t splitmix64() {
    uint64_t z = (g_rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static inline float urand() { return (float)((splitmix64() >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f; } // [-1,1)

static double now_ms() {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// fill a tensor with random values; tensor is contiguous [D, L, H, 1]
static void fill(ggml_tensor * t, enum ggml_type type, size_t n) {
    if (type == GGML_TYPE_F32) {
        float * p = (float *) ggml_get_data(t);
        for (size_t i = 0; i < n; ++i) p[i] = urand();
    } else {
        ggml_fp16_t * p = (ggml_fp16_t *) ggml_get_data(t);
        const size_t CH = 1 << 16;
        std::vector<float> tmp(CH);
        for (size_t i = 0; i < n; i += CH) {
            size_t m = std::min(CH, n - i);
            for (size_t j = 0; j < m; ++j) tmp[j] = urand();
            ggml_fp32_to_fp16_row(tmp.data(), p + i, (int64_t) m);
        }
    }
}
static inline double elem(const void * base, enum ggml_type type, size_t i) {
    return type == GGML_TYPE_F32 ? (double) ((const float *) base)[i]
                                 : (double) ggml_fp16_to_fp32(((const ggml_fp16_t *) base)[i]);
}

static volatile uint64_t g_sink;
static void evict(std::vector<uint64_t> & buf) {   // read 1 GiB (every element) to flush L1/L2/L3
    uint64_t s = 0;
    const size_t n = buf.size();
    for (size_t i = 0; i < n; i += 4) s += buf[i] ^ buf[i + 1] ^ buf[i + 2] ^ buf[i + 3];
    g_sink += s;
}

static void stats(std::vector<double> v, double & med, double & mn) {
    std::sort(v.begin(), v.end());
    mn  = v.front();
    med = v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

int main(int argc, char ** argv) {
    if (argc < 4) { fprintf(stderr, "usage: %s <S5|S7> <f16|f32> <check|time> [timed_iters=15] [threads=2]\n", argv[0]); return 2; }
    const std::string shape = argv[1], kvt = argv[2], mode = argv[3];
    const int iters    = argc > 4 ? atoi(argv[4]) : 15;
    const int nthreads = argc > 5 ? atoi(argv[5]) : 2;

    const int64_t B = 1, Hq = 32, Lq = 1, Lk = 16384, D = 128;
    int64_t Hkv;
    if (shape == "S5") Hkv = 32; else if (shape == "S7") Hkv = 8; else { fprintf(stderr, "bad shape\n"); return 2; }
    enum ggml_type kvtype;
    if (kvt == "f16") kvtype = GGML_TYPE_F16; else if (kvt == "f32") kvtype = GGML_TYPE_F32; else { fprintf(stderr, "bad kv type\n"); return 2; }
    (void) B;

    // ---- identity / CPU variant ----
    ggml_cpu_init();
    printf("ggml_version=%s ggml_commit=%s\n", ggml_version(), ggml_commit());
    {
        typedef int (*score_t)(void);
        score_t sc = (score_t) dlsym(RTLD_DEFAULT, "ggml_backend_score");
        Dl_info info{};
        if (dladdr((void *) &ggml_graph_compute_with_ctx, &info) && info.dli_fname)
            printf("ggml_graph_compute_with_ctx resolved from: %s\n", info.dli_fname);
        if (sc && dladdr((void *) sc, &info)) printf("ggml_backend_score() of %s = %d (0 = unsupported on this CPU)\n", info.dli_fname, sc());
        ggml_backend_reg_t reg = ggml_backend_cpu_reg();
        printf("backend reg: %s; features:", ggml_backend_reg_name(reg));
        auto gf = (ggml_backend_get_features_t) ggml_backend_reg_get_proc_address(reg, "ggml_backend_get_features");
        if (gf) for (ggml_backend_feature * f = gf(reg); f && f->name; ++f) printf(" %s=%s", f->name, f->value);
        printf("\ncpu_has: avx2=%d avx512=%d avx512_vnni=%d avx512_bf16=%d f16c=%d fma=%d\n",
               ggml_cpu_has_avx2(), ggml_cpu_has_avx512(), ggml_cpu_has_avx512_vnni(), ggml_cpu_has_avx512_bf16(),
               ggml_cpu_has_f16c(), ggml_cpu_has_fma());
        FILE * m = fopen("/proc/self/maps", "r");
        char line[1024]; std::string seen;
        while (m && fgets(line, sizeof line, m)) {
            const char * p = strstr(line, "libggml");
            if (p && seen.find(p) == std::string::npos) { seen += p; printf("mapped: %s", strchr(line, '/')); }
        }
        if (m) fclose(m);
    }

    const size_t esz      = kvtype == GGML_TYPE_F32 ? 4 : 2;
    const size_t nkv      = (size_t) D * Lk * Hkv;
    const size_t kv_bytes = 2 * nkv * esz;
    printf("shape=%s Hq=%ld Hkv=%ld Lq=%ld Lk=%ld D=%ld kv=%s q=f32 threads=%d K+V bytes=%zu (%.1f MiB)\n",
           shape.c_str(), (long) Hq, (long) Hkv, (long) Lq, (long) Lk, (long) D, kvt.c_str(), nthreads, kv_bytes, kv_bytes / 1048576.0);

    ggml_init_params ip;
    ip.mem_size   = kv_bytes + (size_t) D * Hq * Lq * 4 * 2 + 16 * ggml_tensor_overhead() + ggml_graph_overhead() + (256u << 20);
    ip.mem_buffer = nullptr;
    ip.no_alloc   = false;
    ggml_context * ctx = ggml_init(ip);
    if (!ctx) { fprintf(stderr, "ggml_init failed\n"); return 1; }

    ggml_tensor * q = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, D, Lq, Hq, 1);
    ggml_tensor * k = ggml_new_tensor_4d(ctx, kvtype, D, Lk, Hkv, 1);
    ggml_tensor * v = ggml_new_tensor_4d(ctx, kvtype, D, Lk, Hkv, 1);
    const float scale = 1.0f / sqrtf((float) D);
    ggml_tensor * out = ggml_flash_attn_ext(ctx, q, k, v, /*mask=*/nullptr, scale, /*max_bias=*/0.0f, /*logit_softcap=*/0.0f);
    ggml_flash_attn_ext_set_prec(out, GGML_PREC_F32);
    ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, out);
    if (ggml_nbytes(out) != (size_t) D * Hq * Lq * 4) { fprintf(stderr, "unexpected out size %zu\n", ggml_nbytes(out)); return 1; }

    double t0 = now_ms();
    fill(q, GGML_TYPE_F32, (size_t) D * Lq * Hq);
    fill(k, kvtype, nkv);
    fill(v, kvtype, nkv);
    printf("fill: %.0f ms\n", now_ms() - t0);

    auto step = [&]() {
        enum ggml_status st = ggml_graph_compute_with_ctx(ctx, gf, nthreads);
        if (st != GGML_STATUS_SUCCESS) { fprintf(stderr, "compute failed: %d\n", (int) st); exit(1); }
    };

    if (mode == "check") {
        t0 = now_ms();
        step();
        printf("single step (untimed check run): %.2f ms\n", now_ms() - t0);
        const float * o  = (const float *) ggml_get_data(out);
        const float * qd = (const float *) ggml_get_data(q);
        const void  * kd = ggml_get_data(k);
        const void  * vd = ggml_get_data(v);
        const int64_t rep = Hq / Hkv;
        double maxdiff = 0, maxref = 0, maxdiff_h0 = 0;
        std::vector<double> s(Lk), acc(D);
        for (int64_t h = 0; h < Hq; ++h) {            // all heads (head 0 reported separately)
            const int64_t hk = h / rep;                // ggml broadcast: ik2 = iq2 / (neq2/nek2)
            const float * qh = qd + h * D;             // q ne=[D,Lq,Hq]: (d,0,h) at h*D+d
            double mx = -1e300;
            for (int64_t j = 0; j < Lk; ++j) {
                const size_t base = ((size_t) hk * Lk + j) * D;
                double dot = 0;
                for (int64_t d = 0; d < D; ++d) dot += (double) qh[d] * elem(kd, kvtype, base + d);
                s[j] = dot * (double) scale;
                mx = std::max(mx, s[j]);
            }
            double sum = 0;
            std::fill(acc.begin(), acc.end(), 0.0);
            for (int64_t j = 0; j < Lk; ++j) {
                const double p = std::exp(s[j] - mx);
                sum += p;
                const size_t base = ((size_t) hk * Lk + j) * D;
                for (int64_t d = 0; d < D; ++d) acc[d] += p * elem(vd, kvtype, base + d);
            }
            for (int64_t d = 0; d < D; ++d) {
                const double ref = acc[d] / sum;
                const double got = o[h * D + d];        // out ne=[D,Hq,Lq]: (d,h,0) at h*D+d
                const double df  = std::fabs(ref - got);
                maxdiff = std::max(maxdiff, df);
                maxref  = std::max(maxref, std::fabs(ref));
                if (h == 0) maxdiff_h0 = std::max(maxdiff_h0, df);
            }
        }
        if (kvtype == GGML_TYPE_F16) {   // head 0 again, with Q rounded to f16 as ggml does for f16 K (isolates the f16 V-accumulator error)
            std::vector<ggml_fp16_t> q16(D);
            ggml_fp32_to_fp16_row(qd, q16.data(), D);
            double mx = -1e300, sum = 0, md = 0;
            std::fill(acc.begin(), acc.end(), 0.0);
            for (int64_t j = 0; j < Lk; ++j) {
                double dot = 0;
                for (int64_t d = 0; d < D; ++d) dot += (double) ggml_fp16_to_fp32(q16[d]) * elem(kd, kvtype, (size_t) j * D + d);
                s[j] = dot * (double) scale; mx = std::max(mx, s[j]);
            }
            for (int64_t j = 0; j < Lk; ++j) {
                const double p = std::exp(s[j] - mx); sum += p;
                for (int64_t d = 0; d < D; ++d) acc[d] += p * elem(vd, kvtype, (size_t) j * D + d);
            }
            for (int64_t d = 0; d < D; ++d) md = std::max(md, std::fabs(acc[d] / sum - o[d]));
            printf("head0 vs double reference using f16-rounded Q: max|diff|=%.3e\n", md);
        }
        printf("CHECK %s %s: max|diff| head0=%.3e  all %ld heads=%.3e  (max|ref|=%.3e)  out[0..3]=%.6f %.6f %.6f %.6f\n",
               shape.c_str(), kvt.c_str(), maxdiff_h0, (long) Hq, maxdiff, maxref, o[0], o[1], o[2], o[3]);
        return 0;
    }

    // ---- timing ----
    std::vector<uint64_t> evbuf((size_t) 1 << 27, 1);   // 1 GiB
    for (size_t i = 0; i < evbuf.size(); i += 512) evbuf[i] = i;  // touch all pages
    std::vector<double> steady, cold;

    step();                                         // warm-up
    for (int i = 0; i < iters; ++i) { double a = now_ms(); step(); steady.push_back(now_ms() - a); }

    evict(evbuf); step();                           // warm-up for cold series
    for (int i = 0; i < iters; ++i) { evict(evbuf); double a = now_ms(); step(); cold.push_back(now_ms() - a); }

    double sm, smin, cm, cmin;
    stats(steady, sm, smin);
    stats(cold, cm, cmin);
    printf("steady ms:"); for (double x : steady) printf(" %.2f", x); printf("\n");
    printf("cold   ms:"); for (double x : cold)   printf(" %.2f", x); printf("\n");
    printf("RESULT %s kv=%s threads=%d iters=%d | steady median %.2f ms min %.2f ms | cold median %.2f ms min %.2f ms | "
           "GB/s(steady med) %.1f | GB/s(cold med) %.1f\n",
           shape.c_str(), kvt.c_str(), nthreads, iters, sm, smin, cm, cmin, kv_bytes / (sm * 1e6), kv_bytes / (cm * 1e6));
    ggml_free(ctx);
    return 0;
}
