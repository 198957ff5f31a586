"""CPython 3.11/3.12/3.13 bytecode as editable data: decode, analyse, assemble.

The leaf layer every bytecode transformation in Kiln stands on::

    body = decode(fn.__code__)        # Bytecode: Instr list + exception table + pools
    ...edit body.instrs...            # args are values; jumps point at Instr objects
    code = assemble(body)             # a code object CPython runs and dis prints
"""

from kiln.capture.bytecode.analysis import (
    live_locals,
    max_stack_depth,
    prune_unreachable,
    reachable,
    stack_depths,
    stack_effect,
)
from kiln.capture.bytecode.assemble import assemble, const_key
from kiln.capture.bytecode.build import (
    binary_op,
    call,
    load_callable,
    make_cell,
    make_function,
    new_body,
    prologue,
)
from kiln.capture.bytecode.decode import decode
from kiln.capture.bytecode.format import format_bytecode, format_code, log_code
from kiln.capture.bytecode.info import CodeInfo, code_info
from kiln.capture.bytecode.instructions import Bytecode, ExceptionEntry, Instr, Positions
from kiln.capture.bytecode.optable import PY311, PY312, PY313, ArgKind
from kiln.capture.bytecode.versions import VERSION, BytecodeVersion

__all__ = [
    "PY311",
    "PY312",
    "PY313",
    "VERSION",
    "ArgKind",
    "BytecodeVersion",
    "Bytecode",
    "CodeInfo",
    "ExceptionEntry",
    "Instr",
    "Positions",
    "assemble",
    "binary_op",
    "call",
    "code_info",
    "const_key",
    "decode",
    "format_bytecode",
    "format_code",
    "live_locals",
    "load_callable",
    "log_code",
    "make_cell",
    "make_function",
    "max_stack_depth",
    "new_body",
    "prologue",
    "prune_unreachable",
    "reachable",
    "stack_depths",
    "stack_effect",
]
