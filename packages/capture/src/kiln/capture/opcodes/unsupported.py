"""Instructions capture does not model: async code, ``yield from``, class bodies, ``match``."""

from __future__ import annotations

import dis
from typing import TYPE_CHECKING

from kiln.capture.breaks.reasons import unsupported
from kiln.capture.opcodes.common import registry

if TYPE_CHECKING:
    from kiln.capture.tracer import Tracer

HANDLERS, handles = registry()


def refuse(tr: Tracer, ins: dis.Instruction) -> None:
    """Every opcode without a model: async code, ``yield from``, class bodies, ``match``."""
    raise unsupported("unsupported_opcode", ins.opname)
