"""The functionalization pass's rules: mutations to functional ops, views to scatters.

The tracer (``trace.py``) keeps, for every tensor it has seen, the chain of view
ops that leads from the tensor's root (a graph input or a freshly computed value)
to it. A mutation of any alias writes a new value into the root through the
inverse of each view in the chain (``slice_scatter``, ``select_scatter`` ...);
other aliases are regenerated from the new root by replaying their chains. This
module holds those per-op rules; the bookkeeping lives in the tracer.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from kiln.autograd_aot.errors import UnsupportedMutation
from kiln.capture.meta import METADATA_MUTATIONS

__all__ = [
    "Functional",
    "ViewStep",
    "apply_view",
    "functional_variant",
    "is_mutation",
    "is_view",
    "mutated_args",
    "scatter_into",
    "unhide_mutation",
]

aten = torch.ops.aten


@dataclasses.dataclass(frozen=True)
class ViewStep:
    """One view op applied to a parent: ``func(parent, *args, **kwargs)[index]``."""

    func: Any
    args: tuple[Any, ...]
    kwargs: tuple[tuple[str, Any], ...]
    index: int | None = None


def is_view(func: Any) -> bool:
    """True for ops whose first output aliases an input without writing it."""
    returns = func._schema.returns
    if not returns:
        return False
    info = returns[0].alias_info
    return info is not None and not info.is_write and not is_mutation(func)


def unhide_mutation(func: Any, args: tuple[Any, ...]) -> Any:
    """An equivalent op whose schema declares the writes ``func`` makes without saying so.

    ``native_batch_norm`` updates its running statistics in training mode, but
    its schema has no write annotations; ``_native_batch_norm_legit`` does.
    ``lift_fresh`` is a view by schema but makes a fresh tensor.
    """
    if func is aten.native_batch_norm.default and len(args) > 5 and args[5] and args[3] is not None:
        return aten._native_batch_norm_legit.default
    if func is aten.lift_fresh.default:
        # torch.tensor(data): the new tensor is the program's own, free to mutate, not an
        # alias of the constant holding the data.
        return aten.lift_fresh_copy.default
    return func


def is_mutation(func: Any) -> bool:
    """True for in-place and ``out=`` ops."""
    return any(a.alias_info is not None and a.alias_info.is_write for a in func._schema.arguments)


def mutated_args(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[torch.Tensor]:
    """The tensors ``func`` writes, in schema order."""
    if func.overloadpacket in METADATA_MUTATIONS:
        msg = (
            f"{func} changes a tensor's sizes or strides in place; Kiln's functionalization "
            "pass handles value mutations only. Use the out-of-place op (e.g. x = x.t())."
        )
        raise UnsupportedMutation(msg)
    out = []
    for i, a in enumerate(func._schema.arguments):
        if a.alias_info is None or not a.alias_info.is_write:
            continue
        value = kwargs[a.name] if a.kwarg_only or i >= len(args) else args[i]
        if isinstance(value, torch.Tensor):
            out.append(value)
        elif isinstance(value, (list, tuple)):
            out.extend(value)
    return out


@dataclasses.dataclass(frozen=True)
class Functional:
    """How to run a mutating op functionally.

    ``op`` runs without ``drop`` (the ``out=`` arguments). With ``appends_values``
    (``*_functional`` ops such as batch norm's), ``op`` returns the mutating op's
    results followed by the new values of the written arguments; otherwise its
    results are the new values.
    """

    op: Any
    drop: tuple[str, ...] = ()
    appends_values: bool = False


def functional_variant(func: Any) -> Functional:
    """The functional form of a mutating op.

    ``add_.Tensor`` gives ``add.Tensor``; ``add.out`` gives ``add.Tensor``;
    ``_batch_norm_with_update`` gives ``_batch_norm_with_update_functional``.
    """
    schema = func._schema
    written = [a for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]
    name = func.overloadpacket.__name__
    if name.endswith("_") and written[0].name == "self":
        found = _overload_with_args(name[:-1], _params(schema.arguments))
        if found is not None:
            return Functional(found)
    if all(a.kwarg_only for a in written):
        drop = tuple(a.name for a in written)
        keep = _params([a for a in schema.arguments if a.name not in drop])
        found = _overload_with_args(name, keep)
        if found is not None:
            return Functional(found, drop)
    all_args = _params(schema.arguments)
    found = _overload_with_args(f"{name}_functional", all_args)
    if found is not None:
        return Functional(found, appends_values=True)
    # normal_ -> normal_functional: same arguments, returns the new value only
    found = _overload_with_args(f"{name.rstrip('_')}_functional", all_args)
    if found is not None and len(found._schema.returns) == 1:
        return Functional(found)
    msg = f"no functional variant of {func} is known to Kiln's functionalization pass"
    raise UnsupportedMutation(msg)


def _params(arguments: Any) -> list[tuple[str, str]]:
    """Names and types: ``fill_.Tensor`` must find ``fill.Tensor``, not ``fill.Scalar``
    (both name their arguments ``self, value``)."""
    return [(a.name, str(a.type)) for a in arguments]


def _overload_with_args(packet_name: str, params: list[tuple[str, str]]) -> Any:
    packet = getattr(aten, packet_name, None)
    if packet is None:
        return None
    for overload in packet.overloads():
        cand = getattr(packet, overload)
        if not is_mutation(cand) and _params(cand._schema.arguments) == params:
            return cand
    return None


def apply_view(step: ViewStep, parent: torch.Tensor) -> torch.Tensor:
    """Replay ``step`` on ``parent`` (inside the tracer, so the op is recorded)."""
    out = step.func(parent, *step.args, **dict(step.kwargs))
    return out if step.index is None else out[step.index]


def scatter_into(step: ViewStep, parent: torch.Tensor, child: torch.Tensor) -> torch.Tensor:
    """The new ``parent`` once its view ``step`` holds ``child``: the inverse of the view."""
    packet = step.func.overloadpacket
    args = step.args
    if packet in (aten.alias, aten.detach, aten.lift_fresh, aten._reshape_alias):
        return child if packet is not aten._reshape_alias else child.reshape(parent.shape)
    if packet in (aten.view, aten._unsafe_view, aten.squeeze, aten.unsqueeze, aten.reshape):
        return aten.reshape.default(child, list(parent.shape))
    if packet is aten.slice:
        dim, start, end, step_ = (list(args) + [0, None, None, 1][len(args) :])[:4]
        return aten.slice_scatter.default(parent, child, dim, start, end, step_)
    if packet is aten.select:
        return aten.select_scatter.default(parent, child, *args)
    if packet is aten.diagonal:
        return aten.diagonal_scatter.default(parent, child, *args)
    if packet is aten.as_strided:
        return aten.as_strided_scatter.default(parent, child, *args)
    if packet is aten.permute:
        dims = [d % parent.dim() for d in args[0]]
        inverse = sorted(range(len(dims)), key=dims.__getitem__)
        return aten.permute.default(child, inverse)
    if packet is aten.transpose:
        return aten.transpose.int(child, *args)
    if packet is aten.t:
        return aten.t.default(child)
    if packet in (aten.split, aten.split_with_sizes) and step.index is not None:
        return _scatter_split(step, parent, child)
    if packet is aten.unbind and step.index is not None:
        dim = args[0] if args else 0
        return aten.select_scatter.default(parent, child, dim, step.index)
    msg = (
        f"a tensor made by the view op {step.func} is mutated in place; Kiln's "
        "functionalization pass cannot write through that view. Mutate a clone instead."
    )
    raise UnsupportedMutation(msg)


def _scatter_split(step: ViewStep, parent: torch.Tensor, child: torch.Tensor) -> torch.Tensor:
    assert step.index is not None
    dim = step.args[1] if len(step.args) > 1 else 0
    dim %= parent.dim()
    length = parent.shape[dim]
    if step.func.overloadpacket is aten.split:
        size = int(step.args[0])
        sizes = [min(size, length - s) for s in range(0, length, size)]
    else:
        sizes = list(step.args[0])
    start = sum(sizes[: step.index])
    return aten.slice_scatter.default(parent, child, dim, start, start + sizes[step.index], 1)
