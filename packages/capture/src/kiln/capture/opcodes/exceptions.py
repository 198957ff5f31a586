"""Raising and handling exceptions inside the traced code.

A Python exception the traced program raises at capture time (``raise``, a
missing key, a failed attribute lookup) travels as
:class:`~kiln.capture.breaks.reasons.UserException`; the tracer jumps to the
handler the exception table names, and these handlers run the ``except``
blocks symbolically. Uncaught, the exception ends the capture.
"""

from __future__ import annotations

import dis
from typing import TYPE_CHECKING

from kiln.capture import builtin_calls, contexts, dispatch
from kiln.capture.breaks.reasons import raised, unsupported
from kiln.capture.opcodes.common import registry
from kiln.capture.values.base import ConstantValue, Value
from kiln.capture.values.objects import ObjectValue

if TYPE_CHECKING:
    from kiln.capture.tracer import Tracer

HANDLERS, handles = registry()


def _exception_of(v: Value) -> BaseException:
    obj = v.obj if isinstance(v, ObjectValue) else None
    if isinstance(obj, type) and issubclass(obj, BaseException):
        return obj()
    if isinstance(obj, BaseException):
        return obj
    raise unsupported("unsupported_value", f"raising {v}")


@handles("RAISE_VARARGS")
def raise_varargs(tr: Tracer, ins: dis.Instruction) -> None:
    argc = ins.arg or 0
    if argc == 0:
        if not tr.exc_stack:
            raise unsupported("user_exception", "a bare raise outside an except block")
        raise raised(_exception_of(tr.exc_stack[-1]))
    if argc == 2:
        tr.pop()  # the cause does not change which handler runs
    raise raised(_exception_of(tr.pop()))


@handles("RERAISE")
def reraise(tr: Tracer, ins: dis.Instruction) -> None:
    exc = tr.pop()
    if ins.arg:
        tr.pop()  # the saved instruction offset
    raise raised(_exception_of(exc))


@handles("PUSH_EXC_INFO")
def push_exc_info(tr: Tracer, ins: dis.Instruction) -> None:
    exc = tr.pop()
    tr.push(tr.exc_stack[-1] if tr.exc_stack else ConstantValue(None))
    tr.exc_stack.append(exc)
    tr.push(exc)


@handles("POP_EXCEPT")
def pop_except(tr: Tracer, ins: dis.Instruction) -> None:
    tr.pop()
    if tr.exc_stack:
        tr.exc_stack.pop()


@handles("CHECK_EXC_MATCH")
def check_exc_match(tr: Tracer, ins: dis.Instruction) -> None:
    types_v = tr.pop()
    exc = _exception_of(tr.peek())
    matched = builtin_calls.handler_for(isinstance)
    assert matched is not None
    tr.push(matched(tr, [ObjectValue(exc), types_v], {}))


@handles("WITH_EXCEPT_START")
def with_except_start(tr: Tracer, ins: dis.Instruction) -> None:
    exc_v = tr.peek()
    exit_fn = tr.peek(4)
    exc = _exception_of(exc_v)
    if isinstance(exit_fn, contexts.ExitValue):
        exit_fn.ctx.exit(tr)
        tr.push(ConstantValue(False))
        return
    args = [ObjectValue(type(exc)), ObjectValue(exc), ConstantValue(None)]
    tr.push(dispatch.call(tr, exit_fn, args, {}))


@handles("LOAD_ASSERTION_ERROR")
def load_assertion_error(tr: Tracer, ins: dis.Instruction) -> None:
    tr.push(ObjectValue(AssertionError))
