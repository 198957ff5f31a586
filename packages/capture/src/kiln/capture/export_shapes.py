"""``export(..., dynamic_shapes=...)``: which input dimensions an exported graph keeps symbolic.

The spec mirrors the call's arguments: a sequence with one entry per positional argument, or
a dict by parameter name (keyword arguments too). For a tensor, the entry is None (static), a
dict ``{dim: spec}`` or a sequence with one spec per dim; for a list, tuple or dict of
tensors, a list, tuple or dict of entries. A dim's spec is a :class:`Dim` (a name and an
optional range), ``True`` or a name (unbounded), or None (static).
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from kiln.capture.dynamic_dims import DimRange
from kiln.capture.errors import KilnError
from kiln.capture.shapes import expr_code
from kiln.capture.source import LocalSource, Source

__all__ = ["Dim", "DynamicShapesError", "dims_by_source"]


@dataclasses.dataclass(frozen=True)
class Dim:
    """A dynamic dimension of an exported graph: ``Dim("seq", min=2, max=512)``."""

    name: str
    min: int | None = None
    max: int | None = None


class DynamicShapesError(KilnError, ValueError):
    """A ``dynamic_shapes`` spec that does not fit the arguments, or a dimension it asks to
    keep dynamic that the program fixed to one value."""


def _range(spec: Any, where: str) -> DimRange | None:
    if spec is None or spec is False:
        return None
    if spec is True or isinstance(spec, str):
        return (None, None)
    if isinstance(spec, Dim):
        return (spec.min, spec.max)
    msg = (
        f"dynamic_shapes: {where}: a dimension's spec is a Dim, True, a name or None, got {spec!r}"
    )
    raise DynamicShapesError(msg)


def _tensor_dims(t: torch.Tensor, spec: Any, where: str) -> dict[int, DimRange]:
    if isinstance(spec, Mapping):
        items = list(spec.items())
    elif isinstance(spec, Sequence) and not isinstance(spec, str):
        if len(spec) != t.dim():
            msg = f"dynamic_shapes: {where} has {t.dim()} dims, its spec {len(spec)}"
            raise DynamicShapesError(msg)
        items = list(enumerate(spec))
    else:
        msg = f"dynamic_shapes: {where} is a tensor: its spec is a dict or a sequence, got {spec!r}"
        raise DynamicShapesError(msg)
    out: dict[int, DimRange] = {}
    for d, s in items:
        if not isinstance(d, int) or not -t.dim() <= d < t.dim():
            msg = f"dynamic_shapes: {where} has no dimension {d!r}"
            raise DynamicShapesError(msg)
        r = _range(s, f"{where} dim {d}")
        if r is not None:
            out[d % t.dim()] = r
    return out


def _walk(value: Any, spec: Any, source: Source, out: dict[str, dict[int, DimRange]]) -> None:
    if spec is None:
        return
    where = str(source)
    if isinstance(value, torch.Tensor):
        dims = _tensor_dims(value, spec, where)
        if dims:
            out[where] = dims
        return
    if isinstance(value, Mapping) and isinstance(spec, Mapping):
        for k, s in spec.items():
            if k not in value:
                msg = f"dynamic_shapes: {where} has no key {k!r}"
                raise DynamicShapesError(msg)
            _walk(value[k], s, source.item(k), out)
        return
    if isinstance(value, (list, tuple)) and isinstance(spec, (list, tuple)):
        if len(spec) != len(value):
            msg = f"dynamic_shapes: {where} has {len(value)} items, its spec {len(spec)}"
            raise DynamicShapesError(msg)
        for i, (v, s) in enumerate(zip(value, spec, strict=True)):
            _walk(v, s, source.item(i), out)
        return
    msg = (
        f"dynamic_shapes: {where} is a {type(value).__name__}, which its spec {spec!r} does not fit"
    )
    raise DynamicShapesError(msg)


def dims_by_source(
    fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any], spec: Any
) -> dict[str, dict[int, DimRange]]:
    """The symbolic dims ``spec`` asks for, by the source of each tensor in ``fn``'s frame."""
    signature = inspect.signature(fn)
    bound = signature.bind(*args, **kwargs)
    out: dict[str, dict[int, DimRange]] = {}
    if isinstance(spec, Mapping):
        for name, s in spec.items():
            if name not in bound.arguments:
                msg = f"dynamic_shapes: {fn.__qualname__} has no argument {name!r} in this call"
                raise DynamicShapesError(msg)
            _walk(bound.arguments[name], s, _frame_source(fn, signature, name, kwargs), out)
        return out
    if isinstance(spec, (list, tuple)):
        names = list(bound.arguments)
        if len(spec) > len(args):
            msg = f"dynamic_shapes: {len(spec)} entries for {len(args)} positional arguments"
            raise DynamicShapesError(msg)
        for name, s in zip(names, spec, strict=False):
            _walk(bound.arguments[name], s, _frame_source(fn, signature, name, kwargs), out)
        return out
    msg = f"dynamic_shapes must be a tuple, list or dict, got {type(spec).__name__}"
    raise DynamicShapesError(msg)


def _frame_source(fn: Any, signature: inspect.Signature, name: str, kwargs: Any) -> Source:
    """Where argument ``name`` of ``signature`` lives in the frame the tracer runs.

    ``inspect.signature`` follows ``__wrapped__``: for a decorated ``forward`` whose wrapper
    takes ``(*args, **kwargs)`` the spec names the wrapped function's parameters, but the
    traced frame is the wrapper's, where they are ``L['args'][i]`` or ``L['kwargs'][name]``.
    """
    frame = inspect.signature(fn, follow_wrapped=False)
    if frame == signature or name in frame.parameters:
        return LocalSource(name)
    kinds = inspect.Parameter
    positional = [
        p.name
        for p in frame.parameters.values()
        if p.kind in (kinds.POSITIONAL_ONLY, kinds.POSITIONAL_OR_KEYWORD)
    ]
    varargs = next(
        (p.name for p in frame.parameters.values() if p.kind is kinds.VAR_POSITIONAL), None
    )
    varkw = next((p.name for p in frame.parameters.values() if p.kind is kinds.VAR_KEYWORD), None)
    if name in kwargs and varkw is not None:
        return LocalSource(varkw).item(name)
    index = list(signature.parameters).index(name)
    if index < len(positional):
        return LocalSource(positional[index])
    if varargs is not None:
        return LocalSource(varargs).item(index - len(positional))
    return LocalSource(name)


def check_kept_dynamic(
    wanted: Mapping[str, Mapping[int, DimRange]], inputs: Sequence[Any], env: Any
) -> None:
    """Raise where the program fixed a dimension ``wanted`` dynamic to one value, naming the
    line whose use of the size fixed it."""
    by_source = {str(i.source): i for i in inputs}
    for where, dims in wanted.items():
        found = by_source.get(where)
        if found is None or not isinstance(found.real, torch.Tensor):
            continue
        shape = found.value.fake.shape
        for d in dims:
            n = shape[d]
            if isinstance(n, torch.SymInt) and not n.node.expr.is_Number:
                continue
            origin = _origin_of(env, f"{where}.size()[{d}]")
            msg = (
                f"export: {where}.size()[{d}] was marked dynamic, but the program needs it to "
                f"be {int(n)}{origin}"
            )
            raise DynamicShapesError(msg)


def _origin_of(env: Any, text: str) -> str:
    """`` at file:line`` of the guard that fixed the size read by ``text``, when known."""
    if env is None:
        return ""
    for g in env.recorded:
        if text in expr_code(env, g.expr) and g.origin:
            return f" (at {g.origin})"
    return ""
