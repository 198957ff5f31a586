"""Building functions and fresh code bodies: what resume functions and emitted code need.

:func:`new_body` starts a :class:`Bytecode` with a new signature and the
prologue CPython expects (``COPY_FREE_VARS``, ``MAKE_CELL``, generator start,
``RESUME``); :func:`make_function` turns a code object into a function with
given globals, closure and defaults.
"""

from __future__ import annotations

import dis
import inspect
import types
from collections.abc import Sequence
from typing import Any

from kiln.capture.bytecode import optable
from kiln.capture.bytecode.instructions import Bytecode, Instr, Positions
from kiln.capture.errors import CaptureError

__all__ = [
    "CO_GENERATOR_LIKE",
    "binary_op",
    "build_function",
    "call",
    "to_bool",
    "load_callable",
    "make_cell",
    "make_function",
    "new_body",
    "prologue",
]

#: Flags that make a code object start with RETURN_GENERATOR.
CO_GENERATOR_LIKE = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR


def prologue(
    cellvars: Sequence[str], freevars: Sequence[str], flags: int, positions: Positions | None
) -> list[Instr]:
    """The instructions that open a function body on 3.11+, RESUME last."""
    out = [Instr("COPY_FREE_VARS", len(freevars), positions)] if freevars else []
    out += [Instr("MAKE_CELL", name, positions) for name in cellvars]
    if flags & CO_GENERATOR_LIKE:
        out += [Instr("RETURN_GENERATOR", None, positions), Instr("POP_TOP", None, positions)]
    out.append(Instr("RESUME", 0, positions))
    return out


def new_body(
    name: str,
    args: Sequence[str],
    *,
    qualname: str | None = None,
    filename: str = "<kiln>",
    firstlineno: int = 1,
    kwonly: Sequence[str] = (),
    varargs: str | None = None,
    varkw: str | None = None,
    cellvars: Sequence[str] = (),
    freevars: Sequence[str] = (),
    flags: int = 0,
) -> Bytecode:
    """An empty function body with this signature, holding only its prologue.

    Append instructions to ``body.instrs``; other locals are added as they are
    used. ``flags`` adds to the usual optimized/new-locals ones (e.g. generator).
    """
    varnames = [*args, *kwonly]
    flags |= inspect.CO_OPTIMIZED | inspect.CO_NEWLOCALS | (inspect.CO_NESTED if freevars else 0)
    if varargs is not None:
        varnames.append(varargs)
        flags |= inspect.CO_VARARGS
    if varkw is not None:
        varnames.append(varkw)
        flags |= inspect.CO_VARKEYWORDS
    if len(set(varnames)) != len(varnames):
        msg = f"duplicate argument names in {varnames} for {name}"
        raise CaptureError(msg)
    where = Positions(firstlineno, firstlineno, 0, 0)
    return Bytecode(
        instrs=prologue(cellvars, freevars, flags, where),
        name=name,
        qualname=qualname or name,
        filename=filename,
        firstlineno=firstlineno,
        argcount=len(args),
        kwonlyargcount=len(kwonly),
        flags=flags,
        varnames=varnames,
        cellvars=list(cellvars),
        freevars=list(freevars),
        consts=[None],
    )


def make_cell(value: Any) -> types.CellType:
    """A closure cell holding ``value``."""
    return types.CellType(value)


def make_function(
    code: types.CodeType,
    globals: dict[str, Any],
    *,
    closure: Sequence[types.CellType] | None = None,
    defaults: Sequence[Any] | None = None,
    kwdefaults: dict[str, Any] | None = None,
    name: str | None = None,
    qualname: str | None = None,
) -> types.FunctionType:
    """A function over ``code`` with these globals, closure cells and defaults."""
    if len(closure or ()) != len(code.co_freevars):
        msg = (
            f"{code.co_qualname} has free variables {code.co_freevars} "
            f"but {len(closure or ())} closure cells were given"
        )
        raise CaptureError(msg)
    fn = types.FunctionType(
        code,
        globals,
        name or code.co_name,
        tuple(defaults) if defaults else None,
        tuple(closure) if closure else None,
    )
    if kwdefaults:
        fn.__kwdefaults__ = dict(kwdefaults)
    fn.__qualname__ = qualname or code.co_qualname
    return fn


def load_callable(value: Any) -> list[Instr]:
    """``value`` as a constant and a NULL, in the order :func:`call` expects them.

    The NULL goes below the callable before 3.13 and above it from 3.13 on.
    """
    null, const = Instr("PUSH_NULL"), Instr("LOAD_CONST", value)
    return [const, null] if optable.VERSION.null_above_callable else [null, const]


def call(nargs: int, kw_names: Sequence[str] = ()) -> list[Instr]:
    """Call what :func:`load_callable` pushed with ``*args`` above it (the last
    ``len(kw_names)`` by keyword).

    3.11 needs ``PRECALL`` before ``CALL``; 3.11 and 3.12 take the keyword names
    in ``KW_NAMES`` first, 3.13 as a tuple on the stack for ``CALL_KW``.
    """
    if optable.VERSION.call_kw:
        if not kw_names:
            return [Instr("CALL", nargs)]
        return [Instr("LOAD_CONST", tuple(kw_names)), Instr("CALL_KW", nargs)]
    out = [Instr("KW_NAMES", tuple(kw_names))] if kw_names else []
    if optable.VERSION.precall:
        out.append(Instr("PRECALL", nargs))
    out.append(Instr("CALL", nargs))
    return out


def to_bool() -> list[Instr]:
    """What a POP_JUMP_IF_TRUE/FALSE or UNARY_NOT needs before it to test any object:
    3.13's TO_BOOL (they take only an exact bool there); nothing before 3.13."""
    return [Instr("TO_BOOL")] if optable.VERSION.exact_bool_jumps else []


def build_function(flags: int = 0) -> list[Instr]:
    """Make a function of the code on top of the stack and, below it, the attributes
    ``flags`` names (0x08 closure, on top, 0x04 annotations, 0x02 keyword defaults,
    0x01 defaults): one MAKE_FUNCTION before 3.13, then a SET_FUNCTION_ATTRIBUTE each."""
    if not optable.VERSION.function_attributes:
        return [Instr("MAKE_FUNCTION", flags)]
    sets = [Instr("SET_FUNCTION_ATTRIBUTE", f) for f in (0x08, 0x04, 0x02, 0x01) if flags & f]
    return [Instr("MAKE_FUNCTION"), *sets]


_NB_OPS = {symbol: i for i, (_, symbol) in enumerate(dis._nb_ops)}  # type: ignore[attr-defined]


def binary_op(symbol: str) -> Instr:
    """``BINARY_OP`` for an operator symbol such as ``"+"`` or ``"+="``."""
    try:
        return Instr("BINARY_OP", _NB_OPS[symbol])
    except KeyError:
        msg = f"unknown binary operator {symbol!r}; expected one of {sorted(_NB_OPS)}"
        raise CaptureError(msg) from None
