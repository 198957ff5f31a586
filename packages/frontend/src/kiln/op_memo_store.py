"""Capture's static op memo kept across processes, beside the whole-graph cache.

Capture runs every op of a frame on meta tensors to learn its result's layout, and on a warm
start it still does (capture yields the graph cache's key). Those runs are mostly Python
(torch's meta kernels and references), and the first one of a process makes torch import its
own symbolic-shapes module (its shape checks do): together a good part of a small model's
warm first call. :mod:`kiln.capture.shapes.memo` remembers, for the process, the
layout each op gave on static metadata; this module keeps that table in
``<graph cache folder>/ops/memo-<stamp>.pkl`` for later processes, the stamp naming what could
change an answer (Kiln's sources, torch's and Python's versions: the graph key's ``versions``).
A process loads it before its first capture, so an op an earlier process ran on the same
metadata runs no meta kernel; a compile that added entries writes the merged table. What a
process loads is what one long-running process of the same torch and Kiln would hold after
compiling what the earlier ones compiled: the memo's table is the process's, whatever modes and
settings its captures ran under, as its keys name everything a result depends on.

The file is pickled (operators by name) and read only when it matches its sealed sidecar, in
a folder as private as the graph cache's (:mod:`kiln.loopir.disk_cache`). An entry that does
not pickle is left out; a file that does not load, or a folder that cannot be used, costs only
the memo. Used where the whole-graph cache is (``KILN_GRAPH_CACHE``, the ``graph_cache``
option).
"""

from __future__ import annotations

import hashlib
import logging
import sys
from pathlib import Path
from typing import Any

import torch

from kiln import graph_cache
from kiln.capture.shapes import memo
from kiln.loopir import disk_cache, serialize

__all__ = ["load_once", "store_if_grown"]

log = logging.getLogger("kiln.frontend.cache")
#: the file this process loaded or last wrote, and how many entries the table had then
_state: dict[str, Any] = {"path": None, "size": 0}


def _path() -> Path:
    stamp = repr(
        (graph_cache._kiln_sources(), torch.__version__, sys.version, sys.platform, sys.byteorder)
    )
    name = f"memo-{hashlib.sha256(stamp.encode()).hexdigest()[:32]}.pkl"
    return disk_cache.private_dir(graph_cache.folder(), "ops") / name


def load_once() -> None:
    """Add the table kept in the current graph cache folder to this process's memo, once per
    folder (the folder moves with ``KILN_GRAPH_CACHE_DIR``)."""
    try:
        path = _path()
        if path == _state["path"]:
            return
        _state["path"], _state["size"] = path, len(memo.static_entries())
        data = disk_cache.read_verified(path)
        if data is None:
            return
        entries = serialize.loads(data)
        if not isinstance(entries, dict):
            return
    except Exception as e:  # an unusable folder or a foreign file: capture runs the ops
        log.info("op memo not loaded: %s: %s", type(e).__name__, e)
        return
    memo.add_static(entries)
    _state["size"] = len(memo.static_entries())
    disk_cache.touch(path)


def store_if_grown() -> None:
    """Write the table to the folder :func:`load_once` last read, if captures since then (or
    since the last write) added entries."""
    path = _state["path"]
    entries = memo.static_entries()
    if path is None or len(entries) <= _state["size"]:
        return
    try:
        try:
            data = serialize.dumps(entries)
        except Exception:  # an op or result without a stored form: kept without it
            data = serialize.dumps({k: e for k, e in entries.items() if _stored(k, e)})
        staged = disk_cache.temporary_sibling(path)
        try:
            staged.write_bytes(data)
            disk_cache.seal(staged, path)
        finally:
            staged.unlink(missing_ok=True)
        disk_cache.evict(path.parent, keep={path.name.split(".", 1)[0]})
    except Exception as e:  # a full disk, a folder gone: only the next process pays
        log.info("op memo not stored: %s: %s", type(e).__name__, e)
    _state["size"] = len(entries)


def _stored(key: Any, entry: Any) -> bool:
    try:
        serialize.dumps((key, entry))
    except Exception:
        return False
    return True
