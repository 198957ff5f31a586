"""What every opcode family shares: the handler type and its registration decorator."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, TypeAlias

if TYPE_CHECKING:
    from kiln.capture.tracer import OpcodeHandler

__all__ = ["Handler", "registry"]

Handler: TypeAlias = "OpcodeHandler"


def registry() -> tuple[dict[str, Handler], Callable[..., Callable[[Handler], Handler]]]:
    """A family's handler table and the decorator that fills it by opname."""
    table: dict[str, Handler] = {}

    def handles(*names: str) -> Callable[[Handler], Handler]:
        def register(fn: Handler) -> Handler:
            for name in names:
                table[name] = fn
            return fn

        return register

    return table, handles
