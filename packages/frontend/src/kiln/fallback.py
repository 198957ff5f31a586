"""What happens when Kiln itself fails: run eagerly, warn once, never give a wrong result.

A failure while compiling is either the user's (their code raises in eager too) or Kiln's.
Running the frame eagerly tells the two apart: a user error surfaces exactly as eager raises it,
while a Kiln failure warns once and the frame keeps running eagerly.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

from kiln.capture import KilnError, counters

__all__ = ["CompileError", "run_eagerly_after_failure"]


class CompileError(KilnError):
    """Kiln could not compile a frame (raised only under ``fullgraph=True``)."""


def run_eagerly_after_failure(
    name: str,
    error: BaseException,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    key: tuple[Any, ...],
    skipped: set[tuple[Any, ...]],
) -> Any:
    """Run ``fn`` eagerly after compiling it failed with ``error``.

    If eager raises too, the user's own error propagates and nothing is remembered. If eager
    succeeds, the failure was Kiln's: one warning, and the frame is skipped from now on.
    """
    result = fn(*args, **kwargs)
    counters.bump("stats", "eager_fallbacks")
    skipped.add(key)
    warnings.warn(
        f"kiln: compiling {name} failed ({type(error).__name__}: {error}); it runs eagerly "
        "from now on. Pass fullgraph=True to raise instead, or KILN_LOGS=+kiln for details.",
        RuntimeWarning,
        stacklevel=5,  # run_eagerly_after_failure, _compile_or_eager, _miss, __call__, user
    )
    return result
