"""``kiln.disable``: run compiled code uncompiled, for a call or a ``with`` block.

Compiled functions read :data:`_disabled` on every call and run the original function while it
is set; capture calls a function marked ``_kiln_disabled`` as is.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Callable
from typing import Any

__all__ = ["disable"]

_disabled: contextvars.ContextVar[bool] = contextvars.ContextVar("kiln_disabled", default=False)


class _DisableContext(contextlib.ContextDecorator):
    """``with kiln.disable():`` and ``@kiln.disable()``: run compiled code uncompiled."""

    _kiln_disabled = True

    def __enter__(self) -> None:
        self._token = _disabled.set(True)

    def __exit__(self, *exc: object) -> None:
        _disabled.reset(self._token)


def disable(fn: Callable[..., Any] | None = None) -> Any:
    """Run ``fn`` (or the ``with`` block) without Kiln; capture calls such functions as is."""
    if fn is None:
        return _DisableContext()
    if not callable(fn):
        msg = f"kiln.disable needs a callable, got {type(fn).__name__}"
        raise TypeError(msg)

    @functools.wraps(fn)
    def uncompiled(*args: Any, **kwargs: Any) -> Any:
        token = _disabled.set(True)
        try:
            return fn(*args, **kwargs)
        finally:
            _disabled.reset(token)

    uncompiled._kiln_disabled = True  # type: ignore[attr-defined]
    return uncompiled
