"""Continuation functions for graph breaks: ``resume_at_<offset>``.

When capture stops at an instruction it cannot put in a graph, the rest of the
user's function must still run. :func:`make_resume` builds that rest as a new
function whose arguments are the values on the stack at the break and the
locals still live there. Its code is a copy of the original with a prefix that
pushes the stack values back (``PUSH_NULL`` where the stack held a NULL) and
jumps to the break; code no longer reachable from there is dropped. Because
3.11+ exception handling is table-driven, the copy keeps its exception table,
so enclosing ``try``/``with`` blocks are re-entered just by restoring their
stack items (a ``with`` block's ``__exit__``).

Cells: the original's cell and free variables become free variables of the
resume function; whoever creates it passes the original cells (in
``ResumeFunction.closure``'s order) so closures already made keep sharing
them. Code that cannot reach the cells may pass their contents instead
(``cells=CELLS_AS_VALUES``).
"""

from __future__ import annotations

import dataclasses
import dis
import functools
import inspect
import types
from collections.abc import Iterable, Sequence
from typing import Any

from kiln.capture.bytecode import VERSION, Bytecode, CodeInfo, Instr, assemble, code_info
from kiln.capture.bytecode.analysis import local_accesses, prune_unreachable, reachable
from kiln.capture.bytecode.assemble import split_pair
from kiln.capture.bytecode.build import CO_GENERATOR_LIKE, make_function, prologue
from kiln.capture.errors import CaptureError, Unsupported
from kiln.capture.user_words import FrameWords, name_frame, place, words_of

__all__ = [
    "CELLS_AS_CLOSURE",
    "CELLS_AS_VALUES",
    "STACK_NULL",
    "STACK_VALUE",
    "ResumeFunction",
    "make_resume",
]

STACK_VALUE = "value"
STACK_NULL = "null"
CELLS_AS_CLOSURE = "closure"
CELLS_AS_VALUES = "values"

_PROLOGUE_OPS = frozenset({"COPY_FREE_VARS", "MAKE_CELL", "RESUME"})
#: Instructions before a call that only set interpreter state (KW_NAMES) or,
#: on 3.11, that the compiler's stack accounting treats as taking the arguments
#: (PRECALL): a break at the CALL resumes at them so they run again.
_CALL_SETUP = frozenset({"KW_NAMES", "PRECALL"})
#: Instructions that take only an exact bool on 3.13 (TO_BOOL makes it).
_BOOL_TAKERS = frozenset({"POP_JUMP_IF_TRUE", "POP_JUMP_IF_FALSE", "UNARY_NOT"})


@dataclasses.dataclass(frozen=True)
class ResumeFunction:
    """A continuation: call it with the stack values, then the live locals.

    ``stack_args`` name the stack values (NULLs are not passed) bottom first;
    ``locals`` the live locals after them. ``closure`` names the cells to
    pass when building the function, in order. ``entry_offset`` is where in
    the original the copy starts running (before ``offset`` when a call's
    KW_NAMES/PRECALL setup must run again).
    """

    code: types.CodeType
    offset: int
    entry_offset: int
    stack_kinds: tuple[str, ...]
    stack_args: tuple[str, ...]
    locals: tuple[str, ...]
    closure: tuple[str, ...]

    @property
    def name(self) -> str:
        return self.code.co_name

    @property
    def argnames(self) -> tuple[str, ...]:
        return self.stack_args + self.locals

    def make_function(
        self, globals: dict[str, Any], cells: Sequence[types.CellType] = ()
    ) -> types.FunctionType:
        """The resume function over ``globals`` with ``cells`` for :attr:`closure`."""
        return make_function(self.code, globals, closure=tuple(cells))


def make_resume(
    code: types.CodeType,
    offset: int,
    stack: Sequence[str] | int = 0,
    live: Iterable[str] | None = None,
    *,
    cells: str = CELLS_AS_CLOSURE,
) -> ResumeFunction:
    """Build ``resume_at_<offset>`` for ``code``.

    ``stack`` lists the kinds of the stack items at ``offset``, bottom first
    (:data:`STACK_VALUE` or :data:`STACK_NULL`; an int means that many values).
    ``live`` names the locals to pass (default: those live at ``offset``);
    locals not passed start unbound. ``code``'s own cell variables are shared
    through the closure (:data:`CELLS_AS_CLOSURE`), or with
    :data:`CELLS_AS_VALUES` become fresh cells of the resume function whose
    contents are passed like locals (default: all of them; leave empty ones
    out of ``live``) — right only when no closure made before the break
    still uses them. Raises :class:`Unsupported` where the function cannot
    be resumed (generators, inside an ``except`` body) and
    :class:`CaptureError` where the request does not fit the code.
    """
    if cells not in (CELLS_AS_CLOSURE, CELLS_AS_VALUES):
        msg = f"cells must be {CELLS_AS_CLOSURE!r} or {CELLS_AS_VALUES!r}, got {cells!r}"
        raise CaptureError(msg)
    kinds = (STACK_VALUE,) * stack if isinstance(stack, int) else tuple(stack)
    bad = [k for k in kinds if k not in (STACK_VALUE, STACK_NULL)]
    if bad:
        msg = f"stack kinds must be {STACK_VALUE!r} or {STACK_NULL!r}, got {bad}"
        raise CaptureError(msg)
    return _make_resume(code, offset, kinds, None if live is None else tuple(live), cells)


def is_continuation(fn: object) -> bool:
    """Whether ``fn`` is a continuation built here: the rest of a user's function after a
    break, which reports (names its graphs, counts its breaks) as that function."""
    code = getattr(fn, "__code__", None)
    return isinstance(code, types.CodeType) and code.co_name.startswith("resume_at_")


@functools.lru_cache(maxsize=256)
def _make_resume(
    code: types.CodeType,
    offset: int,
    kinds: tuple[str, ...],
    live: tuple[str, ...] | None,
    cells: str,
) -> ResumeFunction:
    if code.co_flags & CO_GENERATOR_LIKE:
        raise Unsupported(
            "resume_generator",
            f"cannot resume {code.co_qualname} in the middle: it is a generator or coroutine",
            "move the tensor code out of the generator into a plain function",
        )
    if not code.co_flags & inspect.CO_OPTIMIZED:
        raise Unsupported(
            "resume_not_function",
            f"cannot resume {code.co_qualname}: module and class bodies keep their locals "
            "in a dict, not in fast locals a resume function could take as arguments",
            "put the code in a function",
        )
    info = code_info(code)
    index = _break_index(info, offset)
    if info.depths[index] != len(kinds):
        msg = (
            f"{code.co_qualname} holds {info.depths[index]} stack items at offset {offset}, "
            f"but {len(kinds)} stack kinds were given"
        )
        raise CaptureError(msg)
    body = info.body.clone()
    index = max(index, _prologue_length(body))  # resuming at the very start
    target = body.instrs[index]
    _check_normally_reachable(body, index)
    own = [n for n in body.cellvars if n not in body.freevars]
    by_value = own if cells == CELLS_AS_VALUES else []
    shared = [*body.freevars, *(n for n in own if n not in by_value)]
    if live is None:
        # (3.13 loads closure cells with LOAD_FAST: the cells are no locals to pass)
        slots = set(body.cellvars) | set(body.freevars)
        live = tuple(sorted(info.live[index] - slots)) + tuple(by_value)
    elif set(live) & set(shared):
        msg = f"{sorted(set(live) & set(shared))} are cells: pass them as closure cells"
        raise CaptureError(msg)
    stack_args = tuple(f"___stack{i}" for i, k in enumerate(kinds) if k == STACK_VALUE)
    resume = _rewrite(body, target, offset, kinds, stack_args, live, shared, by_value)
    resume_code = assemble(resume)
    closure = tuple(resume.freevars)
    entry = target.offset if target.offset is not None else offset
    name_frame(resume_code, _words(code, offset, stack_args))
    return ResumeFunction(resume_code, offset, entry, kinds, stack_args, live, closure)


def _words(code: types.CodeType, offset: int, stack_args: tuple[str, ...]) -> FrameWords:
    """The continuation in the user's words: their function and the line it resumes at; a
    stack value by the local it is stored to next, else by the line that computed it."""
    at = next((i for i in dis.get_instructions(code) if i.offset == offset), None)
    line = at.positions.lineno if at is not None and at.positions is not None else None
    base = words_of(code)
    name = base.label.split(" (")[0] if base else code.co_qualname.split(".resume_at_")[0]
    label = f"{name} ({place(code.co_filename, line)}, after a graph break)"
    names = {f"L[{arg!r}]": f"the value computed on line {line}" for arg in stack_args}
    if stack_args and at is not None and at.opname in ("STORE_FAST", "STORE_DEREF"):
        names[f"L[{stack_args[-1]!r}]"] = str(at.argval)
    return FrameWords(label, names)


def _break_index(info: CodeInfo, offset: int) -> int:
    """Index of the instruction at ``offset``, moved back over the call setup before it."""
    i = info.index(offset)
    instrs = info.body.instrs
    while (
        i > 0 and instrs[i - 1].opname in _CALL_SETUP and instrs[i].offset not in info.jump_targets
    ):
        i -= 1
    return i


def _prologue_length(body: Bytecode) -> int:
    """How many instructions open the body: cell set-up up to the first RESUME."""
    n = 0
    while n < len(body.instrs) and body.instrs[n].opname in _PROLOGUE_OPS:
        n += 1
        if body.instrs[n - 1].opname == "RESUME":
            break
    return n


def _check_normally_reachable(body: Bytecode, index: int) -> None:
    """Refuse breaks that only an exception reaches (``except``/cleanup code)."""
    if index not in reachable(body.instrs, body.exception_table, handlers=False):
        raise Unsupported(
            "resume_in_handler",
            f"cannot resume {body.qualname} inside an exception handler (offset "
            f"{body.instrs[index].offset}): the exception being handled cannot be restored",
            "move the code that breaks the graph out of the except/finally block",
        )


def _check_loads(
    body: Bytecode, target: Instr, rest: list[Instr], bound: set[str]
) -> tuple[Instr, list[Instr]]:
    """Loads of locals not passed in made checked loads; returns the new target and rest.

    LOAD_FAST (and 3.13's superinstructions that load) trust the compiler's proof that
    a local is bound; locals that are not passed in start unbound here.
    """
    for ins in list(rest):
        unbound = [n for w, n in local_accesses(ins) if not w and n not in bound]
        if ins.opname == "LOAD_FAST" and unbound:
            ins.opname = "LOAD_FAST_CHECK"
        elif ins.opname in VERSION.superinstructions and unbound:
            halves = split_pair(ins)
            for half in halves:
                if half.opname == "LOAD_FAST" and half.arg not in bound:
                    half.opname = "LOAD_FAST_CHECK"
            body.replace(ins, halves)
            at = next(i for i, x in enumerate(rest) if x is ins)
            rest[at : at + 1] = halves
            target = halves[0] if target is ins else target
    return target, rest


def _rewrite(
    body: Bytecode,
    target: Instr,
    offset: int,
    kinds: tuple[str, ...],
    stack_args: tuple[str, ...],
    live: tuple[str, ...],
    shared: list[str],
    by_value: list[str],
) -> Bytecode:
    """The resume body: new prologue, stack-restoring prefix, then the original code."""
    start = _prologue_length(body)
    rest = body.instrs[start:]
    dropped = {id(ins) for ins in body.instrs[:start]}
    for entry in body.exception_table:
        if {id(entry.start), id(entry.end), id(entry.target)} & dropped:
            msg = f"an exception-table entry of {body.qualname} covers its prologue"
            raise CaptureError(msg)
    args = [*stack_args, *live]
    others = [n for n in body.varnames if n not in args and n not in shared]
    where = target.positions
    head = prologue(by_value, shared, 0, where)
    values = iter(stack_args)
    for kind in kinds:
        ins = Instr("PUSH_NULL") if kind == STACK_NULL else Instr("LOAD_FAST", next(values))
        head.append(ins.at(where))
    if VERSION.unchecked_load_fast:
        target, rest = _check_loads(body, target, rest, set(args) | set(shared) | set(by_value))
    if VERSION.exact_bool_jumps and target.opname in _BOOL_TAKERS:
        # the value handed in is whatever the break saw (a tensor, a raiser), not the bool
        # the TO_BOOL before a 3.13 jump makes: take its truth again, where the same
        # handlers cover it
        truth = Instr("TO_BOOL", None, target.positions)
        body.insert_before(target, [truth])
        rest.insert(next(i for i, x in enumerate(rest) if x is target), truth)
        target = truth
    jump = Instr("JUMP_FORWARD", target, where)
    head.append(jump)
    instrs, table = prune_unreachable(head + rest, body.exception_table)
    at = instrs.index(jump)
    if instrs[at + 1] is target:  # everything in between was dead
        del instrs[at]
    flags = body.flags & ~(inspect.CO_VARARGS | inspect.CO_VARKEYWORDS)
    flags = flags | inspect.CO_NESTED if shared else flags
    name = f"resume_at_{offset}"
    return dataclasses.replace(
        body,
        instrs=instrs,
        exception_table=table,
        name=name,
        qualname=f"{body.qualname}.{name}",
        argcount=len(args),
        posonlyargcount=0,
        kwonlyargcount=0,
        flags=flags,
        varnames=args + others,
        cellvars=by_value,
        freevars=shared,
    )
