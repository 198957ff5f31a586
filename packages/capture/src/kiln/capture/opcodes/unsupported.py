"""Instructions capture does not model: generators, async code, exceptions, class bodies."""

from __future__ import annotations

import dis
from typing import TYPE_CHECKING

from kiln.capture.break_reasons import unsupported
from kiln.capture.opcodes.common import registry

if TYPE_CHECKING:
    from kiln.capture.tracer import Tracer

HANDLERS, handles = registry()


@handles("RAISE_VARARGS", "RERAISE")
def raise_(tr: Tracer, ins: dis.Instruction) -> None:
    raise unsupported("user_exception", "raise")


def refuse(tr: Tracer, ins: dis.Instruction) -> None:
    """Every opcode without a model: generators, async, exception handling, class bodies."""
    raise unsupported("unsupported_opcode", ins.opname)
