"""The instruction loop: symbolic evaluation of one code object.

A :class:`Tracer` runs the bytecode of the captured frame, or of a function
inlined into it, over a symbolic stack and symbolic locals. Opcode handlers
(``kiln.capture.opcodes``, registered in :data:`OPCODES`) do the work; the loop fetches,
dispatches and counts. Tracers of inlined calls share the parent's :class:`OutputGraph`.
"""

from __future__ import annotations

import builtins
import dis
import linecache
import logging
import types
import weakref
from collections.abc import Callable
from typing import Any

import torch

from kiln.capture.binding import bind_arguments
from kiln.capture.breaks.reasons import UserException, unsupported
from kiln.capture.bytecode.decode import decode
from kiln.capture.bytecode.disassemble import instructions
from kiln.capture.errors import Unsupported, UserFrame
from kiln.capture.graph import OutputGraph
from kiln.capture.source import GlobalSource, Source
from kiln.capture.values.base import ConstantValue, Value
from kiln.capture.values.containers import CellValue
from kiln.capture.values.functions import UserFunctionValue
from kiln.capture.values.iterators import GeneratorIterator, leaving_generator
from kiln.capture.values.objects import ObjectValue, SuperValue
from kiln.capture.wrap import wrap

__all__ = ["MAX_INLINE_DEPTH", "MAX_STEPS", "OPCODES", "Checkpoint", "OpcodeHandler", "Tracer"]

log = logging.getLogger(__name__)

MAX_INLINE_DEPTH = 48
MAX_STEPS = 1_000_000  # instructions per capture, inlined calls included
CO_GENERATOR = 0x20
CO_GENERATOR_LIKE = (
    0x20 | 0x80 | 0x100 | 0x200
)  # generator, coroutine, iterable coroutine, async gen


OpcodeHandler = Callable[["Tracer", dis.Instruction], None]
#: The handler of every opname; :mod:`kiln.capture.opcodes` fills it when imported (the opcode
#: layer depends on the tracer, never the other way), ``kiln.capture.evaluator`` imports it.
OPCODES: dict[str, OpcodeHandler] = {}


ExceptionRow = tuple[int, int, int, int, bool]  # start, end, target offsets; depth; lasti


class CodeFacts:
    """What the loop reads from a code object's bytecode: its instructions, the index of each
    offset and (decoded on first need) its exception table.

    Shared by every tracer of the same code object (:func:`code_facts`): a model runs the same
    methods once per layer, and each inlined call disassembled them again. Code objects are
    immutable and ``dis.Instruction`` is a named tuple, so the facts never go stale; nothing
    may mutate them."""

    __slots__ = ("_exception_table", "index_of", "instructions")

    def __init__(self, code: types.CodeType) -> None:
        self.instructions: tuple[dis.Instruction, ...] = instructions(code)
        self.index_of: dict[int, int] = {ins.offset: i for i, ins in enumerate(self.instructions)}
        self._exception_table: tuple[ExceptionRow, ...] | None = None

    def exception_table(self, code: types.CodeType) -> tuple[ExceptionRow, ...]:
        if self._exception_table is None:
            self._exception_table = tuple(
                (e.start.offset, e.end.offset, e.target.offset, e.depth, e.lasti)
                for e in decode(code).exception_table
                if e.start.offset is not None
                and e.end.offset is not None
                and e.target.offset is not None
            )
        return self._exception_table


# id(code) -> (a weak reference to that code, its facts). Keyed by identity, not equality:
# equal code objects of different files (code equality ignores co_filename) must not share
# constants such as nested code objects. An entry goes with its code object.
_FACTS: dict[int, tuple[weakref.ref[types.CodeType], CodeFacts]] = {}


def code_facts(code: types.CodeType) -> CodeFacts:
    """The :class:`CodeFacts` of ``code``, computed once while it lives."""
    key = id(code)
    entry = _FACTS.get(key)
    if entry is not None and entry[0]() is code:
        return entry[1]
    facts = CodeFacts(code)

    def forget(ref: weakref.ref[types.CodeType]) -> None:
        if (held := _FACTS.get(key)) is not None and held[0] is ref:
            del _FACTS[key]

    _FACTS[key] = (weakref.ref(code, forget), facts)
    return facts


class Checkpoint:
    """Enough of a tracer's state to roll back to an instruction boundary."""

    def __init__(self, tracer: Tracer) -> None:
        self.ip: int = tracer.ip
        self.stack = list(tracer.stack)
        self.locals = dict(tracer.locals)
        self.nodes = set(tracer.out.graph.nodes)
        self.effects_version = tracer.out.side_effects.version


class Tracer:
    """Symbolic evaluation of one code object; ``run()`` returns the returned value."""

    def __init__(
        self,
        code: types.CodeType,
        f_globals: dict[str, Any],
        out: OutputGraph,
        *,
        f_locals: dict[str, Value],
        cells: dict[str, CellValue],
        globals_source: Source | None = None,
        parent: Tracer | None = None,
    ) -> None:
        self.code = code
        self.f_globals = f_globals
        self.out = out
        self.locals = f_locals
        self.cells = cells
        self.globals_source = globals_source
        self.parent = parent
        self.root: Tracer = self if parent is None else parent.root
        self.depth: int = 0 if parent is None else parent.depth + 1
        if self.depth > MAX_INLINE_DEPTH:
            raise unsupported("inline_limit", f"call depth above {MAX_INLINE_DEPTH}")
        self.facts = code_facts(code)
        self.instructions = self.facts.instructions
        self.index_of = self.facts.index_of
        self.ip: int = 0
        self.stack: list[Value] = []
        self.kw_names: tuple[str, ...] = ()
        self.return_value: Value | None = None
        self.current: dis.Instruction | None = None
        self.lineno = code.co_firstlineno
        self._trace: tuple[int, str] | None = None  # (lineno, stack_trace()) while called
        self.exc_stack: list[Value] = []  # exceptions being handled (PUSH_EXC_INFO)
        self.yielded: list[Value] | None = None  # items of a generator run eagerly
        # grad mode and open autocast blocks when a generator run eagerly started: its consumer
        # runs all its steps under them (check_generator_state)
        self.started_under: tuple[bool, int] | None = None

    # the loop ----------------------------------------------------------------
    def run(self) -> Value:
        self.out.active.append(self)
        try:
            return self._loop()
        finally:
            self.out.active.pop()

    def _loop(self) -> Value:
        while self.return_value is None:
            self.before_step()
            ins = self.instructions[self.ip]
            self.ip += 1
            self.current = ins
            if ins.starts_line:
                self.lineno = _line_of(ins, self.lineno)
            self.out.steps += 1
            if self.out.steps > MAX_STEPS:
                raise unsupported("inline_limit", f"more than {MAX_STEPS} instructions")
            handler = OPCODES.get(ins.opname)
            if handler is None:
                raise unsupported("unsupported_opcode", ins.opname)
            try:
                handler(self, ins)
            except UserException as e:
                if not self._catch(ins, e):
                    raise self._located(e) from None
            except Unsupported as e:
                if e.frame is not None:
                    raise
                raise self._located(e) from e
        return self.return_value

    def _located(self, e: Unsupported) -> Unsupported:
        if e.frame is not None:
            return e
        located = e.with_frame(self.user_frame())
        located.user_stack = self.stack_trace()  # type: ignore[attr-defined]
        return located

    def _catch(self, ins: dis.Instruction, e: UserException) -> bool:
        """Jump to the handler covering ``ins`` (per the exception table), if there is one."""
        entry = self._handler_for(ins.offset)
        if entry is None:
            return False
        _, _, target, depth, lasti = entry
        del self.stack[depth:]
        if lasti:
            self.push(ConstantValue(ins.offset))
        self.push(ObjectValue(e.exc))
        self.jump_to(target)
        return True

    def _handler_for(self, offset: int) -> ExceptionRow | None:
        for entry in self.facts.exception_table(self.code):
            if entry[0] <= offset <= entry[1]:
                return entry
        return None

    def jump_to(self, offset: int) -> None:
        self.ip = self.index_of[offset]

    # stack -------------------------------------------------------------------
    def push(self, value: Value) -> None:
        self.stack.append(value)

    def pop(self) -> Value:
        return self.stack.pop()

    def popn(self, n: int) -> list[Value]:
        if n == 0:
            return []
        items = self.stack[-n:]
        del self.stack[-n:]
        return items

    def peek(self, depth: int = 1) -> Value:
        return self.stack[-depth]

    def before_step(self) -> None:
        """Called before each instruction; the captured frame's tracer snapshots its state here."""

    def checkpoint(self) -> Checkpoint:
        return Checkpoint(self)

    def rollback(self, cp: Checkpoint) -> None:
        """Restore ``cp`` and drop the ops recorded since (inputs found since stay).

        Recorded side effects cannot be taken back: an attempt that made one
        cannot be rolled back.
        """
        if self.out.side_effects.version != cp.effects_version:
            raise unsupported("side_effect", "state changed inside an attempt that must be undone")
        self.ip, self.stack, self.locals = cp.ip, list(cp.stack), dict(cp.locals)
        for node in reversed(list(self.out.graph.nodes)):
            if node not in cp.nodes and node.op != "placeholder":
                self.out.graph.erase_node(node)

    # where we are ------------------------------------------------------------
    def user_frame(self) -> UserFrame:
        name = self.code.co_name
        text = linecache.getline(self.code.co_filename, self.lineno)
        return UserFrame(self.code.co_filename, self.lineno, name, text.strip())

    def stack_trace(self) -> str:
        f = self.user_frame()
        line = f'  File "{f.filename}", line {f.lineno}, in {f.name}\n    {f.source}'
        return line if self.parent is None else f"{self.parent._held_trace()}\n{line}"

    def _held_trace(self) -> str:
        """:meth:`stack_trace` of a tracer suspended in a call, kept while its line stays (its
        callers are suspended too): each node records its trace without walking every frame."""
        if self._trace is None or self._trace[0] != self.lineno:
            self._trace = (self.lineno, self.stack_trace())
        return self._trace[1]

    def code_const(self, index: int) -> Any:
        return self.code.co_consts[index]

    # names -------------------------------------------------------------------
    def load_global(self, name: str) -> Value:
        """A global (or builtin) of the running code, guarded through its source."""
        pending = self.out.side_effects.pending_global(self.f_globals, name)
        if pending is not None:
            return pending
        if name in self.f_globals:
            if self.f_globals is self.root.f_globals:
                src: Source | None = GlobalSource(name)
            elif self.globals_source is not None:
                src = self.globals_source.item(name)
            else:
                src = None
            return wrap(self.out, self.f_globals[name], src)
        builtins_ns = self.f_globals.get("__builtins__", builtins)
        table = builtins_ns if isinstance(builtins_ns, dict) else vars(builtins_ns)
        if name not in table:
            raise unsupported("user_exception", f"NameError: name {name!r} is not defined")
        return wrap(self.out, table[name], None)

    def load_cell(self, cell: CellValue) -> Value:
        if cell.contents is not None:
            return cell.contents
        if cell.real is None:
            raise unsupported(
                "user_exception", "NameError: free variable referenced before assignment"
            )
        try:
            contents = cell.real.cell_contents
        except ValueError:
            raise unsupported("user_exception", "NameError: empty closure cell") from None
        cell.contents = wrap(self.out, contents, cell.source)
        return cell.contents

    def zero_arg_super(self) -> Value:
        """``super()`` inside a method: ``__class__`` cell and the first argument."""
        cell = self.cells.get("__class__")
        if cell is None or not self.code.co_argcount:
            raise unsupported("unsupported_call", "super() outside a method")
        cls = self.load_cell(cell)
        first = self.code.co_varnames[0]
        obj = self.locals.get(first)
        if obj is None and first in self.cells:
            obj = self.load_cell(self.cells[first])
        if not isinstance(cls, ObjectValue) or obj is None:
            raise unsupported("unsupported_call", "super() with an unknown class")
        return SuperValue(cls.obj, obj)

    # calls -------------------------------------------------------------------
    def inline(self, fn: UserFunctionValue, args: list[Value], kwargs: dict[str, Value]) -> Value:
        """Run ``fn`` in a child tracer that shares this graph; return its result."""
        code = fn.code
        generator = code.co_flags & CO_GENERATOR_LIKE == CO_GENERATOR
        if code.co_flags & CO_GENERATOR_LIKE and not generator:
            raise unsupported("unsupported_call", f"coroutine {code.co_qualname}")
        defaults, kwdefaults = fn.defaults, fn.kwdefaults
        if fn.real is not None:
            defaults, kwdefaults = self._real_defaults(fn)
        f_locals = bind_arguments(code, defaults, kwdefaults, args, kwargs)
        cells = dict(zip(code.co_freevars, fn.closure, strict=False))
        globals_source = fn.globals_source
        child = Tracer(
            code,
            fn.f_globals,
            self.out,
            f_locals=f_locals,
            cells=cells,
            globals_source=globals_source,
            parent=self,
        )
        log.debug("inlining %s", code.co_qualname)
        if generator:
            # run the generator to its end now; its items are then iterated as a list
            child.yielded = []
            child.started_under = (torch.is_grad_enabled(), len(self.out.entered))
            try:
                returned = child.run()
            except UserException as e:  # raised for the consumer after the items yielded
                return GeneratorIterator(
                    child.yielded, ConstantValue(None), leaving_generator(e.exc)
                )
            child.check_generator_state()
            return GeneratorIterator(child.yielded, returned)
        return child.run()

    def check_generator_state(self) -> None:
        """Refuse a generator that yields or ends with grad mode or autocast changed.

        It runs to its end at its call, so its consumer's code between two of its steps would
        run under the state the generator left last, not the one it left at that step (a
        ``@contextmanager`` that disables grad around its ``yield``).
        """
        if self.started_under is None:
            return
        if (torch.is_grad_enabled(), len(self.out.entered)) != self.started_under:
            raise unsupported(
                "unsupported_context",
                f"{self.code.co_qualname} yields with grad mode or autocast changed",
            )

    def _real_defaults(self, fn: UserFunctionValue) -> tuple[tuple[Value, ...], dict[str, Value]]:
        real = fn.real
        assert real is not None
        src = fn.source
        defaults = tuple(
            wrap(self.out, d, src.attr("__defaults__").item(i) if src is not None else None)
            for i, d in enumerate(real.__defaults__ or ())
        )
        kwdefaults = {
            k: wrap(self.out, d, src.attr("__kwdefaults__").item(k) if src is not None else None)
            for k, d in (real.__kwdefaults__ or {}).items()
        }
        return defaults, kwdefaults


def _line_of(ins: dis.Instruction, previous: int) -> int:
    positions = getattr(ins, "positions", None)
    if positions is not None and positions.lineno is not None:
        return int(positions.lineno)
    return int(ins.starts_line) if isinstance(ins.starts_line, int) else previous
