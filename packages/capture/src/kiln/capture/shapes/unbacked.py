"""Data-dependent ops on fakes: results whose values or sizes are unbacked symbols.

``t.item()`` or ``nonzero(t)`` cannot be computed without data. With TorchDynamo's
``capture_scalar_outputs`` (for ``item``) or ``capture_dynamic_output_shape_ops`` (for
``nonzero``, ``unique``, ``masked_select``, ``x[mask]``, ``repeat_interleave`` without an
output size) on, such an op still runs on fakes: its scalar is a fresh unbacked symbol of the
capture's shape environment, or its data-dependent size is one, ranged as the op allows (a
row count of ``nonzero`` lies in ``[0, numel]``, a bool's value in ``[0, 1]``). Off (the
default), the caller raises ``DataDependentOp`` and the graph breaks, as before.

The permission is a context (:func:`allowing`), set by capture while it traces a frame
whose options ask for it and by autograd_aot while it retraces such a graph, so fakes made
anywhere else keep refusing data-dependent ops.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Iterator
from typing import Any

import sympy
import torch

from kiln.capture.shapes.dispatch import UNBACKED_KERNELS, run_symbolic
from kiln.capture.shapes.env import ShapeEnv
from kiln.capture.shapes.exprs import INF
from kiln.capture.shapes.node import SymNode, wrap

__all__ = ["DataDependentOps", "allowing", "current", "permits", "run_data_dependent"]

aten = torch.ops.aten


@dataclasses.dataclass(frozen=True)
class DataDependentOps:
    """Which data-dependent ops run on fakes, and the environment their symbols join."""

    env: ShapeEnv
    scalars: bool = False
    shapes: bool = False


_current: contextvars.ContextVar[DataDependentOps | None] = contextvars.ContextVar(
    "kiln_data_dependent_ops", default=None
)


def current() -> DataDependentOps | None:
    """The permission in force, or None (data-dependent ops refuse)."""
    return _current.get()


@contextlib.contextmanager
def allowing(ops: DataDependentOps | None) -> Iterator[None]:
    """Data-dependent ops inside run as ``ops`` permits (None: as outside)."""
    token = _current.set(ops)
    try:
        yield
    finally:
        _current.reset(token)


def permits(func: Any) -> bool:
    """Whether the permission in force lets ``func`` (an aten overload) run on fakes."""
    ops = current()
    if ops is None:
        return False
    if func.overloadpacket is aten._local_scalar_dense:
        return ops.scalars
    return ops.shapes and func.overloadpacket in _SHAPE_OPS


def _numel(t: torch.Tensor) -> float:
    n = t.numel()
    return n if isinstance(n, int) else INF


def _size(env: ShapeEnv, upper: float) -> torch.SymInt:
    """A fresh unbacked size in ``[0, upper]``."""
    symbol = env.create_unbacked(int, 0, upper, size=True)
    value = wrap(SymNode(symbol, env, int, None))
    assert isinstance(value, torch.SymInt)
    return value


def _empty(sizes: Any, like: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    return torch.empty(sizes, dtype=dtype or like.dtype, device="meta")


def _local_scalar_dense(env: ShapeEnv, x: torch.Tensor) -> Any:
    if x.dtype == torch.bool:
        bit = env.create_unbacked(int, 0, 1)
        return wrap(SymNode(sympy.Eq(bit, 1), env, bool, None))
    if x.dtype.is_floating_point:
        return wrap(SymNode(env.create_unbacked(float), env, float, None))
    if x.dtype.is_complex:
        return NotImplemented
    info = torch.iinfo(x.dtype)
    return wrap(SymNode(env.create_unbacked(int, info.min, info.max), env, int, None))


def _nonzero(env: ShapeEnv, x: torch.Tensor) -> torch.Tensor:
    n = _size(env, _numel(x))
    # eager's CPU and CUDA kernels lay the indices out column by column
    return torch.empty_strided((n, x.dim()), (1, n), dtype=torch.long, device="meta")


def _masked_select(env: ShapeEnv, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    shape = torch.broadcast_shapes(x.shape, mask.shape)
    upper = INF if any(not isinstance(s, int) for s in shape) else float(torch.Size(shape).numel())
    return _empty((_size(env, upper),), x)


def _index(env: ShapeEnv, x: torch.Tensor, indices: list[Any]) -> torch.Tensor:
    """``x[mask]``: each boolean mask becomes the long indices its ``nonzero`` gives."""
    expanded: list[Any] = []
    for index in indices:
        if isinstance(index, torch.Tensor) and index.dtype in (torch.bool, torch.uint8):
            n = _size(env, _numel(index))
            expanded.extend(_empty((n,), index, torch.long) for _ in range(index.dim()))
        else:
            expanded.append(index)
    return run_symbolic(aten.index.Tensor, (x, expanded), {})  # type: ignore[no-any-return]


def _unique(
    env: ShapeEnv, x: torch.Tensor, inverse: bool, counts: bool, dim: int | None = None
) -> tuple[torch.Tensor, ...]:
    if dim is None:
        n = _size(env, _numel(x))
        values = _empty((n,), x)
        inverse_shape: Any = x.shape if inverse else (0,)
        return (
            values,
            _empty(inverse_shape, x, torch.long),
            _empty((n if counts else 0,), x, torch.long),
        )
    dim = dim % x.dim()
    n = _size(env, x.shape[dim] if isinstance(x.shape[dim], int) else INF)
    shape = [*x.shape[:dim], n, *x.shape[dim + 1 :]]
    return _empty(shape, x), _empty((x.shape[dim],), x, torch.long), _empty((n,), x, torch.long)


def _repeat_interleave(
    env: ShapeEnv, repeats: torch.Tensor, output_size: Any = None
) -> torch.Tensor:
    size = output_size if output_size is not None else _size(env, INF)
    return _empty((size,), repeats)


def _arg(args: tuple[Any, ...], kwargs: dict[str, Any], i: int, name: str, default: Any) -> Any:
    return args[i] if len(args) > i else kwargs.get(name, default)


def run_data_dependent(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``func`` on meta tensors, its data-dependent values unbacked symbols of the env in
    force (:func:`permits` said yes); NotImplemented for a form not modelled here."""
    ops = current()
    assert ops is not None
    env, packet = ops.env, func.overloadpacket
    x = args[0]
    a = lambda i, name, default: _arg(args, kwargs, i, name, default)  # noqa: E731
    if packet is aten._local_scalar_dense:
        return _local_scalar_dense(env, x)
    if packet is aten.nonzero:
        return _nonzero(env, x)
    if packet is aten.masked_select:
        return _masked_select(env, x, a(1, "mask", None))
    if packet is aten.index:
        return _index(env, x, list(a(1, "indices", ())))
    if packet is aten._unique2:
        return _unique(env, x, a(2, "return_inverse", False), a(3, "return_counts", False))
    if packet is aten._unique:
        return _unique(env, x, a(2, "return_inverse", False), False)[:2]
    if packet is aten.unique_consecutive:
        inverse, counts = a(1, "return_inverse", False), a(2, "return_counts", False)
        return _unique(env, x, inverse, counts, a(3, "dim", None))
    if packet is aten.unique_dim:
        return _unique(
            env, x, a(3, "return_inverse", False), a(4, "return_counts", False), a(1, "dim", 0)
        )
    if func is aten.repeat_interleave.Tensor:
        return _repeat_interleave(env, x, kwargs.get("output_size"))
    return NotImplemented


_SHAPE_OPS = frozenset(
    {
        aten.nonzero,
        aten.masked_select,
        aten.index,
        aten._unique,
        aten._unique2,
        aten.unique_consecutive,
        aten.unique_dim,
        aten.repeat_interleave,
    }
)


def _slice(
    x: torch.Tensor, dim: int = 0, start: Any = None, end: Any = None, step: int = 1
) -> torch.Tensor:
    """``x[start:end:step]`` along ``dim`` with a data-dependent bound. torch's kernels
    branch on the bound's sign and on whether it passes the size; here a data-dependent
    bound is assumed at least 0 (a runtime assert checks it) and clamped to the size."""
    if not isinstance(step, int):
        return NotImplemented
    dim = dim % x.dim()
    size = x.shape[dim]
    bounds = []
    for given, default in ((start, 0), (end, size)):
        if given is None:
            bound = default
        elif isinstance(given, int):
            bound = given + size if given < 0 else given
        else:
            torch._check(given >= 0, lambda: "a data-dependent slice bound is negative")
            bound = given
        bounds.append(torch.sym_max(0, torch.sym_min(bound, size)))
    lo, hi = bounds
    length = torch.sym_max(hi - lo, 0)
    length = (length + step - 1) // step
    sizes = [*x.shape[:dim], length, *x.shape[dim + 1 :]]
    strides = [*x.stride()[:dim], x.stride(dim) * step, *x.stride()[dim + 1 :]]
    return x.as_strided(sizes, strides, x.storage_offset() + lo * x.stride(dim))


def _known(value: Any) -> bool:
    """Whether ``value`` (a bool or SymBool) is true for every value of its symbols."""
    if isinstance(value, torch.SymBool):
        return bool(value.node.statically_known_true("", 0))
    return bool(value)


def _contiguous_strides(sizes: list[Any]) -> list[Any]:
    strides: list[Any] = []
    running: Any = 1
    for n in reversed(sizes):
        strides.append(running)
        running = running * torch.sym_max(n, 1) if not isinstance(n, int) else running * max(n, 1)
    return strides[::-1]


def _view(x: torch.Tensor, *shape: Any) -> torch.Tensor:
    """``x.view(shape)`` where sizes are data-dependent, for a contiguous ``x`` (the form
    torch's own kernel needs a hint for). The element count a ``-1`` stands for divides
    evenly and the counts match, asserted when the graph runs."""
    sizes = list(shape[0] if len(shape) == 1 and isinstance(shape[0], (list, tuple)) else shape)
    if not all(
        _known(s == e) for s, e in zip(x.stride(), _contiguous_strides(list(x.shape)), strict=True)
    ):
        return NotImplemented
    numel = x.numel()
    if any(isinstance(s, int) and s == -1 for s in sizes):
        at = next(i for i, s in enumerate(sizes) if isinstance(s, int) and s == -1)
        rest: Any = 1
        for i, s in enumerate(sizes):
            rest = rest if i == at else rest * s
        torch._check(numel % rest == 0, lambda: f"view: shape {sizes} is invalid")
        sizes[at] = numel // rest
    total: Any = 1
    for s in sizes:
        total = total * s
    torch._check(total == numel, lambda: f"view: shape {sizes} is invalid for the input")
    return x.as_strided(sizes, _contiguous_strides(sizes), x.storage_offset())


UNBACKED_KERNELS[aten.slice.Tensor] = _slice
UNBACKED_KERNELS[aten.view.default] = _view
