"""``torch.cond`` and ``torch.while_loop`` nodes (capture's ``control_flow``) in ATen graphs.

Capture's node holds torch-level subgraphs. The torch-level graph is run node by node
(:class:`ControlFlowInterpreter`); at such a node each subgraph is traced on its own into a
functional ATen graph (a fresh :class:`AtenTracer` over fresh fakes with the operands'
metadata, the same decomposition table), and the outer trace records one node whose target
(capture's ``CondCall`` or ``WhileLoopCall``) holds the ATen graphs and picks at run
time. Branch outputs are fresh contiguous tensors (an operand returned as it is, or a view,
is copied), so both branches give the layout the node's fakes promise.

Gradients: the node is an ``autograd.Function`` (:class:`_Cond`) during the trace, so autograd
calls its backward when the joint graph is traced; that records a second cond node over the
branches' backward graphs, each the derivative of its branch (traced with autograd on fresh
leaves: the branch's forward runs again inside the backward, so the forward saves only the
predicate and the operands). The backward picks the branch the forward took, as it reads the
same predicate. As the backward runs the branch again, a differentiated branch that draws
random numbers raises :class:`AotError` (its backward would draw others: a new dropout mask).
``torch.while_loop`` is forward only: a loop whose carried values require grad
raises :class:`AotError` (the graph then runs eagerly, with a warning).

Before a graph holding such nodes is handed to the backend, :func:`compile_branches` compiles
every branch graph with the same compiler (innermost first) and swaps the node's target for one
holding the compiled branches: a backend that cannot lower the node calls it from its wrapper
(loopir's fallback calls), and it runs the compiled branch the predicate picks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import fx
from torch.utils._python_dispatch import _disable_current_modes, _get_current_dispatch_mode

from kiln.autograd_aot.errors import AotError
from kiln.autograd_aot.regions import MarkingInterpreter, call_marked
from kiln.autograd_aot.trace import AtenTracer
from kiln.capture.control_flow import CondCall, WhileLoopCall
from kiln.capture.meta import FakeTensor

__all__ = ["ControlFlowInterpreter", "compile_branches", "has_control_flow"]

Compiler = Callable[[fx.GraphModule, list[torch.Tensor]], Callable[..., Any]]


def _branches(target: Any) -> tuple[Any, ...] | None:
    if isinstance(target, CondCall):
        return target.kiln_cond
    if isinstance(target, WhileLoopCall):
        return target.kiln_while_loop
    return None


def has_control_flow(gm: torch.nn.Module) -> bool:
    """Whether a torch-level graph holds a ``torch.cond`` or ``torch.while_loop`` node."""
    graph = getattr(gm, "graph", None)
    return isinstance(graph, fx.Graph) and any(
        n.op == "call_function" and _branches(n.target) is not None for n in graph.nodes
    )


class ControlFlowInterpreter(MarkingInterpreter):
    """Runs a torch-level graph node by node; under an :class:`AtenTracer` a control-flow
    node becomes one ATen node over traced branch graphs (elsewhere, on real tensors, its
    target runs as it is)."""

    def call_function(self, target: Any, args: Any, kwargs: dict[str, Any]) -> Any:
        tracer = _get_current_dispatch_mode()
        if not isinstance(tracer, AtenTracer) or _branches(target) is None:
            return super().call_function(target, args, kwargs)
        if isinstance(target, CondCall):
            pred, *operands = args
            return _Cond.apply(tracer, target.kiln_cond, pred, *operands)
        return _while_loop(tracer, target.kiln_while_loop, args)


def _run(gm: fx.GraphModule, args: Sequence[Any]) -> list[torch.Tensor]:
    return list(call_marked(gm, {}, args, ControlFlowInterpreter))


def _fake(like: torch.Tensor, requires_grad: bool = False, contiguous: bool = False) -> FakeTensor:
    """A new fake with ``like``'s metadata (a graph input of a branch, or a node's output),
    laid out contiguously with ``contiguous``."""
    stride = torch.empty(like.shape, device="meta").stride() if contiguous else like.stride()
    with _disable_current_modes():
        meta = torch.empty_strided(like.shape, stride, dtype=like.dtype, device="meta")
    return FakeTensor(meta, like.device, requires_grad=requires_grad)


def _aten_graph(
    outer: AtenTracer,
    fn: Callable[..., Sequence[torch.Tensor]],
    inputs: Sequence[torch.Tensor],
    needs_grad: Sequence[bool] = (),
    contiguous: int = 0,
) -> fx.GraphModule:
    """``fn`` traced on fresh fakes like ``inputs`` (the first ``contiguous`` of them laid out
    contiguously) into its own functional ATen graph, with ``outer``'s table and outside
    ``outer`` (whose graph must not see the branch's ops)."""
    with _disable_current_modes():
        tracer = AtenTracer(outer.decompositions)
        fakes = [
            _fake(t, i < len(needs_grad) and needs_grad[i], i < contiguous)
            for i, t in enumerate(inputs)
        ]
        for i, f in enumerate(fakes):
            tracer.placeholder(f, f"arg{i}")
        with tracer:
            outs = [_own(tracer, o) for o in fn(*fakes)]
        if tracer.mutated_inputs():
            msg = "a torch.cond or torch.while_loop function mutates one of its inputs"
            raise AotError(msg)
        return tracer.finish(outs)


def _own(tracer: AtenTracer, t: torch.Tensor) -> torch.Tensor:
    """``t`` as a new contiguous tensor of the branch's own (never a view of an input)."""
    if tracer.input_root(t) is not None or not t.is_contiguous():
        return torch.clone(t, memory_format=torch.contiguous_format)
    return t


def _draws_random(gm: Any) -> bool:
    """Whether an ATen graph, or a branch of one of its control-flow nodes, draws random
    numbers."""
    for node in getattr(gm, "graph", fx.Graph()).nodes:
        if torch.Tag.nondeterministic_seeded in getattr(node.target, "tags", ()):
            return True
        if any(_draws_random(b) for b in (_branches(node.target) or ())[:2]):
            return True
    return False


def _outputs(gm: fx.GraphModule) -> list[torch.Tensor]:
    (out,) = (n.args[0] for n in gm.graph.nodes if n.op == "output")
    return [_fake(n.meta["val"]) for n in out]


class _Cond(torch.autograd.Function):
    """One cond node in the traced graph; its backward one more over the branches'
    derivatives."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, tracer: AtenTracer, branches: tuple[fx.GraphModule, ...], pred: Any, *ops: Any
    ) -> Any:
        graphs = [_aten_graph(tracer, lambda *a, b=b: _run(b, a), ops) for b in branches]
        if any(ctx.needs_input_grad) and any(map(_draws_random, graphs)):
            # the backward runs the branch again: it would draw other numbers (a new mask)
            msg = "a torch.cond branch that draws random numbers, differentiated"
            raise AotError(msg)
        results = tracer.record_call(CondCall(*graphs), [pred, *ops], _outputs(graphs[0]))
        ctx.tracer, ctx.branches, ctx.args, ctx.results = tracer, branches, (pred, *ops), results
        ctx.mark_non_differentiable(*(r for r in results if not r.dtype.is_floating_point))
        return results

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> Any:
        pred, *ops = ctx.args
        needs = list(ctx.needs_input_grad[3:])
        wanted = [i for i, need in enumerate(needs) if need]
        outs = [
            torch.zeros_like(r) if g is None else g for g, r in zip(grads, ctx.results, strict=True)
        ]
        graphs = []
        for branch in ctx.branches:

            def derivative(*args: Any, branch: fx.GraphModule = branch) -> list[torch.Tensor]:
                leaves, tangents = args[: len(ops)], args[len(ops) :]
                with torch.enable_grad():
                    results = _run(branch, leaves)
                    pairs = [
                        (r, t) for r, t in zip(results, tangents, strict=True) if r.requires_grad
                    ]
                    found = (
                        torch.autograd.grad(
                            [r for r, _ in pairs],
                            [leaves[i] for i in wanted],
                            [t for _, t in pairs],
                            allow_unused=True,
                        )
                        if pairs
                        else [None] * len(wanted)
                    )
                return [
                    torch.zeros_like(leaves[i]) if g is None else g
                    for i, g in zip(wanted, found, strict=True)
                ]

            graphs.append(_aten_graph(ctx.tracer, derivative, [*ops, *outs], needs))
        fakes = _outputs(graphs[0])  # contiguous, as _own makes each branch's
        found = iter(ctx.tracer.record_call(CondCall(*graphs), [pred, *ops, *outs], fakes))
        return (None, None, None, *(next(found) if need else None for need in needs))


def _while_loop(tracer: AtenTracer, loop: tuple[Any, ...], args: Sequence[Any]) -> Any:
    test, body, carried = loop
    if torch.is_grad_enabled() and any(a.requires_grad for a in args[:carried]):
        raise AotError("torch.while_loop with carried values that require grad has no backward")
    # the carried values are contiguous in every iteration (the body's outputs are; the node
    # makes the first ones so), so the graphs are traced for that layout
    graphs = [
        _aten_graph(tracer, lambda *a, g=g: _run(g, a), args, contiguous=carried)
        for g in (test, body)
    ]
    results = _outputs(graphs[1])
    target = WhileLoopCall(graphs[0], graphs[1], carried)
    return tracer.record_call(target, args, results)


def compile_branches(gm: fx.GraphModule, compiler: Compiler) -> None:
    """Compile the branch graphs of ``gm``'s control-flow nodes with ``compiler`` (their
    own such nodes first), in place: the nodes' targets run the compiled branches."""
    changed = False
    for node in gm.graph.nodes:
        found = _branches(node.target) if node.op == "call_function" else None
        if found is None or not isinstance(found[0], fx.GraphModule):
            continue
        compiled = [_compiled(g, compiler) for g in found[:2]]
        if isinstance(node.target, CondCall):
            node.target = CondCall(*compiled)
        else:
            node.target = WhileLoopCall(compiled[0], compiled[1], found[2])
        changed = True
    if changed:
        gm.recompile()


def _compiled(gm: fx.GraphModule, compiler: Compiler) -> Callable[..., Any]:
    compile_branches(gm, compiler)
    return compiler(gm, [n.meta["val"] for n in gm.graph.nodes if n.op == "placeholder"])
