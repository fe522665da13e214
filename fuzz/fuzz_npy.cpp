// libFuzzer target: attn::read_npy on any bytes. Never trusted, a .npy file may only give
// a tensor or an attn::Error — no crash, no sanitizer report, no other exception. A file
// that reads must also survive a round trip: write_npy then read_npy give the same dtype,
// shape and bytes (bool bytes are 0/1 after reading, so they round-trip too).
#include <cstdint>
#include <cstring>

#include "attn/error.hpp"
#include "attn/npy.hpp"
#include "scratch.hpp"

using attn_fuzz::finding;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    static attn_fuzz::MemFile file("attn-fuzz.npy");
    static const std::string copy = attn_fuzz::scratch_dir() + "/roundtrip.npy";
    file.set(data, size);
    attn::Tensor t;
    try {
        t = attn::read_npy(file.path());
    } catch (const attn::Error&) {
        return 0;
    }
    // The data came from the file: it cannot be larger than the file.
    if (t.nbytes() > size) finding("read_npy returned " + std::to_string(t.nbytes()) + " bytes from a " +
                                   std::to_string(size) + "-byte file");
    attn::write_npy(copy, t.view());  // a valid tensor must be writable: an Error here is a finding too
    const attn::Tensor back = attn::read_npy(copy);
    if (back.dtype() != t.dtype() || !(back.shape() == t.shape()) ||
        (t.nbytes() != 0 && std::memcmp(back.data(), t.data(), t.nbytes()) != 0)) {
        finding("write_npy/read_npy round trip changed " + t.shape().str() + " " + std::string(attn::dtype_name(t.dtype())));
    }
    return 0;
}
