"""Whether this Python runs an attn module built with AddressSanitizer (-DATTN_SANITIZE=ON): an
uninstrumented interpreter loads it only with the runtime preloaded (tests/common/asan_preload.sh).
As the C++ tests do with `#if !defined(__SANITIZE_ADDRESS__)`, a test then skips what ASan cannot
run: a throwing operator new past ASan's largest allocation aborts the process (the runtime cannot
throw bad_alloc), and its shadow memory cannot live under an RLIMIT_AS."""
import os

UNDER_ASAN = "libasan" in os.environ.get("LD_PRELOAD", "")
