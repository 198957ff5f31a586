"""Attention masks over symbolic sizes: each element's value as an expression of its position.

With symbolic sizes a mask built from ``arange`` cannot be evaluated once and dropped (see
``attention_masks``): its size changes from call to call. Its values follow a rule that does
not, though: HuggingFace's bidirectional mask is ``q_idx >= 0`` over ``arange(L)`` and its
causal one ``kv_idx <= q_idx``. So the mask's nodes are evaluated here on expressions instead
of tensors: an element's value as a sympy expression of its position, one nonnegative integer
symbol per dimension counted from the right (``p0`` the last), the way broadcasting aligns
them. ``arange(n)`` is ``p0``; indexing with ``None`` moves a dimension's symbol; a
comparison of two such values is a relation between positions. A mask whose expression is
``True`` for every position passes everything; one that is ``p0 <= p1`` over a square
(L, L) is causal. A dimension of size 1 is read at position 0 whatever the position it is
broadcast to, so its symbol becomes 0; any other size must be the result's at that
dimension (capture's guards decided it), or the mask is left alone. Any op not handled here
leaves the mask alone too: the verdict is a proof for every size, never a sample.
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Callable
from typing import Any

import sympy
import torch
from sympy.core.relational import Relational
from sympy.logic.boolalg import BooleanAtom, BooleanFunction
from torch import fx

from kiln.capture.shapes import expr_of

__all__ = ["symbolic_mask_verdict"]

log = logging.getLogger("kiln.loopir")

_MAX_NODES = 64
_POSITIONS = tuple(sympy.Symbol(f"p{r}", integer=True, nonnegative=True) for r in range(8))
_COMPARISONS: dict[Any, Callable[[Any, Any], Any]] = {
    operator.ge: sympy.Ge, operator.gt: sympy.Gt, operator.le: sympy.Le,
    operator.lt: sympy.Lt, operator.eq: sympy.Eq, operator.ne: sympy.Ne,
    torch.ge: sympy.Ge, torch.gt: sympy.Gt, torch.le: sympy.Le,
    torch.lt: sympy.Lt, torch.eq: sympy.Eq, torch.ne: sympy.Ne,
    "ge": sympy.Ge, "gt": sympy.Gt, "le": sympy.Le, "lt": sympy.Lt, "eq": sympy.Eq, "ne": sympy.Ne,
}  # fmt: skip
_LOGICAL: dict[Any, Callable[..., Any]] = {
    operator.and_: sympy.And, operator.or_: sympy.Or, torch.logical_and: sympy.And,
    torch.logical_or: sympy.Or, "logical_and": sympy.And, "logical_or": sympy.Or,
    "__and__": sympy.And, "__or__": sympy.Or,
}  # fmt: skip
_ARITHMETIC: dict[Any, Callable[[Any, Any], Any]] = {
    operator.add: operator.add, operator.sub: operator.sub, operator.mul: operator.mul,
    torch.add: operator.add, torch.sub: operator.sub, torch.mul: operator.mul,
    "add": operator.add, "sub": operator.sub, "mul": operator.mul,
}  # fmt: skip
_NOT = (operator.invert, torch.logical_not, "logical_not", "__invert__")
_SIZE_OPS = (torch.ops.aten.sym_size.int, torch.ops.aten.sym_numel.default)


class _Refused(Exception):
    pass


class _Size:
    """A size read off a tensor: only ever an extent (``arange``'s end, ``expand``'s sizes)."""


class _Value:
    """A tensor's elements as ``expr`` of their positions, with the tensor's sizes."""

    def __init__(self, expr: Any, sizes: tuple[sympy.Expr, ...]) -> None:
        if len(sizes) > len(_POSITIONS):
            raise _Refused
        # a dimension of size 1 is read at position 0 wherever it is broadcast
        ones = {_POSITIONS[r]: 0 for r, n in enumerate(reversed(sizes)) if n == 1}
        self.expr = sympy.sympify(expr).xreplace(ones) if ones else sympy.sympify(expr)
        self.sizes = sizes


def _sizes_of(node: fx.Node) -> tuple[sympy.Expr, ...]:
    traced = node.meta.get("val")
    if not isinstance(traced, torch.Tensor):
        raise _Refused
    return tuple(sympy.sympify(expr_of(n)) for n in traced.shape)


def _operand(a: Any, sizes: tuple[sympy.Expr, ...]) -> Any:
    """``a``'s expression read at the positions of a result of ``sizes``."""
    if isinstance(a, _Value):
        if len(a.sizes) > len(sizes):
            raise _Refused
        for r, n in enumerate(reversed(a.sizes)):
            if n != 1 and n != sizes[len(sizes) - 1 - r]:
                raise _Refused  # a size capture did not prove equal to the result's
        return a.expr
    if isinstance(a, (bool, int)):
        return sympy.true if a is True else sympy.false if a is False else sympy.Integer(a)
    raise _Refused


def _moved(value: _Value, index: tuple[Any, ...], sizes: tuple[sympy.Expr, ...]) -> _Value:
    """``value[index]`` for an index of ``None`` and whole slices only."""
    kept = [i for i, item in enumerate(index) if item == slice(None)]
    if len(kept) != len(value.sizes) or any(
        item is not None and item != slice(None) for item in index
    ):
        raise _Refused
    rank_in, rank_out = len(value.sizes), len(index)
    moves = {
        _POSITIONS[rank_in - 1 - k]: _POSITIONS[rank_out - 1 - at] for k, at in enumerate(kept)
    }
    return _Value(value.expr.xreplace(moves), sizes)


class _Evaluator:
    def __init__(self) -> None:
        self.memo: dict[fx.Node, Any] = {}

    def __call__(self, node: Any) -> Any:
        if not isinstance(node, fx.Node):
            return node
        if node not in self.memo:
            if len(self.memo) >= _MAX_NODES:
                raise _Refused
            self.memo[node] = self._evaluate(node)
        return self.memo[node]

    def _evaluate(self, node: fx.Node) -> Any:
        traced = node.meta.get("val")
        if isinstance(traced, (int, torch.SymInt)) and (
            node.op == "placeholder" or node.target in _SIZE_OPS
        ):
            return _Size()
        if node.op not in ("call_function", "call_method"):
            raise _Refused
        target = node.target
        if target is torch.arange:
            return self._arange(node)
        args = [self(a) for a in node.args]
        if any(isinstance(v, fx.Node) for v in node.kwargs.values()):
            raise _Refused
        sizes = _sizes_of(node)
        if target in _COMPARISONS or target in _ARITHMETIC:
            if len(args) != 2 or node.kwargs:
                raise _Refused
            a, b = (_operand(x, sizes) for x in args)
            if _is_boolean(a) or _is_boolean(b):
                raise _Refused  # arithmetic or order on booleans: not modelled
            combine = _COMPARISONS.get(target) or _ARITHMETIC[target]
            return _Value(combine(a, b), sizes)
        if target in _LOGICAL:
            if node.kwargs:
                raise _Refused
            return _Value(_LOGICAL[target](*(_boolean(_operand(x, sizes)) for x in args)), sizes)
        if target in _NOT:
            return _Value(sympy.Not(_boolean(_operand(args[0], sizes))), sizes)
        if target is operator.getitem and isinstance(args[0], _Value):
            index = args[1] if isinstance(args[1], tuple) else (args[1],)
            return _moved(args[0], index, sizes)
        if target in ("unsqueeze", torch.unsqueeze) and isinstance(args[0], _Value):
            dim = args[1] if len(args) > 1 else node.kwargs.get("dim")
            if not isinstance(dim, int):
                raise _Refused
            dim = dim % (len(args[0].sizes) + 1)
            items: list[Any] = [slice(None)] * len(args[0].sizes)
            items.insert(dim, None)
            return _moved(args[0], tuple(items), sizes)
        if target in ("expand", "expand_as", "contiguous") and isinstance(args[0], _Value):
            return _Value(_operand(args[0], sizes), sizes)
        if target in ("to", "bool") and isinstance(args[0], _Value):
            return self._converted(node, args[0], sizes)
        if target in (torch.ones, torch.zeros, torch.ones_like, torch.zeros_like):
            one = target in (torch.ones, torch.ones_like)
            return _Value(self._filled(node, 1 if one else 0), sizes)
        raise _Refused

    def _arange(self, node: fx.Node) -> _Value:
        args = [self(a) for a in node.args]
        if set(node.kwargs) - {"device", "dtype"} or node.kwargs.get("dtype") not in (
            None,
            torch.int64,
            torch.int32,
        ):
            raise _Refused
        start, step = (0, 1) if len(args) == 1 else (args[0], args[2] if len(args) > 2 else 1)
        if not (isinstance(start, int) and isinstance(step, int)) or len(args) > 3:
            raise _Refused
        if not all(isinstance(a, (int, _Size)) for a in args):
            raise _Refused
        return _Value(start + step * _POSITIONS[0], _sizes_of(node))

    def _converted(self, node: fx.Node, value: _Value, sizes: tuple[sympy.Expr, ...]) -> _Value:
        traced = node.meta.get("val")
        source = node.args[0].meta.get("val") if isinstance(node.args[0], fx.Node) else None
        if not (isinstance(traced, torch.Tensor) and isinstance(source, torch.Tensor)):
            raise _Refused
        if traced.dtype == source.dtype:
            return _Value(value.expr, sizes)  # a device move
        if traced.dtype == torch.bool and not _is_boolean(value.expr):
            return _Value(sympy.Ne(value.expr, 0), sizes)
        raise _Refused

    def _filled(self, node: fx.Node, fill: int) -> Any:
        traced = node.meta.get("val")
        if not isinstance(traced, torch.Tensor):
            raise _Refused
        if traced.dtype == torch.bool:
            return sympy.true if fill else sympy.false
        return sympy.Integer(fill)


def _is_boolean(expr: Any) -> bool:
    """Whether ``expr`` is a truth value (a sympy ``Symbol`` is a ``Boolean`` too: not one)."""
    return isinstance(expr, (BooleanAtom, BooleanFunction, Relational))


def _boolean(expr: Any) -> Any:
    if not _is_boolean(expr):
        raise _Refused
    return expr


def _causal(expr: Any) -> bool:
    """Whether ``expr`` is ``p0 <= p1``: the key's position at most the query's."""
    lhs, rhs = getattr(expr, "lhs", None), getattr(expr, "rhs", None)
    if lhs is None or rhs is None:
        return False
    gap = {
        sympy.LessThan: lhs - rhs,
        sympy.GreaterThan: rhs - lhs,
        sympy.StrictLessThan: lhs - rhs + 1,
        sympy.StrictGreaterThan: rhs - lhs + 1,
    }.get(type(expr))
    return gap is not None and sympy.expand(gap - (_POSITIONS[0] - _POSITIONS[1])) == 0


def symbolic_mask_verdict(mask: Any) -> tuple[str, list[fx.Node]] | None:
    """``("pass", nodes)`` for a mask that passes every element at every size, ``("causal",
    nodes)`` for a square causal one (``nodes``: those that computed it), else None."""
    if not isinstance(mask, fx.Node):
        return None
    traced = mask.meta.get("val")
    if not isinstance(traced, torch.Tensor):
        return None
    evaluate = _Evaluator()
    try:
        value = evaluate(mask)
    except _Refused:
        return None
    except Exception as exc:  # an expression sympy cannot build: leave the mask as it is
        log.debug("attention mask %s not judged by rule: %s", mask.name, exc)
        return None
    if not isinstance(value, _Value):
        return None
    computed = [n for n in evaluate.memo if n.op != "placeholder"]
    expr = value.expr
    if traced.dtype == torch.bool:
        if expr is sympy.true:
            return "pass", computed
        square = len(value.sizes) >= 2 and value.sizes[-1] == value.sizes[-2] != 1
        return ("causal", computed) if square and _causal(expr) else None
    if traced.is_floating_point() and expr == 0:
        return "pass", computed
    return None
