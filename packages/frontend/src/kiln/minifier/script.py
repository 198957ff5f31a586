"""``repro.py``: a failing graph written as a script a person can run, read and edit.

The graph is FX's own Python for it (``torch.ops``/``torch`` calls only, every value an
input); the inputs' sizes, strides and dtypes are written in the script and their values saved
beside it (``repro.pt``), so the script runs with the recorded values, or with random ones when
that file is removed. The check itself is :func:`kiln.minifier.runner.main`.
"""

from __future__ import annotations

import builtins
import math
import re
import types
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import fx

from kiln.minifier.runner import Target, TensorSpec

__all__ = ["write_script"]

_TEMPLATE = '''"""Reproduces a Kiln failure: {what}.

`python {name}` exits with status 1 while the failure occurs and 0 once it is gone. The inputs'
values come from {data} beside this script; delete it to run on random inputs instead.
"""

import sys
from pathlib import Path

import torch

from kiln.minifier import runner
from kiln.minifier.runner import Target, TensorSpec
{imports}
{code}

INPUTS = [
{inputs}
]
TARGET = {target!r}

if __name__ == "__main__":
    sys.exit(runner.main(forward, INPUTS, TARGET, Path(__file__).with_name("{data}")))
'''


def _import_line(name: str, value: Any, src: str) -> str:
    if name == "torch" or not re.search(rf"\b{re.escape(name)}\b", src):
        return ""
    if value is type(None):
        return f"{name} = type(None)"
    if isinstance(value, types.ModuleType):
        return f"import {value.__name__} as {name}"
    if getattr(builtins, name, None) is value:
        return ""
    if isinstance(value, float) and not math.isfinite(value):
        return f"{name} = float({str(value)!r})"
    if isinstance(value, torch.dtype):
        return f"{name} = {value!r}"
    module, qualname = getattr(value, "__module__", None), getattr(value, "__qualname__", "")
    if module and qualname and "<" not in qualname:
        return f"{name} = runner.resolve({module!r}, {qualname!r})"
    msg = f"cannot write the global {name}={value!r} of the graph's code"
    raise ValueError(msg)


def _spec(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"    {TensorSpec.of(value)!r},"
    return f"    {value!r},"


def write_script(
    path: Path, target: Target, gm: fx.GraphModule, inputs: Sequence[Any], what: str
) -> Path:
    """Write ``gm`` and its inputs as ``path`` (and ``path`` with ``.pt``); returns ``path``."""
    code = gm.graph.python_code(root_module="self")
    imports = [_import_line(name, value, code.src) for name, value in code.globals.items()]
    data = path.with_suffix(".pt")
    saved = [t.detach().clone() if isinstance(t, torch.Tensor) else t for t in inputs]
    torch.save(saved, data)
    text = _TEMPLATE.format(
        what=what,
        name=path.name,
        data=data.name,
        imports="\n".join(line for line in imports if line),
        code=code.src.rstrip() + "\n",
        inputs="\n".join(_spec(v) for v in inputs),
        target=target,
    )
    path.write_text(text)
    return path
