"""Resident memory of the test process, for the tests that bound how much a run keeps."""

from __future__ import annotations

import ctypes
import os


def resident_bytes() -> int:
    """Resident bytes of this process (Linux), after glibc returns its free heap memory.

    glibc raises its mmap threshold after a large block is freed, so later blocks of that size
    come from the heap, whose free memory stays resident until trimmed: without the trim, RSS
    counts what the allocator keeps as well as what is leaked.
    """
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass
    with open(f"/proc/{os.getpid()}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
