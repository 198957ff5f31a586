"""Shape guards out of the env: as Python text over sources, and checked on real sizes.

``guard_code`` prints each relation with every symbol replaced by its source
(``L['x'].size()[0] > 16``, ``L['y'].size()[1] == L['x'].size()[1]``): the text
``kiln.guards`` compiles into its check function. ``failing_guards`` evaluates the relations
on given sizes with sympy, independently of the printed text, and ``describe_failure`` says
why one failed in the user's terms (``L['x'].size()[1] == 1 failed: got 7``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import sympy
from sympy.printing.str import StrPrinter

from kiln.capture.shapes.env import ShapeEnv, ShapeGuard, number
from kiln.capture.source import Source

__all__ = ["guard_code", "expr_code", "values_of", "failing_guards", "describe_failure"]


class _SourcePrinter(StrPrinter):  # type: ignore[misc]
    """Python text for shape expressions: symbols as their sources, Python's operators for
    Kiln's integer functions (``math`` must be in scope for ``floor``/``ceil``)."""

    def __init__(
        self, sources: Mapping[sympy.Symbol, Source], name_of: Callable[[Source], str]
    ) -> None:
        super().__init__()
        self.sources = sources
        self.name_of = name_of

    def _print_Symbol(self, expr: sympy.Symbol) -> str:
        return self.name_of(self.sources[expr])

    def _wrap(self, expr: Any) -> str:
        text = self._print(expr)
        return text if expr.is_Atom or isinstance(expr, sympy.Function) else f"({text})"

    def _print_Float(self, expr: Any) -> str:
        return repr(float(expr))  # every digit of the double, not sympy's fifteen

    def _print_FloorDiv(self, expr: Any) -> str:
        return f"({self._wrap(expr.args[0])} // {self._wrap(expr.args[1])})"

    def _print_Mod(self, expr: Any) -> str:
        return f"({self._wrap(expr.args[0])} % {self._wrap(expr.args[1])})"

    def _print_Trunc(self, expr: Any) -> str:
        return f"int({self._print(expr.args[0])})"

    def _print_floor(self, expr: Any) -> str:
        return f"math.floor({self._print(expr.args[0])})"

    def _print_ceiling(self, expr: Any) -> str:
        return f"math.ceil({self._print(expr.args[0])})"

    def _print_Abs(self, expr: Any) -> str:
        return f"abs({self._print(expr.args[0])})"

    def _print_Max(self, expr: Any) -> str:
        return f"max({', '.join(self._print(a) for a in expr.args)})"

    def _print_Min(self, expr: Any) -> str:
        return f"min({', '.join(self._print(a) for a in expr.args)})"

    def _print_Relational(self, expr: Any) -> str:
        op = {"==": "==", "!=": "!=", "<": "<", "<=": "<=", ">": ">", ">=": ">="}[expr.rel_op]
        return f"{self._print(expr.lhs)} {op} {self._print(expr.rhs)}"

    _print_Equality = _print_Relational
    _print_Unequality = _print_Relational
    _print_StrictLessThan = _print_Relational
    _print_LessThan = _print_Relational
    _print_StrictGreaterThan = _print_Relational
    _print_GreaterThan = _print_Relational

    def _print_And(self, expr: Any) -> str:
        return " and ".join(self._wrap(a) for a in expr.args)

    def _print_Or(self, expr: Any) -> str:
        return " or ".join(self._wrap(a) for a in expr.args)

    def _print_Not(self, expr: Any) -> str:
        return f"not {self._wrap(expr.args[0])}"

    def _print_Piecewise(self, expr: Any) -> str:
        (then, cond), (other, _) = expr.args
        return f"({self._wrap(then)} if {self._wrap(cond)} else {self._wrap(other)})"

    def _print_BooleanTrue(self, expr: Any) -> str:
        return "True"

    def _print_BooleanFalse(self, expr: Any) -> str:
        return "False"


def _sources(env: ShapeEnv) -> dict[sympy.Symbol, Source]:
    return {s: info.source for s, info in env.symbols.items()}


def expr_code(env: ShapeEnv, expr: sympy.Basic, name_of: Callable[[Source], str] = str) -> str:
    """``expr`` as Python text over the sources of its symbols, each printed by ``name_of``
    (a source's own text by default; a guard compiler passes how it reads a source)."""
    return str(_SourcePrinter(_sources(env), name_of).doprint(expr))


def guard_code(env: ShapeEnv, name_of: Callable[[Source], str] = str) -> list[str]:
    """Each guard (``env.guards``) as a Python boolean expression over sources, in order."""
    printer = _SourcePrinter(_sources(env), name_of)
    return [str(printer.doprint(g.expr)) for g in env.guards]


def values_of(
    env: ShapeEnv,
    f_locals: dict[str, Any],
    f_globals: dict[str, Any] | None = None,
    cells: dict[str, Any] | None = None,
) -> dict[sympy.Symbol, int | float]:
    """Each symbol's value in a frame: its source read from the frame's values."""
    return {
        s: _plain(info.source.resolve(f_locals, f_globals or {}, cells or {}))
        for s, info in env.symbols.items()
    }


def _plain(value: Any) -> int | float:
    return value if isinstance(value, float) else int(value)


def _holds(guard: ShapeGuard, values: Mapping[sympy.Symbol, int | float]) -> bool:
    substituted = guard.expr.xreplace({s: number(v) for s, v in values.items()})
    return bool(substituted)


def failing_guards(env: ShapeEnv, values: Mapping[sympy.Symbol, int | float]) -> list[ShapeGuard]:
    """The guards that do not hold when each symbol has its value in ``values``."""
    return [g for g in env.guards if not _holds(g, values)]


def describe_failure(
    env: ShapeEnv, guard: ShapeGuard, values: Mapping[sympy.Symbol, int | float]
) -> str:
    """Why ``guard`` failed: its text and the sizes it read (``... failed: got 7``)."""
    sources = _sources(env)
    read = sorted(guard.expr.free_symbols, key=lambda s: str(sources[s]))
    got = ", ".join(
        str(values[s]) if len(read) == 1 else f"{sources[s]} = {values[s]}" for s in read
    )
    where = f" (assumed at {guard.origin})" if guard.origin else ""
    return f"{expr_code(env, guard.expr)} failed: got {got}{where}"
