"""Calls (3.11 PRECALL/CALL/KW_NAMES, 3.12 CALL, 3.13 CALL_KW), functions, classes, returns,
imports, ``with``."""

from __future__ import annotations

import builtins
import dis
import importlib.util
import sys
from typing import TYPE_CHECKING

from kiln.capture import contexts, dispatch
from kiln.capture.breaks.reasons import raised, unsupported
from kiln.capture.opcodes.common import registry
from kiln.capture.values.base import ConstantValue, NullValue, Value, callable_and_args
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


@handles("CALL_KW")
def call_kw(tr: Tracer, ins: dis.Instruction) -> None:
    """3.13: the keyword names are a constant tuple above the arguments."""
    tr.kw_names = tuple(tr.pop().as_constant())
    call(tr, ins)


@handles("CALL")
def call(tr: Tracer, ins: dis.Instruction) -> None:
    argc = ins.arg or 0
    args = tr.popn(argc)
    second = tr.pop()
    first = tr.pop()
    fn, args = callable_and_args(first, second, args)
    kwargs: dict[str, Value] = {}
    if tr.kw_names:
        n = len(tr.kw_names)
        kwargs = dict(zip(tr.kw_names, args[-n:], strict=False))
        args = args[:-n]
        tr.kw_names = ()
    _refuse_class_statement(fn, args)
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
    if isinstance(fn, NullValue):  # 3.13: the NULL is above the callable
        fn = tr.pop()
    elif tr.stack and isinstance(tr.peek(), NullValue):
        tr.pop()
    _refuse_class_statement(fn, args)
    tr.push(dispatch.call(tr, fn, args, kwargs))


def _set_function_attribute(fn: UserFunctionValue, flag: int, value: Value) -> None:
    """One of MAKE_FUNCTION's flags: 1 defaults, 2 keyword defaults, 4 annotations, 8 closure
    (other bits, such as 3.13's annotate function, do not change behaviour)."""
    if flag == 0x08:
        assert isinstance(value, TupleValue)
        fn.closure = tuple(c for c in value.items if isinstance(c, CellValue))
    elif flag == 0x02:
        assert isinstance(value, DictValue)
        fn.kwdefaults = {str(k): v for k, (_, v) in value.items.items()}
    elif flag == 0x01:
        fn.defaults = (
            tuple(value.items)
            if isinstance(value, TupleValue)
            else tuple(ConstantValue(x) for x in value.as_constant())
        )


@handles("MAKE_FUNCTION")
def make_function(tr: Tracer, ins: dis.Instruction) -> None:
    """Before 3.13 the oparg's flags say which attributes lie below the code, closure on top."""
    flags = ins.arg or 0
    code = tr.pop().as_constant()
    fn = UserFunctionValue(code, tr.f_globals, name=code.co_name, globals_source=tr.globals_source)
    for flag in (0x08, 0x04, 0x02, 0x01):
        if flags & flag:
            _set_function_attribute(fn, flag, tr.pop())
    tr.push(fn)


@handles("SET_FUNCTION_ATTRIBUTE")
def set_function_attribute(tr: Tracer, ins: dis.Instruction) -> None:
    """3.13: MAKE_FUNCTION made the function from the code alone; each attribute follows."""
    fn = tr.pop()
    assert isinstance(fn, UserFunctionValue)
    _set_function_attribute(fn, ins.arg or 0, tr.pop())
    tr.push(fn)


@handles("RETURN_VALUE")
def return_value(tr: Tracer, ins: dis.Instruction) -> None:
    tr.return_value = tr.pop()


@handles("RETURN_CONST")
def return_const(tr: Tracer, ins: dis.Instruction) -> None:
    tr.return_value = ConstantValue(ins.argval)


@handles("IMPORT_NAME")
def import_name(tr: Tracer, ins: dis.Instruction) -> None:
    """An import of a module already imported is a lookup; a first import runs in Python.

    Relative imports resolve against the running code's package, as ``__import__``
    does; a name in the ``from`` list that the module lacks and that is no
    imported submodule would make Python import it, so that import runs in Python too.
    """
    fromlist = tr.pop().as_constant() or ()
    level = tr.pop().as_constant()
    name = _absolute_name(tr, ins.argval, level)
    module = sys.modules.get(name)
    missing = [
        a
        for a in fromlist
        if a != "*" and not hasattr(module, a) and f"{name}.{a}" not in sys.modules
    ]
    if module is None or missing:
        raise unsupported("unsupported_call", f"importing {name!r} while tracing")
    if not fromlist and "." in name:
        module = sys.modules[name.split(".")[0]]
    tr.push(ObjectValue(module))


def _absolute_name(tr: Tracer, name: str, level: int) -> str:
    if not level:
        return name
    package = tr.f_globals.get("__package__")
    spec = tr.f_globals.get("__spec__")
    if not package and spec is not None:
        package = spec.parent
    if not package:
        raise unsupported("unsupported_call", f"relative import of {name!r} outside a package")
    try:
        return importlib.util.resolve_name("." * level + name, package)
    except ImportError as e:
        raise raised(e) from None


@handles("IMPORT_FROM")
def import_from(tr: Tracer, ins: dis.Instruction) -> None:
    """``from m import a``: the attribute, or the submodule ``m.a`` Python has imported."""
    module = tr.peek()
    real = module.obj if isinstance(module, ObjectValue) else None
    name = ins.argval
    if real is not None and not hasattr(real, name):
        qualified = f"{getattr(real, '__name__', '')}.{name}"
        if qualified in sys.modules:
            tr.push(ObjectValue(sys.modules[qualified]))
            return
    tr.push(dispatch.get_attr(tr, module, name))


@handles("LOAD_BUILD_CLASS")
def load_build_class(tr: Tracer, ins: dis.Instruction) -> None:
    """A class statement: ``__build_class__`` is called after the body function is made.

    The call (see :func:`call`) is the graph break; loading it is not.
    """
    tr.push(ObjectValue(builtins.__build_class__))


def _refuse_class_statement(fn: Value, args: list[Value]) -> None:
    """A class statement makes a new class object on every call: it runs in Python.

    Building it at capture time would hand every call the same class, which
    identity checks, class attributes set later and ``isinstance`` across calls
    can tell apart; the graphs before and after the statement stay compiled.
    """
    if isinstance(fn, ObjectValue) and fn.obj is builtins.__build_class__:
        name = args[1].as_constant() if len(args) > 1 and args[1].is_constant() else "?"
        raise unsupported("class_statement", f"class {name}")


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
