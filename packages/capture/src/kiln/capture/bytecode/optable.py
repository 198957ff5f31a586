"""What each opcode's argument means on the running CPython (3.11, 3.12 or 3.13).

Decoding and assembling both ask the same questions of an opcode: does its
oparg index the constants, the names, the fast locals or the cells; is it a
jump, and which way may it jump; how many inline CACHE units follow it. The
answers differ between versions, so they live here, computed once from the
interpreter's own ``opcode`` tables and the version's table
(:mod:`~kiln.capture.bytecode.versions`).
"""

from __future__ import annotations

import dis
import functools
import opcode
import sys

from kiln.capture.bytecode.versions import PY311, PY312, PY313, VERSION

__all__ = [
    "NAME_FLAG_BITS",
    "PY311",
    "PY312",
    "PY313",
    "TERMINATORS",
    "UNCONDITIONAL_JUMPS",
    "VERSION",
    "ArgKind",
    "arg_kind",
    "cache_entries",
    "compare_from_oparg",
    "compare_oparg",
    "has_arg",
    "is_backward_only",
    "is_terminator",
    "is_unconditional_jump",
    "opcode_of",
]


class ArgKind:
    """How an instruction's argument is represented in :class:`~.Instr`."""

    NONE = "none"  # no argument
    RAW = "raw"  # the oparg itself (BINARY_OP, CALL, BUILD_TUPLE, ...)
    COMPARE = "compare"  # COMPARE_OP: the operator string, "<" ... ">="
    CONST = "const"  # the constant object
    NAME = "name"  # a name string, or (flag, name) for NAME_FLAG_BITS ops
    LOCAL = "local"  # a fast-local name
    CELL = "cell"  # a cell or free variable name
    LOCAL_PAIR = "local_pair"  # two fast-local names (3.13's superinstructions)
    JUMP = "jump"  # the target Instr


def _real(names: list[int]) -> frozenset[str]:
    return frozenset(opcode.opname[i] for i in names if not opcode.opname[i].startswith("<"))


_CONST = _real(dis.hasconst)
_NAME = _real(dis.hasname)
_LOCAL = _real(dis.haslocal)
_CELL = _real(dis.hasfree)
_JUMP = _real(dis.hasjrel) | _real(dis.hasjabs)

#: Name ops whose low oparg bits carry a flag; their arg is ``(flag, name)``.
NAME_FLAG_BITS: dict[str, int] = dict(VERSION.name_flag_bits)

UNCONDITIONAL_JUMPS = frozenset(
    {"JUMP_FORWARD", "JUMP_BACKWARD", "JUMP_BACKWARD_NO_INTERRUPT", "JUMP", "JUMP_NO_INTERRUPT"}
)
TERMINATORS = frozenset({"RETURN_VALUE", "RETURN_CONST", "RAISE_VARARGS", "RERAISE"})

#: Jumps that encode a backward offset; every other jump goes forward.
_BACKWARD = frozenset(
    {
        "JUMP_BACKWARD",
        "JUMP_BACKWARD_NO_INTERRUPT",
        "POP_JUMP_BACKWARD_IF_FALSE",
        "POP_JUMP_BACKWARD_IF_TRUE",
        "POP_JUMP_BACKWARD_IF_NONE",
        "POP_JUMP_BACKWARD_IF_NOT_NONE",
    }
)


# The outcome bits specialized compares test: unordered 1, less 2, greater 4,
# equal 8 (CPython's compare_masks).
_COMPARE_MASKS = {"<": 2, "<=": 2 | 8, "==": 8, "!=": 1 | 2 | 4, ">": 4, ">=": 4 | 8}


def compare_oparg(op: str) -> int:
    """The COMPARE_OP oparg for an operator string (``"bool(<)"``: with the bool bit)."""
    inner = op[5:-1] if op.startswith("bool(") and op.endswith(")") else op
    if inner not in _COMPARE_MASKS or (inner != op and not VERSION.compare_bool_bit):
        msg = f"unknown comparison {op!r}; expected one of {list(dis.cmp_op)}"
        raise ValueError(msg)
    oparg = dis.cmp_op.index(inner) << VERSION.compare_shift
    if VERSION.compare_masks:
        oparg |= _COMPARE_MASKS[inner]
    return oparg | VERSION.compare_bool_bit if inner != op else oparg


def compare_from_oparg(oparg: int) -> str:
    """The operator string of a COMPARE_OP oparg; ``"bool(<)"`` where the bool bit is set."""
    op = dis.cmp_op[oparg >> VERSION.compare_shift]
    return f"bool({op})" if oparg & VERSION.compare_bool_bit else op


@functools.cache
def opcode_of(opname: str) -> int:
    """The opcode number of a real (not pseudo) instruction on this Python."""
    op = opcode.opmap.get(opname)
    if op is None or op >= 256:
        msg = f"{opname!r} is not a CPython {sys.version_info[0]}.{sys.version_info[1]} opcode"
        raise ValueError(msg)
    return op


@functools.cache
def has_arg(opname: str) -> bool:
    """Whether the instruction takes an oparg (3.13's MAKE_FUNCTION, past HAVE_ARGUMENT, does not)."""
    hasarg = getattr(dis, "hasarg", None)
    if hasarg is not None:
        return opcode_of(opname) in hasarg
    return opcode_of(opname) >= opcode.HAVE_ARGUMENT


@functools.cache
def arg_kind(opname: str) -> str:
    """The :class:`ArgKind` of ``opname``'s argument."""
    if opname in _JUMP or opname in UNCONDITIONAL_JUMPS:
        return ArgKind.JUMP
    if opname in _CONST:
        return ArgKind.CONST
    if opname == "COMPARE_OP":
        return ArgKind.COMPARE
    if opname in _NAME:
        return ArgKind.NAME
    if opname in VERSION.superinstructions:
        return ArgKind.LOCAL_PAIR
    if opname in _LOCAL:
        return ArgKind.LOCAL
    if opname in _CELL:
        return ArgKind.CELL
    return ArgKind.RAW if has_arg(opname) else ArgKind.NONE


@functools.cache
def cache_entries(opname: str) -> int:
    """How many inline CACHE code units follow the instruction."""
    entries = opcode._inline_cache_entries  # type: ignore[attr-defined]
    if isinstance(entries, dict):  # 3.13: by name, only the instructions that have any
        return int(entries.get(opname, 0))
    return int(entries[opcode_of(opname)])


def is_unconditional_jump(opname: str) -> bool:
    return opname in UNCONDITIONAL_JUMPS


def is_terminator(opname: str) -> bool:
    """Instructions after which control never falls through."""
    return opname in TERMINATORS or opname in UNCONDITIONAL_JUMPS


def is_backward_only(opname: str) -> bool:
    return opname in _BACKWARD
