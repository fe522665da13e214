#!/usr/bin/python3 -S
"""The attn CLI of a ThreadSanitizer build, started from a Python that runs under tsan_preload.sh:
without that script's preloaded runtime, which would be the CLI's second (it has clang's linked in).
Python, not a shell script: bash and dash crash at start under GCC's preloaded TSan runtime
(SIGSEGV on `bash -c 'echo hi'`), Python does not."""
import os
import sys

os.environ.pop("LD_PRELOAD", None)
cli = os.environ["ATTN_TSAN_CLI"]
os.execv(cli, [cli] + sys.argv[1:])
