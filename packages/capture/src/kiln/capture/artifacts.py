"""Debug artifacts: one folder per compiled frame under ``KILN_DEBUG_DIR``.

Any package may call :func:`dump` with a file name and text; when the
environment variable (or :func:`set_debug_dir`) names a folder, the text is
written into the folder of the frame being compiled, otherwise nothing
happens. The frontend opens a frame's folder with :func:`frame`. :func:`note` adds a line to a
section of the frame's notes (a pass's time, say), which the frontend writes into the
folder's index when the frame is done.
"""

from __future__ import annotations

import contextlib
import contextvars
import itertools
import os
import re
from collections.abc import Iterator
from pathlib import Path

__all__ = ["debug_dir", "set_debug_dir", "frame", "dump", "current_frame_dir", "note", "notes"]

_override: Path | None = None
_frame_dir: contextvars.ContextVar[Path | None] = contextvars.ContextVar(
    "kiln_frame_dir", default=None
)
_notes: contextvars.ContextVar[dict[str, list[str]] | None] = contextvars.ContextVar(
    "kiln_frame_notes", default=None
)
_ids = itertools.count()


def debug_dir() -> Path | None:
    """The root folder for artifacts, or None when dumping is off."""
    if _override is not None:
        return _override
    env = os.environ.get("KILN_DEBUG_DIR")
    return Path(env) if env else None


def set_debug_dir(path: str | os.PathLike[str] | None) -> None:
    """Override ``KILN_DEBUG_DIR`` for this process (None: back to the variable)."""
    global _override
    _override = Path(path) if path is not None else None


@contextlib.contextmanager
def frame(name: str, root: Path | None = None) -> Iterator[Path | None]:
    """Collect the artifacts dumped inside the block into a folder for ``name``.

    ``root`` overrides the debug folder for this frame (``kiln.compile(options={"debug_dir"})``).
    """
    root = root if root is not None else debug_dir()
    if root is None:
        yield None
        return
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", name)[:80]
    path = root / f"{next(_ids):04d}_{safe}"
    path.mkdir(parents=True, exist_ok=True)
    token = _frame_dir.set(path)
    notes_token = _notes.set({})
    try:
        yield path
    finally:
        _frame_dir.reset(token)
        _notes.reset(notes_token)


def note(section: str, line: str) -> None:
    """Add ``line`` to ``section`` of the open frame's notes (nothing when none is open)."""
    found = _notes.get()
    if found is not None:
        found.setdefault(section, []).append(line)


def notes() -> dict[str, list[str]]:
    """The open frame's notes by section (empty when none is open)."""
    return _notes.get() or {}


def current_frame_dir() -> Path | None:
    """The folder of the frame being compiled, if dumping is on."""
    path = _frame_dir.get()
    if path is None and debug_dir() is not None:
        path = debug_dir() / "_outside_frames"  # type: ignore[operator]
        path.mkdir(parents=True, exist_ok=True)
    return path


def dump(filename: str, text: str) -> Path | None:
    """Write ``text`` into the current frame's folder; returns the path written."""
    folder = current_frame_dir()
    if folder is None:
        return None
    target = folder / filename
    stem, dot, ext = filename.partition(".")
    n = 1
    while target.exists():
        target = folder / f"{stem}_{n}{dot}{ext}"
        n += 1
    target.write_text(text)
    return target
