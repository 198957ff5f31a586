"""torch.distributed calls met while capturing: collectives and rank queries.

Handled as TorchDynamo handles them (the DDP and FSDP2 modules are
:mod:`kiln.capture.parallel_modules`'):

- **In-place collectives.** ``dist.all_reduce(t)``, ``all_gather_into_tensor``,
  ``reduce_scatter_tensor`` and the other calls torch lists in
  ``traceable_collective_remaps`` are traced as the functional collective it maps them to:
  ``_c10d_functional`` nodes whose result is copied back into the argument (``t.copy_``),
  so the graph holds the collective, runs it at its place, and later reads see its result.
  ``async_op=True`` returns a Work handle no graph can hold: the call breaks the graph.
- **Rank queries.** ``dist.get_rank()``, ``get_world_size()``, ``is_initialized()`` and
  ``is_available()`` are constants of the process: folded while tracing, each guarded by
  calling it again (a ``CACHED_CALL`` guard), so a process group made again with another
  size is seen.

Nothing here imports torch's distributed packages beyond what ``import torch`` loaded: the
functional collectives are imported at the first traced collective.
"""

from __future__ import annotations

import importlib
import inspect
import types
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from kiln.capture import dispatch, literals
from kiln.capture.breaks.reasons import raised, unsupported
from kiln.capture.guard_data import CachedCall, GuardKind
from kiln.capture.values.base import ConstantValue, Value
from kiln.capture.values.objects import ObjectValue
from kiln.capture.wrap import function_value

if TYPE_CHECKING:
    from kiln.capture.tracer import Tracer

__all__ = ["HANDLERS"]

Handler = Callable[["Tracer", list[Value], dict[str, Value]], Value]


# collectives -----------------------------------------------------------------------------
def _functional_collectives() -> Any:
    return importlib.import_module("torch.distributed._functional_collectives")


def _collective(legacy: Callable[..., Any]) -> Handler:
    name = getattr(legacy, "__name__", "collective")

    def handler(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
        funcol = _functional_collectives()
        remapped = funcol.traceable_collective_remaps.get(legacy)
        if not isinstance(remapped, types.FunctionType):
            raise unsupported("unsupported_call", f"torch.distributed.{name}")
        try:
            bound = inspect.signature(legacy).bind(*args, **kwargs).arguments
        except TypeError as e:
            raise raised(e) from e
        async_op = bound.get("async_op")
        if async_op is not None and (
            not literals.is_literal(async_op) or literals.literal(async_op)
        ):
            raise unsupported(
                "unsupported_call",
                f"torch.distributed.{name}(async_op=True) returns a Work handle a graph cannot "
                "hold; call it with async_op=False inside compiled code",
            )
        if "op" in bound:
            op = funcol.REDUCE_OP_TO_STR.get(_plain(bound["op"]))
            if op is None:
                raise unsupported("unsupported_call", f"torch.distributed.{name} with this op")
            bound["op"] = ConstantValue(op)
        return dispatch.call(tr, function_value(remapped, None), [], dict(bound))

    return handler


def _plain(v: Value) -> Any:
    """The real object of a constant or of an object the frame holds (a ReduceOp, a group)."""
    if isinstance(v, ObjectValue):
        return v.obj
    if literals.is_literal(v):
        return literals.literal(v)
    raise unsupported("unsupported_value", f"{v} as an argument of a torch.distributed call")


def _folded(fn: Callable[..., Any]) -> Handler:
    """A rank query answered now, guarded by asking again (its arguments pinned by identity)."""

    def handler(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
        for v in [*args, *kwargs.values()]:
            if isinstance(v, ObjectValue) and v.source is not None:
                tr.out.guard(v.source, GuardKind.ID_MATCH, id(v.obj))
            elif not literals.is_literal(v):
                name = getattr(fn, "__name__", "?")
                raise unsupported("unsupported_call", f"torch.distributed.{name} on {v}")
        plain = [_plain(a) for a in args]
        plain_kw = {k: _plain(a) for k, a in kwargs.items()}
        try:
            result = fn(*plain, **plain_kw)
        except Exception as e:
            raise raised(e) from e
        cached = CachedCall(fn, tuple(plain), tuple(plain_kw.items()), result)
        tr.out.guard(None, GuardKind.CACHED_CALL, cached)
        return ConstantValue(result)

    return handler


def _group_method(fn: Callable[..., Any]) -> Handler:
    """``group.size()`` and the like: fixed for a group's life, so answered now, the group
    pinned by identity."""

    def handler(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
        group = args[0] if len(args) == 1 and not kwargs else None
        if not isinstance(group, ObjectValue) or group.source is None:
            raise unsupported("unsupported_call", f"ProcessGroup.{fn.__name__} on {group}")
        tr.out.guard(group.source, GuardKind.ID_MATCH, id(group.obj))
        return ConstantValue(fn(group.obj))

    return handler


_COLLECTIVES = (
    "all_reduce",
    "all_gather_into_tensor",
    "all_gather_single",
    "reduce_scatter_tensor",
    "reduce_scatter_single",
    "all_gather",
    "reduce_scatter",
    "all_to_all_single",
    "_all_gather_base",
    "_reduce_scatter_base",
)
_QUERIES = ("get_rank", "get_world_size", "is_initialized", "is_available")
_GROUP_METHODS = ("size", "rank", "name", "group_desc")

HANDLERS: dict[Any, Handler] = {}
if torch.distributed.is_available():
    for _name in _COLLECTIVES:
        _fn = getattr(torch.distributed.distributed_c10d, _name, None)
        if _fn is not None:
            HANDLERS[_fn] = _collective(_fn)
    for _name in _QUERIES:
        _fn = getattr(torch.distributed, _name, None)
        if _fn is not None:
            HANDLERS[_fn] = _folded(_fn)
    for _name in _GROUP_METHODS:
        _fn = getattr(torch.distributed.ProcessGroup, _name, None)
        # older torch's pybind methods are ``instancemethod`` objects, which do not hash
        _fn = getattr(_fn, "__func__", _fn)
        if _fn is not None:
            HANDLERS[_fn] = _group_method(_fn)
