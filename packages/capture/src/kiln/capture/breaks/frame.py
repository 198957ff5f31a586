"""The new frame's code at a graph break: value expressions and continuation calls.

:class:`Frame` writes the expressions that rebuild the stack values and live
locals from the graph's outputs (one evaluation per tracked object, so aliases
stay aliases; iterators of interrupted loops, bound methods, partials,
closures and grad-mode blocks included). :class:`Continuations` builds the
``resume_at_<offset>`` functions and the calls to them. Used by
:mod:`kiln.capture.breaks.split`.
"""

from __future__ import annotations

import dis
import functools
import threading
import types
from collections.abc import Callable
from typing import Any

import torch

from kiln.capture.breaks.resume import (
    CELLS_AS_CLOSURE,
    CELLS_AS_VALUES,
    STACK_NULL,
    STACK_VALUE,
    make_resume,
)
from kiln.capture.breaks.rollback import BreakState, GradModeExit, ResumeIterator
from kiln.capture.bytecode.format import log_code
from kiln.capture.contexts import ExitValue
from kiln.capture.emit import _Writer
from kiln.capture.errors import CaptureError
from kiln.capture.graph import DATA_ARGUMENTS, EAGER_RANDOM
from kiln.capture.values.base import NULL, Value
from kiln.capture.values.containers import CellValue, DictViewValue, ListValue
from kiln.capture.values.functions import (
    BoundMethodValue,
    BuiltinMethodValue,
    PartialValue,
    ReplayedCallValue,
    UserFunctionValue,
)
from kiln.capture.values.iterators import IteratorValue, remaining
from kiln.capture.values.tensor import TensorMethodValue

__all__ = [
    "MAX_RESUME_NESTING",
    "Reraise",
    "Continuations",
    "Frame",
    "Named",
    "NotResumable",
    "cannot",
    "check_shared_iterators",
    "flat_values",
    "live_values",
]

#: Continuations run nested in the frame that broke (a break inside a loop nests
#: once per iteration). This many levels deep they are compiled; deeper ones run
#: uncompiled, finishing the loop in one frame, so the Python stack stays shallow.
MAX_RESUME_NESTING = 16

_nesting = threading.local()


def _continue(compiled: Callable[..., Any], plain: Callable[..., Any], *args: Any) -> Any:
    """Call a continuation: compiled while the nesting allows, else as plain Python."""
    depth: int = getattr(_nesting, "depth", 0)
    if depth >= MAX_RESUME_NESTING:
        return plain(*args)
    _nesting.depth = depth + 1
    try:
        return compiled(*args)
    finally:
        _nesting.depth = depth


class Reraise:
    """Stands for the callable (or tested value) of an instruction that raised when run natively.

    Inside a ``try`` the uncompiled continuation runs the instruction again with
    this in its place, so the exception is raised where the user's handlers see it.
    """

    __slots__ = ("exc",)

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    def __call__(self, *args: object, **kwargs: object) -> None:
        raise self.exc

    def __bool__(self) -> bool:
        raise self.exc


class Frame:
    """Writes the new frame's body: expressions over the graph outputs and the frame."""

    def __init__(self, state: BreakState, func: types.FunctionType, writer: _Writer) -> None:
        self.state = state
        self.func = func
        self.writer = writer
        self.lines: list[str] = []  # values, read before the side effects are replayed
        self.after: list[str] = []  # the instruction itself, after them
        self._temps: dict[int, str] = {}
        self._count = 0
        writer.on_closure = self.check_closure

    def temp(self, text: str, *, after: bool = False) -> str:
        name = f"__kiln_t{self._count}"
        self._count += 1
        (self.after if after else self.lines).append(f"{name} = {text}")
        return name

    def expr(self, v: Value) -> str:
        """A name holding ``v``; one evaluation per tracked object, so aliases stay aliases."""
        if isinstance(v, Named):
            return v.name
        known = self._temps.get(id(v))
        if known is None:
            known = self._temps[id(v)] = self.temp(self._text(v))
        return known

    def check_closure(self, v: UserFunctionValue) -> None:
        """A closure rebuilt at the break shares its cells' values only if they never change."""
        tr = self.state.tracer
        offset = self.state.instruction.offset
        for name, cell in zip(v.code.co_freevars, v.closure, strict=False):
            own = [n for n, c in tr.cells.items() if c is cell and n in tr.code.co_cellvars]
            # the continuation gets its own copy of the frame's cell: neither side may set it
            if own and (
                _writes_cell(v.code, name) or any(_stored_again(tr.code, n, offset) for n in own)
            ):
                raise cannot(f"the closure variable {name!r} may change after the break")

    def _text(self, v: Value) -> str:
        w = self.writer
        if isinstance(v, IteratorValue):
            return f"{w.const(ResumeIterator)}({w.value(ListValue(_remaining(v)))})"
        if isinstance(v, (TensorMethodValue, BuiltinMethodValue)):
            owner = v.tensor if isinstance(v, TensorMethodValue) else v.receiver
            return f"{w.const(getattr)}({self.expr(owner)}, {v.name!r})"
        if isinstance(v, BoundMethodValue) and v.source is None:
            return f"{w.const(types.MethodType)}({self.expr(v.func)}, {self.expr(v.self_value)})"
        if isinstance(v, ReplayedCallValue):
            return w.const(v.fn)
        if isinstance(v, PartialValue):
            parts = [self.expr(v.func), *(self.expr(a) for a in v.args)]
            parts.extend(f"**{{{k!r}: {self.expr(x)}}}" for k, x in v.kwargs.items())
            return f"{w.const(functools.partial)}({', '.join(parts)})"
        if isinstance(v, CellValue):
            return w.cell(v)
        if isinstance(v, DictViewValue):  # a view of the very dict the frame holds
            return f"{w.const(getattr(dict, v.kind))}({self.expr(v.dict)})"
        if isinstance(v, ExitValue):
            # the block's mode is entered again for real; its __exit__ restores the outer one
            prev = v.ctx.previous[-1] if v.ctx.previous else torch.is_grad_enabled()
            return f"{w.const(GradModeExit)}({v.ctx.target}, {prev})"
        return w.value(v)


#: Instructions that only move references around: they call no user code and touch no tensor.
_PLAIN_OPS = frozenset(
    {
        "RESUME",
        "NOP",
        "CACHE",
        "EXTENDED_ARG",
        "COPY_FREE_VARS",
        "MAKE_CELL",
        "LOAD_FAST",
        "LOAD_FAST_CHECK",
        "STORE_FAST",
        "LOAD_FAST_LOAD_FAST",
        "STORE_FAST_LOAD_FAST",
        "STORE_FAST_STORE_FAST",
        "LOAD_CONST",
        "LOAD_DEREF",
        "STORE_DEREF",
        "LOAD_CLOSURE",
        "POP_TOP",
        "PUSH_NULL",
        "COPY",
        "SWAP",
        "BUILD_TUPLE",
        "BUILD_LIST",
        "JUMP_FORWARD",
        "RETURN_VALUE",
        "RETURN_CONST",
    }
)


def _nothing_to_compile(code: types.CodeType) -> bool:
    """Whether a continuation only returns what it is given (a break at a frame's last call).

    Such a one is called directly: compiling it finds no graph, and going through a compiled
    wrapper would cost a cache lookup on every call for nothing.
    """
    return all(ins.opname in _PLAIN_OPS for ins in dis.get_instructions(code))


def _writes_cell(code: types.CodeType, name: str) -> bool:
    """Whether ``code`` (or code nested in it) assigns or deletes the closure variable ``name``."""
    for ins in dis.get_instructions(code):
        if ins.opname in ("STORE_DEREF", "DELETE_DEREF") and ins.argval == name:
            return True
    return any(_writes_cell(c, name) for c in code.co_consts if isinstance(c, types.CodeType))


def _stored_again(code: types.CodeType, name: str, offset: int) -> bool:
    """Whether running ``code`` on from ``offset`` may assign the cell ``name`` again.

    Conservative: a second store, a store at or after ``offset``, or a jump back
    over the one store (a loop) count.
    """
    instrs = list(dis.get_instructions(code))
    stores = [
        i.offset for i in instrs if i.opname in ("STORE_DEREF", "DELETE_DEREF") and i.argval == name
    ]
    if len(stores) > 1 or any(o >= offset for o in stores):
        return True
    first = stores[0] if stores else -1
    return any("BACKWARD" in i.opname and i.offset > first and i.argval <= first for i in instrs)


class NotResumable(Exception):
    """The break cannot be resumed soundly; the frame runs eagerly."""


def cannot(why: str) -> NotResumable:
    return NotResumable(why)


def _remaining(v: IteratorValue) -> list[Value]:
    """What an interrupted loop's iterator still yields (it has not been advanced)."""
    rest = remaining(v)
    if rest is None:
        raise cannot(f"a graph break inside a loop over {type(v).__name__}")
    return rest


def check_shared_iterators(values: list[Value]) -> None:
    """Each iterator live at a break goes on as the list of items it still yields; two that
    advance one iterator (``enumerate(it)`` and ``it``) would each yield those items."""
    reader: dict[int, int] = {}
    for top in values:
        if not isinstance(top, IteratorValue):
            continue
        todo = [top]
        while todo:
            it = todo.pop()
            if reader.setdefault(id(it), id(top)) != id(top):
                raise cannot("a graph break while two live iterators advance the same iterator")
            todo.extend(it.reads())


def flat_values(values: list[Value]) -> list[Value]:
    """Stand-ins the graph-output search can walk (iterators as the lists they still yield)."""
    out: list[Value] = []
    for v in values:
        if isinstance(v, IteratorValue):
            out.append(ListValue(_remaining(v)))
        elif isinstance(v, TensorMethodValue):
            out.append(v.tensor)
        elif isinstance(v, BuiltinMethodValue):
            out.extend(flat_values([v.receiver]))
        elif isinstance(v, BoundMethodValue) and v.source is None:
            out.extend(flat_values([v.func, v.self_value]))
        elif isinstance(v, PartialValue):
            out.extend(flat_values([v.func, *v.args, *v.kwargs.values()]))
        elif v is not NULL and not isinstance(v, ExitValue):
            out.append(v)
    return out


def live_values(state: BreakState) -> dict[str, Value]:
    """Locals and own cells bound at the break, by name."""
    tr = state.tracer
    values = dict(state.locals)
    for name in tr.code.co_cellvars:
        cell = tr.cells.get(name)
        if cell is not None and cell.contents is not None:
            values[name] = cell.contents
    return values


class Continuations:
    """Builds ``resume_at_<offset>`` functions over the frame's globals and cells."""

    def __init__(
        self,
        state: BreakState,
        func: types.FunctionType,
        frame: Frame,
        wrap_callable: Callable[[Callable[..., Any]], Callable[..., Any]],
    ) -> None:
        self.state = state
        self.func = func
        self.frame = frame
        self.wrap_callable = wrap_callable
        self.compiles = False  # whether a continuation made so far is compiled
        self.values = live_values(state)
        # the continuations run after a reseeding: they keep random ops eager (graph.py)
        self.eager_random = state.tracer.out.eager_random
        code = state.tracer.code
        self.cells_mode = CELLS_AS_VALUES if code.co_cellvars else CELLS_AS_CLOSURE

    def call(self, offset: int, stack: list[Value], *, compiled: bool = True) -> str:
        """The text calling the continuation at ``offset`` with ``stack`` and the live locals."""
        code = self.state.tracer.code
        kinds = [STACK_NULL if v is NULL else STACK_VALUE for v in stack]
        try:
            rf = make_resume(code, offset, kinds, cells=self.cells_mode)
            bound = tuple(n for n in rf.locals if n in self.values)
            if bound != rf.locals:
                rf = make_resume(code, offset, kinds, bound, cells=self.cells_mode)
        except CaptureError as e:
            raise cannot(str(e)) from e
        by_name = dict(zip(code.co_freevars, self.func.__closure__ or (), strict=False))
        fn = rf.make_function(self.func.__globals__, [by_name[n] for n in rf.closure])
        if self.eager_random:
            setattr(fn, EAGER_RANDOM, True)
        log_code(rf.name, rf.code)
        given = [v for v in stack if v is not NULL] + [self.values[n] for n in rf.locals]
        out = self.state.tracer.out
        names = rf.code.co_varnames[: len(given)]
        from_data = {n: out.from_data(v) for n, v in zip(names, given, strict=True)}
        if any(dims is not None for dims in from_data.values()):
            setattr(fn, DATA_ARGUMENTS, {n: d for n, d in from_data.items() if d is not None})
        args = [self.frame.expr(v) for v in given]
        w = self.frame.writer
        if not compiled or _nothing_to_compile(rf.code):
            return f"return {w.const(fn)}({', '.join(args)})"
        targets = [w.const(self.wrap_callable(fn)), w.const(fn)]
        self.compiles = True
        return f"return {w.const(_continue)}({', '.join([*targets, *args])})"


class Named(Value):
    """A stack value the new frame computed natively and holds in a variable."""

    def __init__(self, name: str) -> None:
        self.name = name

    def python_type(self) -> type:
        return object
