"""Operators: BINARY_OP, COMPARE_OP, IS_OP, CONTAINS_OP, unary ops, f-strings, GET_LEN."""

from __future__ import annotations

import dis
from typing import TYPE_CHECKING

from kiln.capture import dispatch, literals, operators
from kiln.capture.opcodes.common import registry
from kiln.capture.values.base import ConstantValue

if TYPE_CHECKING:
    from kiln.capture.tracer import Tracer

HANDLERS, handles = registry()


@handles("BINARY_OP")
def binary_op(tr: Tracer, ins: dis.Instruction) -> None:
    b = tr.pop()
    a = tr.pop()
    tr.push(dispatch.binary_op(tr, ins.argrepr, a, b))


@handles("COMPARE_OP")
def compare_op(tr: Tracer, ins: dis.Instruction) -> None:
    b = tr.pop()
    a = tr.pop()
    tr.push(dispatch.compare_op(tr, str(ins.argval), a, b))


@handles("IS_OP")
def is_op(tr: Tracer, ins: dis.Instruction) -> None:
    b = tr.pop()
    a = tr.pop()
    tr.push(ConstantValue(operators.is_op(tr, a, b) != bool(ins.arg)))


@handles("CONTAINS_OP")
def contains_op(tr: Tracer, ins: dis.Instruction) -> None:
    container = tr.pop()
    item = tr.pop()
    tr.push(ConstantValue(dispatch.contains(tr, item, container) != bool(ins.arg)))


@handles("UNARY_NEGATIVE")
def unary_negative(tr: Tracer, ins: dis.Instruction) -> None:
    tr.push(dispatch.unary_op(tr, "neg", tr.pop()))


@handles("UNARY_POSITIVE")
def unary_positive(tr: Tracer, ins: dis.Instruction) -> None:
    tr.push(dispatch.unary_op(tr, "pos", tr.pop()))


@handles("UNARY_INVERT")
def unary_invert(tr: Tracer, ins: dis.Instruction) -> None:
    tr.push(dispatch.unary_op(tr, "invert", tr.pop()))


@handles("UNARY_NOT")
def unary_not(tr: Tracer, ins: dis.Instruction) -> None:
    tr.push(ConstantValue(not dispatch.truth(tr, tr.pop())))


@handles("GET_LEN")
def get_len(tr: Tracer, ins: dis.Instruction) -> None:
    tr.push(ConstantValue(dispatch.length(tr, tr.peek())))


_CONVERSIONS = {0: None, 1: str, 2: repr, 3: ascii}


@handles("FORMAT_VALUE")
def format_value(tr: Tracer, ins: dis.Instruction) -> None:
    flags = ins.arg or 0
    spec = tr.pop().as_constant() if flags & 0x04 else ""
    value = literals.literal(tr.pop())
    convert = _CONVERSIONS[flags & 0x03]
    if convert is not None:
        value = convert(value)
    tr.push(ConstantValue(format(value, spec)))


@handles("CONVERT_VALUE")
def convert_value(tr: Tracer, ins: dis.Instruction) -> None:
    """3.13's f-string conversion (``!s``, ``!r``, ``!a``), before the formatting."""
    convert = _CONVERSIONS[ins.arg or 0]
    value = literals.literal(tr.pop())
    tr.push(ConstantValue(convert(value) if convert is not None else value))


@handles("FORMAT_SIMPLE")
def format_simple(tr: Tracer, ins: dis.Instruction) -> None:
    tr.push(ConstantValue(format(literals.literal(tr.pop()), "")))


@handles("FORMAT_WITH_SPEC")
def format_with_spec(tr: Tracer, ins: dis.Instruction) -> None:
    spec = tr.pop().as_constant()
    tr.push(ConstantValue(format(literals.literal(tr.pop()), spec)))


@handles("BUILD_STRING")
def build_string(tr: Tracer, ins: dis.Instruction) -> None:
    parts = tr.popn(ins.arg or 0)
    tr.push(ConstantValue("".join(str(p.as_constant()) for p in parts)))
