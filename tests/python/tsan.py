"""Whether this Python runs an attn module built with ThreadSanitizer (-DATTN_SANITIZE=thread): an
uninstrumented interpreter loads it only with GCC's TSan runtime preloaded (tests/common/tsan_preload.sh).
What a test then skips, as the runtime differs from a plain process:
- it starts a thread of its own beside the process's second thread: a test that counts the process's
  threads to see how many attn started cannot tell them apart;
- it holds an asynchronous signal until the receiving thread next enters a function it intercepts:
  the SIGINT test_interrupt sends during a long call stopped nothing (the call ran to its end and no
  KeyboardInterrupt came);
- as under ASan (asan.py), a throwing operator new it cannot serve ends the process instead of
  throwing: past its largest allocation ("allocator is out of memory trying to allocate
  0x1000000000000 bytes", exit status 66), and under an RLIMIT_AS (0x2000000 bytes, 32 MiB)."""
import os

UNDER_TSAN = "libtsan" in os.environ.get("LD_PRELOAD", "")
