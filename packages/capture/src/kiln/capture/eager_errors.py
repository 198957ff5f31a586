"""Which failures of a torch op on fake tensors eager would raise too.

A torch op that fails while tracing is usually a graph break (it needs data, or has no meta
kernel). But an op that rejects its inputs' sizes (``linear`` of a ``[2, 5]`` input with a
``[4, 4]`` weight) fails the same way in eager: that is the user's error, and a report of
graph breaks before it would mislead. Such a failure raises
:class:`~kiln.capture.errors.EagerRaises`, and the frame runs eagerly to raise it as eager does.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import torch
from torch.utils import _pytree as pytree

from kiln.capture.values.symbolic import is_symbolic

if TYPE_CHECKING:
    from kiln.capture.tracer import Tracer

__all__ = ["raises_in_eager"]

# failures of the fake machinery itself, not of the user's inputs: those stay graph breaks
_FAKE_TROUBLE = ("fake", "meta", "data-dependent", "data dependent", "symbolic", "storage")


def raises_in_eager(tr: Tracer, error: Exception, fake_inputs: Iterable[Any]) -> bool:
    """Whether ``error``, raised by a torch op on ``fake_inputs``, is one eager raises too:
    a RuntimeError, ValueError or IndexError about the inputs of static sizes, met outside
    any ``try`` block of the user's that might expect it."""
    if type(error) not in (RuntimeError, ValueError, IndexError):
        return False
    text = str(error).lower()
    if any(word in text for word in _FAKE_TROUBLE):
        return False
    for leaf in pytree.tree_leaves(list(fake_inputs)):
        if isinstance(leaf, torch.Tensor) and any(is_symbolic(s) for s in leaf.shape):
            return False  # a size the trace left open: eager's values may well fit
        if is_symbolic(leaf):
            return False
    frame: Tracer | None = tr
    while frame is not None:
        at = frame.current
        if at is not None and frame._handler_for(at.offset) is not None:
            return False  # the user's own handler may catch it: break, and let eager decide
        frame = frame.parent
    return True
