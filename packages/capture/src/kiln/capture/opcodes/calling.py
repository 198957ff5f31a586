"""Calls (3.11 PRECALL/CALL/KW_NAMES, 3.12 CALL), functions, returns, imports, ``with``."""

from __future__ import annotations

import dis
import sys
from typing import TYPE_CHECKING

from kiln.capture import contexts, dispatch
from kiln.capture.breaks.reasons import unsupported
from kiln.capture.opcodes.common import registry
from kiln.capture.values.base import ConstantValue, NullValue, Value
from kiln.capture.values.containers import CellValue, DictValue, TupleValue
from kiln.capture.values.functions import UserFunctionValue
from kiln.capture.values.objects import ObjectValue

if TYPE_CHECKING:
    from kiln.capture.tracer import Tracer

HANDLERS, handles = registry()


@handles("PRECALL")
def precall(tr: Tracer, ins: dis.Instruction) -> None:
    """3.11 prepares the call here; CALL does the work."""


@handles("KW_NAMES")
def kw_names(tr: Tracer, ins: dis.Instruction) -> None:
    tr.kw_names = tuple(tr.code_const(ins.arg or 0))


@handles("CALL")
def call(tr: Tracer, ins: dis.Instruction) -> None:
    argc = ins.arg or 0
    args = tr.popn(argc)
    second = tr.pop()
    first = tr.pop()
    if isinstance(first, NullValue):
        fn = second
    else:
        fn, args = first, [second, *args]
    kwargs: dict[str, Value] = {}
    if tr.kw_names:
        n = len(tr.kw_names)
        kwargs = dict(zip(tr.kw_names, args[-n:], strict=False))
        args = args[:-n]
        tr.kw_names = ()
    tr.push(dispatch.call(tr, fn, args, kwargs))


@handles("CALL_FUNCTION_EX")
def call_function_ex(tr: Tracer, ins: dis.Instruction) -> None:
    kwargs: dict[str, Value] = {}
    if (ins.arg or 0) & 1:
        kw = tr.pop()
        if not isinstance(kw, DictValue):
            raise unsupported("unsupported_call", "** of a non-dict")
        kwargs = {str(k): v for k, (_, v) in kw.items.items()}
    args = dispatch.unpack_iterable(tr, tr.pop())
    fn = tr.pop()
    if tr.stack and isinstance(tr.peek(), NullValue):
        tr.pop()
    tr.push(dispatch.call(tr, fn, args, kwargs))


@handles("MAKE_FUNCTION")
def make_function(tr: Tracer, ins: dis.Instruction) -> None:
    flags = ins.arg or 0
    code = tr.pop().as_constant()
    closure: tuple[CellValue, ...] = ()
    if flags & 0x08:
        cells = tr.pop()
        assert isinstance(cells, TupleValue)
        closure = tuple(c for c in cells.items if isinstance(c, CellValue))
    if flags & 0x04:
        tr.pop()  # annotations do not change behaviour
    kwdefaults: dict[str, Value] = {}
    if flags & 0x02:
        kw = tr.pop()
        assert isinstance(kw, DictValue)
        kwdefaults = {str(k): v for k, (_, v) in kw.items.items()}
    defaults: tuple[Value, ...] = ()
    if flags & 0x01:
        d = tr.pop()
        defaults = (
            tuple(d.items)
            if isinstance(d, TupleValue)
            else tuple(ConstantValue(x) for x in d.as_constant())
        )
    tr.push(
        UserFunctionValue(
            code,
            tr.f_globals,
            name=code.co_name,
            defaults=defaults,
            kwdefaults=kwdefaults,
            closure=closure,
            globals_source=tr.globals_source,
        )
    )


@handles("RETURN_VALUE")
def return_value(tr: Tracer, ins: dis.Instruction) -> None:
    tr.return_value = tr.pop()


@handles("RETURN_CONST")
def return_const(tr: Tracer, ins: dis.Instruction) -> None:
    tr.return_value = ConstantValue(ins.argval)


@handles("IMPORT_NAME")
def import_name(tr: Tracer, ins: dis.Instruction) -> None:
    fromlist = tr.pop().as_constant()
    level = tr.pop().as_constant()
    name = ins.argval
    if level or name not in sys.modules:
        raise unsupported("unsupported_call", f"importing {name!r} while tracing")
    module = sys.modules[name]
    if not fromlist and "." in name:
        module = sys.modules[name.split(".")[0]]
    tr.push(ObjectValue(module))


@handles("IMPORT_FROM")
def import_from(tr: Tracer, ins: dis.Instruction) -> None:
    module = tr.peek()
    tr.push(dispatch.get_attr(tr, module, ins.argval))


@handles("BEFORE_WITH")
def before_with(tr: Tracer, ins: dis.Instruction) -> None:
    ctx = tr.pop()
    if isinstance(ctx, contexts.ContextValue):
        ctx.enter(tr)
        tr.push(contexts.ExitValue(ctx))
        tr.push(ConstantValue(None))
        return
    exit_fn = dispatch.get_attr(tr, ctx, "__exit__")
    enter_fn = dispatch.get_attr(tr, ctx, "__enter__")
    tr.push(exit_fn)
    tr.push(dispatch.call(tr, enter_fn, [], {}))
