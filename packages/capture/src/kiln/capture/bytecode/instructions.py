"""Instructions, exception-table entries and whole code bodies as plain data.

An :class:`Instr` holds its argument as a Python-level value, never a raw
oparg: the constant object for ``LOAD_CONST``, the name for ``LOAD_FAST`` or
``LOAD_ATTR``, the target :class:`Instr` for a jump. Indices, EXTENDED_ARG
prefixes, CACHE units and jump offsets are the assembler's business, so code
can be edited by inserting, removing and re-pointing instructions freely.
Instructions compare by identity: a jump targets one particular instruction.
"""

from __future__ import annotations

import dataclasses
import dis
import functools
from collections.abc import Sequence
from typing import Any

from kiln.capture.bytecode import optable
from kiln.capture.errors import CaptureError

__all__ = ["Bytecode", "ExceptionEntry", "Instr", "Positions", "concrete_opname", "name_flag"]

Positions = dis.Positions


@dataclasses.dataclass(eq=False)
class Instr:
    """One instruction.

    ``arg`` by kind (see :func:`optable.arg_kind`): the constant (CONST); a
    name string (NAME, LOCAL, CELL); ``(flag, name)`` for LOAD_GLOBAL (push
    NULL first) and, on 3.12, LOAD_ATTR (method load) and LOAD_SUPER_ATTR
    (two flag bits), where a bare name means flag 0; the operator string for
    COMPARE_OP (``"<"``; on 3.13 ``"bool(<)"`` where the result is made a bool);
    the target ``Instr`` (JUMP); two local names for 3.13's superinstructions
    (LOCAL_PAIR: ``LOAD_FAST_LOAD_FAST`` and friends); the oparg int (RAW); or
    None. Jump opnames may be the generic ``JUMP``/``JUMP_NO_INTERRUPT`` and,
    on 3.11, ``POP_JUMP_IF_<cond>``: the assembler picks the direction.
    ``offset`` is where a decoded instruction sat in its original code (None
    for new ones); ``positions`` its source location (None: no location).
    """

    opname: str
    arg: Any = None
    positions: Positions | None = None
    offset: int | None = dataclasses.field(default=None, compare=False)

    @property
    def lineno(self) -> int | None:
        return self.positions.lineno if self.positions is not None else None

    @property
    def kind(self) -> str:
        return optable.arg_kind(concrete_opname(self.opname))

    @property
    def is_jump(self) -> bool:
        return self.kind == optable.ArgKind.JUMP

    def at(self, other: Instr | Positions | None) -> Instr:
        """Give this instruction ``other``'s source location; returns self."""
        self.positions = other.positions if isinstance(other, Instr) else other
        return self

    def __repr__(self) -> str:
        if isinstance(self.arg, Instr):
            target = self.arg
            arg = f"-> {target.opname}@{target.offset}" if target.offset is not None else "-> ?"
            return f"Instr({self.opname} {arg})"
        if self.arg is None and self.kind in (optable.ArgKind.NONE,):
            return f"Instr({self.opname})"
        return f"Instr({self.opname} {self.arg!r})"


@functools.cache
def concrete_opname(opname: str) -> str:
    """A real opcode name of this Python with the same argument kind and stack effect.

    Generic jump names (``JUMP``, 3.11's ``POP_JUMP_IF_*``) map to their forward form;
    ``LOAD_CLOSURE`` to 3.13's ``LOAD_FAST`` of the cell's slot.
    """
    if opname == "LOAD_CLOSURE" and optable.VERSION.cells_by_load_fast:
        return "LOAD_FAST"
    if opname in ("JUMP", "JUMP_NO_INTERRUPT"):
        return "JUMP_FORWARD"
    if optable.VERSION.directional_jumps and opname.startswith("POP_JUMP_IF_"):
        return "POP_JUMP_FORWARD_IF_" + opname[len("POP_JUMP_IF_") :]
    return opname


def name_flag(instr: Instr) -> tuple[int, str]:
    """``(flag bits, name)`` of a flagged name op; a bare name means flag 0."""
    if isinstance(instr.arg, str):
        return 0, instr.arg
    try:
        flag, name = instr.arg
    except (TypeError, ValueError):
        flag, name = None, None
    if not isinstance(name, str) or not isinstance(flag, int):
        msg = f"{instr.opname} needs (flag, name) or a name, got {instr.arg!r}"
        raise CaptureError(msg)
    return int(flag), name


@dataclasses.dataclass(eq=False)
class ExceptionEntry:
    """One row of the exception table, over instructions rather than offsets.

    It covers ``start`` through ``end`` inclusive, in list order; when any of
    them raises, the stack is cut to ``depth`` items, the offset of the raising
    instruction is pushed if ``lasti``, then the exception, and control goes to
    ``target``.
    """

    start: Instr
    end: Instr
    target: Instr
    depth: int
    lasti: bool


@dataclasses.dataclass
class Bytecode:
    """A code body as editable data, plus what a code object needs besides.

    ``consts`` and ``names`` are the pools the assembler starts from (kept in
    order, so a decoded body keeps its docstring in ``consts[0]``); values the
    instructions use that are missing get appended. ``varnames`` grows the
    same way; cell and free variables must be declared.
    """

    instrs: list[Instr]
    exception_table: list[ExceptionEntry] = dataclasses.field(default_factory=list)
    name: str = "<kiln>"
    qualname: str = "<kiln>"
    filename: str = "<kiln>"
    firstlineno: int = 1
    argcount: int = 0
    posonlyargcount: int = 0
    kwonlyargcount: int = 0
    flags: int = 0
    varnames: list[str] = dataclasses.field(default_factory=list)
    cellvars: list[str] = dataclasses.field(default_factory=list)
    freevars: list[str] = dataclasses.field(default_factory=list)
    consts: list[Any] = dataclasses.field(default_factory=list)
    names: list[str] = dataclasses.field(default_factory=list)

    def clone(self) -> Bytecode:
        """A deep copy of the instructions and table, jumps re-pointed at the copies."""
        copies = {id(i): Instr(i.opname, i.arg, i.positions, i.offset) for i in self.instrs}

        def twin(ins: Instr) -> Instr:
            return copies.get(id(ins), ins)

        for new in copies.values():
            if isinstance(new.arg, Instr):
                new.arg = twin(new.arg)
        table = [
            ExceptionEntry(twin(e.start), twin(e.end), twin(e.target), e.depth, e.lasti)
            for e in self.exception_table
        ]
        return dataclasses.replace(
            self,
            instrs=[copies[id(ins)] for ins in self.instrs],
            exception_table=table,
            varnames=list(self.varnames),
            cellvars=list(self.cellvars),
            freevars=list(self.freevars),
            consts=list(self.consts),
            names=list(self.names),
        )

    def insert_before(self, anchor: Instr, new: Sequence[Instr]) -> None:
        """Insert ``new`` so it runs before ``anchor`` on every path that reaches it.

        Jumps and handlers landing on ``anchor`` land on ``new[0]`` instead, and
        the new code is protected by whatever exception entry protects ``anchor``.
        """
        if not new:
            return
        self.instrs[self._position(anchor) : self._position(anchor)] = list(new)
        self._repoint(anchor, first=new[0], last=None)

    def replace(self, old: Instr, new: Sequence[Instr]) -> None:
        """Put ``new`` (not empty) where ``old`` was; jumps and entries follow."""
        if not new:
            msg = "replace() needs at least one instruction; use insert_before() and remove"
            raise CaptureError(msg)
        at = self._position(old)
        self.instrs[at : at + 1] = list(new)
        self._repoint(old, first=new[0], last=new[-1])

    def _position(self, ins: Instr) -> int:
        for i, x in enumerate(self.instrs):
            if x is ins:
                return i
        msg = f"{ins!r} is not an instruction of {self.qualname}"
        raise CaptureError(msg)

    def _repoint(self, old: Instr, first: Instr, last: Instr | None) -> None:
        for ins in self.instrs:
            if ins.arg is old and ins.is_jump:
                ins.arg = first
        for entry in self.exception_table:
            if entry.start is old:
                entry.start = first
            if entry.target is old:
                entry.target = first
            if last is not None and entry.end is old:
                entry.end = last

    def index(self, offset: int) -> int:
        """Position in ``instrs`` of the decoded instruction at ``offset``."""
        for i, instr in enumerate(self.instrs):
            if instr.offset == offset:
                return i
        msg = f"no instruction at offset {offset} in {self.qualname}"
        raise KeyError(msg)
