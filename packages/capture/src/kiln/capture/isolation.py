"""Keeping the user's autograd hooks out of compilation.

Capture evaluates ops on fake tensors and autograd_aot traces forward and backward
graphs with them. Both run wherever the compiled function is first called, which may
be inside the user's ``torch.autograd.graph.saved_tensors_hooks`` (non-reentrant
``torch.utils.checkpoint`` is one): the hooks would be handed fake tensors and count
the tracer's saves as the program's. :func:`no_user_hooks` hides the hooks while
compiling; the compiled code then runs under them like eager code.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

__all__ = ["no_user_hooks"]

_autograd: Any = torch._C._autograd


@contextlib.contextmanager
def no_user_hooks() -> Iterator[None]:
    """Saved-tensor default hooks are not called inside the block (and come back after it)."""
    set_tracing = getattr(_autograd, "_saved_tensors_hooks_set_tracing", None)
    if set_tracing is not None:
        # the flag autograd itself consults: while set, saving a tensor ignores the hooks
        previous = set_tracing(True)
        try:
            yield
        finally:
            set_tracing(previous)
        return
    stack = []
    while (top := _autograd._top_saved_tensors_default_hooks(True)) is not None:
        stack.append(top)
        _autograd._pop_saved_tensors_default_hooks()
    try:
        yield
    finally:
        for pack, unpack in reversed(stack):
            _autograd._push_saved_tensors_default_hooks(pack, unpack)
