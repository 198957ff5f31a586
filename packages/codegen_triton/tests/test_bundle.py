"""A saved cache file's Triton members (``kiln.codegen_triton.bundle``): found from the binaries
Triton's JIT holds for Kiln's kernel modules, written back under another machine's Triton cache
with the group index pointing at the new folder. Triton's objects are stood in for (the
interpreter compiles no binary); the GPU round trip is in the root tests' persistence file."""

from __future__ import annotations

import dataclasses
import json
import types
from pathlib import Path

import pytest
from triton import knobs

from kiln.codegen_triton import autotune, bundle, config, module_cache
from kiln.codegen_triton.autotune import Autotuner, Config


def _triton_folder(root: Path, group: str) -> dict[str, str]:
    """A compiled kernel's folder as Triton writes it: files and the index naming them."""
    folder = root / group
    folder.mkdir(parents=True)
    children = {}
    for name, data in (("k.cubin", b"\x7fELF"), ("k.json", b'{"name": "k"}')):
        (folder / name).write_bytes(data)
        children[name] = str(folder / name)
    (folder / "__grp__k.json").write_text(json.dumps({"child_paths": children}))
    return children


def test_members_are_the_binaries_of_kiln_kernels_and_restore_relocates_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    children = _triton_folder(first, "GROUPA")
    _triton_folder(first, "UNUSED")  # another program's kernel: not carried
    kernel = types.SimpleNamespace(metadata_group=children)  # no launcher loaded yet
    jit = types.SimpleNamespace(device_caches={0: ({"key": kernel}, {}, None, None, None)})
    module = types.ModuleType("kiln_triton_kstub")
    module.kiln_poi_add_0 = jit  # type: ignore[attr-defined]
    monkeypatch.setitem(module_cache._modules, str(tmp_path / "kstub.py"), module)
    monkeypatch.setattr(knobs.cache, "dir", str(first))
    monkeypatch.setattr(config, "options", dataclasses.replace(config.options, cache_dir=tmp_path))
    monkeypatch.setattr(bundle, "used_records", lambda: [])

    found = [(kind, name) for kind, name, _ in bundle.members()]
    assert found == [
        ("triton", "GROUPA/k.cubin"),
        ("triton", "GROUPA/k.json"),
        ("triton", "GROUPA/__grp__k.json"),  # the index after the files it names
    ]

    files = [(kind, name, path.read_bytes()) for kind, name, path in bundle.members()]
    monkeypatch.setattr(knobs.cache, "dir", str(second))
    for kind, name, data in files:
        bundle.restore(kind, name, data)
    index = json.loads((second / "GROUPA" / "__grp__k.json").read_text())
    assert index["child_paths"] == {
        "k.cubin": str(second / "GROUPA" / "k.cubin"),
        "k.json": str(second / "GROUPA" / "k.json"),
    }
    assert (second / "GROUPA" / "k.cubin").read_bytes() == b"\x7fELF"
    assert not (second / "UNUSED").exists()


def test_autotuning_records_read_or_written_are_members(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(autotune, "_used", {})  # the records of this test alone
    configs = [Config(64, 1, 4, 1024), Config(128, 1, 4, 1024)]
    source = "def k(): pass  # bundle test"
    Autotuner(source, configs, tmp_path / "first", [])._save(configs[1])
    found = [(name, path) for kind, name, path in bundle.members() if kind == "autotune"]
    assert len(found) == 1 and found[0][1].parent == tmp_path / "first" / "autotune"

    # another machine's cache folder: the record lands where its tuners look
    other = tmp_path / "second"
    monkeypatch.setattr(config, "options", dataclasses.replace(config.options, cache_dir=other))
    name, path = found[0]
    assert bundle.restore("autotune", name, path.read_bytes()) == other / "autotune" / name
    assert Autotuner(source, configs, other, []).load_cached() == configs[1]
