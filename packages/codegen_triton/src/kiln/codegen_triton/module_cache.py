"""Generated kernel modules on disk: written once per source, imported once per process.

``<cache>/kernels/k<sha>.py`` holds a module's source (Triton reads kernel
source from real files, and its own cache of compiled binaries is keyed by it);
``<cache>/index.json`` records which Kiln kernel each file holds. A file's name
is the hash of its text, so an existing file is checked against its name before
it is reused (a truncated or altered one is rewritten), and a new one trims the folder to
``KILN_CACHE_SIZE_MB``, least recently used first; the folders are checked
private by :func:`kiln.loopir.disk_cache.private_dir`, since their code is run.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import threading
from pathlib import Path
from types import ModuleType

import triton

from kiln.codegen_triton.errors import TritonLaunchError
from kiln.loopir.disk_cache import atomic_write, evict, private_dir, touch

__all__ = [
    "MODULE_HEADER",
    "loaded_modules",
    "load_module",
    "module_path",
    "source_hash",
    "write_module",
]

MODULE_HEADER = """\
import triton
import triton.language as tl

from kiln.codegen_triton import helpers as kh
from kiln.codegen_triton.mathlib import libdevice

"""

_lock = threading.Lock()
_modules: dict[str, ModuleType] = {}


def source_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:40]


def module_path(cache_dir: Path, text: str) -> Path:
    """Where ``text`` is kept: under ``cache_dir`` or, if that is unsafe, its private fallback."""
    return private_dir(cache_dir, "kernels") / f"k{source_hash(text)}.py"


def _holds(path: Path, text: str) -> bool:
    try:
        return path.read_bytes() == text.encode()
    except OSError:
        return False


def write_module(cache_dir: Path, text: str, kernel_name: str) -> Path:
    """The module file holding ``text`` (written atomically if new or damaged) and its index."""
    path = module_path(cache_dir, text)
    if not _holds(path, text):
        atomic_write(path, text)
        _index_add(path.parent.parent, path.stem, kernel_name)
        evict(path.parent, keep={path.stem})
    else:
        touch(path)
    return path


def _index_add(cache_dir: Path, stem: str, kernel_name: str) -> None:
    index = cache_dir / "index.json"
    with _lock:
        try:
            data = json.loads(index.read_text())
        except (OSError, ValueError):
            data = {}
        if not isinstance(data, dict):
            data = {}
        data[stem] = {"kernel": kernel_name, "triton": triton.__version__}
        atomic_write(index, json.dumps(data, indent=1, sort_keys=True))


def load_module(path: Path) -> ModuleType:
    """Import a kernel module file once per process."""
    key = str(path)
    with _lock:
        if key in _modules:
            return _modules[key]
        spec = importlib.util.spec_from_file_location(f"kiln_triton_{path.stem}", path)
        if spec is None or spec.loader is None:
            msg = f"cannot import generated kernel module {path}"
            raise TritonLaunchError(msg)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _modules[key] = module
        return module


def loaded_modules() -> list[ModuleType]:
    """The kernel modules this process imported."""
    with _lock:
        return list(_modules.values())
