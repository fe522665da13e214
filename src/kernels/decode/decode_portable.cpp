// The decode kernel in portable C++ (any x86-64 or other CPU): the same algorithm as
// decode_avx2.cpp (decode_core.hpp), with scalar loops the compiler may vectorise for the
// baseline ISA. The kernel table's portable row.
#include "attn/half.hpp"
#include "../isa.hpp"
#include "../simd/exp2.hpp"
#include "decode_core.hpp"

namespace attn::detail {
namespace {

struct PortableOps {
    struct Half { std::uint16_t bits; };
    struct Brain { std::uint16_t bits; };

    static float load1(const float* p) { return *p; }
    static float load1(const Half* p) { return f16_to_float(p->bits); }
    static float load1(const Brain* p) { return bf16_to_float(p->bits); }

    template <class T>
    static void scores(const float* q, i64 qstride, int R, const KeyRun<T>* k, int nruns, i64 kstride, i64 Dk,
                       float* s, i64 sstride, Lookahead<T>&) {
        for (int x = 0; x < nruns; s += k[x].n, ++x)
            for (i64 j = 0; j < k[x].n; ++j) {
                const T* kj = k[x].rows + j * kstride;
                for (int r = 0; r < R; ++r) {
                    const float* qr = q + r * qstride;
                    // Four partial sums: shorter dependency chains, as the vector path has.
                    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                    i64 d = 0;
                    for (; d + 4 <= Dk; d += 4)
                        for (int y = 0; y < 4; ++y) acc[y] += qr[d + y] * load1(kj + d + y);
                    for (; d < Dk; ++d) acc[0] += qr[d] * load1(kj + d);
                    s[r * sstride + j] = (acc[0] + acc[1]) + (acc[2] + acc[3]);
                }
            }
    }

    static float row_max(const float* s, i64 n) {
        float mx = -INFINITY;
        for (i64 j = 0; j < n; ++j) mx = s[j] > mx ? s[j] : mx;
        return mx;
    }

    static float exp2_1(float x) { return exp2poly::exp2_scalar(x); }

    static float exp_shift(float* s, i64 n, float m) {
        float total = 0.0f;
        for (i64 j = 0; j < n; ++j) {
            const float e = exp2poly::exp2_scalar(kept_exponent((s[j] - m) * kLog2e));  // 0 for s = −inf
            s[j] = e;
            total += e;
        }
        return total;
    }

    template <class T>
    static void accumulate(float* o, i64 ostride, const float* alpha, const float* p, i64 pstride, int R,
                           const KeyRun<T>* v, int nruns, i64 vstride, i64 Dv, Lookahead<T>&) {
        for (int r = 0; r < R; ++r) {
            float* orow = o + r * ostride;
            for (i64 d = 0; d < Dv; ++d) orow[d] *= alpha[r];
        }
        for (int x = 0; x < nruns; p += v[x].n, ++x)
            for (i64 j = 0; j < v[x].n; ++j) {
                const T* vj = v[x].rows + j * vstride;
                for (int r = 0; r < R; ++r) {
                    const float pj = p[r * pstride + j];
                    float* orow = o + r * ostride;
                    for (i64 d = 0; d < Dv; ++d) orow[d] += pj * load1(vj + d);
                }
            }
    }
};

}  // namespace

void decode_portable(const SdpaProblem& p, const DecodeWork& w) { decode_entry<PortableOps>(p, w); }

}  // namespace attn::detail
