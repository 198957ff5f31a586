"""kiln.guards' errors, rooted in :class:`kiln.capture.errors.KilnError`."""

from __future__ import annotations

from kiln.capture.errors import KilnError

__all__ = ["GuardsError", "RecompileLimitExceeded", "UnsupportedGuard"]


class GuardsError(KilnError):
    """Base of every error kiln.guards raises."""


class UnsupportedGuard(GuardsError):
    """A guard record kiln.guards cannot turn into a check (a capture bug or a version skew)."""


class RecompileLimitExceeded(GuardsError):
    """A function kept failing its guards past ``config.recompile_limit``.

    Raised only with ``config.fail_on_recompile_limit``; otherwise the frame runs eagerly.
    """

    def __init__(self, name: str, limit: int, reason: str) -> None:
        self.name = name
        self.limit = limit
        self.reason = reason
        super().__init__(
            f"{name} was recompiled {limit} times (config.recompile_limit); the last guard "
            f"failure: {reason}. Make that value stable between calls (or a tensor input "
            f"instead of a Python constant), raise kiln.guards.config.recompile_limit, or "
            f"unset kiln.guards.config.fail_on_recompile_limit to run it eagerly instead."
        )
