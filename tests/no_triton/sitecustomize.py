"""An interpreter started with this folder on ``PYTHONPATH`` behaves as if Triton were absent.

torch depends on triton, so every environment Kiln's tests share has it installed; here importing
``triton`` (and each module named in ``KILN_HIDE_MODULES``, a comma list, e.g.
``kiln.codegen_triton``) raises ``ModuleNotFoundError``, as on a machine without it. Python
imports ``sitecustomize`` at startup, before any user code, so nothing imports triton first.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from importlib.abc import MetaPathFinder
from importlib.machinery import ModuleSpec
from types import ModuleType

HIDDEN = ("triton", *filter(None, os.environ.get("KILN_HIDE_MODULES", "").split(",")))


class _Hide(MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if any(fullname == h or fullname.startswith(h + ".") for h in HIDDEN):
            raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)
        return None


sys.meta_path.insert(0, _Hide())
