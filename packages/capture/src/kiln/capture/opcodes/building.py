"""Building and unpacking containers: tuples, lists, sets, dicts, slices, comprehensions."""

from __future__ import annotations

import dis
from typing import TYPE_CHECKING

from kiln.capture import container_methods, dispatch
from kiln.capture.breaks.reasons import unsupported
from kiln.capture.opcodes.common import registry
from kiln.capture.values.base import ConstantValue
from kiln.capture.values.containers import DictValue, ListValue, SetValue, TupleValue, dict_key
from kiln.capture.values.symbolic import slice_value

if TYPE_CHECKING:
    from kiln.capture.tracer import Tracer

HANDLERS, handles = registry()


@handles("BUILD_TUPLE")
def build_tuple(tr: Tracer, ins: dis.Instruction) -> None:
    tr.push(TupleValue(tr.popn(ins.arg or 0)))


@handles("BUILD_LIST")
def build_list(tr: Tracer, ins: dis.Instruction) -> None:
    tr.push(ListValue(tr.popn(ins.arg or 0)))


@handles("BUILD_SET")
def build_set(tr: Tracer, ins: dis.Instruction) -> None:
    items = tr.popn(ins.arg or 0)
    tr.push(SetValue({dict_key(x): x for x in items}))


@handles("BUILD_MAP")
def build_map(tr: Tracer, ins: dis.Instruction) -> None:
    flat = tr.popn(2 * (ins.arg or 0))
    d = DictValue({})
    for k, v in zip(flat[::2], flat[1::2], strict=False):
        d.set(k, v)
    tr.push(d)


@handles("BUILD_CONST_KEY_MAP")
def build_const_key_map(tr: Tracer, ins: dis.Instruction) -> None:
    keys = tr.pop().as_constant()
    values = tr.popn(ins.arg or 0)
    tr.push(DictValue({k: (ConstantValue(k), v) for k, v in zip(keys, values, strict=False)}))


@handles("BUILD_SLICE")
def build_slice(tr: Tracer, ins: dis.Instruction) -> None:
    parts = tr.popn(ins.arg or 2)
    if not all(isinstance(p, ConstantValue) for p in parts):
        raise unsupported("unsupported_value", "a slice bound that is not a constant")
    tr.push(slice_value(parts))  # type: ignore[arg-type]


@handles("LIST_APPEND")
def list_append(tr: Tracer, ins: dis.Instruction) -> None:
    v = tr.pop()
    target = tr.peek(ins.arg or 1)
    assert isinstance(target, ListValue)
    target.check_mutable()  # a list from the frame (a resume function's argument) is written back
    target.items.append(v)


@handles("SET_ADD")
def set_add(tr: Tracer, ins: dis.Instruction) -> None:
    v = tr.pop()
    target = tr.peek(ins.arg or 1)
    assert isinstance(target, SetValue)
    target.check_mutable()
    target.items[dict_key(v)] = v


@handles("MAP_ADD")
def map_add(tr: Tracer, ins: dis.Instruction) -> None:
    v = tr.pop()
    k = tr.pop()
    target = tr.peek(ins.arg or 1)
    assert isinstance(target, DictValue)
    target.set(k, v)


@handles("LIST_EXTEND")
def list_extend(tr: Tracer, ins: dis.Instruction) -> None:
    items = dispatch.unpack_iterable(tr, tr.pop())
    target = tr.peek(ins.arg or 1)
    assert isinstance(target, ListValue)
    target.check_mutable()
    target.items.extend(items)


@handles("SET_UPDATE")
def set_update(tr: Tracer, ins: dis.Instruction) -> None:
    items = dispatch.unpack_iterable(tr, tr.pop())
    target = tr.peek(ins.arg or 1)
    assert isinstance(target, SetValue)
    target.check_mutable()
    for x in items:
        target.items[dict_key(x)] = x


@handles("DICT_UPDATE", "DICT_MERGE")
def dict_update(tr: Tracer, ins: dis.Instruction) -> None:
    update = tr.pop()
    target = tr.peek(ins.arg or 1)
    assert isinstance(target, DictValue)
    if not isinstance(update, DictValue):
        update = container_methods.make_dict(tr, [update], {})
    assert isinstance(update, DictValue)
    if ins.opname == "DICT_MERGE" and set(update.items) & set(target.items):
        raise unsupported("user_exception", "TypeError: got multiple values for a keyword argument")
    target.check_mutable()
    target.items.update(update.items)


@handles("LIST_TO_TUPLE")
def list_to_tuple(tr: Tracer, ins: dis.Instruction) -> None:
    lst = tr.pop()
    assert isinstance(lst, ListValue)
    tr.push(TupleValue(list(lst.items)))


@handles("UNPACK_SEQUENCE")
def unpack_sequence(tr: Tracer, ins: dis.Instruction) -> None:
    items = dispatch.unpack_iterable(tr, tr.pop())
    if len(items) != (ins.arg or 0):
        raise unsupported("user_exception", f"ValueError: expected {ins.arg} values to unpack")
    for item in reversed(items):
        tr.push(item)


@handles("UNPACK_EX")
def unpack_ex(tr: Tracer, ins: dis.Instruction) -> None:
    arg = ins.arg or 0
    before, after = arg & 0xFF, arg >> 8
    items = dispatch.unpack_iterable(tr, tr.pop())
    if len(items) < before + after:
        raise unsupported("user_exception", "ValueError: not enough values to unpack")
    middle = ListValue(items[before : len(items) - after])
    for item in reversed([*items[:before], middle, *items[len(items) - after :]]):
        tr.push(item)
