"""Code object → :class:`Bytecode`: instructions with Python-level arguments.

``dis`` (``disassemble.instructions``) does the byte walking (EXTENDED_ARG folding, CACHE skipping, jump
offsets, positions); this module turns its output into editable data: jump
targets become instruction references, flag bits of LOAD_GLOBAL and friends
are split from their names, and the exception table is re-expressed over
instructions.
"""

from __future__ import annotations

import bisect
import dis
from types import CodeType
from typing import Any

from kiln.capture.bytecode import optable
from kiln.capture.bytecode.disassemble import instructions
from kiln.capture.bytecode.instructions import Bytecode, ExceptionEntry, Instr
from kiln.capture.bytecode.optable import ArgKind
from kiln.capture.bytecode.tables import parse_exception_table
from kiln.capture.errors import CaptureError

__all__ = ["decode"]


def _arg_value(ins: dis.Instruction, code: CodeType) -> Any:
    kind = optable.arg_kind(ins.opname)
    if kind == ArgKind.NONE:
        return None
    if kind == ArgKind.RAW:
        return ins.arg
    if kind == ArgKind.COMPARE:
        assert ins.arg is not None
        return optable.compare_from_oparg(ins.arg)
    if kind == ArgKind.CONST:
        assert ins.arg is not None
        return code.co_consts[ins.arg]
    if kind == ArgKind.NAME:
        bits = optable.NAME_FLAG_BITS.get(ins.opname)
        if bits is None:
            return ins.argval
        assert ins.arg is not None
        flag = ins.arg & ((1 << bits) - 1)
        name = code.co_names[ins.arg >> bits]
        return (bool(flag), name) if bits == 1 else (flag, name)
    return ins.argval  # LOCAL, CELL: the variable's name; JUMP: fixed up later


def decode(code: CodeType) -> Bytecode:
    """Decode ``code`` into a :class:`Bytecode` that assembles back to an equal function."""
    raw = [ins for ins in instructions(code) if ins.opname != "EXTENDED_ARG"]
    instrs = [Instr(ins.opname, _arg_value(ins, code), _positions(ins), ins.offset) for ins in raw]
    starts = [ins.offset for ins in raw]

    def at(offset: int) -> Instr:
        # A target may name the EXTENDED_ARG before an instruction: take the next real one.
        i = bisect.bisect_left(starts, offset)
        if i == len(instrs):
            msg = f"offset {offset} lies past the end of {code.co_qualname}"
            raise CaptureError(msg)
        return instrs[i]

    for instr, ins in zip(instrs, raw, strict=True):
        if instr.is_jump:
            instr.arg = at(ins.argval)

    table = []
    for row in parse_exception_table(code.co_exceptiontable):
        last = bisect.bisect_left(starts, row.end) - 1
        table.append(
            ExceptionEntry(at(row.start), instrs[last], at(row.target), row.depth, row.lasti)
        )

    return Bytecode(
        instrs=instrs,
        exception_table=table,
        name=code.co_name,
        qualname=code.co_qualname,
        filename=code.co_filename,
        firstlineno=code.co_firstlineno,
        argcount=code.co_argcount,
        posonlyargcount=code.co_posonlyargcount,
        kwonlyargcount=code.co_kwonlyargcount,
        flags=code.co_flags,
        varnames=list(code.co_varnames),
        cellvars=list(code.co_cellvars),
        freevars=list(code.co_freevars),
        consts=list(code.co_consts),
        names=list(code.co_names),
    )


def _positions(ins: dis.Instruction) -> dis.Positions | None:
    pos = ins.positions
    if pos is None or pos.lineno is None:
        return None
    return pos
