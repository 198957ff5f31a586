"""The swappable ``ops`` namespace and the ``V`` context every kernel body sees.

A kernel body calls ``ops.load(...)``, ``ops.add(...)``; which object answers is
decided by the innermost :func:`set_ops_handler` block, so one IR function can be
analysed, printed, evaluated or turned into code. Handlers are per thread/task
(a ``contextvars`` variable), so compiling in two threads does not mix them.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Any, cast

from kiln.loopir.errors import LoopIRError
from kiln.loopir.ops import OpsHandler

__all__ = ["ops", "V", "set_ops_handler", "current_ops_handler"]

_handler: contextvars.ContextVar[Any] = contextvars.ContextVar("kiln_ops_handler", default=None)
_kernel: contextvars.ContextVar[Any] = contextvars.ContextVar("kiln_kernel", default=None)
_graph: contextvars.ContextVar[Any] = contextvars.ContextVar("kiln_graph", default=None)


def current_ops_handler() -> Any:
    """The handler answering ``ops`` now; raises when none is installed."""
    handler = _handler.get()
    if handler is None:
        msg = (
            "ops.* was called outside a handler; wrap the call in "
            "`with kiln.loopir.virtualized.set_ops_handler(handler):`"
        )
        raise LoopIRError(msg)
    return handler


@contextlib.contextmanager
def set_ops_handler(handler: Any) -> Iterator[Any]:
    """Make ``handler`` answer ``ops.*`` inside the block (blocks nest)."""
    token = _handler.set(handler)
    try:
        yield handler
    finally:
        _handler.reset(token)


class _OpsProxy:
    """Forwards every call to the handler current *at call time*, so ``ops.add`` can
    be passed around (e.g. to a pointwise builder) before any handler is set."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)

        def forward(*args: Any, **kwargs: Any) -> Any:
            return getattr(current_ops_handler(), name)(*args, **kwargs)

        forward.__name__ = name
        return forward

    def __repr__(self) -> str:
        return f"ops<{type(_handler.get()).__name__}>"


ops: OpsHandler[Any] = cast("OpsHandler[Any]", _OpsProxy())


class _Virtualized:
    """``V.ops``, ``V.kernel`` (the kernel a codegen is emitting), ``V.graph`` (the lowering)."""

    @property
    def ops(self) -> OpsHandler[Any]:
        return ops

    @property
    def ops_handler(self) -> Any:
        return current_ops_handler()

    @property
    def kernel(self) -> Any:
        return _kernel.get()

    @property
    def graph(self) -> Any:
        return _graph.get()

    set_ops_handler = staticmethod(set_ops_handler)

    @staticmethod
    @contextlib.contextmanager
    def set_kernel(kernel: Any) -> Iterator[Any]:
        """Make ``V.kernel`` return ``kernel`` inside the block."""
        token = _kernel.set(kernel)
        try:
            yield kernel
        finally:
            _kernel.reset(token)

    @staticmethod
    @contextlib.contextmanager
    def set_graph(graph: Any) -> Iterator[Any]:
        """Make ``V.graph`` return ``graph`` inside the block."""
        token = _graph.set(graph)
        try:
            yield graph
        finally:
            _graph.reset(token)


V = _Virtualized()
