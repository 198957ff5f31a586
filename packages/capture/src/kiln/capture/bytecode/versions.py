"""What differs between the CPython versions Kiln reads and writes, one table per version.

Everything else in the bytecode layer and the evaluator asks :data:`VERSION`
(the running interpreter's table) rather than comparing ``sys.version_info``,
so supporting a new CPython is one more table here plus handlers for the
opcodes it adds. Opcode numbers, argument kinds, cache sizes and stack
effects come from the interpreter's own ``dis``/``opcode`` modules and need
no table.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Mapping

__all__ = ["PY311", "PY312", "PY313", "TABLES", "VERSION", "BytecodeVersion"]


@dataclasses.dataclass(frozen=True)
class BytecodeVersion:
    """The bytecode facts of one CPython minor version."""

    version: tuple[int, int]
    #: Name ops whose low oparg bits carry a flag (their arg is ``(flag, name)``):
    #: LOAD_GLOBAL pushes NULL too; LOAD_ATTR loads a method; LOAD_SUPER_ATTR has
    #: two bits (method load, two-argument super).
    name_flag_bits: Mapping[str, int]
    #: COMPARE_OP's oparg: the operator's index shifted left this far ...
    compare_shift: int
    #: ... above the outcome bits its specialized forms test (unordered 1, less 2,
    #: greater 4, equal 8) ...
    compare_masks: bool
    #: ... and this bit asks for ``bool()`` of the result (0: the version has none).
    compare_bool_bit: int
    #: Conditional jumps come as POP_JUMP_FORWARD_IF_* / POP_JUMP_BACKWARD_IF_*;
    #: without, conditionals only jump forward and a loop needs a JUMP_BACKWARD.
    directional_jumps: bool
    #: A call is PRECALL then CALL.
    precall: bool
    #: Keyword names travel as a tuple on the stack into CALL_KW, not in KW_NAMES.
    call_kw: bool
    #: A call's stack is ``callable, self-or-NULL, args`` (NULL above the callable);
    #: otherwise ``NULL-or-callable, callable-or-self, args``.
    null_above_callable: bool
    #: Instructions at FOR_ITER's target that its exhausted path jumps over
    #: (END_FOR; END_FOR and POP_TOP), and how many items END_FOR pops.
    for_iter_skips: int
    end_for_pops: int
    #: How far RETURN_CONST's constant counts above the stack in ``co_stacksize``
    #: (3.13 sizes the stack before fusing LOAD_CONST; RETURN_VALUE).
    return_const_peak: int
    #: SEND leaves the exhausted receiver under the returned value (END_SEND pops it).
    send_keeps_receiver: bool
    #: The line table merges runs of instructions with one location.
    merged_locations: bool
    #: LOAD_FAST trusts the compiler's proof that the local is bound.
    unchecked_load_fast: bool
    #: MAKE_FUNCTION takes only the code; SET_FUNCTION_ATTRIBUTE adds defaults,
    #: annotations and the closure one by one.
    function_attributes: bool
    #: Closure cells are loaded with LOAD_FAST of the cell's slot (no LOAD_CLOSURE).
    cells_by_load_fast: bool
    #: POP_JUMP_IF_TRUE/FALSE and UNARY_NOT need an exact bool (TO_BOOL makes it).
    exact_bool_jumps: bool
    #: Two fast-local accesses in one instruction, oparg ``first << 4 | second``.
    superinstructions: frozenset[str]


PY311_TABLE = BytecodeVersion(
    version=(3, 11),
    name_flag_bits={"LOAD_GLOBAL": 1},
    compare_shift=0,
    compare_masks=False,
    compare_bool_bit=0,
    directional_jumps=True,
    precall=True,
    call_kw=False,
    null_above_callable=False,
    for_iter_skips=0,
    end_for_pops=0,
    return_const_peak=0,
    send_keeps_receiver=False,
    merged_locations=False,
    unchecked_load_fast=False,
    function_attributes=False,
    cells_by_load_fast=False,
    exact_bool_jumps=False,
    superinstructions=frozenset(),
)

PY312_TABLE = dataclasses.replace(
    PY311_TABLE,
    version=(3, 12),
    name_flag_bits={"LOAD_GLOBAL": 1, "LOAD_ATTR": 1, "LOAD_SUPER_ATTR": 2},
    compare_shift=4,
    compare_masks=True,
    directional_jumps=False,
    precall=False,
    for_iter_skips=1,
    end_for_pops=2,
    send_keeps_receiver=True,
    merged_locations=True,
    unchecked_load_fast=True,
)

PY313_TABLE = dataclasses.replace(
    PY312_TABLE,
    version=(3, 13),
    compare_shift=5,
    compare_bool_bit=16,
    call_kw=True,
    null_above_callable=True,
    for_iter_skips=2,
    end_for_pops=1,
    return_const_peak=1,
    function_attributes=True,
    cells_by_load_fast=True,
    exact_bool_jumps=True,
    superinstructions=frozenset(
        {"LOAD_FAST_LOAD_FAST", "STORE_FAST_LOAD_FAST", "STORE_FAST_STORE_FAST"}
    ),
)

TABLES = {t.version: t for t in (PY311_TABLE, PY312_TABLE, PY313_TABLE)}


def _running() -> BytecodeVersion:
    version = (sys.version_info[0], sys.version_info[1])
    if version not in TABLES:
        known = ", ".join(f"{major}.{minor}" for major, minor in TABLES)
        msg = f"Kiln reads the bytecode of CPython {known}; this is {version[0]}.{version[1]}"
        raise ImportError(msg)
    return TABLES[version]


VERSION = _running()
PY311 = VERSION.version == (3, 11)
PY312 = VERSION.version == (3, 12)
PY313 = VERSION.version == (3, 13)
