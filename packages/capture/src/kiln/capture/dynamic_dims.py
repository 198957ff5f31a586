"""Which input dimensions capture traces with symbolic sizes.

A capture runs under one :class:`DynamicDims` policy (``with dynamic_dims(policy):``; the
frontend sets it from ``kiln.compile(dynamic=...)`` and what earlier calls saw change). A
tensor input's dimension is symbolic when the policy says every size is
(``every_size``), when the frame's earlier captures saw that size change (``history``, by
the input's source), or when the tensor carries a mark (:func:`mark_dynamic`, or the marks
TorchDynamo's ``mark_dynamic`` leaves as tensor attributes, which are read). ``mark_static`` and
module state (parameters and buffers, whose sizes a model does not change between calls)
keep sizes static unless a mark asks otherwise.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import math
from collections.abc import Iterator, Mapping

import torch

from kiln.capture.source import AttrSource, ItemSource, LocalSource, Source

__all__ = [
    "DimRange",
    "DynamicDims",
    "STATIC",
    "SizeHistory",
    "current",
    "dims_of",
    "dynamic_dims",
    "mark_dynamic",
    "mark_static",
    "maybe_mark_dynamic",
    "number_is_dynamic",
]

#: (min, max) a dynamic size may take; None: unbounded on that side
DimRange = tuple[int | None, int | None]

# Kiln's own marks, one dict per tensor: dim -> range; and the dims kept static
_DYNAMIC = "_kiln_dynamic_dims"
_WEAK = "_kiln_weak_dynamic_dims"
_STATIC = "_kiln_static_dims"
# what torch.compile's mark_dynamic / maybe_mark_dynamic / mark_static leave on a tensor
_TORCH_DYNAMIC = "_dynamo_dynamic_indices"
_TORCH_WEAK = "_dynamo_weak_dynamic_indices"
_TORCH_STATIC = "_dynamo_static_indices"
_TORCH_RANGES = "_dynamo_dynamic_range"


def _same(a: int | float, b: int | float) -> bool:
    """Equal, NaN equal to NaN (a NaN argument is the same value on every call)."""
    return a == b or (
        isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b)
    )


class SizeHistory:
    """The sizes one frame's captures saw, per input source: a dim whose size differs from
    the one seen before is symbolic from then on (automatic dynamic shapes). Captures of a
    frame run one at a time (under its cache's lock), so the history needs no lock."""

    def __init__(self) -> None:
        self._seen: dict[str, tuple[int | None, ...]] = {}
        self._numbers: dict[str, int | float | None] = {}  # None: changed

    def changed_value(self, source: Source, value: int | float) -> bool:
        """Record a Python number read from ``source``; whether it has changed, now or before."""
        key = str(source)
        before = self._numbers.get(key, value)
        changed = before is None or type(before) is not type(value) or not _same(before, value)
        self._numbers[key] = None if changed else value
        return changed

    def changed_dims(self, source: Source, t: torch.Tensor) -> set[int]:
        """Record ``t``'s sizes for ``source``; the dims that have changed, now or before."""
        key = str(source)
        sizes = tuple(t.shape)
        before = self._seen.get(key)
        if before is None or len(before) != len(sizes):
            self._seen[key] = sizes
            return set()
        merged = tuple(None if b != n else b for b, n in zip(before, sizes, strict=True))
        self._seen[key] = merged
        return {d for d, b in enumerate(merged) if b is None}


@dataclasses.dataclass(frozen=True)
class DynamicDims:
    """What a capture makes symbolic: ``every_size`` (``dynamic=True``), the dims ``history``
    saw change (``dynamic=None``; no history: none), ``never`` (``dynamic=False``, marks
    included)."""

    every_size: bool = False
    history: SizeHistory | None = None
    never: bool = False
    # input source text -> dims (with ranges) made symbolic, as export's dynamic_shapes says
    by_source: Mapping[str, Mapping[int, DimRange]] = dataclasses.field(default_factory=dict)
    # data-dependent values become unbacked symbols rather than graph breaks: ``item()``
    # (torch.compile's capture_scalar_outputs) and output sizes
    # (capture_dynamic_output_shape_ops)
    scalar_outputs: bool = False
    dynamic_output_shapes: bool = False
    # a continuation's arguments computed from tensor data before its break (argument name ->
    # the dims of a tensor whose sizes are; () for numbers): symbolic from the first capture,
    # as they change from call to call
    from_data: Mapping[str, tuple[int, ...]] = dataclasses.field(default_factory=dict)

    @property
    def any(self) -> bool:
        """Whether a capture under it may make some size symbolic (marks included)."""
        return not self.never


STATIC = DynamicDims(never=True)
_current: contextvars.ContextVar[DynamicDims | None] = contextvars.ContextVar(
    "kiln_dynamic_dims", default=None
)
_NO_HISTORY = DynamicDims()


def current() -> DynamicDims:
    """The policy of the capture running (outside ``dynamic_dims``: marks only)."""
    return _current.get() or _NO_HISTORY


@contextlib.contextmanager
def dynamic_dims(policy: DynamicDims) -> Iterator[None]:
    """Capture inside traces input sizes as ``policy`` says."""
    token = _current.set(policy)
    try:
        yield
    finally:
        _current.reset(token)


def _check_dim(t: torch.Tensor, dim: int) -> int:
    if not isinstance(t, torch.Tensor):
        msg = f"marking a dimension dynamic or static needs a tensor, got {type(t).__name__}"
        raise TypeError(msg)
    if not -t.dim() <= dim < max(t.dim(), 1):
        msg = f"dimension {dim} is out of range for a tensor of {t.dim()} dimensions"
        raise IndexError(msg)
    return dim % t.dim() if t.dim() else 0


def mark_dynamic(
    t: torch.Tensor, dim: int | list[int], *, min: int | None = None, max: int | None = None
) -> None:
    """Compile ``t``'s size at ``dim`` as a symbol from the first call, in ``[min, max]``.

    A call with a size outside the range compiles that size statically. A size of 0 or 1
    is still specialized (as TorchDynamo's ``mark_dynamic`` does in its default mode).
    """
    for given in [dim] if isinstance(dim, int) else dim:
        d = _check_dim(t, given)
        if min is not None and max is not None and min > max:
            msg = f"mark_dynamic: min {min} is above max {max}"
            raise ValueError(msg)
        marks = dict(getattr(t, _DYNAMIC, {}))
        marks[d] = (min, max)
        setattr(t, _DYNAMIC, marks)
        static = set(getattr(t, _STATIC, ())) - {d}
        setattr(t, _STATIC, frozenset(static))


def maybe_mark_dynamic(t: torch.Tensor, dim: int | list[int]) -> None:
    """Compile ``t``'s size at ``dim`` as a symbol, unless tracing needs a value: then it is
    specialized without complaint (``mark_dynamic`` promises a symbol)."""
    for given in [dim] if isinstance(dim, int) else dim:
        d = _check_dim(t, given)
        setattr(t, _WEAK, frozenset({*getattr(t, _WEAK, ()), d}))


def mark_static(t: torch.Tensor, dim: int | list[int]) -> None:
    """Keep ``t``'s size at ``dim`` static, even under ``dynamic=True``."""
    for given in [dim] if isinstance(dim, int) else dim:
        d = _check_dim(t, given)
        setattr(t, _STATIC, frozenset({*getattr(t, _STATIC, ()), d}))
        marks = dict(getattr(t, _DYNAMIC, {}))
        marks.pop(d, None)
        setattr(t, _DYNAMIC, marks)


def _torch_marks(t: torch.Tensor) -> tuple[dict[int, DimRange], set[int]]:
    """The dims TorchDynamo's marks (tensor attributes) make dynamic (with ranges) and static."""
    ranges: dict[int, DimRange] = {}
    for d in getattr(t, _TORCH_DYNAMIC, ()) or ():
        ranges[int(d)] = (None, None)
    for r in getattr(t, _TORCH_RANGES, ()) or ():
        d = getattr(r, "dim", None)
        if d is not None:
            lo, hi = getattr(r, "min", None), getattr(r, "max", None)
            ranges[int(d)] = (lo, hi if hi is None or hi < 2**62 else None)
    for d in getattr(t, _TORCH_WEAK, ()) or ():
        ranges.setdefault(int(d), (None, None))
    return ranges, {int(d) for d in getattr(t, _TORCH_STATIC, ()) or ()}


def number_is_dynamic(policy: DynamicDims, source: Source, value: object) -> bool:
    """Whether a Python int or float argument is traced as a symbol: under ``dynamic=True``
    (ints) or once its value changed between captures. Only the frame's own arguments and
    what they hold are (an attribute read, such as a module's ``num_heads``, stays a constant),
    and only finite floats: sympy's algebra (``p - p == 0``, ``p == inf`` is False) holds for
    finite values alone, so an infinite or NaN argument is a constant, guarded by value.
    """
    if policy.never or type(value) not in (int, float) or not _argument(source):
        return False
    if type(value) is float and not math.isfinite(value):
        return False  # a symbol stands for finite floats alone; inf and NaN stay constants
    if _argument_name(source) in policy.from_data:
        return True
    if policy.history is not None and policy.history.changed_value(source, value):  # type: ignore[arg-type]
        return True
    return policy.every_size and type(value) is int


def _argument(source: Source) -> bool:
    return _argument_name(source) is not None


def _argument_name(source: Source) -> str | None:
    s: Source = source
    while isinstance(s, ItemSource):
        s = s.base
    return s.name if isinstance(s, LocalSource) else None


def _within(n: int, r: DimRange) -> bool:
    return (r[0] is None or n >= r[0]) and (r[1] is None or n <= r[1])


def in_module_state(source: Source) -> bool:
    """Whether ``source`` reads a parameter or buffer of a module (``..._parameters['w']``)."""
    s: Source | None = source
    while s is not None:
        if isinstance(s, AttrSource) and s.name in ("_parameters", "_buffers"):
            return True
        s = s.base if isinstance(s, (AttrSource, ItemSource)) else None
    return False


def dims_of(policy: DynamicDims, source: Source, t: torch.Tensor) -> dict[int, DimRange]:
    """The dims of ``t`` (read from ``source``) to trace as symbols, with their ranges."""
    if policy.never or t.dim() == 0:
        return {}
    marked: dict[int, DimRange] = dict(getattr(t, _DYNAMIC, {}))
    marked.update(policy.by_source.get(str(source), {}))
    if isinstance(source, LocalSource):
        marked.update(dict.fromkeys(policy.from_data.get(source.name, ()), (None, None)))
    torch_marked, torch_static = _torch_marks(t)
    for d, r in torch_marked.items():
        marked.setdefault(d, r)
    for d in getattr(t, _WEAK, ()):
        marked.setdefault(d, (None, None))
    static = set(getattr(t, _STATIC, ())) | torch_static
    # a size outside its marked range is compiled static for this call (the graph for the
    # range would never be reused for it)
    dims: dict[int, DimRange] = {
        d: r for d, r in marked.items() if d not in static and _within(t.shape[d], r)
    }
    if isinstance(t, torch.nn.Parameter) or in_module_state(source):
        return dims
    if policy.every_size:
        wanted = set(range(t.dim()))
    elif policy.history is not None:
        wanted = policy.history.changed_dims(source, t)
    else:
        wanted = set()
    for d in wanted - static:
        if d < t.dim():
            dims.setdefault(d, (None, None))
    return dims
