"""kiln.cache and ``python -m kiln cache``: the on-disk caches inspected and emptied."""

from __future__ import annotations

import os
import subprocess
import sys

import torch

import kiln

try:
    from kiln.codegen_triton.config import options as triton_options
except ImportError:  # no Triton here: the C++ cache is the only one
    triton_options = None


def test_info_and_clear(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "c"))
    if triton_options is not None:
        monkeypatch.setattr(triton_options, "cache_dir", tmp_path / "t")
    kiln.reset()
    f = kiln.compile(lambda x: x.cos() * 2, backend="kiln", fullgraph=True)
    x = torch.randn(8)
    torch.testing.assert_close(f(x), x.cos() * 2)
    found = {c.name: c for c in kiln.cache.info()}
    assert found["cpp"].entries >= 1 and found["cpp"].size > 0
    assert found["cpp"].path == tmp_path / "c" / "cpp"
    assert kiln.cache.clear() >= 1
    assert all(c.entries == 0 for c in kiln.cache.info())
    kiln.reset()
    g = kiln.compile(lambda x: x.cos() * 2, backend="kiln", fullgraph=True)
    torch.testing.assert_close(g(x), x.cos() * 2)  # rebuilt after the clear
    assert {c.name: c for c in kiln.cache.info()}["cpp"].entries >= 1
    kiln.reset()


def test_command_line(tmp_path, monkeypatch):
    env = {"KILN_CACHE_DIR": str(tmp_path / "c"), "KILN_TRITON_CACHE": str(tmp_path / "t")}
    (tmp_path / "c" / "cpp").mkdir(parents=True, mode=0o700)
    (tmp_path / "c").chmod(0o700)
    (tmp_path / "c" / "cpp" / "abc.so").write_bytes(b"x" * 10)

    def run(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "kiln", "cache", *args],
            env={**os.environ, **env},
            capture_output=True, text=True, check=True, timeout=120,
        )  # fmt: skip
        return done.stdout

    out = run("info")
    assert "cpp" in out and "1 entries" in out and str(tmp_path / "c" / "cpp") in out
    assert "removed 1 entries" in run("clear")
    assert not list((tmp_path / "c" / "cpp").iterdir())


def _wide_check() -> kiln.guards.GuardCheck:
    from kiln.capture.guard_data import GuardKind, GuardSpec, TensorMeta
    from kiln.capture.source import LocalSource

    def wide(a, b, c, d, e, f):
        return a + b + c + d + e + f

    meta = TensorMeta.of(torch.randn(4, 3))
    specs = [GuardSpec(LocalSource(n), GuardKind.TENSOR_MATCH, meta) for n in "abcdef"]
    return kiln.guards.build_check(specs, wide)


def test_guard_checks_are_kept_compiled(tmp_path, monkeypatch):
    from kiln.guards import check as check_module

    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "c"))
    first = _wide_check()
    folder = kiln.cache.folders()["guards"]
    assert folder == tmp_path / "c" / "guards"
    (entry,) = folder.glob("*.code")
    compiled: list[str] = []

    def counted(*args, **kwargs):
        compiled.append(args[1])
        return compile(*args, **kwargs)

    monkeypatch.setattr(check_module, "compile", counted, raising=False)
    args = [torch.randn(4, 3) for _ in range(6)]
    second = _wide_check()
    assert not compiled and second.source == first.source
    assert second(*args) and first(*args)
    assert not second(*args[:5], args[5].double()) and not first(*args[:5], args[5].double())
    data = entry.read_bytes()
    entry.write_bytes(data[:-1] + bytes([data[-1] ^ 0xFF]))  # fails its sidecar: compiled again
    third = _wide_check()
    assert len(compiled) == 1 and third(*args) and not third(*args[:5], 1)
    assert {c.name: c for c in kiln.cache.info()}["guards"].entries == 1
