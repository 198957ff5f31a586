"""Operators on symbolic numbers (``x.shape[1] * 4``, ``s // h > 16``, ``-n``, ``if n:``).

Each runs on the ``SymInt``/``SymFloat``/``SymBool`` itself, so the result is another symbolic
number of the capture's shape environment (no graph node: one is built where a torch op takes
the value, ``OutputGraph.sym_arg``), and a branch on one records a guard on the relation, not
on the value. An operand that is not a number (a list repeated ``n`` times, a string) is left
to the other operand's kind, which reads the plain value and so specializes it.
"""

from __future__ import annotations

import operator
from typing import TYPE_CHECKING, Any

import torch

from kiln.capture import dispatch
from kiln.capture.breaks.reasons import raised
from kiln.capture.values.base import ConstantValue, Value, is_constant
from kiln.capture.values.symbolic import SymValue, is_symbolic

if TYPE_CHECKING:
    from kiln.capture.tracer import Tracer

__all__ = ["number_value"]

_NUMBER = (int, float, bool)


def number_value(result: Any) -> Value:
    """A tracked value for the result of an operation on symbolic numbers."""
    if is_symbolic(result):
        return SymValue(result)
    if is_constant(result):
        return ConstantValue(result)
    raise TypeError(f"an operation on sizes gave a {type(result).__name__}")


def _operand(v: Value) -> Any:
    """The number an operand stands for (symbolic kept), or None for other values."""
    if isinstance(v, SymValue):
        return v.sym
    if isinstance(v, ConstantValue) and type(v.value) in _NUMBER:
        return v.value
    return None


@dispatch.BINARY_OP.register(SymValue, priority=1)
@dispatch.COMPARE_OP.register(SymValue, priority=1)
def _sym_op(tr: Tracer, sym: str, a: Value, b: Value) -> Value | None:
    left, right = _operand(a), _operand(b)
    if left is None or right is None:
        return None
    if sym in dispatch.BINARY:
        fn = dispatch.BINARY[sym]
        if sym.endswith("=") and sym[:-1] in dispatch.BINARY:  # numbers update by rebinding
            fn = dispatch.BINARY[sym[:-1]]
    elif sym in ("==", "!=", "<", "<=", ">", ">="):
        fn = dispatch.COMPARE[sym]
    else:  # ``is``, ``in``: identity of numbers is the plain value's
        return None
    try:
        if sym in ("**", "**=") and _whole_power_of_float(left, right):
            return number_value(torch.SymFloat(left.node.float_pow(left.node.wrap_float(right))))
        return number_value(fn(left, right))
    except Exception as e:
        raise raised(e) from e


def _whole_power_of_float(base: Any, exponent: Any) -> bool:
    """``s ** 2`` of a symbolic float: Python's result is real for any sign of ``s``, where
    torch's ``SymFloat.__pow__`` checks ``s >= 0`` for every exponent (a negative ``s`` would
    fail that check and run the frame eagerly)."""
    return (
        isinstance(base, torch.SymFloat)
        and type(exponent) in (int, float)
        and float(exponent).is_integer()
    )


@dispatch.TRUTH.register(SymValue)
def _sym_truth(tr: Tracer, v: SymValue) -> bool:
    return bool(v.sym)  # guards on ``expr != 0`` (or the SymBool's relation), not the value


@dispatch.UNARY_OP.register(SymValue)
def _sym_unary(tr: Tracer, name: str, v: SymValue) -> Value:
    try:
        return number_value(getattr(operator, name)(v.sym))
    except Exception as e:
        raise raised(e) from e
