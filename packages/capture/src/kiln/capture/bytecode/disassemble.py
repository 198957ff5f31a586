"""``dis.get_instructions(code)`` as a tuple, the same ``dis.Instruction``s built faster.

Capture disassembles every code object it runs once per process (``tracer.code_facts``),
and in a process that loads its compiled graphs from the cache that is a fifth of tracing:
3.11's ``dis`` builds each instruction through a generator chain, finds jump targets with a
list membership test per jump (quadratic) and makes each tuple through Python-level
``__new__``. On 3.11 :func:`instructions` decodes the code in two passes over the raw bytes
with the tables ``dis`` itself uses, giving equal instructions (``tests/test_disassemble.py``
compares them with ``dis`` over the standard library and torch); other versions use ``dis``.
"""

from __future__ import annotations

import dis
import sys
import types
from typing import Any, cast

__all__ = ["instructions"]

# dis's private tables (3.11 only, see _tables) and the code method it names variables by
_dis: Any = dis
_Instr = dis.Instruction
_Pos = dis.Positions
_LOAD_CONST = dis.opmap["LOAD_CONST"]


def _dis_instructions(code: types.CodeType) -> tuple[dis.Instruction, ...]:
    return tuple(dis.get_instructions(code))


def _tables() -> tuple[list[str], list[int], list[int], list[int]] | None:
    """3.11's opname (specialized names included), deoptimized opcode, inline cache count and
    argument kind per opcode byte; None where this module does not mirror ``dis``."""
    if sys.version_info[:2] != (3, 11):
        return None
    names: list[str] = list(_dis._all_opname)
    deopt = [_dis._deoptop(op) for op in range(256)]
    caches: list[int] = list(_dis._inline_cache_entries)
    kind = [0] * 256  # 1 const, 2 name, 3 abs jump, 4 rel jump, 5 local/free, 6 compare,
    for op in range(256):  # 7 FORMAT_VALUE, 8 MAKE_FUNCTION, 9 BINARY_OP, 10 LOAD_GLOBAL
        d = deopt[op]
        if d in dis.hasconst:
            kind[op] = 1
        elif d in dis.hasname:
            kind[op] = 10 if d == dis.opmap["LOAD_GLOBAL"] else 2
        elif d in dis.hasjabs:
            kind[op] = 3
        elif d in dis.hasjrel:
            kind[op] = 4
        elif d in dis.haslocal or d in dis.hasfree:
            kind[op] = 5
        elif d in dis.hascompare:
            kind[op] = 6
        elif d == dis.opmap["FORMAT_VALUE"]:
            kind[op] = 7
        elif d == dis.opmap["MAKE_FUNCTION"]:
            kind[op] = 8
        elif d == dis.opmap["BINARY_OP"]:
            kind[op] = 9
    return names, deopt, caches, kind


_TABLES = _tables()


def _arg_info(kind: int, op: int, arg: int, offset: int, code: types.CodeType) -> tuple[Any, str]:
    """(argval, argrepr) as 3.11's ``dis._get_instructions_bytes`` computes them."""
    if kind == 1:  # KW_NAMES is a const op too, whose value dis leaves unknown
        if op != _LOAD_CONST:
            return _dis.UNKNOWN, ""
        value = code.co_consts[arg]
        return value, repr(value)
    if kind == 2:
        name = code.co_names[arg]
        return name, name
    if kind == 10:
        name = code.co_names[arg // 2]
        return name, ("NULL + " + name if arg & 1 and name else name)
    if kind == 3:
        return arg * 2, "to " + repr(arg * 2)
    if kind == 4:
        assert _TABLES is not None
        backward = "JUMP_BACKWARD" in _TABLES[0][_TABLES[1][op]]
        target = offset + 2 + (-arg if backward else arg) * 2
        return target, "to " + repr(target)
    if kind == 5:
        name = cast(Any, code)._varname_from_oparg(arg)
        return name, name
    if kind == 6:
        return dis.cmp_op[arg], dis.cmp_op[arg]
    if kind == 7:
        converter, text = _dis.FORMAT_VALUE_CONVERTERS[arg & 0x3]
        if arg & 0x4:
            text = text + ", with format" if text else "with format"
        return (converter, bool(arg & 0x4)), text
    if kind == 8:
        flags = _dis.MAKE_FUNCTION_FLAGS
        return arg, ", ".join(s for i, s in enumerate(flags) if arg & (1 << i))
    if kind == 9:
        return arg, _dis._nb_ops[arg][1]
    return arg, ""


def _instructions_311(code: types.CodeType) -> tuple[dis.Instruction, ...]:
    assert _TABLES is not None
    names, deopt, cache_counts, kinds = _TABLES
    raw = code.co_code
    extended_arg_op = dis.opmap["EXTENDED_ARG"]
    have_argument = dis.HAVE_ARGUMENT
    # pass 1: (offset, op, arg) of each instruction, cache entries skipped, and jump targets
    decoded: list[tuple[int, int, int | None]] = []
    labels: set[int] = set()
    extended = 0
    i, n = 0, len(raw)
    while i < n:
        op = raw[i]
        d = deopt[op]
        arg: int | None = None
        if d >= have_argument:
            arg = raw[i + 1] | extended
            extended = (arg << 8) if d == extended_arg_op else 0
            if extended >= 1 << 31:
                extended -= 1 << 32
            k = kinds[op]
            if k == 4:
                labels.add(i + 2 + (-arg if "JUMP_BACKWARD" in names[op] else arg) * 2)
            elif k == 3:
                labels.add(arg * 2)
        else:
            extended = 0
        decoded.append((i, op, arg))
        i += 2 + 2 * cache_counts[d]
    # pass 2: the instructions, each with its line start and position
    linestarts = dict(dis.findlinestarts(code))
    positions = list(code.co_positions())
    consts, co_names = code.co_consts, code.co_names
    varname = cast(Any, code)._varname_from_oparg
    new = tuple.__new__
    out: list[dis.Instruction] = []
    append = out.append
    for offset, op, arg in decoded:
        index = offset >> 1
        pos = positions[index] if index < len(positions) else (None, None, None, None)
        argval: Any = None
        argrepr = ""
        if arg is not None:  # the common kinds inline, the rest in _arg_info
            k = kinds[op]
            if k == 5:
                argval = argrepr = varname(arg)
            elif k == 2:
                argval = argrepr = co_names[arg]
            elif k == 1 and op == _LOAD_CONST:
                argval = consts[arg]
                argrepr = repr(argval)
            else:
                argval, argrepr = _arg_info(k, op, arg, offset, code)
        line = linestarts.get(offset)
        pos_t = new(_Pos, pos)
        append(
            new(
                _Instr, (names[op], op, arg, argval, argrepr, offset, line, offset in labels, pos_t)
            )
        )
    return tuple(out)


def instructions(code: types.CodeType) -> tuple[dis.Instruction, ...]:
    """``tuple(dis.get_instructions(code))``."""
    return _instructions_311(code) if _TABLES is not None else _dis_instructions(code)
