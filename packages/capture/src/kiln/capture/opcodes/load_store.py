"""Loads and stores: constants, fast locals, cells, globals, attributes and subscripts."""

from __future__ import annotations

import dis
from typing import TYPE_CHECKING

from kiln.capture import dispatch
from kiln.capture.breaks.reasons import unsupported
from kiln.capture.bytecode.versions import VERSION
from kiln.capture.opcodes.common import registry
from kiln.capture.values.base import NULL, ConstantValue, NullValue, Value
from kiln.capture.values.containers import CellValue
from kiln.capture.values.objects import ObjectValue, SuperValue
from kiln.capture.values.symbolic import slice_value
from kiln.capture.wrap import wrap

if TYPE_CHECKING:
    from kiln.capture.tracer import Tracer

HANDLERS, handles = registry()


@handles("LOAD_CONST")
def load_const(tr: Tracer, ins: dis.Instruction) -> None:
    tr.push(wrap(tr.out, ins.argval, None))


def _push_callable(tr: Tracer, value: Value, null: bool) -> None:
    """``value`` and, if asked, the NULL a call finds beside it (above it from 3.13 on)."""
    if null and not VERSION.null_above_callable:
        tr.push(NULL)
    tr.push(value)
    if null and VERSION.null_above_callable:
        tr.push(NULL)


def _load_fast(tr: Tracer, name: str) -> None:
    if name not in tr.locals and VERSION.cells_by_load_fast and name in tr.cells:
        tr.push(tr.cells[name])  # 3.13 loads a closure's cell from the cell's own slot
        return
    if name not in tr.locals:
        raise unsupported("user_exception", f"UnboundLocalError: {name!r}")
    tr.push(tr.locals[name])


def _store_fast(tr: Tracer, name: str) -> None:
    value = tr.pop()
    if isinstance(value, NullValue):  # restoring an unbound comprehension variable (3.12+)
        tr.locals.pop(name, None)
    else:
        tr.locals[name] = value


@handles("LOAD_FAST", "LOAD_FAST_CHECK")
def load_fast(tr: Tracer, ins: dis.Instruction) -> None:
    _load_fast(tr, ins.argval)


@handles("LOAD_FAST_AND_CLEAR")
def load_fast_and_clear(tr: Tracer, ins: dis.Instruction) -> None:
    tr.push(tr.locals.pop(ins.argval, NULL))


@handles("STORE_FAST")
def store_fast(tr: Tracer, ins: dis.Instruction) -> None:
    _store_fast(tr, ins.argval)


@handles("LOAD_FAST_LOAD_FAST")
def load_fast_load_fast(tr: Tracer, ins: dis.Instruction) -> None:
    first, second = ins.argval
    _load_fast(tr, first)
    _load_fast(tr, second)


@handles("STORE_FAST_LOAD_FAST")
def store_fast_load_fast(tr: Tracer, ins: dis.Instruction) -> None:
    first, second = ins.argval
    _store_fast(tr, first)
    _load_fast(tr, second)


@handles("STORE_FAST_STORE_FAST")
def store_fast_store_fast(tr: Tracer, ins: dis.Instruction) -> None:
    first, second = ins.argval
    _store_fast(tr, first)
    _store_fast(tr, second)


@handles("DELETE_FAST")
def delete_fast(tr: Tracer, ins: dis.Instruction) -> None:
    tr.locals.pop(ins.argval, None)


@handles("LOAD_GLOBAL")
def load_global(tr: Tracer, ins: dis.Instruction) -> None:
    _push_callable(tr, tr.load_global(ins.argval), bool(ins.arg is not None and ins.arg & 1))


@handles("STORE_GLOBAL")
def store_global(tr: Tracer, ins: dis.Instruction) -> None:
    """Recorded, seen by later loads, and made by the emitted code after the graph."""
    tr.out.side_effects.store_global(tr.f_globals, ins.argval, tr.pop())


@handles("DELETE_GLOBAL")
def delete_global(tr: Tracer, ins: dis.Instruction) -> None:
    raise unsupported("side_effect", f"deleting the global {ins.argval!r}")


@handles("MAKE_CELL")
def make_cell(tr: Tracer, ins: dis.Instruction) -> None:
    tr.cells[ins.argval] = CellValue(contents=tr.locals.pop(ins.argval, None))


@handles("COPY_FREE_VARS")
def copy_free_vars(tr: Tracer, ins: dis.Instruction) -> None:
    """Free variables' cells were bound when the call was set up."""


@handles("LOAD_CLOSURE")
def load_closure(tr: Tracer, ins: dis.Instruction) -> None:
    cell = tr.cells.get(ins.argval)
    if cell is None:
        cell = tr.cells[ins.argval] = CellValue()
    tr.push(cell)


@handles("LOAD_DEREF")
def load_deref(tr: Tracer, ins: dis.Instruction) -> None:
    cell = tr.cells.get(ins.argval)
    if cell is None:
        raise unsupported("user_exception", f"NameError: free variable {ins.argval!r}")
    tr.push(tr.load_cell(cell))


@handles("STORE_DEREF")
def store_deref(tr: Tracer, ins: dis.Instruction) -> None:
    value = tr.pop()
    cell = tr.cells.get(ins.argval)
    if cell is None:
        cell = tr.cells[ins.argval] = CellValue()
    if cell.real is not None:
        tr.out.side_effects.store_cell(cell.real, value)
    cell.contents = value


@handles("DELETE_DEREF")
def delete_deref(tr: Tracer, ins: dis.Instruction) -> None:
    cell = tr.cells.get(ins.argval)
    if cell is None or cell.real is not None:
        raise unsupported("side_effect", f"deleting the closure variable {ins.argval!r}")
    cell.contents = None


@handles("LOAD_ATTR", "LOAD_METHOD")
def load_attr(tr: Tracer, ins: dis.Instruction) -> None:
    obj = tr.pop()
    method_form = ins.opname == "LOAD_METHOD" or (
        ins.opname in VERSION.name_flag_bits and ins.arg is not None and ins.arg & 1
    )
    _push_callable(tr, dispatch.get_attr(tr, obj, ins.argval), bool(method_form))


@handles("LOAD_SUPER_ATTR")
def load_super_attr(tr: Tracer, ins: dis.Instruction) -> None:
    self_v = tr.pop()
    cls_v = tr.pop()
    tr.pop()  # the global super
    if not isinstance(cls_v, ObjectValue) or not isinstance(cls_v.obj, type):
        raise unsupported("unsupported_call", "super() with an unknown class")
    value = dispatch.get_attr(tr, SuperValue(cls_v.obj, self_v), ins.argval)
    _push_callable(tr, value, bool(ins.arg is not None and ins.arg & 1))


@handles("STORE_ATTR")
def store_attr(tr: Tracer, ins: dis.Instruction) -> None:
    obj = tr.pop()
    value = tr.pop()
    dispatch.set_attr(tr, obj, ins.argval, value)


@handles("DELETE_ATTR")
def delete_attr(tr: Tracer, ins: dis.Instruction) -> None:
    dispatch.delete_attr(tr, tr.pop(), ins.argval)


@handles("BINARY_SUBSCR")
def binary_subscr(tr: Tracer, ins: dis.Instruction) -> None:
    index = tr.pop()
    container = tr.pop()
    tr.push(dispatch.get_item(tr, container, index))


@handles("STORE_SUBSCR")
def store_subscr(tr: Tracer, ins: dis.Instruction) -> None:
    index = tr.pop()
    container = tr.pop()
    value = tr.pop()
    dispatch.set_item(tr, container, index, value)


@handles("DELETE_SUBSCR")
def delete_subscr(tr: Tracer, ins: dis.Instruction) -> None:
    index = tr.pop()
    container = tr.pop()
    dispatch.delete_item(tr, container, index)


def _slice(tr: Tracer) -> ConstantValue:
    end = tr.pop()
    start = tr.pop()
    if not (isinstance(start, ConstantValue) and isinstance(end, ConstantValue)):
        return ConstantValue(slice(start.as_constant(), end.as_constant()))
    return slice_value([start, end])


@handles("BINARY_SLICE")
def binary_slice(tr: Tracer, ins: dis.Instruction) -> None:
    index = _slice(tr)
    container = tr.pop()
    tr.push(dispatch.get_item(tr, container, index))


@handles("STORE_SLICE")
def store_slice(tr: Tracer, ins: dis.Instruction) -> None:
    index = _slice(tr)
    container = tr.pop()
    value = tr.pop()
    dispatch.set_item(tr, container, index, value)
