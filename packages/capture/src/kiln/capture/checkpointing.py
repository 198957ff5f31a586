"""Activation checkpointing traced into the graph, through Python stand-ins capture inlines.

``torch.utils.checkpoint.checkpoint(fn, *args)`` runs ``fn`` and later reruns it during
the backward to rebuild the values it did not keep. A call of it (read from the frame as a
:class:`CheckpointValue`) traces the stand-in here, which runs ``fn`` inline inside a
:class:`recompute_region`; ``contexts.RegionValue`` marks every node made inside with
``meta["kiln_recompute"]`` (a region id). autograd_aot's partitioner recomputes the marked
ops in the backward instead of saving their values, saving the region's inputs (and its
outputs, which later ops read) as eager's checkpointing keeps them; random ops inside draw
the same numbers when recomputed, as eager's ``preserve_rng_state=True`` replays them.

A call the stand-ins do not model (:func:`untraceable`: a ``context_fn``, ``debug=True``,
``use_reentrant`` left out, the curried form) breaks the graph and runs torch's function.
"""

from __future__ import annotations

import types
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.utils.checkpoint
from torch.utils.checkpoint import noop_context_fn

from kiln.capture.values.base import ConstantValue, Value
from kiln.capture.values.objects import ObjectValue

__all__ = [
    "CheckpointValue",
    "checkpoint",
    "checkpoint_sequential",
    "recompute_region",
    "stand_in",
    "untraceable",
]


class recompute_region:
    """Marks the ops traced inside it as one checkpointed region; capture models it
    (``contexts.RegionValue``). Never entered in Python: the stand-ins are only traced."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


class CheckpointValue(ObjectValue):
    """torch's ``checkpoint`` or ``checkpoint_sequential`` read by the trace. A call traces
    the stand-in (``contexts``) or, where :func:`untraceable` says why not, breaks the graph
    and calls torch's function as it is."""


def untraceable(fn: Any, args: list[Value], kwargs: dict[str, Value]) -> str | None:
    """Why a call of torch's ``fn`` with these arguments is left to torch, or None."""

    def given(name: str, position: int | None = None) -> Any:
        value = kwargs.get(name)
        if value is None and position is not None and len(args) > position:
            value = args[position]
        if value is None:
            return _MISSING
        if isinstance(value, ConstantValue):
            return value.value
        return getattr(value, "real", getattr(value, "obj", value))

    sequential = fn is _TORCH[1]
    if type(given("use_reentrant", 3 if sequential else None)) is not bool:
        return "activation checkpointing with use_reentrant left out (torch warns)"
    if not args:
        return "activation checkpointing in its curried form"
    if given("context_fn") not in (_MISSING, noop_context_fn):
        return "activation checkpointing with a context_fn (selective checkpointing)"
    if given("debug") not in (_MISSING, False):
        return "activation checkpointing with debug=True"
    return None


_MISSING = object()


def checkpoint(
    function: Any = None,
    *args: Any,
    use_reentrant: bool | None = None,
    preserve_rng_state: bool = True,
    context_fn: Callable[[], Any] = noop_context_fn,
    determinism_check: str = "default",
    debug: bool = False,
    early_stop: bool = True,
    respect_saved_tensors_hooks: bool | None = None,
    **kwargs: Any,
) -> Any:
    """``torch.utils.checkpoint.checkpoint``: ``function(*args, **kwargs)`` as a region.

    The reentrant form runs its function under ``no_grad`` when no tensor argument
    requires grad (its outputs then require none, and parameters get no gradient), as
    torch's ``CheckpointFunction`` does; otherwise both forms compute the same values and
    gradients. ``preserve_rng_state``, ``determinism_check`` and ``early_stop`` change
    nothing here: the recomputation always replays the forward's random numbers.
    """
    if use_reentrant:
        if kwargs:
            raise ValueError("Unexpected keyword arguments: " + ",".join(arg for arg in kwargs))
        if respect_saved_tensors_hooks is not None:  # (context_fn and debug: left to torch)
            raise ValueError(
                "Passing `context_fn`, `debug`, or `respect_saved_tensors_hooks` "
                "is only supported when use_reentrant=False."
            )
        if not any(isinstance(a, torch.Tensor) and a.requires_grad for a in args):
            warnings.warn(
                "None of the inputs have requires_grad=True. Gradients will be None", stacklevel=2
            )
            with torch.no_grad():
                return function(*args)
    with recompute_region():
        return function(*args, **kwargs)


def checkpoint_sequential(
    functions: Any, segments: int, input: Any, use_reentrant: bool | None = None, **kwargs: Any
) -> Any:
    """``torch.utils.checkpoint.checkpoint_sequential``: each segment but the last a region."""
    preserve = kwargs.pop("preserve_rng_state", True)
    if kwargs:
        raise ValueError("Unexpected keyword arguments: " + ",".join(arg for arg in kwargs))

    def run_function(start: int, end: int, functions: Any) -> Callable[[Any], Any]:
        def forward(input: Any) -> Any:
            for j in range(start, end + 1):
                input = functions[j](input)
            return input

        return forward

    if isinstance(functions, torch.nn.Sequential):
        functions = list(functions.children())
    segment_size = len(functions) // segments
    end = -1
    for start in range(0, segment_size * (segments - 1), segment_size):
        end = start + segment_size - 1
        input = checkpoint(
            run_function(start, end, functions),
            input,
            use_reentrant=use_reentrant,
            preserve_rng_state=preserve,
        )
    return run_function(end + 1, len(functions) - 1, functions)(input)


_TORCH = (torch.utils.checkpoint.checkpoint, torch.utils.checkpoint.checkpoint_sequential)
_STAND_INS: dict[Any, Callable[..., Any]] = dict(
    zip(_TORCH, (checkpoint, checkpoint_sequential), strict=True)
)


def stand_in(fn: Any) -> types.FunctionType | None:
    """The stand-in capture traces for torch's checkpointing function ``fn``, or None."""
    try:
        found = _STAND_INS.get(fn)
    except TypeError:  # unhashable
        return None
    return found if isinstance(found, types.FunctionType) else None
