import ctypes
import shutil

import pytest
import torch

from kiln.codegen_cpp import build
from kiln.codegen_cpp.errors import CppBuildError
from kiln.codegen_cpp.loader import KernelFunction

SOURCE = """
#include "kiln_vec.h"
extern "C" void twice(const float* in, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = 2.0f * in[i];
}
"""


def test_build_load_call_and_cache_hit():
    (lib,) = build.build_libraries([SOURCE])
    assert lib.path.exists() and not lib.cached
    assert "-fopenmp" in lib.flags and "-O3" in lib.flags
    assert lib.source_path.read_text() == SOURCE
    (again,) = build.build_libraries([SOURCE])
    assert again.cached and again.path == lib.path
    kernel = KernelFunction(lib.path, "twice", ["ptr", "ptr", "i64"])
    x = torch.randn(37)
    out = torch.empty_like(x)
    kernel(x, out, x.numel())
    torch.testing.assert_close(out, 2 * x)


def test_parallel_builds_and_error_names_the_file():
    good = SOURCE.replace("2.0f", "3.0f")
    bad = 'extern "C" void broken() { this is not C++; }'
    with pytest.raises(CppBuildError) as info:
        build.build_libraries([good, bad])
    err = info.value
    assert str(err.source_path) in str(err)
    assert "error" in err.compiler_output
    assert err.source_path.read_text() == bad
    # The good library was still built and cached; no failed entry exists.
    (good_lib,) = build.build_libraries([good])
    assert good_lib.cached
    assert not err.source_path.with_suffix(".so").exists()
    assert not [p for p in err.source_path.parent.iterdir() if p.name.endswith(".tmp")]


def test_key_depends_on_flags_and_compiler():
    tools = build.toolchain()
    key = build.library_key(SOURCE, tools)
    other = build.Toolchain(tools.compiler, tools.version + "x", tools.target, tools.flags)
    assert build.library_key(SOURCE, other) != key
    fewer = build.Toolchain(tools.compiler, tools.version, tools.target, tools.flags[1:])
    assert build.library_key(SOURCE, fewer) != key
    assert isinstance(ctypes.sizeof(ctypes.c_int64), int)


def test_concurrent_builds_share_one_clean_entry(tmp_path, monkeypatch):
    """Two builders racing on one source (as two processes would) leave one entry."""
    import threading

    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))
    source = SOURCE.replace("2.0f", "5.0f")
    results = []
    threads = [
        threading.Thread(target=lambda: results.append(build.build_libraries([source])[0]))
        for _ in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({lib.path for lib in results}) == 1
    files = sorted(f.name for f in (tmp_path / "cpp").iterdir())
    assert len([f for f in files if f.endswith(".so")]) == 1
    assert not [f for f in files if f.endswith(".tmp")]


@pytest.fixture
def fresh_toolchain():
    build.toolchain.cache_clear()
    yield
    build.toolchain.cache_clear()  # later tests probe the compiler they run with


def test_compiler_probes_are_kept_until_the_compiler_changes(
    tmp_path, monkeypatch, fresh_toolchain
):
    """A new process reads the compiler's version, target and vector width from the cache's
    folder; a changed compiler file, target or tampered entry makes it run the probes again."""
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))
    real = shutil.which("g++") or shutil.which("c++")
    assert real is not None
    compiler = tmp_path / "bin" / "cxx"
    compiler.parent.mkdir()
    compiler.write_text(f'#!/bin/sh\nexec {real} "$@"\n')
    compiler.chmod(0o755)
    monkeypatch.setenv("CXX", str(compiler))
    runs = []
    probe = build._run
    monkeypatch.setattr(build, "_run", lambda command: runs.append(command) or probe(command))

    def new_process():
        build.toolchain.cache_clear()
        return build.toolchain()

    first = new_process()
    assert first.compiler == str(compiler) and len(runs) == 3
    assert new_process() == first and len(runs) == 3  # read from disk, compiler not run
    stamp = build.toolchain_stamp()
    compiler.write_text(compiler.read_text() + "# upgraded\n")  # same path, another file
    assert build.toolchain_stamp() != stamp
    assert new_process() == first and len(runs) == 6
    entries = (tmp_path / "cache" / "probes").glob("toolchain-*.json")
    entry = max(entries, key=lambda path: path.stat().st_mtime_ns)  # the upgraded compiler's
    entry.write_text(entry.read_text().replace(first.target, "elsewhere"))
    assert new_process() == first and len(runs) == 9  # fails verification: probed
    upgraded = build.toolchain_stamp()
    monkeypatch.setenv("KILN_CPP_MARCH", "x86-64-v2")  # another target: another stamp
    assert build.toolchain_stamp() != upgraded
    monkeypatch.delenv("KILN_CPP_MARCH")
    # a built library's key still holds what the compiler said (its version), as before
    (lib,) = build.build_libraries([SOURCE.replace("2.0f", "7.0f")])
    assert lib.path.exists()
