#include "openblas.hpp"

#include <cblas.h>
#include <dlfcn.h>

#include <stdexcept>

namespace attn::bench {
namespace {

constexpr const char* kLibrary = "libopenblas.so.0";  // Debian's libopenblas0 (the SONAME)

struct OpenBlas {
    decltype(&cblas_sgemm) sgemm = nullptr;
    decltype(&openblas_set_num_threads) set_num_threads = nullptr;
    std::string error;  // why it could not be loaded; empty when it was
};

// Loaded once and never closed (OpenBLAS's pool threads outlive any dlclose).
const OpenBlas& openblas() {
    static const OpenBlas lib = [] {
        OpenBlas l;
        void* handle = dlopen(kLibrary, RTLD_NOW | RTLD_LOCAL);
        if (handle == nullptr) {
            const char* why = dlerror();
            l.error = why != nullptr ? why : std::string(kLibrary) + ": dlopen failed";
            return l;
        }
        l.sgemm = reinterpret_cast<decltype(&cblas_sgemm)>(dlsym(handle, "cblas_sgemm"));
        l.set_num_threads = reinterpret_cast<decltype(&openblas_set_num_threads)>(dlsym(handle, "openblas_set_num_threads"));
        if (l.sgemm == nullptr) l.error = std::string(kLibrary) + " has no symbol cblas_sgemm";
        else if (l.set_num_threads == nullptr) l.error = std::string(kLibrary) + " has no symbol openblas_set_num_threads";
        return l;
    }();
    return lib;
}

}  // namespace

std::string openblas_unavailable() { return openblas().error; }

void openblas_sgemm(bool trans_a, bool trans_b, int M, int N, int K, const float* A, int lda, const float* B,
                    int ldb, float* C, int ldc, int threads) {
    const OpenBlas& lib = openblas();
    if (!lib.error.empty()) throw std::runtime_error("OpenBLAS: " + lib.error);
    lib.set_num_threads(threads);
    lib.sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, M, N, K,
              1.0f, A, lda, B, ldb, 0.0f, C, ldc);
}

}  // namespace attn::bench
