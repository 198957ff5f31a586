"""What a saved cache file (``kiln.save_cache``) carries of this backend.

A loaded program's kernel modules come back from the program itself, but a process that finds
no binary in Triton's cache compiles every kernel again, and one that finds no autotuning record
times every candidate again. So the file also carries:

- ``triton`` members: every binary Triton holds in memory for a kernel module Kiln imported (each
  a folder of Triton's cache: the binary, its metadata and the ``__grp__`` index naming them),
  and the host-side launcher libraries Triton built with the C compiler to launch them;
- ``autotune`` members: the autotuning records this process read or wrote.

:func:`restore` writes a member back under this machine's folders. Triton's group index holds
absolute paths, so it is rewritten to the folder it lands in, and written after the files it
names (a reader that finds the index finds them too).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from triton import knobs

from kiln.codegen_triton import config
from kiln.codegen_triton.autotune import used_records
from kiln.codegen_triton.module_cache import loaded_modules
from kiln.loopir.disk_cache import atomic_write, private_dir

__all__ = ["GROUP_PREFIX", "members", "restore"]

GROUP_PREFIX = "__grp__"
"""How Triton names a folder's index of the files of one compiled kernel."""


def _triton_root() -> Path | None:
    folder = knobs.cache.dir
    return Path(folder) if folder else None


def _compiled_kernels() -> Iterator[Any]:
    """Every binary Triton's JIT holds for a function of a module Kiln imported (none where
    this Triton keeps them in another shape: the file then holds no binary, and the loading
    process compiles them)."""
    for module in loaded_modules():
        for value in vars(module).values():
            caches: Any = getattr(value, "device_caches", None)
            try:  # per device: (kernels by key, key cache, target, backend, binder)
                found = [k for per_device in caches.values() for k in per_device[0].values()]
            except (AttributeError, TypeError, LookupError):
                continue
            yield from found


def _library_file(function: Any) -> Path | None:
    """The file of the extension module a C function belongs to (Triton's launchers)."""
    owner = getattr(function, "__self__", None)
    found = getattr(owner, "__file__", None)
    return Path(found) if isinstance(found, str) else None


def _folders() -> dict[Path, None]:
    """The folders of Triton's cache these binaries and their launchers were read from."""
    folders: dict[Path, None] = {}
    loaded = False
    for kernel in _compiled_kernels():
        for path in getattr(kernel, "metadata_group", {}).values():
            folders[Path(path).parent] = None
        # a launcher built for this kernel's signature (Triton up to 3.6), once it was loaded
        state = getattr(kernel, "__dict__", {})
        launcher = state.get("_run") or state.get("run")
        if launcher is None:
            continue
        loaded = True
        library = _library_file(getattr(launcher, "launch", None))
        if library is not None:
            folders[library.parent] = None
    if loaded:  # the driver's own library, built once per machine and Triton version
        from triton.runtime import driver

        library = _library_file(getattr(driver.active.utils, "load_binary", None))
        if library is not None:
            folders[library.parent] = None
    return folders


def members() -> Iterator[tuple[str, str, Path]]:
    """``(kind, name, file)`` for each file a saved cache holds of this backend; a ``triton``
    name is ``<folder>/<file>`` within Triton's cache, group indexes after what they name."""
    root = _triton_root()
    if root is not None:
        for folder in _folders():
            if folder.parent != root:
                continue  # not in Triton's cache as this machine would look it up
            files = sorted(
                folder.iterdir(), key=lambda p: (p.name.startswith(GROUP_PREFIX), p.name)
            )
            for file in files:
                if file.is_file() and not file.name.startswith((".", "tmp")):
                    yield "triton", f"{folder.name}/{file.name}", file
    for record in used_records():
        if record.exists():
            yield "autotune", record.name, record


def restore(kind: str, name: str, data: bytes) -> Path:
    """Write one member of a saved cache file where this machine's processes will look for it;
    the path written. ``name`` has been checked to hold no path of its own beyond one folder."""
    if kind == "autotune":
        target = private_dir(config.options.cache_dir, "autotune") / name
    else:
        root = _triton_root()
        if root is None:
            msg = "Triton's cache is off on this machine (no cache folder): nothing to load into"
            raise ValueError(msg)
        folder, _, file = name.partition("/")
        target = root / folder / file
        target.parent.mkdir(parents=True, exist_ok=True)
        if file.startswith(GROUP_PREFIX):
            data = _relocated(data, target.parent)
    atomic_write(target, data)
    return target


def _relocated(index: bytes, folder: Path) -> bytes:
    """A group index naming its files in ``folder``, where they were written."""
    group = json.loads(index)
    paths = group.get("child_paths", {})
    group["child_paths"] = {child: str(folder / Path(p).name) for child, p in paths.items()}
    return json.dumps(group).encode()
