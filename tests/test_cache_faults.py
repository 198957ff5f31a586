"""The C++ build cache under faults, across real processes.

Each case runs fresh interpreters against one cache folder: entries corrupted between runs,
two and four processes filling an empty cache at once, a process killed mid-build, and cache
locations that must not (world-writable, another user's) or cannot (read-only) be used. Every
child compiles with ``fullgraph=True``, so a library that failed to load would raise rather
than quietly run eagerly, and checks its answers against eager.
"""

from __future__ import annotations

import collections
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import cast

import pytest

CHILD = r"""
import json, os, sys, time, warnings
import torch
import kiln
from kiln.loopir.disk_cache import CacheDirWarning

barrier = os.environ.get("KILN_TEST_BARRIER")
if barrier:  # "<folder>:<n>": start compiling once n children are ready
    folder, n = barrier.rsplit(":", 1)
    open(os.path.join(folder, str(os.getpid())), "w").close()
    deadline = time.monotonic() + 120
    while len(os.listdir(folder)) < int(n) and time.monotonic() < deadline:
        time.sleep(0.005)

def f(x, y):
    return (x.sin() * y + 1).relu().sum(dim=-1)

def g(x):
    return torch.tanh(x) * 3 - x

with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    cf = kiln.compile(f, backend="kiln", fullgraph=True)
    cg = kiln.compile(g, backend="kiln", fullgraph=True)
    for n in (5, 9, 5):
        x, y = torch.randn(3, n), torch.randn(3, n)
        torch.testing.assert_close(cf(x, y), f(x, y))
        torch.testing.assert_close(cg(x), g(x))
from kiln.codegen_cpp.cache import cache_dir
print(json.dumps({
    "eager_fallbacks": kiln.stats().eager_fallbacks,
    "cache_warnings": [str(w.message) for w in caught if w.category is CacheDirWarning],
    "cache_dir": str(cache_dir()),
}))
"""


def _env(cache: Path) -> dict[str, str]:
    return {**os.environ, "KILN_CACHE_DIR": str(cache), "OMP_NUM_THREADS": "1"}


def _start(cache: Path, barrier: str = "") -> subprocess.Popen[str]:
    env = _env(cache)
    if barrier:
        env["KILN_TEST_BARRIER"] = barrier
        env["KILN_LOGS"] = "+build"  # names each library the child built
    return subprocess.Popen(
        [sys.executable, "-c", CHILD],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _finish(proc: subprocess.Popen[str]) -> dict[str, object]:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, f"child exited {proc.returncode}:\n{err[-4000:]}"
    result: dict[str, object] = json.loads(out.strip().splitlines()[-1])
    assert result["eager_fallbacks"] == 0
    result["built"] = re.findall(r"built \S*/(\w+)\.so$", err, re.MULTILINE)
    return result


def _run(cache: Path) -> dict[str, object]:
    return _finish(_start(cache))


def _libraries(cache: Path) -> list[Path]:
    return sorted((cache / "cpp").glob("*.so"))


def _assert_clean(cache: Path) -> None:
    """Every entry is whole (its source, library and sidecar) and verifies; nothing else."""
    from kiln.loopir.disk_cache import entries, verified

    found = entries(cache / "cpp")
    assert found
    for entry in found:
        names = sorted(path.name[len(entry.stem) :] for path in entry.files)
        assert names == [".cpp", ".so", ".so.sha256"], entry
        assert verified(cache / "cpp" / f"{entry.stem}.so"), entry
    assert not list(cache.rglob("*.tmp"))
    assert not [p for p in (cache / "cpp").iterdir() if p.name.startswith(".")]


def test_corrupt_libraries_are_rebuilt_by_the_next_run(tmp_path):
    cache = tmp_path / "cache"
    _run(cache)
    libs = _libraries(cache)
    assert len(libs) >= 2
    foreign = libs[-1].read_bytes()
    # Every way a library can go wrong, one per entry (cycled if there are more).
    damage = [
        lambda data: data[: len(data) // 2],  # truncated: dlopen would SIGBUS
        lambda data: b"",
        lambda data: os.urandom(len(data)),
        lambda data: foreign,  # a valid library of another kernel
    ]
    for i, lib in enumerate(libs[:-1]):
        lib.write_bytes(damage[i % len(damage)](lib.read_bytes()))
    libs[-1].write_bytes(libs[-1].read_bytes()[:100])
    _run(cache)
    _assert_clean(cache)
    assert [lib.name for lib in _libraries(cache)] == [lib.name for lib in libs]


@pytest.mark.parametrize("processes", [2, 4])
def test_processes_fill_an_empty_cache_at_once(tmp_path, processes):
    cache, ready = tmp_path / "cache", tmp_path / "ready"
    ready.mkdir()
    # every child imports first and compiles only once all are ready, so their builds overlap
    procs = [_start(cache, f"{ready}:{processes}") for _ in range(processes)]
    built = collections.Counter(
        name for proc in procs for name in cast(list[str], _finish(proc)["built"])
    )
    assert max(built.values()) >= 2, f"no library was built by two children at once: {built}"
    _assert_clean(cache)
    # a rewrite renames a new file into place (a new inode); a hit only touches its times
    before = {lib.name: lib.stat().st_ino for lib in _libraries(cache)}
    _run(cache)  # everything is a cache hit now: nothing rewritten
    assert {lib.name: lib.stat().st_ino for lib in _libraries(cache)} == before


def test_killed_mid_build_then_a_fresh_run(tmp_path):
    cache = tmp_path / "cache"
    proc = _start(cache)
    deadline = time.monotonic() + 120
    while not list((cache / "cpp").glob("*.tmp")):  # a compiler is writing its output
        assert proc.poll() is None, "the child finished before any build was seen"
        assert time.monotonic() < deadline
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGKILL)  # the child and its compilers
    proc.communicate()
    leftovers = list((cache / "cpp").glob("*.tmp"))
    if not leftovers:  # the build seen finished between the look and the kill
        leftovers = [cache / "cpp" / "killed-build.so.tmp"]
        leftovers[0].write_bytes(b"\x7fELF half-written")
    old = time.time() - 2 * 3600
    for path in leftovers:
        os.utime(path, (old, old))
    _run(cache)
    _assert_clean(cache)


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs a read-only /proc")
def test_read_only_cache_location_falls_back_with_one_warning(tmp_path):
    result = _run(Path("/proc/kiln-cache-test"))
    warnings = result["cache_warnings"]
    assert isinstance(warnings, list) and len(warnings) == 1
    assert "cannot be created" in warnings[0]
    assert not str(result["cache_dir"]).startswith("/proc")


def test_world_writable_cache_location_refused(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    result = _run(shared)
    warnings = result["cache_warnings"]
    assert isinstance(warnings, list) and len(warnings) == 1
    assert "other users can write" in warnings[0]
    assert not list(shared.iterdir())


def test_foreign_owned_cache_location_refused(tmp_path):
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    try:
        os.chown(theirs, os.geteuid() + 4242, -1)
    except PermissionError:
        pytest.skip("giving a folder to another user needs root")
    result = _run(theirs)  # root could write there: only the owner check refuses it
    warnings = result["cache_warnings"]
    assert isinstance(warnings, list) and len(warnings) == 1
    assert "owned by another user" in warnings[0]
    assert not list(theirs.iterdir())
