#include "float_env.hpp"

#if defined(__SSE2__)
#include <xmmintrin.h>
#endif

namespace attn::detail {

#if defined(__SSE2__)
namespace {
constexpr unsigned kFlushBits = 0x8040u;  // MXCSR's FTZ (bit 15) and DAZ (bit 6)
}  // namespace

IeeeSubnormals::IeeeSubnormals() : saved_(_mm_getcsr() & kFlushBits) {
    if (saved_ != 0) _mm_setcsr(_mm_getcsr() & ~kFlushBits);
}

// Only the two bits go back: the exception flags the work raised stay raised.
IeeeSubnormals::~IeeeSubnormals() {
    if (saved_ != 0) _mm_setcsr(_mm_getcsr() | saved_);
}
#else
IeeeSubnormals::IeeeSubnormals() = default;  // elsewhere attn leaves the environment as it is
IeeeSubnormals::~IeeeSubnormals() = default;
#endif

}  // namespace attn::detail
