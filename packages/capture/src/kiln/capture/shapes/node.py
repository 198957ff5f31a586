"""``SymNode``: Kiln's implementation of torch's Python SymNode protocol.

``torch.SymInt(node)`` accepts any object with the methods torch's C++ ``PythonSymNodeImpl``
and the Python ``SymInt`` magic methods call by name (``add``, ``int_floordiv``, ``eq``,
``guard_bool``, ``maybe_as_int``, ``is_contiguous``, ...). Each node holds a sympy expression
over a ``ShapeEnv``'s symbols and its hint (the value in the call being compiled), so meta
kernels and decompositions run unchanged on symbolic sizes: arithmetic builds expressions,
and every point where torch needs a concrete answer (``guard_bool``, ``int()``) asks the env,
which answers from the hint and records the guard.

The node has no ``shape_env`` attribute on purpose: torch's helpers
(``guard_or_false``, ``statically_known_true``) then take the path they take for any
foreign SymNode (a plain ``guard_bool``, or "not known statically") instead of calling
into torch's own ShapeEnv.
"""

from __future__ import annotations

import builtins
import math
import operator
import sys
from collections.abc import Callable, Sequence
from typing import Any

import sympy
import torch

from kiln.capture import dynamo_free
from kiln.capture.shapes.env import DataDependentGuard, Scalar, ShapeEnv
from kiln.capture.shapes.exprs import FloorDiv, Mod, Trunc

__all__ = ["SymNode", "wrap"]

ExprFn = Callable[..., Any]


def _result_type(kind: str, a: type, b: type) -> type:
    if kind == "bool":
        return bool
    if kind == "float" or float in (a, b):
        return float
    return int


def _floordiv(a: sympy.Expr, b: sympy.Expr) -> sympy.Expr:
    if a.is_integer and b.is_integer:
        return FloorDiv(a, b)
    return sympy.floor(a / b)


def _mod(a: sympy.Expr, b: sympy.Expr) -> sympy.Expr:
    """Python's ``a % b``: ``Mod`` (an integer) on integers, ``a - b * floor(a / b)`` on
    floats (``3.5 % 2`` is 1.5, and ``Mod`` claims an integer)."""
    if a.is_integer and b.is_integer:
        return Mod(a, b)
    return a - b * sympy.floor(a / b)


def _relation(cls: type) -> ExprFn:
    """``cls(a, b)`` without sympy's own attempt to decide it, which costs more than the
    env's range reasoning that decides it when asked; equal sides and numbers still fold."""

    def build(a: sympy.Expr, b: sympy.Expr) -> sympy.Basic:
        if (a.is_Number and b.is_Number) or a == b:
            return cls(a, b)
        return cls(a, b, evaluate=False)

    return build


def _binary(
    expr_fn: ExprFn, hint_fn: ExprFn, kind: str = ""
) -> Callable[[SymNode, SymNode], SymNode]:
    def method(self: SymNode, other: SymNode) -> SymNode:
        pytype = _result_type(kind, self.pytype, other.pytype)
        hint = _hint_of(pytype, hint_fn, self._hint, other._hint)
        a, b = self.expr, other.expr
        # sympy builds an expression through layers of decorators even where its cache
        # answers: the env keeps each result by operands (``Float(2.0)`` and ``2`` are
        # distinct keys, as sympy compares them unequal)
        key = (expr_fn, a, b)
        built = self.env.built.get(key)
        if built is None:
            built = self.env.built[key] = expr_fn(a, b)
        return SymNode(built, self.env, pytype, hint)

    return method


def _reflexive(cls: type, hint_fn: ExprFn) -> Callable[[SymNode, SymNode], SymNode]:
    """``==``, ``!=``, ``<=``, ``>=``: sympy folds ``u == u`` to True, which a float from
    data that is NaN makes False. Comparing such a float with itself (``v != v``, the NaN
    test) asks the data, so it is refused as a data-dependent decision."""
    compare = _binary(_relation(cls), hint_fn, "bool")

    def method(self: SymNode, other: SymNode) -> SymNode:
        a = self.expr
        if a == other.expr and float in (self.pytype, other.pytype) and a.is_finite is not True:
            raise DataDependentGuard(cls(a, a, evaluate=False))
        if cls in (sympy.Eq, sympy.Ne) and self.pytype is bool and other.expr in (0, 1):
            # ``b == 1`` of a bool is ``b`` (a bool's ``item()`` is ``Eq(u0, 1)``, and a graph
            # that compares it with 1 would nest relations sympy does not fold)
            same = (other.expr == 1) == (cls is sympy.Eq)
            return self if same else self.sym_not()
        return compare(self, other)

    return method


def _min_max(cls: type, hint_fn: ExprFn) -> Callable[[SymNode, SymNode], SymNode]:
    """``min``/``max`` of two sizes: the side that is always the smaller/larger one where the
    ranges (or guards) say which, else sympy's ``Min``/``Max``, whose construction compares
    its arguments at sympy's cost (torch computes every contiguous stride as a product of
    ``max(size, 1)``)."""
    larger = cls is sympy.Max

    def method(self: SymNode, other: SymNode) -> SymNode:
        pytype = _result_type("", self.pytype, other.pytype)
        hints = (self._hint, other._hint)
        hint = None if None in hints else pytype(hint_fn(*hints))
        a, b = self.expr, other.expr
        first = None if a.is_Number and b.is_Number else self.env.static_value(_GE(a, b))
        expr = cls(a, b) if first is None else a if bool(first) == larger else b
        return SymNode(expr, self.env, pytype, hint)

    return method


def _unary(expr_fn: ExprFn, hint_fn: ExprFn, kind: str = "") -> Callable[[SymNode], SymNode]:
    def method(self: SymNode) -> SymNode:
        pytype = _result_type(kind, self.pytype, self.pytype)
        return SymNode(expr_fn(self.expr), self.env, pytype, _hint_of(pytype, hint_fn, self._hint))

    return method


def _hint_of(pytype: type, fn: ExprFn, *hints: Scalar | None) -> Scalar | None:
    """The hint of an operation's result: None when an operand's value comes from data."""
    if any(h is None for h in hints):
        return None
    return pytype(fn(*hints))  # type: ignore[no-any-return]


_GE = _relation(sympy.Ge)

# Dimension orders, innermost first, in which a layout is dense.
_CHANNELS_LAST = {4: (1, 3, 2, 0), 5: (1, 4, 3, 2, 0)}


class SymNode:
    """A symbolic int, float or bool: a sympy expression over ``env``'s symbols and its hint."""

    def __init__(
        self,
        expr: sympy.Basic,
        env: ShapeEnv,
        pytype: type,
        hint: Scalar | None,
        constant: Scalar | None = None,
    ) -> None:
        self._expr = expr
        self.env = env
        self.pytype = pytype
        self._hint = hint
        # a literal's value (torch's magic methods fold operations on constants)
        self.constant = constant

    @property
    def expr(self) -> sympy.Basic:
        """The expression with everything guards have established substituted."""
        return self.env.simplify(self._expr)

    @property
    def hint(self) -> Scalar | None:
        """The value in the call being compiled; None for one computed from tensor data."""
        return self._hint

    # -- what kind of value ----------------------------------------------------------------

    def is_int(self) -> bool:
        return self.pytype is int

    def is_float(self) -> bool:
        return self.pytype is float

    def is_bool(self) -> bool:
        return self.pytype is bool

    def is_nested_int(self) -> bool:
        return False

    def nested_int(self) -> int | None:
        return None

    def is_symbolic(self) -> bool:
        return True

    def is_constant(self) -> bool:
        return self.constant is not None

    def has_hint(self) -> bool:
        return self._hint is not None

    def maybe_as_int(self) -> int | None:
        expr = self.expr
        return int(expr) if expr.is_Integer else None

    def maybe_as_float(self) -> float | None:
        expr = self.expr
        return float(expr) if expr.is_Number else None

    def maybe_as_bool(self) -> bool | None:
        expr = self.expr
        return bool(expr) if expr in (sympy.true, sympy.false) else None

    def constant_int(self) -> int | None:
        return self.maybe_as_int()

    def constant_bool(self) -> bool | None:
        return self.maybe_as_bool()

    # -- literals --------------------------------------------------------------------------

    def wrap_int(self, num: int) -> SymNode:
        return SymNode(sympy.Integer(num), self.env, int, num, constant=num)

    def wrap_float(self, num: float) -> SymNode:
        return SymNode(sympy.Float(num), self.env, float, num, constant=num)

    def wrap_bool(self, num: bool) -> SymNode:
        return SymNode(sympy.true if num else sympy.false, self.env, bool, num, constant=num)

    def clone(self) -> SymNode:
        return self

    # -- arithmetic and comparisons (torch calls both the short and the typed names) -------

    add = _binary(operator.add, operator.add)
    sub = _binary(operator.sub, operator.sub)
    mul = _binary(operator.mul, operator.mul)
    mod = _binary(_mod, operator.mod)
    floordiv = _binary(_floordiv, operator.floordiv)
    int_floordiv = floordiv
    truediv = _binary(operator.truediv, operator.truediv, "float")
    int_truediv = truediv
    float_truediv = truediv
    pow = _binary(operator.pow, operator.pow)
    pow_by_natural = pow
    float_pow = _binary(operator.pow, operator.pow, "float")
    sym_min = _min_max(sympy.Min, min)
    sym_max = _min_max(sympy.Max, max)
    eq = _reflexive(sympy.Eq, operator.eq)
    ne = _reflexive(sympy.Ne, operator.ne)
    lt = _binary(_relation(sympy.Lt), operator.lt, "bool")
    le = _reflexive(sympy.Le, operator.le)
    gt = _binary(_relation(sympy.Gt), operator.gt, "bool")
    ge = _reflexive(sympy.Ge, operator.ge)
    sym_and = _binary(sympy.And, operator.and_, "bool")
    sym_or = _binary(sympy.Or, operator.or_, "bool")

    neg = _unary(operator.neg, operator.neg)
    pos = _unary(operator.pos, operator.pos)
    abs = _unary(sympy.Abs, abs)
    sym_not = _unary(sympy.Not, operator.not_, "bool")
    sym_float = _unary(lambda e: e, float, "float")
    ceil = _unary(sympy.ceiling, math.ceil)
    floor = _unary(sympy.floor, math.floor)

    def sym_int(self) -> SymNode:
        return SymNode(Trunc(self.expr), self.env, int, _hint_of(int, int, self._hint))

    trunc = sym_int

    def sym_ite(self, then_val: SymNode, else_val: SymNode) -> SymNode:
        expr = sympy.Piecewise((then_val.expr, self.expr), (else_val.expr, True))
        hint = None if self._hint is None else then_val._hint if self._hint else else_val._hint
        return SymNode(expr, self.env, then_val.pytype, hint)

    def sym_sum(self, args: Sequence[SymNode]) -> SymNode:
        pytype = float if any(a.pytype is float for a in args) else int
        hint = _hint_of(pytype, lambda *h: sum(h), *[a._hint for a in args])
        return SymNode(sympy.Add(*[a.expr for a in args]), self.env, pytype, hint)

    # -- layout questions C++ asks of symbolic sizes and strides ----------------------------

    def _dense_in(
        self, sizes: Sequence[SymNode], strides: Sequence[SymNode], order: Sequence[int]
    ) -> SymNode:
        """Whether the layout is dense with ``order``'s dims innermost first (size-1 dims may
        have any stride; a tensor with a zero size is dense in every order)."""
        expected: sympy.Expr = sympy.Integer(1)
        terms = []
        for d in order:
            size, stride = sizes[d].expr, strides[d].expr
            terms.append(sympy.Or(sympy.Eq(size, 1), sympy.Eq(stride, expected)))
            expected = expected * size
        expr = sympy.Or(sympy.And(*terms), *[sympy.Eq(s.expr, 0) for s in sizes])
        hint = self.env.hint_or_none(expr)
        return SymNode(expr, self.env, bool, None if hint is None else bool(hint))

    def is_contiguous(self, sizes: Sequence[SymNode], strides: Sequence[SymNode]) -> SymNode:
        return self._dense_in(sizes, strides, range(len(sizes) - 1, -1, -1))

    def _channels_last(self, sizes: Sequence[SymNode], strides: Sequence[SymNode]) -> SymNode:
        order = _CHANNELS_LAST.get(len(sizes))
        if order is None:
            return self.wrap_bool(False)
        return self._dense_in(sizes, strides, order)

    is_channels_last_contiguous_2d = _channels_last
    is_channels_last_contiguous_3d = _channels_last
    is_channels_last_strides_2d = _channels_last
    is_channels_last_strides_3d = _channels_last

    def is_non_overlapping_and_dense(
        self, sizes: Sequence[SymNode], strides: Sequence[SymNode]
    ) -> SymNode:
        # the order the strides have in this call; the guard on the answer keeps it sound
        order = sorted(
            range(len(sizes)), key=lambda d: (_or_max(strides[d]._hint), _or_max(sizes[d]._hint))
        )
        return self._dense_in(sizes, strides, order)

    def is_non_overlapping_and_dense_indicator(
        self, sizes: Sequence[SymNode], strides: Sequence[SymNode]
    ) -> SymNode:
        dense = self.is_non_overlapping_and_dense(sizes, strides)
        expr = sympy.Piecewise((1, dense.expr), (0, True))
        return SymNode(expr, self.env, int, _hint_of(int, int, dense._hint))

    # -- decisions: each answers from the hint and records a guard -------------------------

    def _decide(self, file: str, line: int) -> Scalar:
        expr = self.expr
        known = self.env.static_value(expr)
        if known is not None:
            return known
        origin = self._origin(file, line)
        return self.env.evaluate_expr(expr, self._hint, origin)

    def _origin(self, file: str, line: int) -> str:
        # torch's own lines (its Python or C++ sources) say less than the user's line does
        inside_torch = not file or "/torch/" in file or "/pytorch/" in file
        if self.env.user_line is not None:  # a tracer knows the traced program's line
            return self.env.user_line()
        return _user_line() if inside_torch else f"{file}:{line}"

    def guard_bool(self, file: str, line: int) -> bool:
        if self.env.is_unbacked(self.expr) and self.env.static_value(self.expr) is None:
            fallback = _guard_or_default()
            if fallback is not None:
                return fallback
        return bool(self._decide(file, line))

    def guard_int(self, file: str, line: int) -> int:
        return int(self._decide(file, line))

    def guard_float(self, file: str, line: int) -> float:
        return float(self._decide(file, line))

    # A backed symbol has a hint, so the size-oblivious and fallible forms decide as
    # guard_bool does; over unbacked symbols they answer what torch's own ShapeEnv answers.

    def guard_or_false(self, file: str, line: int) -> bool:
        return self._fallible(file, line, False)

    def guard_or_true(self, file: str, line: int) -> bool:
        return self._fallible(file, line, True)

    def _fallible(self, file: str, line: int, otherwise: bool) -> bool:
        if self.env.is_unbacked(self.expr):
            known = self.env.static_value(self.expr)
            return otherwise if known is None else bool(known)
        return self.guard_bool(file, line)

    def guard_size_oblivious(self, file: str, line: int) -> bool:
        if self.env.is_unbacked(self.expr):
            known = self.env.size_oblivious_value(self.expr)
            if known is not None:
                return bool(known)
        return self.guard_bool(file, line)

    def expect_true(self, file: str, line: int) -> bool:
        """True, where the data decides it: assumed, and checked when the graph runs."""
        expr = self.expr
        if self.env.is_unbacked(expr) and self.env.static_value(expr) is None:
            self.env.defer(expr, self._origin(file, line))
            return True
        return self.guard_bool(file, line)

    def expect_size(self, file: str, line: int) -> bool:
        return self.ge(self.wrap_int(0)).expect_true(file, line)

    def statically_known_true(self, file: str, line: int) -> bool:
        return self.env.static_value(self.expr) is True

    def bool_(self) -> bool:
        return self.guard_bool("", 0)

    def int_(self) -> int:
        return self.guard_int("", 0)

    def evaluate(self, size_oblivious: bool = False) -> Scalar:
        return self._decide("", 0)

    # -- printing --------------------------------------------------------------------------

    def str(self) -> builtins.str:
        return f"{self.expr}"

    def _graph_repr(self) -> builtins.str:
        return self.str()

    def __str__(self) -> builtins.str:
        return self.str()

    def __repr__(self) -> builtins.str:
        return f"SymNode({self.expr}, {self.pytype.__name__}, hint={self._hint})"


def _or_max(hint: Scalar | None) -> float:
    return math.inf if hint is None else hint


def wrap(node: SymNode) -> torch.SymInt | torch.SymFloat | torch.SymBool | Scalar:
    """The torch value for ``node``: a Python scalar when its expression is a number."""
    expr = node.expr
    if expr.is_Number or expr in (sympy.true, sympy.false):
        if node._hint is None:  # a data-dependent value its range pins
            return node.pytype(expr)  # type: ignore[no-any-return]
        return node.pytype(node._hint)  # type: ignore[no-any-return]
    if node.pytype is int:
        return torch.SymInt(node)  # type: ignore[arg-type]  # torch accepts any SymNode-like
    if node.pytype is float:
        return torch.SymFloat(node)  # type: ignore[arg-type]
    return torch.SymBool(node)  # type: ignore[arg-type]


def _guard_or_default() -> bool | None:
    """The answer torch's ``guard_or_false``/``guard_or_true`` asked for where they called
    ``guard_bool`` (their path for a SymNode without torch's own ShapeEnv), or None."""
    frame = sys._getframe(2)
    for _ in range(3):
        if frame is None:
            return None
        if frame.f_code.co_name == "_guard_or" and "/torch/" in frame.f_code.co_filename:
            default = frame.f_locals.get("default")
            return default if isinstance(default, bool) else None
        frame = frame.f_back  # type: ignore[assignment]
    return None


#: the file of the stand-in that runs torch's kernels while TorchDynamo is not imported
_SPARED = dynamo_free.__file__


def _user_line() -> str:
    """``file:line`` of the innermost frame outside torch and this package: the user's code
    (or capture's trace of it) whose question added a guard."""
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_code.co_filename
        if "/torch/" not in name and "/kiln/capture/shapes/" not in name and name != _SPARED:
            return f"{name}:{frame.f_lineno}"
        frame = frame.f_back  # type: ignore[assignment]
    return ""
