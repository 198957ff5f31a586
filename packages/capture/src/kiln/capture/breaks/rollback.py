"""The root tracer that can stop at an instruction and hand its state to the break handler.

Before every instruction of the captured frame (not of functions inlined into
it; ``Tracer.before_step``) :class:`BreakTracer` remembers the symbolic state:
stack, locals, cells, the last graph node, the positions of iterators and,
before calls that may run Python code, the contents of containers and the
recorded side effects. When the instruction raises
:class:`~kiln.capture.errors.Unsupported` (also from deep inside an inlined
call), the state is rolled back to just before it and attached to the error
as a :class:`BreakState`, which ``kiln.capture.breaks.split`` turns into a partial
graph plus continuation functions. Where that cannot be done soundly (a store
recorded by an instruction that is not a call) nothing is attached and the
frame runs eagerly.

``ResumeIterator`` and ``GradModeExit`` carry an interrupted loop and open
grad-mode blocks into a continuation; its capture turns them back into
tracked values (with guards).
"""

from __future__ import annotations

import dataclasses
import dis
import types
from collections.abc import Iterator
from typing import Any

import torch
from torch import fx

from kiln.capture.autograd_function import is_apply
from kiln.capture.breaks.reasons import UserException
from kiln.capture.contexts import ContextValue, ExitValue
from kiln.capture.errors import Unsupported
from kiln.capture.guard_data import GuardKind
from kiln.capture.side_effects import SideEffects
from kiln.capture.tracer import Tracer
from kiln.capture.values.base import ConstantValue, Value, callable_and_args
from kiln.capture.values.containers import DictValue, ListValue, SetValue, TupleValue
from kiln.capture.values.functions import BuiltinMethodValue
from kiln.capture.values.iterators import ItemsIterator, IteratorValue
from kiln.capture.values.objects import NewObjectValue, ObjectValue
from kiln.capture.values.tensor import TensorMethodValue, TensorValue
from kiln.capture.wrap import wrap

__all__ = ["BreakState", "BreakTracer", "GradModeExit", "ResumeIterator", "break_state"]

_CALLS = frozenset({"CALL", "CALL_KW", "CALL_FUNCTION_EX", "PRECALL"})
_STATE_ATTR = "kiln_break_state"


class ResumeIterator:
    """The rest of a ``for`` loop a graph break interrupted, handed to its continuation.

    A real list iterator cannot be read without consuming it; this one exposes
    its remaining ``items``, so the continuation's capture unrolls them with guards.
    """

    __slots__ = ("items", "pos")

    def __init__(self, items: list[Any]) -> None:
        self.items = items
        self.pos = 0

    def __iter__(self) -> ResumeIterator:
        return self

    def __next__(self) -> Any:
        if self.pos >= len(self.items):
            raise StopIteration
        self.pos += 1
        return self.items[self.pos - 1]


class GradModeExit:
    """A grad-mode ``with`` block entered again for a continuation; calling it leaves it.

    It stands where the block's ``__exit__`` stood on the stack, so the
    continuation's capture knows the block (and the mode to go back to).
    """

    __slots__ = ("prev",)

    def __init__(self, enabled: bool, prev: bool) -> None:
        self.prev = prev
        torch._C._set_grad_enabled(enabled)

    def __call__(self, *exc_info: object) -> None:
        torch._C._set_grad_enabled(self.prev)


@dataclasses.dataclass
class BreakState:
    """The root frame just before the instruction that could not be captured."""

    tracer: Tracer
    instruction: dis.Instruction
    index: int
    stack: list[Value]
    locals: dict[str, Value]
    kw_names: tuple[str, ...]
    grad_enabled: bool
    contexts_entered: int


class _EffectsState:
    """The side effects recorded before a call, so a call that fails can be taken back."""

    def __init__(self, effects: SideEffects) -> None:
        self.version = effects.version
        self.calls = len(effects.calls)
        self.attrs = {k: (t, dict(st)) for k, (t, st) in effects.attr_stores.items()}
        self.globals = {k: (ns, dict(st)) for k, (ns, st) in effects.global_stores.items()}
        self.cells = dict(effects.cell_stores)
        self.wrapped = dict(effects._wrapped)
        self.containers = [(c, _copy(c.items), c.mutated) for c in effects.containers]

    def restore(self, effects: SideEffects) -> None:
        effects.version = self.version
        del effects.calls[self.calls :]
        effects.attr_stores = {k: (t, dict(st)) for k, (t, st) in self.attrs.items()}
        effects.global_stores = {k: (ns, dict(st)) for k, (ns, st) in self.globals.items()}
        effects.cell_stores = dict(self.cells)
        effects._wrapped = dict(self.wrapped)
        effects.containers = [c for c, _, _ in self.containers]
        for c, items, mutated in self.containers:
            c.items, c.mutated = _copy(items), mutated


class _Snapshot:
    """Enough to undo one root instruction, including in-place changes to tracked values."""

    def __init__(self, tr: Tracer, index: int) -> None:
        self.index = index
        self.stack = list(tr.stack)
        self.locals = dict(tr.locals)
        self.kw_names = tr.kw_names
        self.cells = {name: cell.contents for name, cell in tr.cells.items()}
        self.last_node: fx.Node = next(iter(reversed(tr.out.graph.nodes)), tr.out.graph._root)
        self.effects_version = tr.out.side_effects.version
        self.effect_calls = len(tr.out.side_effects.calls)
        self.grad_enabled = torch.is_grad_enabled()
        self.contexts_entered = len(tr.out.entered)
        self.mutable: list[tuple[Value, Any]] = []
        seen: set[int] = set()
        deep = _may_run_user_code(tr, tr.instructions[index])
        # a call may record stores deep inside before it fails: keep what to go back to
        self.effects = _EffectsState(tr.out.side_effects) if deep else None
        for v in [*self.stack, *self.locals.values(), *self.cells.values()]:
            if v is not None:
                self._remember(v, seen, deep)

    def _remember(self, v: Value, seen: set[int], deep: bool) -> None:
        if id(v) in seen:
            return
        seen.add(id(v))
        if isinstance(v, IteratorValue):
            self.mutable.append((v, v.save()))
        elif deep and isinstance(v, (ListValue, DictValue, SetValue)):
            self.mutable.append((v, (_copy(v.items), v.mutated, dict(v.attrs))))
            for x in _children(v):
                self._remember(x, seen, deep)
        elif deep and isinstance(v, NewObjectValue):
            self.mutable.append((v, dict(v.attrs)))
            for x in v.attrs.values():
                self._remember(x, seen, deep)

    def restore(self, tr: Tracer) -> None:
        tr.stack, tr.locals, tr.kw_names = list(self.stack), dict(self.locals), self.kw_names
        for name, cell in tr.cells.items():
            cell.contents = self.cells.get(name)
        graph = tr.out.graph
        for node in reversed(list(graph.nodes)):
            if node is self.last_node:
                break
            if node.op != "placeholder" and not node.users:
                graph.erase_node(node)
        for v, saved in self.mutable:
            if isinstance(v, IteratorValue):
                saved()
            elif isinstance(v, NewObjectValue):
                v.attrs = saved
            elif isinstance(v, (ListValue, DictValue, SetValue)):
                v.items, v.mutated, v.attrs = saved


def _may_run_user_code(tr: Tracer, ins: dis.Instruction) -> bool:
    """Whether ``ins`` is a call that may inline Python code (which can change state, then fail).

    Not: torch ops, tensor methods and builtins called on tensors and constants only
    (they fail before changing anything, and call back into nothing).
    """
    if ins.opname not in _CALLS:
        return False
    arg = ins.arg or 0
    argc = 1 + (arg & 1) if ins.opname == "CALL_FUNCTION_EX" else arg  # (args, kwargs) or args
    stack = tr.stack[:-1] if ins.opname == "CALL_KW" else tr.stack  # 3.13: the keywords' names
    below = stack[-(argc + 2) :]
    if len(below) < 2:
        return True
    fn, operands = callable_and_args(below[0], below[1], below[2:])
    if not all(_plain_data(v) for v in operands):
        return True
    if isinstance(fn, (TensorMethodValue, BuiltinMethodValue)):
        return False
    if isinstance(fn, ObjectValue):
        obj = fn.obj
        if is_apply(obj):  # a C method that runs the user's forward
            return True
        if isinstance(obj, (types.BuiltinFunctionType, types.MethodDescriptorType)):
            return False
        if isinstance(obj, type) and obj.__module__ == "builtins":
            return False
    return True


def _plain_data(v: Value) -> bool:
    """Tensors, constants, and containers of them: nothing a builtin could call back."""
    if isinstance(v, (TensorValue, ConstantValue)):
        return True
    if isinstance(v, (ListValue, TupleValue)):
        return all(isinstance(x, (TensorValue, ConstantValue)) for x in v.items)
    return False


def _copy(items: Any) -> Any:
    return list(items) if isinstance(items, list) else dict(items)


def _children(v: ListValue | DictValue | SetValue) -> Iterator[Value]:
    yield from v.attrs.values()
    if isinstance(v, ListValue):
        yield from v.items
    elif isinstance(v, DictValue):
        for key, value in v.items.values():
            yield key
            yield value
    else:
        yield from v.items.values()


class BreakTracer(Tracer):
    """A :class:`Tracer` for the captured frame that records where a graph break can happen."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.snapshot: _Snapshot | None = None
        for name, value in self.locals.items():
            if isinstance(value, ObjectValue) and type(value.obj) is ResumeIterator:
                self.locals[name] = self._resumed_iterator(value)
            elif isinstance(value, ObjectValue) and type(value.obj) is GradModeExit:
                self.locals[name] = self._resumed_block(value)

    def _resumed_block(self, value: ObjectValue) -> Value:
        if value.source is None:
            return value
        self.out.guard(value.source, GuardKind.TYPE_MATCH, GradModeExit)
        self.out.guard(value.source.attr("prev"), GuardKind.EQUALS, value.obj.prev)
        ctx = ContextValue(torch.is_grad_enabled())
        ctx.previous.append(value.obj.prev)
        return ExitValue(ctx)

    def _resumed_iterator(self, value: ObjectValue) -> Value:
        it = value.obj
        if it.pos or value.source is None:
            return value
        self.out.guard(value.source, GuardKind.TYPE_MATCH, ResumeIterator)
        items = wrap(self.out, it.items, value.source.attr("items"))
        assert isinstance(items, ListValue)
        return ItemsIterator(list(items.items))

    def before_step(self) -> None:
        self.snapshot = _Snapshot(self, self.ip)

    def run(self) -> Value:
        try:
            return super().run()
        except UserException:
            raise
        except Unsupported as e:
            self._attach(e)
            raise

    def _attach(self, e: Unsupported) -> None:
        snap = self.snapshot
        effects = self.out.side_effects
        if snap is None:
            return
        if snap.effects is not None:
            snap.effects.restore(effects)
        else:
            new_calls = len(effects.calls) - snap.effect_calls
            if effects.version - snap.effects_version != new_calls:
                return  # a store or mutation was recorded: it cannot be taken back
            # only replayed calls (log lines, prints) were recorded: drop them, they run again
            del effects.calls[snap.effect_calls :]
            effects.version = snap.effects_version
        snap.restore(self)
        ins = self.instructions[snap.index]
        state = BreakState(
            self,
            ins,
            snap.index,
            list(snap.stack),
            dict(snap.locals),
            snap.kw_names,
            snap.grad_enabled,
            snap.contexts_entered,
        )
        setattr(e, _STATE_ATTR, state)


def break_state(e: Unsupported) -> BreakState | None:
    """The root frame's state before the failing instruction, if the break can be resumed."""
    state = getattr(e, _STATE_ATTR, None)
    return state if isinstance(state, BreakState) else None
