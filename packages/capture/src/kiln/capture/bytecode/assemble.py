""":class:`Bytecode` → code object that CPython runs and ``dis`` prints.

Steps, in order: pick a concrete direction for each jump (rewriting 3.12's
backward conditional jumps, which do not exist, into a forward test around a
``JUMP_BACKWARD``); turn arguments into opargs through the constant, name,
local and cell pools; lay the code out, growing EXTENDED_ARG prefixes until
jump offsets stop changing; then write the bytes with their CACHE units, the
location table, the exception table and the stack size.
"""

from __future__ import annotations

import itertools
import types
from collections.abc import Sequence
from typing import Any

from kiln.capture.bytecode import optable
from kiln.capture.bytecode.analysis import local_accesses, max_stack_depth
from kiln.capture.bytecode.instructions import (
    Bytecode,
    ExceptionEntry,
    Instr,
    Positions,
    concrete_opname,
    name_flag,
)
from kiln.capture.bytecode.optable import ArgKind
from kiln.capture.bytecode.tables import (
    RawExceptionEntry,
    encode_exception_table,
    encode_linetable,
)
from kiln.capture.errors import CaptureError

__all__ = ["assemble", "const_key"]

_EXTENDED_ARG = optable.opcode_of("EXTENDED_ARG")
_CACHE = optable.opcode_of("CACHE")

_NEGATED = {"FALSE": "TRUE", "TRUE": "FALSE", "NONE": "NOT_NONE", "NOT_NONE": "NONE"}


def const_key(value: Any) -> Any:
    """A key under which two constants may share a ``co_consts`` slot.

    Like CPython's own: type-aware (``1``, ``1.0`` and ``True`` differ), sign-aware
    for floats, recursive for tuples; any other object (code objects too, as
    in CPython) is kept by identity, so tensors and callables placed in
    constants are never compared.
    """
    if isinstance(value, tuple | frozenset):
        keys = tuple(const_key(v) for v in value)
        return (type(value), frozenset(keys) if isinstance(value, frozenset) else keys)
    if isinstance(value, float | complex):
        return (type(value), repr(value))  # repr tells -0.0 from 0.0
    if value is None or value is Ellipsis or isinstance(value, int | str | bytes):
        return (type(value), value)
    return ("id", id(value))


def _direction_name(opname: str, backward: bool) -> str:
    """The real opname that jumps the required way (or the input if it can)."""
    if opname in ("JUMP", "JUMP_FORWARD", "JUMP_BACKWARD"):
        return "JUMP_BACKWARD" if backward else "JUMP_FORWARD"
    if opname in ("JUMP_NO_INTERRUPT", "JUMP_BACKWARD_NO_INTERRUPT"):
        return "JUMP_BACKWARD_NO_INTERRUPT" if backward else "JUMP_FORWARD"
    if optable.VERSION.directional_jumps and opname.startswith("POP_JUMP_"):
        cond = opname.rsplit("_IF_", 1)[1]
        return f"POP_JUMP_{'BACKWARD' if backward else 'FORWARD'}_IF_{cond}"
    if backward:
        msg = f"{opname} cannot jump backward on this Python; jump to a JUMP_BACKWARD instead"
        raise CaptureError(msg)
    return opname


def _resolve_jumps(code: Bytecode) -> None:
    """Name every jump for its direction (list order decides), in place."""
    instrs = code.instrs
    index = {id(ins): i for i, ins in enumerate(instrs)}
    out: list[Instr] = []
    moved_ends: dict[int, Instr] = {}
    for i, ins in enumerate(instrs):
        out.append(ins)
        if not ins.is_jump:
            ins.opname = concrete_opname(ins.opname)
            continue
        if id(ins.arg) not in index:
            msg = f"jump target of {ins!r} (instruction {i}) is not in the instruction list"
            raise CaptureError(msg)
        backward = index[id(ins.arg)] <= i
        if (
            not optable.VERSION.directional_jumps
            and backward
            and ins.opname.startswith("POP_JUMP_IF_")
        ):
            # 3.12+ has no backward conditional: branch forward over a JUMP_BACKWARD.
            cond = ins.opname[len("POP_JUMP_IF_") :]
            skip = Instr("NOP", positions=ins.positions)
            out += [Instr("JUMP_BACKWARD", ins.arg, ins.positions), skip]
            ins.opname, ins.arg = f"POP_JUMP_IF_{_NEGATED[cond]}", skip
            moved_ends[id(ins)] = skip
            continue
        ins.opname = _direction_name(ins.opname, backward)
    if optable.VERSION.precall:
        _check_precall_pairs(out)
    else:
        _check_for_iter_targets(out)
    code.instrs = out
    for entry in code.exception_table:
        entry.end = moved_ends.get(id(entry.end), entry.end)


def _check_precall_pairs(instrs: list[Instr]) -> None:
    """3.11's specialized PRECALLs make the call themselves and skip the CALL after them."""
    for i, ins in enumerate(instrs):
        if ins.opname == "PRECALL" and (i + 1 == len(instrs) or instrs[i + 1].opname != "CALL"):
            msg = f"PRECALL (instruction {i}) must be directly followed by CALL on Python 3.11"
            raise CaptureError(msg)


def _check_for_iter_targets(instrs: list[Instr]) -> None:
    """3.12+'s FOR_ITER, when the iterator is exhausted, jumps past the END_FOR it targets."""
    index = {id(ins): i for i, ins in enumerate(instrs)}
    for i, ins in enumerate(instrs):
        if ins.opname == "FOR_ITER" and ins.arg.opname != "END_FOR":
            msg = f"FOR_ITER (instruction {i}) must target an END_FOR on Python 3.12+"
            raise CaptureError(msg)
        # 3.13's exhausted FOR_ITER skips END_FOR and the POP_TOP after it, not looking
        if ins.opname == "FOR_ITER" and optable.VERSION.for_iter_skips == 2:
            after = index[id(ins.arg)] + 1
            if after == len(instrs) or instrs[after].opname != "POP_TOP":
                msg = f"FOR_ITER (instruction {i}) must target END_FOR; POP_TOP on Python 3.13"
                raise CaptureError(msg)


class _Pools:
    """The constant, name and variable tables, filled as opargs are needed."""

    def __init__(self, code: Bytecode) -> None:
        self.consts: list[Any] = list(code.consts)
        self.const_index: dict[Any, int] = {}
        for i, value in enumerate(self.consts):
            self.const_index.setdefault(const_key(value), i)
        self.names = list(code.names)
        self.name_index = {n: i for i, n in reversed(list(enumerate(self.names)))}
        self.varnames = list(code.varnames)
        self.cellvars = list(code.cellvars)
        self.freevars = list(code.freevars)
        self.cell_index: dict[str, int] = {}

    def const(self, value: Any) -> int:
        key = const_key(value)
        if key not in self.const_index:
            self.const_index[key] = len(self.consts)
            self.consts.append(value)
        return self.const_index[key]

    def name(self, name: str) -> int:
        if name not in self.name_index:
            self.name_index[name] = len(self.names)
            self.names.append(name)
        return self.name_index[name]

    def is_cell_slot(self, name: str) -> bool:
        """A LOAD_FAST of a cell's own slot (3.13 loads closure cells so), not a plain local."""
        return name not in self.varnames and (name in self.cellvars or name in self.freevars)

    def local(self, name: str) -> int:
        if self.is_cell_slot(name):
            return self.cell(name)
        if name not in self.varnames:
            self.varnames.append(name)
        return self.varnames.index(name)

    def freeze_cells(self) -> None:
        """Lay out cell and free slots after the locals, as CPython does."""
        slot = len(self.varnames)
        for name in self.cellvars:
            if name in self.varnames:
                self.cell_index[name] = self.varnames.index(name)
            else:
                self.cell_index[name] = slot
                slot += 1
        for name in self.freevars:
            self.cell_index.setdefault(name, slot)
            slot += 1

    def cell(self, name: str) -> int:
        try:
            return self.cell_index[name]
        except KeyError:
            msg = f"{name!r} is neither a cell nor a free variable of the code being assembled"
            raise CaptureError(msg) from None


def _oparg(ins: Instr, pools: _Pools) -> int:
    kind = ins.kind
    if kind == ArgKind.NONE:
        return 0
    if kind == ArgKind.RAW:
        if not isinstance(ins.arg, int) or ins.arg < 0:
            msg = f"{ins.opname} needs a non-negative int argument, got {ins.arg!r}"
            raise CaptureError(msg)
        return ins.arg
    if kind == ArgKind.CONST:
        return pools.const(ins.arg)
    if kind == ArgKind.COMPARE:
        try:
            return optable.compare_oparg(ins.arg)
        except ValueError as e:
            raise CaptureError(str(e)) from None
    if kind == ArgKind.JUMP:
        return 0  # filled in by the layout
    if kind == ArgKind.LOCAL_PAIR:
        first, second = ins.arg
        return (pools.local(first) << 4) | pools.local(second)
    if kind == ArgKind.NAME and ins.opname in optable.NAME_FLAG_BITS:
        flag, name = name_flag(ins)
        return (pools.name(name) << optable.NAME_FLAG_BITS[ins.opname]) | flag
    if not isinstance(ins.arg, str):
        msg = f"{ins.opname} needs a name (str) argument, got {ins.arg!r}"
        raise CaptureError(msg)
    if kind == ArgKind.NAME:
        return pools.name(ins.arg)
    if kind == ArgKind.LOCAL:
        return pools.local(ins.arg)
    return pools.cell(ins.arg)


def _extended(value: int) -> int:
    """How many EXTENDED_ARG prefixes an oparg needs."""
    return 0 if value < 1 << 8 else 1 if value < 1 << 16 else 2 if value < 1 << 24 else 3


def _layout(instrs: list[Instr], opargs: list[int]) -> list[int]:
    """Start offsets (in code units, EXTENDED_ARGs included); fills jump opargs."""
    index = {id(ins): i for i, ins in enumerate(instrs)}
    caches = [optable.cache_entries(ins.opname) for ins in instrs]
    ext = [_extended(a) for a in opargs]
    while True:
        starts = [0]
        for i in range(len(instrs)):
            starts.append(starts[-1] + ext[i] + 1 + caches[i])
        changed = False
        for i, ins in enumerate(instrs):
            if not ins.is_jump:
                continue
            target = starts[index[id(ins.arg)]]
            end = starts[i + 1]
            opargs[i] = end - target if optable.is_backward_only(ins.opname) else target - end
            if opargs[i] < 0:
                msg = f"{ins.opname} at instruction {i} cannot reach its target"
                raise CaptureError(msg)
            need = _extended(opargs[i])
            if need > ext[i]:
                ext[i] = need
                changed = True
        if not changed:
            return starts


def _emit(instrs: list[Instr], opargs: list[int], starts: list[int]) -> bytes:
    out = bytearray()
    for i, ins in enumerate(instrs):
        ext = starts[i + 1] - starts[i] - 1 - optable.cache_entries(ins.opname)
        arg = opargs[i]
        for shift in range(ext, 0, -1):
            out += bytes([_EXTENDED_ARG, (arg >> (8 * shift)) & 0xFF])
        out += bytes([optable.opcode_of(ins.opname), arg & 0xFF])
        out += bytes([_CACHE, 0]) * optable.cache_entries(ins.opname)
    return bytes(out)


def _linetable(instrs: list[Instr], starts: list[int], firstlineno: int) -> bytes:
    spans: list[tuple[Positions | None, int]] = []
    for i, ins in enumerate(instrs):
        units = starts[i + 1] - starts[i]
        # 3.12+ merges runs with one location; 3.11 writes one run per instruction.
        if optable.VERSION.merged_locations and spans and spans[-1][0] == ins.positions:
            spans[-1] = (ins.positions, spans[-1][1] + units)
        else:
            spans.append((ins.positions, units))
    return encode_linetable(spans, firstlineno)


def _exception_rows(
    instrs: list[Instr], table: Sequence[ExceptionEntry], starts: list[int]
) -> list[RawExceptionEntry]:
    index = {id(ins): i for i, ins in enumerate(instrs)}
    rows = []
    for entry in table:
        try:
            lo, hi, target = (index[id(entry.start)], index[id(entry.end)], index[id(entry.target)])
        except KeyError:
            msg = f"an exception-table entry names an instruction not in the list: {entry}"
            raise CaptureError(msg) from None
        if hi < lo:
            msg = f"exception-table entry ends before it starts: {entry}"
            raise CaptureError(msg)
        rows.append(
            RawExceptionEntry(
                2 * starts[lo], 2 * starts[hi + 1], 2 * starts[target], entry.depth, entry.lasti
            )
        )
    rows.sort(key=lambda r: r.start)
    for a, b in itertools.pairwise(rows):
        if b.start < a.end:
            msg = f"exception-table entries overlap: {a} and {b}"
            raise CaptureError(msg)
    return rows


#: Each half of a two-local superinstruction as an instruction of its own.
_PAIR_HALVES = {
    "LOAD_FAST_LOAD_FAST": ("LOAD_FAST", "LOAD_FAST"),
    "STORE_FAST_LOAD_FAST": ("STORE_FAST", "LOAD_FAST"),
    "STORE_FAST_STORE_FAST": ("STORE_FAST", "STORE_FAST"),
}


def split_pair(ins: Instr) -> list[Instr]:
    """A two-local superinstruction as the two plain instructions it fuses (the first
    keeps its offset: it starts where the pair did)."""
    (first, second), (a, b) = _PAIR_HALVES[ins.opname], ins.arg
    return [Instr(first, a, ins.positions, ins.offset), Instr(second, b, ins.positions)]


def _split_wide_pairs(code: Bytecode, pools: _Pools) -> None:
    """A superinstruction holds each local's index in four bits: wider ones are split."""
    for ins in list(code.instrs):
        if ins.kind == ArgKind.LOCAL_PAIR and max(pools.local(n) for n in ins.arg) >= 16:
            code.replace(ins, split_pair(ins))


def assemble(code: Bytecode) -> types.CodeType:
    """Build the code object for ``code``; raises :class:`CaptureError` if it is malformed."""
    code = code.clone()  # jumps are renamed and rewritten in place
    _resolve_jumps(code)
    instrs = code.instrs
    pools = _Pools(code)
    for ins in instrs:
        for _, name in local_accesses(ins):
            if not pools.is_cell_slot(name):
                pools.local(name)
    pools.freeze_cells()
    _split_wide_pairs(code, pools)
    instrs = code.instrs
    opargs = [_oparg(ins, pools) for ins in instrs]
    starts = _layout(instrs, opargs)
    table = encode_exception_table(_exception_rows(instrs, code.exception_table, starts))
    stacksize = max_stack_depth(instrs, code.exception_table)
    return types.CodeType(
        code.argcount,
        code.posonlyargcount,
        code.kwonlyargcount,
        len(pools.varnames),
        stacksize,
        code.flags,
        _emit(instrs, opargs, starts),
        tuple(pools.consts),
        tuple(pools.names),
        tuple(pools.varnames),
        code.filename,
        code.name,
        code.qualname,
        code.firstlineno,
        _linetable(instrs, starts, code.firstlineno),
        table,
        tuple(pools.freevars),
        tuple(pools.cellvars),
    )
