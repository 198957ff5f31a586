import os
import stat

from kiln.codegen_cpp import cache


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
