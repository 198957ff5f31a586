"""Shape expressions as fx nodes: how a graph computes ``s0 * 4`` from its own inputs.

A graph traced with symbolic sizes passes sizes to ops (``view(x, [s0 * 4, s1])``); in the
graph those arguments must be values the graph computes, not sympy objects. Every symbol is a
size (or stride) of some tensor the graph takes, so a symbol becomes ``aten.sym_size.int``
of that input (``leaf`` says which node), and an expression the operator nodes over those
(``operator.mul``, ``operator.floordiv``, ...). The graph then needs no extra inputs: it reads
its sizes from the tensors it is called with, whichever sizes they have.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import sympy
import torch

from kiln.capture.shapes.exprs import FloorDiv, Mod

__all__ = ["CannotMaterialize", "Materializer", "WithDivision"]


class CannotMaterialize(Exception):
    """An expression with no node form here (the caller specializes the value instead)."""


Leaf = Callable[[sympy.Symbol], Any]
Create = Callable[[Any, tuple[Any, ...], sympy.Expr], Any]

_RELATIONS: dict[Any, Any] = {
    sympy.Eq: operator.eq,
    sympy.Ne: operator.ne,
    sympy.Lt: operator.lt,
    sympy.Le: operator.le,
    sympy.Gt: operator.gt,
    sympy.Ge: operator.ge,
}


class Materializer:
    """Builds (and remembers) the nodes of shape expressions in one graph.

    ``leaf(symbol)`` gives the node reading a symbol; ``create(target, args, expr)`` adds a
    ``call_function`` node computing ``expr`` (its ``meta["val"]`` is the caller's business).
    """

    def __init__(self, leaf: Leaf, create: Create) -> None:
        self.leaf = leaf
        self.create = create
        self._memo: dict[sympy.Basic, Any] = {}

    def __call__(self, expr: sympy.Basic) -> Any:
        """A node (or a Python number) that computes ``expr``."""
        if expr.is_Integer:
            return int(expr)
        if expr.is_Float:
            return float(expr)
        if expr is sympy.true or expr is sympy.false:
            return bool(expr)
        found = self._memo.get(expr)
        # a node a rollback of the trace erased since is built again
        if found is None or getattr(found, "_erased", False):
            found = self._memo[expr] = self._build(expr)
        return found

    def _node(self, target: Any, args: tuple[Any, ...], expr: sympy.Basic) -> Any:
        return self.create(target, args, expr)

    def _fold(self, op: Any, terms: list[sympy.Basic], expr: sympy.Basic) -> Any:
        # numbers last, so ``s0 * 4`` reads as it was written (and a node is never a constant)
        terms = sorted(terms, key=lambda t: t.is_Number)
        acc_expr = terms[0]
        acc = self(acc_expr)
        for t in terms[1:]:
            acc_expr = acc_expr + t if op is operator.add else acc_expr * t
            acc = self._node(op, (acc, self(t)), acc_expr if t is not terms[-1] else expr)
        return acc

    def _build(self, expr: sympy.Basic) -> Any:
        if isinstance(expr, sympy.Symbol):
            return self.leaf(expr)
        if isinstance(expr, sympy.Add):
            return self._fold(operator.add, list(expr.args), expr)
        if isinstance(expr, sympy.Mul):
            if any(a.is_Rational and not a.is_Integer for a in expr.args):
                raise CannotMaterialize(str(expr))
            return self._fold(operator.mul, list(expr.args), expr)
        if isinstance(expr, FloorDiv):
            a, b = expr.args
            return self._node(operator.floordiv, (self(a), self(b)), expr)
        if isinstance(expr, Mod):
            a, b = expr.args
            return self._node(operator.mod, (self(a), self(b)), expr)
        if isinstance(expr, sympy.Pow) and expr.exp.is_Integer and int(expr.exp) >= 0:
            return self._node(operator.pow, (self(expr.base), int(expr.exp)), expr)
        if isinstance(expr, sympy.Abs):
            return self._node(operator.abs, (self(expr.args[0]),), expr)
        if isinstance(expr, (sympy.Max, sympy.Min)):
            fn = torch.sym_max if isinstance(expr, sympy.Max) else torch.sym_min
            return self._fold_minmax(fn, list(expr.args), expr)
        for cls, op in _RELATIONS.items():
            if isinstance(expr, cls):
                lhs, rhs = expr.args
                return self._node(op, (self(lhs), self(rhs)), expr)
        raise CannotMaterialize(str(expr))

    def _fold_minmax(self, fn: Any, terms: list[sympy.Basic], expr: sympy.Basic) -> Any:
        acc = self(terms[0])
        for t in terms[1:]:
            acc = self._node(fn, (acc, self(t)), expr)
        return acc


class WithDivision(Materializer):
    """A ``Materializer`` with true division and fractional powers too: float factors over
    sizes (batch norm's unbiased ``n / (n - 1)``, attention's ``d ** 0.5``) and numbers
    computed from data that a graph returns (``correct / total``). Sizes passed to ops keep
    the plain form: such a factor there is a constant under a guard."""

    def _build(self, expr: sympy.Basic) -> Any:
        if isinstance(expr, sympy.logic.boolalg.Boolean):  # a runtime assert's relation
            return super()._build(expr)
        num, den = sympy.fraction(expr)
        if den != 1 and not expr.is_integer:
            return self._node(operator.truediv, (self(num), self(den)), expr)
        if isinstance(expr, sympy.Pow) and expr.exp.is_Number and not expr.is_integer:
            whole = float(expr.exp)
            if whole.is_integer() and 1 <= abs(whole) <= 4:
                return self._whole_power(expr.base, int(whole), expr)
        if isinstance(expr, sympy.Pow) and not expr.exp.is_Integer and expr.exp.is_Number:
            return self._node(operator.pow, (self(expr.base), float(expr.exp)), expr)
        if isinstance(expr, sympy.Pow) and not expr.is_integer:  # ``2 ** s`` of a float s
            return self._node(operator.pow, (self(expr.base), self(expr.exp)), expr)
        return super()._build(expr)

    def _whole_power(self, base: sympy.Expr, n: int, expr: sympy.Basic) -> Any:
        """``s ** 2`` of a float as products (``1 / ...`` for a negative power): Python's
        result for any sign of ``s``, where torch's ``SymFloat.__pow__`` checks ``s >= 0``
        when a graph runs on symbolic values."""
        factor = self(base)
        acc = factor
        for _ in range(abs(n) - 1):
            acc = self._node(operator.mul, (acc, factor), expr)
        return acc if n > 0 else self._node(operator.truediv, (1.0, acc), expr)
