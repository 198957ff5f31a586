import os
import stat
import time
import warnings

import pytest
import torch

from kiln.codegen_cpp import cache
from kiln.loopir import disk_cache


def test_cache_dir_is_private_and_overridable(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "c"))
    folder = cache.cache_dir()
    assert folder == tmp_path / "c" / "cpp"
    for path in (folder, folder.parent):
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o700


def test_default_cache_dir_under_user_cache(tmp_path, monkeypatch):
    monkeypatch.delenv("KILN_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache.cache_dir() == tmp_path / "kiln" / "cpp"


def test_cache_key_separates_parts():
    assert cache.cache_key(["ab", "c"]) != cache.cache_key(["a", "bc"])
    assert cache.cache_key(["x"]) == cache.cache_key([b"x"])


def test_atomic_write_leaves_no_temporaries(tmp_path):
    target = tmp_path / "f.txt"
    cache.atomic_write(target, "one")
    cache.atomic_write(target, "two")
    assert target.read_text() == "two"
    assert [p.name for p in tmp_path.iterdir()] == ["f.txt"]


SOURCE = """
extern "C" void plus_one(const float* in, float* out, long n) {
  for (long i = 0; i < n; ++i) out[i] = in[i] + 1.0f;
}
"""
FOREIGN = """
extern "C" void something_else(void) {}
"""


def _corrupt(path, how, foreign_bytes):
    data = path.read_bytes()
    if how == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif how == "empty":
        path.write_bytes(b"")
    elif how == "garbage":
        path.write_bytes(os.urandom(len(data)))
    else:  # a valid library of another source under this key
        path.write_bytes(foreign_bytes)


@pytest.mark.parametrize("how", ["truncated", "empty", "garbage", "foreign"])
def test_corrupt_library_is_rebuilt_not_loaded(tmp_path, monkeypatch, how):
    from kiln.codegen_cpp import build
    from kiln.codegen_cpp.errors import CodegenCppError
    from kiln.codegen_cpp.loader import KernelFunction, load_library

    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))
    (lib,) = build.build_libraries([SOURCE])
    (other,) = build.build_libraries([FOREIGN])
    _corrupt(lib.path, how, other.path.read_bytes())
    with pytest.raises(CodegenCppError, match="recorded size and hash"):
        load_library(lib.path)  # a truncated file would SIGBUS inside dlopen
    (again,) = build.build_libraries([SOURCE])
    assert not again.cached and again.path == lib.path
    assert cache.verified(again.path)
    load_library.cache_clear()
    kernel = KernelFunction(again.path, "plus_one", ["ptr", "ptr", "i64"])
    x = torch.randn(11)
    out = torch.empty_like(x)
    kernel(x, out, x.numel())
    torch.testing.assert_close(out, x + 1)
    (third,) = build.build_libraries([SOURCE])
    assert third.cached


def test_missing_or_corrupt_sidecar_means_rebuild(tmp_path, monkeypatch):
    from kiln.codegen_cpp import build

    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))
    (lib,) = build.build_libraries([SOURCE])
    sidecar = lib.path.with_name(lib.path.name + ".sha256")
    sidecar.write_text("{not json")
    assert not build.build_libraries([SOURCE])[0].cached
    sidecar.unlink()
    assert not build.build_libraries([SOURCE])[0].cached
    assert build.build_libraries([SOURCE])[0].cached


def test_world_writable_cache_dir_refused(tmp_path, monkeypatch):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    monkeypatch.setenv("KILN_CACHE_DIR", str(shared))
    with pytest.warns(disk_cache.CacheDirWarning, match="other users can write"):
        folder = cache.cache_dir()
    assert shared not in folder.parents
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
    assert os.stat(folder).st_uid == os.geteuid()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cache.cache_dir() == folder  # warned once


def test_foreign_owned_cache_dir_refused(tmp_path, monkeypatch):
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    try:
        os.chown(theirs, os.geteuid() + 4242, -1)
    except PermissionError:
        monkeypatch.setattr(os, "geteuid", lambda: os.stat(theirs).st_uid + 4242)
    monkeypatch.setenv("KILN_CACHE_DIR", str(theirs))
    with pytest.warns(disk_cache.CacheDirWarning, match="owned by another user"):
        folder = cache.cache_dir()
    assert theirs not in folder.parents


def test_unusable_cache_location_falls_back(tmp_path, monkeypatch):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    monkeypatch.setenv("KILN_CACHE_DIR", str(blocker / "cache"))
    with pytest.warns(disk_cache.CacheDirWarning, match="cannot be created"):
        folder = cache.cache_dir()
    assert folder.is_dir() and folder.name == "cpp"


def test_stale_temporaries_removed_fresh_ones_kept(tmp_path):
    stale = tmp_path / ".x.so.abc.tmp"
    fresh = tmp_path / ".y.so.def.tmp"
    keep = tmp_path / "z.so"
    for path in (stale, fresh, keep):
        path.write_bytes(b"")
    old = time.time() - 2 * disk_cache.STALE_SECONDS
    os.utime(stale, (old, old))
    assert disk_cache.clean_stale(tmp_path) == [stale]
    assert sorted(p.name for p in tmp_path.iterdir()) == [fresh.name, keep.name]


def _entry(folder, stem, size, age):
    for suffix in (".so", ".so.sha256"):
        path = folder / f"{stem}{suffix}"
        path.write_bytes(b"x" * (size if suffix == ".so" else 10))
        os.utime(path, (time.time() - age, time.time() - age))


def test_evict_removes_least_recently_used_whole_entries(tmp_path):
    _entry(tmp_path, "old", 1000, 300)
    _entry(tmp_path, "mid", 1000, 200)
    _entry(tmp_path, "new", 1000, 100)
    (tmp_path / ".pending.so.x.tmp").write_bytes(b"y" * 5000)  # a writer's, not an entry
    assert [e.stem for e in disk_cache.entries(tmp_path)] == ["old", "mid", "new"]
    disk_cache.touch(tmp_path / "old.so")  # used now: the most recent
    removed = disk_cache.evict(tmp_path, limit=2100)
    assert [e.stem for e in removed] == ["mid"]
    assert not list(tmp_path.glob("mid*"))
    removed = disk_cache.evict(tmp_path, limit=0, keep={"new"})
    assert [e.stem for e in removed] == ["old"]
    assert sorted(p.name for p in tmp_path.glob("new*")) == ["new.so", "new.so.sha256"]


def test_build_trims_cache_to_size_limit(tmp_path, monkeypatch):
    from kiln.codegen_cpp import build

    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))
    (first,) = build.build_libraries([SOURCE])
    monkeypatch.setenv(disk_cache.SIZE_ENV, "0")  # nothing beyond what is being loaded
    (second,) = build.build_libraries([FOREIGN])
    assert not first.path.exists() and cache.verified(second.path)
    (again,) = build.build_libraries([SOURCE])
    assert not again.cached and cache.verified(again.path)


def test_size_limit_from_environment(monkeypatch):
    monkeypatch.setenv(disk_cache.SIZE_ENV, "2.5")
    assert disk_cache.size_limit() == int(2.5 * 1024 * 1024)
    monkeypatch.setenv(disk_cache.SIZE_ENV, "lots")
    assert disk_cache.size_limit() == int(disk_cache.DEFAULT_SIZE_MB * 1024 * 1024)


def test_memoized_answers_last_while_their_stamp_does(tmp_path):
    calls = []

    def probe(value):
        def compute():
            calls.append(value)
            return value

        return compute

    assert disk_cache.memoized(tmp_path, "probe", "v1", probe([1, "a"])) == [1, "a"]
    assert disk_cache.memoized(tmp_path, "probe", "v1", probe([2, "b"])) == [1, "a"]
    assert calls == [[1, "a"]]
    # another stamp: computed and kept beside the first
    assert disk_cache.memoized(tmp_path, "probe", "v2", probe([3])) == [3]
    # an answer the caller refuses, and an entry that fails its sidecar: computed again
    assert disk_cache.memoized(tmp_path, "probe", "v1", probe([4]), lambda a: a[0] == 4) == [4]
    entry = next(p for p in tmp_path.glob("probe-*.json") if b"v2" in p.read_bytes())
    entry.write_text('{"stamp": "v2", "answer": [99]}')
    assert disk_cache.memoized(tmp_path, "probe", "v2", probe([5])) == [5]
    assert calls == [[1, "a"], [3], [4], [5]]
    assert not list(tmp_path.glob("*.tmp"))
    # a folder that cannot be written still answers
    missing = tmp_path / "gone" / "deeper"
    assert disk_cache.memoized(missing, "probe", "v1", probe([6])) == [6]
