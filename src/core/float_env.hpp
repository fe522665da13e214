// The floating-point environment attn computes in: IEEE subnormals, whatever the thread had set.
//
// torch.set_flush_denormal(True) and the start-up code of a program linked with -ffast-math set
// MXCSR's FTZ (a subnormal result becomes 0) and DAZ (a subnormal input reads as 0) on the thread
// that asks. OpenMP's pool threads keep the bits of the thread that started them. A call whose
// caller had set them after the pool started flushed the subnormals of the work the calling thread
// did and kept those of the workers' (its bits depended on the thread count), and under DAZ a
// bfloat16 subnormal — a float32 subnormal — read as 0, against "16-bit inputs are converted
// exactly" (docs/conventions.md, "Numerics and threads"). So every thread that computes for attn —
// the caller in ComputeThreads, each thread of a parallel region — holds one of these while it
// does: it clears the two bits and gives them back afterwards (keeping the exception flags the work
// raised). Reading MXCSR costs a few cycles; it is written only when a bit was set.
#pragma once

namespace attn::detail {

// Out of line (float_env.cpp, compiled without ISA flags): ISA-flagged files hold these too, and
// an inline copy built with -mavx would be a VEX vstmxcsr that the linker may keep for everyone.
class IeeeSubnormals {
public:
    IeeeSubnormals();
    ~IeeeSubnormals();
    IeeeSubnormals(const IeeeSubnormals&) = delete;
    IeeeSubnormals& operator=(const IeeeSubnormals&) = delete;

private:
    unsigned saved_ = 0;  // the flush bits this thread had (0: none, nothing to give back)
};

}  // namespace attn::detail
