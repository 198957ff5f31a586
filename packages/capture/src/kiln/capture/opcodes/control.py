"""Jumps, conditional jumps on values known at capture time, and unrolled iteration."""

from __future__ import annotations

import collections.abc
import dis
import types
from typing import TYPE_CHECKING

from kiln.capture import dispatch, iteration
from kiln.capture.breaks.reasons import unsupported
from kiln.capture.bytecode.versions import VERSION
from kiln.capture.opcodes.common import registry
from kiln.capture.values.base import NULL, ConstantValue, Value
from kiln.capture.values.iterators import IteratorValue
from kiln.capture.values.objects import ObjectValue

if TYPE_CHECKING:
    from kiln.capture.tracer import Tracer

HANDLERS, handles = registry()


@handles("NOP", "RESUME", "CACHE", "EXTENDED_ARG")
def nop(tr: Tracer, ins: dis.Instruction) -> None:
    """Nothing to model."""


@handles("POP_TOP")
def pop_top(tr: Tracer, ins: dis.Instruction) -> None:
    tr.pop()


@handles("PUSH_NULL")
def push_null(tr: Tracer, ins: dis.Instruction) -> None:
    tr.push(NULL)


@handles("COPY")
def copy(tr: Tracer, ins: dis.Instruction) -> None:
    tr.push(tr.peek(ins.arg or 1))


@handles("SWAP")
def swap(tr: Tracer, ins: dis.Instruction) -> None:
    n = ins.arg or 1
    tr.stack[-1], tr.stack[-n] = tr.stack[-n], tr.stack[-1]


@handles("JUMP_FORWARD", "JUMP_BACKWARD", "JUMP_BACKWARD_NO_INTERRUPT", "JUMP", "JUMP_NO_INTERRUPT")
def jump(tr: Tracer, ins: dis.Instruction) -> None:
    tr.jump_to(ins.argval)


def _is_none(v: Value) -> bool:
    return isinstance(v, ConstantValue) and v.is_none()


def _pop_jump(tr: Tracer, ins: dis.Instruction, condition: bool) -> None:
    if condition:
        tr.jump_to(ins.argval)


@handles("POP_JUMP_IF_TRUE", "POP_JUMP_FORWARD_IF_TRUE", "POP_JUMP_BACKWARD_IF_TRUE")
def pop_jump_if_true(tr: Tracer, ins: dis.Instruction) -> None:
    _pop_jump(tr, ins, dispatch.truth(tr, tr.pop()))


@handles("POP_JUMP_IF_FALSE", "POP_JUMP_FORWARD_IF_FALSE", "POP_JUMP_BACKWARD_IF_FALSE")
def pop_jump_if_false(tr: Tracer, ins: dis.Instruction) -> None:
    _pop_jump(tr, ins, not dispatch.truth(tr, tr.pop()))


@handles("POP_JUMP_IF_NONE", "POP_JUMP_FORWARD_IF_NONE", "POP_JUMP_BACKWARD_IF_NONE")
def pop_jump_if_none(tr: Tracer, ins: dis.Instruction) -> None:
    _pop_jump(tr, ins, _is_none(tr.pop()))


@handles("POP_JUMP_IF_NOT_NONE", "POP_JUMP_FORWARD_IF_NOT_NONE", "POP_JUMP_BACKWARD_IF_NOT_NONE")
def pop_jump_if_not_none(tr: Tracer, ins: dis.Instruction) -> None:
    _pop_jump(tr, ins, not _is_none(tr.pop()))


@handles("JUMP_IF_TRUE_OR_POP")
def jump_if_true_or_pop(tr: Tracer, ins: dis.Instruction) -> None:
    if dispatch.truth(tr, tr.peek()):
        tr.jump_to(ins.argval)
    else:
        tr.pop()


@handles("JUMP_IF_FALSE_OR_POP")
def jump_if_false_or_pop(tr: Tracer, ins: dis.Instruction) -> None:
    if not dispatch.truth(tr, tr.peek()):
        tr.jump_to(ins.argval)
    else:
        tr.pop()


@handles("GET_ITER")
def get_iter(tr: Tracer, ins: dis.Instruction) -> None:
    v = tr.pop()
    if _python_iterator(v):  # ``iter(it) is it``: the loop advances it (a break, below)
        tr.push(v)
        return
    tr.push(dispatch.iterate(tr, v))


def _python_iterator(v: Value) -> bool:
    """A real generator or builtin iterator the frame was handed (not one capture unrolls)."""
    if not isinstance(v, ObjectValue):
        return False
    cls = type(v.obj)
    return isinstance(v.obj, types.GeneratorType) or (
        cls.__module__ == "builtins" and isinstance(v.obj, collections.abc.Iterator)
    )


@handles("FOR_ITER")
def for_iter(tr: Tracer, ins: dis.Instruction) -> None:
    it = tr.peek()
    if not isinstance(it, IteratorValue):
        # advancing it runs its code for real: the loop runs on in Python, item by item
        raise unsupported("unsupported_value", f"a loop over the Python iterator {it}")
    item = iteration.next_item(tr, it)
    if item is not None:
        tr.push(item)
        return
    tr.pop()
    tr.jump_to(ins.argval)
    if tr.instructions[tr.ip].opname == "END_FOR":  # 3.12+ skips END_FOR (and 3.13 POP_TOP)
        tr.ip += VERSION.for_iter_skips


@handles("END_FOR")
def end_for(tr: Tracer, ins: dis.Instruction) -> None:
    tr.popn(VERSION.end_for_pops)


@handles("TO_BOOL")
def to_bool(tr: Tracer, ins: dis.Instruction) -> None:
    """3.13: the value's truth is taken where the jump or ``not`` after it uses it.

    Taking it there as before 3.13 keeps one evaluation of ``__bool__`` and a
    data-dependent branch breaking at the jump, where the split knows both ways on.
    """
