"""Python stand-ins for torch functions that libraries call only while compiled.

Library code asks ``torch.compiler.is_compiling()`` and, under a compiler, calls torch's
higher-order operators (mamba's selective scan calls ``associative_scan``), which eager
code never reaches and whose own implementation needs Dynamo. Capture traces the stand-in
here instead: plain Python over torch ops that computes what the operator is defined to.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["substitute"]


def associative_scan(
    combine_fn: Callable[[Any, Any], Any],
    xs: Any,
    dim: int,
    reverse: bool = False,
    combine_mode: str = "pointwise",
) -> Any:
    """torch's ``associative_scan``: the inclusive scan of ``xs`` along ``dim``.

    ``xs`` is a tensor, or a tuple or list of tensors scanned together. ``combine_fn`` sees one
    element at a time (the scan dimension removed), as torch's ``generic`` mode hands it, which
    a ``pointwise`` combine also accepts; ``reverse`` scans from the last element, with the
    running result as the left operand, as torch's flip-scan-flip does.
    """
    single = isinstance(xs, torch.Tensor)
    leaves = [xs] if single else list(xs)
    n = leaves[0].shape[dim]
    steps = range(n - 1, -1, -1) if reverse else range(n)
    running: list[torch.Tensor] = []
    outs: list[list[torch.Tensor]] = []
    for i in steps:
        current = [x.select(dim, i) for x in leaves]
        if not running:
            running = current
        elif single:
            running = [combine_fn(running[0], current[0])]
        else:
            running = list(combine_fn(type(xs)(running), type(xs)(current)))
        outs.append(running)
    if reverse:
        outs.reverse()
    scanned = [torch.stack([o[j] for o in outs], dim) for j in range(len(leaves))]
    return scanned[0] if single else type(xs)(scanned)


# Keyed by the (module, qualname) the library's function object reports, so that the call is
# recognised without importing torch's implementation; the stand-in replaces it.
_SUBSTITUTES: dict[tuple[str, str], Callable[..., Any]] = {
    ("torch._higher_order_ops.associative_scan", "associative_scan"): associative_scan,
}


def substitute(fn: types.FunctionType) -> types.FunctionType | None:
    """The stand-in capture traces for ``fn``, or None."""
    found = _SUBSTITUTES.get((fn.__module__, fn.__qualname__))
    return found if isinstance(found, types.FunctionType) else None
