"""Raising and handling exceptions inside the traced code.

A Python exception the traced program raises at capture time (``raise``, a
missing key, a failed attribute lookup) travels as
:class:`~kiln.capture.breaks.reasons.UserException`; the tracer jumps to the
handler the exception table names, and these handlers run the ``except``
blocks symbolically. Uncaught, the exception ends the capture.

``except*`` (CHECK_EG_MATCH, PREP_RERAISE_STAR, and 3.12's CALL_INTRINSIC_2
form of it) splits and recombines exception groups as CPython does
(``Objects/exceptions.c``): the exceptions are real objects, only raised
symbolically, so the same ``split`` calls give the same groups. An exception
raised inside a handler gets the handled one as ``__context__``, as Python sets
it, which is also how ``except*`` tells a re-raise from a new exception.
"""

from __future__ import annotations

import dis
from typing import TYPE_CHECKING, Any

from kiln.capture import builtin_calls, contexts, dispatch
from kiln.capture.breaks.reasons import raised, unsupported
from kiln.capture.opcodes.common import registry
from kiln.capture.values.base import ConstantValue, Value
from kiln.capture.values.containers import ListValue, TupleValue
from kiln.capture.values.objects import ObjectValue

if TYPE_CHECKING:
    from kiln.capture.tracer import Tracer

HANDLERS, handles = registry()


def exception_of(v: Value) -> BaseException:
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
        raise raised(exception_of(tr.exc_stack[-1]))
    cause = tr.pop() if argc == 2 else None
    exc = _with_context(tr, exception_of(tr.pop()))
    if cause is not None:  # ``raise exc from cause``: a handler may read it
        exc.__cause__ = None if _is_none(cause) else exception_of(cause)
        exc.__suppress_context__ = True
    raise raised(exc)


def _with_context(tr: Tracer, exc: BaseException) -> BaseException:
    """``exc`` raised while an exception is handled: Python chains the handled one to it."""
    if not tr.exc_stack:
        return exc
    handled = tr.exc_stack[-1]
    context = handled.obj if isinstance(handled, ObjectValue) else None
    if not isinstance(context, BaseException) or context is exc:
        return exc
    # break a cycle through exc, as Python does, before chaining
    o = context
    while o.__context__ is not None:
        if o.__context__ is exc:
            o.__context__ = None
            break
        o = o.__context__
    exc.__context__ = context
    return exc


@handles("RERAISE")
def reraise(tr: Tracer, ins: dis.Instruction) -> None:
    exc = tr.pop()
    if ins.arg:
        tr.pop()  # the saved instruction offset
    raise raised(exception_of(exc))


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
    exc = exception_of(tr.peek())
    matched = builtin_calls.handler_for(isinstance)
    assert matched is not None
    tr.push(matched(tr, [ObjectValue(exc), types_v], {}))


@handles("WITH_EXCEPT_START")
def with_except_start(tr: Tracer, ins: dis.Instruction) -> None:
    exc_v = tr.peek()
    exit_fn = tr.peek(4)
    exc = exception_of(exc_v)
    if isinstance(exit_fn, contexts.ExitValue):
        exit_fn.ctx.exit(tr)
        tr.push(ConstantValue(False))
        return
    args = [ObjectValue(type(exc)), ObjectValue(exc), ConstantValue(None)]
    tr.push(dispatch.call(tr, exit_fn, args, {}))


@handles("LOAD_ASSERTION_ERROR")
def load_assertion_error(tr: Tracer, ins: dis.Instruction) -> None:
    tr.push(ObjectValue(AssertionError))


def _star_types(types_v: Value) -> Any:
    """The type(s) after ``except*``: exception classes that are not exception groups."""
    parts = types_v.items if isinstance(types_v, TupleValue) else [types_v]
    classes = tuple(v.obj if isinstance(v, ObjectValue) else v.as_constant() for v in parts)
    for cls in classes:
        if not (isinstance(cls, type) and issubclass(cls, BaseException)):
            msg = "catching classes that do not inherit from BaseException is not allowed"
            raise raised(TypeError(msg))
        if issubclass(cls, BaseExceptionGroup):
            msg = "catching ExceptionGroup with except* is not allowed. Use except instead."
            raise raised(TypeError(msg))
    return classes if isinstance(types_v, TupleValue) else classes[0]


@handles("CHECK_EG_MATCH")
def check_eg_match(tr: Tracer, ins: dis.Instruction) -> None:
    """``except* T``: the part of the group that is not T, then the part that is (or None)."""
    match_type = _star_types(tr.pop())
    if _is_none(tr.peek()):  # an earlier clause handled all of it
        tr.push(ConstantValue(None))
        return
    match, rest = _group_match(exception_of(tr.peek()), match_type)
    if match is None:
        tr.push(ConstantValue(None))
        return
    tr.pop()
    tr.push(ObjectValue(rest) if rest is not None else ConstantValue(None))
    matched = ObjectValue(match)
    tr.push(matched)
    if tr.exc_stack:  # a bare ``raise`` in the handler re-raises the matched part
        tr.exc_stack[-1] = matched


def _group_match(
    exc: BaseException, match_type: Any
) -> tuple[BaseException | None, BaseException | None]:
    """``(match, rest)`` of ``exc`` against ``match_type`` (``exception_group_match``)."""
    if isinstance(exc, match_type):
        if isinstance(exc, BaseExceptionGroup):
            return exc, None
        wrapped = BaseExceptionGroup("", [exc])  # a naked exception is matched as a group of one
        wrapped.__traceback__ = exc.__traceback__
        return wrapped, None
    if isinstance(exc, BaseExceptionGroup):
        return exc.split(match_type)
    return None, exc


def prep_reraise_star(orig: Value, excs: Value) -> Value:
    """What leaves a ``try``/``except*``: the unhandled and raised parts (``_PyExc_PrepReraiseStar``).

    Exceptions the handlers raised anew are grouped with what is left of the
    original group, re-raised ones keep the structure of the original.
    """
    assert isinstance(excs, ListValue)
    raised_all = [exception_of(v) for v in excs.items if not _is_none(v)]
    original = exception_of(orig)
    if not raised_all:
        return ConstantValue(None)
    if not isinstance(original, BaseExceptionGroup):
        return ObjectValue(raised_all[0])
    new = [e for e in raised_all if not _same_metadata(e, original)]
    again = [e for e in raised_all if _same_metadata(e, original)]
    leaves = {id(leaf) for e in again for leaf in _leaves(e)}
    kept = original.split(lambda e: id(e) in leaves)[0] if leaves else None
    if kept is not None:
        new.append(kept)
    if not new:
        return ConstantValue(None)
    return ObjectValue(new[0] if len(new) == 1 else BaseExceptionGroup("", new))


@handles("PREP_RERAISE_STAR")
def prep_reraise_star_311(tr: Tracer, ins: dis.Instruction) -> None:
    excs = tr.pop()
    tr.push(prep_reraise_star(tr.pop(), excs))


def _is_none(v: Value) -> bool:
    return isinstance(v, ConstantValue) and v.is_none()


def _same_metadata(a: BaseException, b: BaseException) -> bool:
    """A re-raise keeps the original's notes, traceback, cause and context objects."""
    return (
        getattr(a, "__notes__", None) is getattr(b, "__notes__", None)
        and a.__traceback__ is b.__traceback__
        and a.__cause__ is b.__cause__
        and a.__context__ is b.__context__
    )


def _leaves(e: BaseException) -> list[BaseException]:
    if isinstance(e, BaseExceptionGroup):
        return [leaf for sub in e.exceptions for leaf in _leaves(sub)]
    return [e]
