"""An interpreter started with this folder on ``PYTHONPATH`` behaves as if Triton were absent.

torch depends on triton, so every environment Kiln's tests share has it installed. Here every
import finder answers "not found" for ``triton`` (and each module named in ``KILN_HIDE_MODULES``,
a comma list, e.g. ``kiln.codegen_triton``), as on a machine without it: ``import triton`` raises
``ModuleNotFoundError`` and ``importlib.util.find_spec("triton")`` is None. Python imports
``sitecustomize`` at startup, after the ``.pth`` files added their finders and before any user
code, so nothing imports triton first.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any

HIDDEN = ("triton", *filter(None, os.environ.get("KILN_HIDE_MODULES", "").split(",")))


def _hidden(fullname: str) -> bool:
    return any(fullname == h or fullname.startswith(h + ".") for h in HIDDEN)


class _Blind:
    """A meta path finder that finds what ``inner`` finds, except the hidden modules."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if _hidden(fullname):
            return None
        find = getattr(self.inner, "find_spec", None)
        return None if find is None else find(fullname, path, target)  # type: ignore[no-any-return]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


sys.meta_path[:] = [_Blind(finder) for finder in sys.meta_path]
