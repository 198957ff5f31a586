"""Opcode handlers by family; :data:`HANDLERS` maps every 3.11/3.12 opname to one.

A handler takes the tracer and the instruction and updates the symbolic
state. Instructions capture cannot model map to a handler that raises
:class:`~kiln.capture.errors.Unsupported` (a graph break), never to nothing.
"""

from __future__ import annotations

import dis

from kiln.capture.opcodes import (
    arithmetic,
    building,
    calling,
    control,
    exceptions,
    generators,
    intrinsics,
    load_store,
    matching,
    unsupported,
)
from kiln.capture.opcodes.common import Handler
from kiln.capture.tracer import OPCODES

__all__ = ["HANDLERS"]

HANDLERS: dict[str, Handler] = {}
_FAMILIES = (
    load_store,
    arithmetic,
    calling,
    control,
    building,
    exceptions,
    generators,
    intrinsics,
    matching,
    unsupported,
)
for _family in _FAMILIES:
    HANDLERS.update(_family.HANDLERS)
for _name in dis.opmap:
    HANDLERS.setdefault(_name, unsupported.refuse)
OPCODES.update(HANDLERS)
