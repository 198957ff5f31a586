"""The symbolic evaluator, complete: importing this module fills every dispatch table.

The tracer looks opcode handlers up in :data:`kiln.capture.tracer.OPCODES` and the opcode
handlers look behaviour up in :mod:`kiln.capture.dispatch` by value kind; neither imports the
modules that fill those tables (so that no import cycle runs through them). This module imports
each of them once, and every entry point that traces a frame (``capture``, ``export``) imports
it first.
"""

from __future__ import annotations

from kiln.capture import (
    attributes,
    builtin_calls,
    calls,
    container_methods,
    contexts,
    items,
    iteration,
    numpy_calls,
    opcodes,
    operators,
    symbolic_numbers,
    torch_calls,
)

__all__ = ["MODULES"]

#: The modules that register handlers, in the order they were imported.
MODULES = (
    torch_calls,
    numpy_calls,
    contexts,
    container_methods,
    attributes,
    items,
    operators,
    symbolic_numbers,
    iteration,
    builtin_calls,
    calls,
    opcodes,
)
