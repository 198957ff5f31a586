"""Keeping the user's autograd hooks, and the rest of the process, out of compilation.

Capture evaluates ops on fake tensors and autograd_aot traces forward and backward
graphs with them. Both run wherever the compiled function is first called, which may
be inside the user's ``torch.autograd.graph.saved_tensors_hooks`` (non-reentrant
``torch.utils.checkpoint`` is one): the hooks would be handed fake tensors and count
the tracer's saves as the program's. :func:`no_user_hooks` hides the hooks while
compiling; the compiled code then runs under them like eager code.

A compile makes many objects that live on (fake tensors, graphs, traced values), so CPython
runs full collections during it, and each one traverses every object of the process: the
model, torch's modules, the user's data (0.4 s of a ResNet-18 warm start, a quarter of it).
:func:`older_objects_spared` moves the objects that existed before into the collector's
permanent generation (``gc.freeze``) while compiling, so collections traverse only what the
compile made (its own garbage is still collected), and back into the oldest one after. Where
objects were frozen already (CPython 3.12 starts with a few hundred frozen; a forking server
freezes its heap), thawing after would thaw those too: there the compile raises the threshold
of full collections instead, so the youngest generations are still collected and the full
collections the process owes run after the compile, not over and over during it.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator
from typing import Any

import torch

__all__ = ["no_user_hooks", "older_objects_spared"]

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


_spared = [0]  # compiles inside older_objects_spared now, in every thread (and whether it froze)
_spared_lock = threading.Lock()
_froze = [False]
# (the thresholds to put back, the ones set) where the compiles deferred full collections
_deferred: list[tuple[tuple[int, ...], tuple[int, ...]]] = []
# full collections wait for this many collections of the middle generation: none during a compile
_FULL_DEFERRED = 1 << 30


@contextlib.contextmanager
def older_objects_spared() -> Iterator[None]:
    """Inside the block the garbage collector leaves alone the objects made before it (see the
    module docstring); where objects were frozen already it runs no full collection instead,
    and a process that turned the collector off is left as it is. Nested and concurrent
    blocks share one freeze (or one raised threshold), undone when the last ends."""
    with _spared_lock:
        if _spared[0] == 0:
            _froze[0] = gc.isenabled() and gc.get_freeze_count() == 0
            if _froze[0]:
                gc.freeze()
            elif gc.isenabled():
                before = gc.get_threshold()
                gc.set_threshold(*before[:2], _FULL_DEFERRED, *before[3:])
                _deferred.append((before, gc.get_threshold()))
        _spared[0] += 1
    try:
        yield
    finally:
        with _spared_lock:
            _spared[0] -= 1
            if _spared[0] == 0 and _froze[0]:
                _froze[0] = False
                gc.unfreeze()
            if _spared[0] == 0 and _deferred:
                put_back, raised = _deferred.pop()
                if gc.get_threshold() == raised:  # else the program set its own meanwhile
                    gc.set_threshold(*put_back)
