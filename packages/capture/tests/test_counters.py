"""The process-wide counters under threads: no bump lost, no snapshot torn."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable

from kiln.capture import counters


def _together(*works: Callable[[], None]) -> list[BaseException]:
    errors: list[BaseException] = []
    start = threading.Barrier(len(works))

    def body(work: Callable[[], None]) -> None:
        try:
            start.wait()
            work()
        except BaseException as e:
            errors.append(e)

    pool = [threading.Thread(target=body, args=(w,)) for w in works]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return errors


def test_snapshots_while_other_threads_add_counters():
    # kiln.stats() reads while compiling threads bump counters seen for the first time: a
    # snapshot iterating the dicts as they grow raised "dictionary changed size".
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        counters.clear()

        def bumps() -> None:
            for i in range(20_000):
                counters.bump(f"test_threads_{i % 400}", f"k{i}")

        def snapshots() -> None:
            for _ in range(2_000):
                counters.snapshot()

        assert _together(bumps, bumps, snapshots, snapshots) == []
        snap = counters.snapshot()
        assert sum(sum(c.values()) for k, c in snap.items() if k.startswith("test_")) == 40_000
    finally:
        sys.setswitchinterval(old)
        counters.clear()
