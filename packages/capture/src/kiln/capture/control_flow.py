"""``torch.cond`` and ``torch.while_loop`` as Kiln's own higher-order graph nodes.

Each function argument (``true_fn`` and ``false_fn``; ``cond_fn`` and ``body_fn``) is traced
by capture's tracer on the operands' values, inline, and the ops it recorded are copied out
into a torch-level subgraph (:class:`fx.GraphModule`), then rolled back. Tensors a function
reads from outside (closures, module parameters, globals) are the graph nodes or inputs that
hold them; they become extra inputs of every subgraph, after the operands, so all the
subgraphs of one call take the same arguments. The call is one node whose target
(:class:`CondCall`, :class:`WhileLoopCall`) holds the subgraphs, under
``kiln_cond``/``kiln_while_loop``: on real tensors it runs the branch the predicate picks (the
``eager`` backend), on capture's fakes it gives the outputs' metadata, and autograd_aot reads
the subgraphs to trace them to ATen (``kiln.autograd_aot.control_flow``).

A predicate that is a Python constant picks its branch while tracing, as torch's does in
eager. What the subgraphs cannot express is a ``control_flow`` graph break (the frame runs
torch's function, which raises torch's own error where the call is wrong): a side effect in a
function, outputs that are not tensors or that alias an input or each other, branches whose
outputs differ in shape, dtype or device, a loop body that changes its carried values'
metadata.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import fx

from kiln.capture import dispatch, subgraphs, torch_calls
from kiln.capture.autograd_function import TraceState
from kiln.capture.breaks.reasons import unsupported
from kiln.capture.errors import Unsupported
from kiln.capture.meta import is_fake, storage_key
from kiln.capture.values.base import ConstantValue, Value
from kiln.capture.values.containers import ListValue, TupleValue
from kiln.capture.values.tensor import TensorValue

if TYPE_CHECKING:
    from kiln.capture.tracer import Tracer

__all__ = ["CondCall", "WhileLoopCall", "call"]

_KIND = "control_flow"


class CondCall:
    """The target of one ``torch.cond`` node: ``(pred, *operands, *free) -> tuple``.

    ``kiln_cond`` holds the branches: graphs, or what a backend compiled them into. A class
    rather than a closure, so that it prints as ``kiln.cond`` (fallback counters and logs key
    by the printed target) and the graph's code names it ``kiln_cond``.
    """

    __name__ = "kiln_cond"

    def __init__(self, true_fn: Callable[..., Any], false_fn: Callable[..., Any]) -> None:
        self.kiln_cond = (true_fn, false_fn)
        self.__qualname__ = f"kiln_cond.{_digest(true_fn, false_fn)}"

    def __repr__(self) -> str:
        return "kiln.cond"

    def __call__(self, pred: Any, *args: Any) -> tuple[Any, ...]:
        true_fn, false_fn = self.kiln_cond
        if is_fake(pred):  # capture's trace: the outputs' metadata, from both branches
            return _like_both(true_fn(*args), false_fn(*args))
        _no_meta(pred, *args)
        return _fresh(true_fn(*args) if pred else false_fn(*args), args)


class WhileLoopCall:
    """The target of one ``torch.while_loop`` node: ``(*carried, *free) -> tuple``;
    ``kiln_while_loop`` holds ``(cond_fn, body_fn, number of carried values)``."""

    __name__ = "kiln_while_loop"

    def __init__(
        self, cond_fn: Callable[..., Any], body_fn: Callable[..., Any], carried: int
    ) -> None:
        self.kiln_while_loop = (cond_fn, body_fn, carried)
        self.__qualname__ = f"kiln_while_loop.{carried}.{_digest(cond_fn, body_fn)}"

    def __repr__(self) -> str:
        return "kiln.while_loop"

    def __call__(self, *args: Any) -> tuple[Any, ...]:
        cond_fn, body_fn, carried = self.kiln_while_loop
        values, free = tuple(args[:carried]), args[carried:]
        if any(is_fake(v) for v in values):
            return _like_both(values, body_fn(*values, *free))
        _no_meta(*args)
        # every iteration sees one layout (compiled functions are compiled for one)
        values = tuple(v.contiguous() for v in values)
        while cond_fn(*values, *free)[0]:
            values = tuple(body_fn(*values, *free))
        return _fresh(values, args)


def _digest(*functions: Callable[..., Any]) -> str:
    """What the functions compute, as text equal across processes exactly when their graphs
    are (nested nodes by their own digests): the target's ``__qualname__``, which describes
    it to whatever keys a graph by its targets (an on-disk cache of compiled graphs)."""
    parts = []
    for fn in functions:
        graph = getattr(fn, "graph", None)
        if not isinstance(fn, fx.GraphModule) or graph is None:
            parts.append(repr(fn))
            continue
        parts.append(fn.code)
        parts += [n.target.__qualname__ for n in graph.nodes if isinstance(n.target, _CALLS)]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def _no_meta(*args: Any) -> None:
    """Refuse meta tensors (a backend asking for the result's layout): the branches may be
    compiled kernels, which read and write memory."""
    if any(isinstance(a, torch.Tensor) and a.device.type == "meta" for a in args):
        raise NotImplementedError("torch.cond and torch.while_loop pick a branch by value")


def _fresh(outputs: Sequence[torch.Tensor], args: Sequence[Any]) -> tuple[Any, ...]:
    """The outputs, each an argument among them cloned: the node makes new tensors, as its
    fakes say (a loop that never ran returns its carried values; a contiguous copy, as the
    body's outputs are in compiled graphs)."""
    return tuple(
        o.clone(memory_format=torch.contiguous_format) if any(o is a for a in args) else o
        for o in outputs
    )


def _like_both(first: Sequence[torch.Tensor], second: Sequence[torch.Tensor]) -> tuple[Any, ...]:
    """New fakes like ``first``'s, requiring grad where either side's does (the branch that
    runs decides at run time)."""
    return tuple(
        (a if a.requires_grad or not b.requires_grad else b).clone()
        for a, b in zip(first, second, strict=True)
    )


_CALLS = (CondCall, WhileLoopCall)


@dataclasses.dataclass
class _Traced:
    """One function traced on the operands: its subgraph and the outer nodes it reads."""

    gm: fx.GraphModule
    free: list[TensorValue]
    outputs: list[TensorValue]
    kind: type  # the output's container: TensorValue, TupleValue or ListValue


def call(tr: Tracer, fn: Any, args: list[Value], kwargs: dict[str, Value]) -> Value:
    """``torch.cond(...)`` or ``torch.while_loop(...)`` as one node of the graph."""
    if fn.__name__ == "cond":
        return _cond(tr, *_bind(args, kwargs, ("pred", "true_fn", "false_fn", "operands")))
    return _while_loop(tr, *_bind(args, kwargs, ("cond_fn", "body_fn", "carried_inputs")))


def _bind(args: list[Value], kwargs: dict[str, Value], names: tuple[str, ...]) -> list[Value]:
    bound = dict(zip(names, args, strict=False))
    if len(args) > len(names) or set(kwargs) - set(names) or set(bound) & set(kwargs):
        raise unsupported(_KIND, "unexpected arguments")
    bound.update(kwargs)
    if names[-1] == "operands":
        bound.setdefault("operands", TupleValue([]))
    if set(bound) != set(names):
        raise unsupported(_KIND, "missing arguments")
    return [bound[n] for n in names]


def _tensors(v: Value, what: str) -> list[TensorValue]:
    """The tensors of a flat tuple or list (torch.cond's operands, while_loop's carried)."""
    if isinstance(v, ConstantValue) and v.value in ((), []):
        return []
    items = v.items if isinstance(v, (TupleValue, ListValue)) else None
    if items is None or not all(isinstance(i, TensorValue) for i in items):
        raise unsupported(_KIND, f"{what} must be a tuple or list of tensors")
    return list(items)  # type: ignore[arg-type]


def _cond(tr: Tracer, pred: Value, true_fn: Value, false_fn: Value, operands: Value) -> Value:
    ops = _tensors(operands, "torch.cond's operands")
    if isinstance(pred, ConstantValue) and isinstance(pred.value, (bool, int, float)):
        return dispatch.call(tr, true_fn if pred.value else false_fn, list(ops), {})
    if not isinstance(pred, TensorValue) or pred.fake.numel() != 1:
        raise unsupported(_KIND, "torch.cond's predicate must be a one-element tensor or a bool")
    first = _trace(tr, true_fn, ops, [], "torch.cond's true_fn")
    second = _trace(tr, false_fn, ops, first.free, "torch.cond's false_fn")
    if first.kind is not second.kind or not _same_meta(first.outputs, second.outputs):
        raise unsupported(_KIND, "torch.cond's branches return tensors of different metadata")
    free = _widen(first, second)
    target = CondCall(first.gm, second.gm)
    args: list[Value] = [pred, *ops, *free]
    out = torch_calls.call_function(tr, target, args, {})
    return _rebuild(out, first.kind)


def _while_loop(tr: Tracer, cond_fn: Value, body_fn: Value, carried: Value) -> Value:
    values = _tensors(carried, "torch.while_loop's carried_inputs")
    test = _trace(tr, cond_fn, values, [], "torch.while_loop's cond_fn")
    if test.kind is not TensorValue or test.outputs[0].fake.numel() != 1:
        raise unsupported(_KIND, "torch.while_loop's cond_fn must return a one-element tensor")
    body = _trace(tr, body_fn, values, test.free, "torch.while_loop's body_fn")
    if (body.kind is TensorValue and len(values) > 1) or not _same_meta(values, body.outputs):
        raise unsupported(_KIND, "torch.while_loop's body_fn changes its carried values' metadata")
    free = _widen(test, body)
    target = WhileLoopCall(test.gm, body.gm, len(values))
    out = torch_calls.call_function(tr, target, [*values, *free], {})
    return _rebuild(out, body.kind)  # the body's structure, as torch's returns


def _same_meta(a: Sequence[TensorValue], b: Sequence[TensorValue]) -> bool:
    def meta(t: TensorValue) -> tuple[Any, ...]:
        return (tuple(t.fake.shape), t.fake.dtype, t.fake.device)

    return len(a) == len(b) and all(meta(x) == meta(y) for x, y in zip(a, b, strict=True))


def _rebuild(out: Value, kind: type) -> Value:
    assert isinstance(out, TupleValue)
    if kind is TensorValue:
        return out.items[0]
    return ListValue(list(out.items)) if kind is ListValue else TupleValue(list(out.items))


def _trace(
    tr: Tracer, fn: Value, operands: list[TensorValue], known: list[TensorValue], what: str
) -> _Traced:
    """Trace ``fn(*operands)`` into a subgraph taking ``(*operands, *known, *more)``, where
    ``more`` are the outer nodes it reads besides; the main graph is left as it was (inputs
    it found stay, as a rollback leaves them)."""
    cp = tr.checkpoint()
    before = TraceState(tr)
    versions = {n: n.meta["val"]._version for n in cp.nodes if _is_tensor(n.meta.get("val"))}
    grad_mode = torch.is_grad_enabled()
    try:
        out = dispatch.call(tr, fn, list(operands), {})
        before.check(tr, what, kind=_KIND)
    except Unsupported as e:
        if e.kind == _KIND:
            raise
        raise unsupported(_KIND, f"{what}: {e.kind}: {e.explanation}") from e
    finally:
        torch._C._set_grad_enabled(grad_mode)
    kind: type = type(out)
    items = [out] if isinstance(out, TensorValue) else getattr(out, "items", None)
    if kind not in (TensorValue, TupleValue, ListValue) or not items:
        raise unsupported(_KIND, f"{what} must return a tensor or a tuple or list of tensors")
    if not all(isinstance(i, TensorValue) for i in items):
        raise unsupported(_KIND, f"{what} must return only tensors")
    outputs: list[TensorValue] = list(items)
    entries, ends = [o.node for o in operands], [o.node for o in outputs]
    gm, free = subgraphs.cut(tr, cp.nodes, entries, ends, [v.node for v in known])
    read = [t for t in [*operands, *known, *free] if _is_tensor(t.fake)]
    if _aliased(outputs, read):
        raise unsupported(_KIND, f"{what} returns an input, a view of one or a tensor twice")
    if any(t.fake._version != versions.get(t.node, 0) for t in read):
        raise unsupported(_KIND, f"{what} changes a tensor it reads in place")
    tr.rollback(cp)
    return _Traced(gm, free, outputs, kind)


def _is_tensor(v: Any) -> bool:
    return isinstance(v, torch.Tensor)


def _aliased(outputs: list[TensorValue], inputs: list[TensorValue]) -> bool:
    """Whether an output shares memory with an input or another output (torch's subgraphs
    refuse that: the node's results are new tensors)."""
    taken = {storage_key(t.fake) for t in inputs}
    for out in outputs:
        key = storage_key(out.fake)
        if key in taken:
            return True
        taken.add(key)
    return False


def _widen(first: _Traced, second: _Traced) -> list[TensorValue]:
    """Every outer node either function reads; ``first``'s subgraph gets inputs for those
    only ``second`` reads (``second``'s already takes ``first``'s, in front of its own)."""
    graph = first.gm.graph
    nodes = list(graph.nodes)
    last = next((n for n in reversed(nodes) if n.op == "placeholder"), None)
    for value in second.free:  # after the last input, or first of all where there is none
        where = graph.inserting_after(last) if last else graph.inserting_before(nodes[0])
        with where:
            last = graph.placeholder(f"unused_{len(graph.nodes)}")
        last.meta["val"] = value.fake
    first.gm.recompile()
    return first.free + second.free
