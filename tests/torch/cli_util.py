"""Shared helpers for the CLI tests: where the binary is, running it, listing a directory."""
import os
import subprocess

ATTN_BIN = os.environ.get("ATTN_BIN", "")


def attn_bin():
    # The path ctest passes in ATTN_BIN (see tests/CMakeLists.txt, attn_add_pytest).
    assert ATTN_BIN and os.path.exists(ATTN_BIN), f"ATTN_BIN must name the attn binary, got {ATTN_BIN!r}"
    return ATTN_BIN


def run_attn(*args, cwd=None):
    """Runs `attn args...`; returns the CompletedProcess (text mode, never raises on exit status)."""
    return subprocess.run([attn_bin(), *map(str, args)], capture_output=True, text=True, cwd=cwd, timeout=120)


def listing(directory):
    return sorted(os.listdir(directory))
