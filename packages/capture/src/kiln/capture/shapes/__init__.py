"""Symbolic shapes: Kiln's shape environment and the SymNode that carries its symbols
through torch's meta kernels. See the package README, "Symbolic shapes". (``specialize``,
which runs graphs on fakes, is imported as its own module: ``meta`` imports this package.)"""

from kiln.capture.shapes.dispatch import SymbolicMetaMode, has_symbolic_sizes, run_symbolic
from kiln.capture.shapes.env import Scalar, ShapeEnv, ShapeGuard, SymbolInfo
from kiln.capture.shapes.exprs import FloorDiv, Mod, Range, Trunc
from kiln.capture.shapes.guards import (
    describe_failure,
    expr_code,
    failing_guards,
    guard_code,
    values_of,
)
from kiln.capture.shapes.node import SymNode, wrap
from kiln.capture.shapes.tensors import create_symint, expr_of, symbolic_meta

__all__ = [
    "ShapeEnv",
    "ShapeGuard",
    "SymbolInfo",
    "Scalar",
    "Range",
    "FloorDiv",
    "Mod",
    "Trunc",
    "SymNode",
    "wrap",
    "create_symint",
    "symbolic_meta",
    "SymbolicMetaMode",
    "run_symbolic",
    "has_symbolic_sizes",
    "expr_of",
    "guard_code",
    "expr_code",
    "values_of",
    "failing_guards",
    "describe_failure",
]
