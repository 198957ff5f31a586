"""Values of tensors the program computes from constants alone.

Capture traces without data, so the truth of a tensor is normally a data-dependent branch.
A tensor whose every ancestor in the graph is an op on constants (``torch.tensor(0.0)``,
``full_like`` of one, comparisons of those: the argument checks ``torch.distributions``
runs on the parameters it is built with) has the same value on every call of the graph,
whose constants are its own. :func:`value_of` computes such a value for real, on the CPU,
so the branch is answered while tracing.

Refused (None): an ancestor that is an input, a module attribute, a call that is not a torch
op, a random op (one ATen tagged ``nondeterministic_seeded``), a storage some op of the
graph writes in place, and anything large.
"""

from __future__ import annotations

import operator
from typing import TYPE_CHECKING, Any

import torch
from torch import fx
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from kiln.capture import torch_functions
from kiln.capture.meta import storage_key
from kiln.capture.values.tensor import TensorValue

if TYPE_CHECKING:
    from kiln.capture.tracer import Tracer

__all__ = ["value_of"]

_MAX_NODES = 200
_MAX_NUMEL = 4096
_CPU = torch.device("cpu")
_IN_PLACE_OPERATORS = frozenset(
    {
        operator.setitem, operator.iadd, operator.isub, operator.imul, operator.itruediv,
        operator.ifloordiv, operator.imod, operator.ipow, operator.iand, operator.ior,
        operator.ixor, operator.ilshift, operator.irshift, operator.imatmul,
    }
)  # fmt: skip
_PURE_OPERATORS = frozenset(
    v for k, v in vars(operator).items() if callable(v) and not k.startswith(("i", "_", "set"))
)


class _Random(Exception):
    pass


class _NoRandom(TorchDispatchMode):
    """Refuses ops that draw random numbers (their values differ on every call)."""

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        if torch.Tag.nondeterministic_seeded in getattr(func, "tags", ()):
            raise _Random
        return func(*args, **(kwargs or {}))


def value_of(tr: Tracer, v: TensorValue) -> torch.Tensor | None:
    """The real value of ``v`` if the graph computes it from constants alone, else None."""
    ancestors = _ancestors(v.node)
    if ancestors is None or any(not _pure(n) for n in ancestors):
        return None
    keys = {storage_key(t) for n in ancestors for t in _tensors(n.meta.get("val"))}
    if keys & _written_storages(v.node.graph):
        return None
    env: dict[fx.Node, Any] = {}
    try:
        with _disable_current_modes(), torch.no_grad(), _NoRandom():
            for n in ancestors:
                args, kwargs = fx.node.map_arg((n.args, n.kwargs), lambda a: env[a])
                args, kwargs = pytree.tree_map(_on_cpu, (args, dict(kwargs)))
                if "device" in kwargs:  # also given as a string
                    kwargs["device"] = _CPU
                if n.op == "call_method":
                    env[n] = getattr(args[0], str(n.target))(*args[1:], **kwargs)
                else:
                    env[n] = n.target(*args, **kwargs)  # type: ignore[operator]
    except Exception:  # a random op, or anything the CPU does not run: not known
        return None
    out = env[v.node]
    return out if isinstance(out, torch.Tensor) else None


def _ancestors(node: fx.Node) -> list[fx.Node] | None:
    """``node`` and the nodes it depends on, in graph order; None past the size limit."""
    seen: set[fx.Node] = set()
    todo = [node]
    while todo:
        n = todo.pop()
        if n in seen:
            continue
        seen.add(n)
        if len(seen) > _MAX_NODES:
            return None
        todo.extend(n.all_input_nodes)
    return [n for n in node.graph.nodes if n in seen]


def _pure(n: fx.Node) -> bool:
    if any(t.numel() > _MAX_NUMEL for t in _tensors(n.meta.get("val"))):
        return False
    if n.op == "call_method":
        name = str(n.target)
        return not name.endswith("_") or name.startswith("__")
    if n.op != "call_function" or "out" in n.kwargs or n.kwargs.get("inplace"):
        return False
    target = n.target
    if target in _PURE_OPERATORS:
        return True
    name = getattr(target, "__name__", "")
    return torch_functions.is_torch_callable(target) and not (
        name.endswith("_") and not name.startswith("__")
    )


def _written_storages(graph: fx.Graph) -> set[int]:
    """The storages the ops of ``graph`` write in place."""
    keys: set[int] = set()
    for n in graph.nodes:
        if n.op not in ("call_method", "call_function"):
            continue
        name = str(n.target) if n.op == "call_method" else getattr(n.target, "__name__", "")
        in_place = (name.endswith("_") and not name.startswith("__")) or (
            n.op == "call_function" and (n.target in _IN_PLACE_OPERATORS or n.kwargs.get("inplace"))
        )
        written = [n.kwargs["out"]] if "out" in n.kwargs else []
        if in_place and n.args:
            written.append(n.args[0])
        for w in written:
            for leaf in pytree.tree_leaves(w):
                if isinstance(leaf, fx.Node):
                    keys.update(storage_key(t) for t in _tensors(leaf.meta.get("val")))
    return keys


def _tensors(val: Any) -> list[torch.Tensor]:
    return [t for t in pytree.tree_leaves(val) if isinstance(t, torch.Tensor)]


def _on_cpu(x: Any) -> Any:
    return _CPU if isinstance(x, torch.device) else x
