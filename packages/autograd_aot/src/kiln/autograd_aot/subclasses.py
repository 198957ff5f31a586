"""``__torch_dispatch__`` wrapper subclasses (float8- and quantized-style tensors) desugared.

A graph input that is a wrapper subclass with the flatten protocol (``__tensor_flatten__``
returning the names of its inner tensors and a context, ``__tensor_unflatten__(inner, ctx,
outer_size, outer_stride)`` rebuilding it) is compiled as its inner tensors: the graph is run
once on wrappers rebuilt around the inner tensors' fakes under :class:`AtenTracer`, which
steps aside for them (a mode's ``NotImplemented``), so the subclass's ``__torch_dispatch__``
runs and only its ops on the inner tensors are recorded. An inner tensor may itself be a
wrapper (a float8-style tensor around a logging or another scaled one): flattening recurses
to plain tensors (a :class:`_Tree` per value), the rebuilt wrappers nest the same way, and
the tracer steps aside at every level, so each level's ``__torch_dispatch__`` runs in turn
and only ATen ops on the innermost tensors are recorded. That plain ATen graph is compiled as
any other (gradients of plain inputs included); each call flattens its wrapper inputs and
rebuilds the wrapper outputs with ``__tensor_unflatten__``, innermost level first.

One compiled program serves the calls whose trees (each level's type, inner names, context
and outer sizes) and plain tensors' metadata equal those it was traced with; another is
traced for others, a new nesting included. In training the forward is that program and the
backward is traced, on first use, from eager's own autograd over wrappers of the inner fakes
(the graph run again with the inputs that need gradients as leaves, and
``torch.autograd.grad`` of its outputs): the ATen ops of the outer tensors' backward, which
differentiating the program over the inner tensors would not give. As in AOTAutograd,
the autograd function takes and returns the outer tensors (wrappers rebuilt inside it), so a
wrapper output that requires grad has eager's ``grad_fn`` on the outer tensor and its inner
tensors need none; its gradient, plain or a wrapper, is flattened into the backward (one
traced per kind of gradient). The outputs eager would not differentiate (found the same way)
are marked so; an input the backward reads that was written in place since the forward makes
it raise, as eager's saved tensors do.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch
from torch import fx
from torch.utils import _pytree as pytree

from kiln.capture import counters

__all__ = ["SubclassProgram", "has_wrapper_inputs", "is_dispatch_wrapper", "is_wrapper_type"]

log = logging.getLogger(__name__)

_Key = tuple[Any, ...]


def is_wrapper_type(cls: type) -> bool:
    """A tensor class that overrides ``__torch_dispatch__`` and has the flatten protocol."""
    return (
        issubclass(cls, torch.Tensor)
        and getattr(cls, "__torch_dispatch__", None) is not torch.Tensor.__torch_dispatch__
        and hasattr(cls, "__tensor_flatten__")
        and hasattr(cls, "__tensor_unflatten__")
    )


def is_dispatch_wrapper(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and is_wrapper_type(type(t))


def has_wrapper_inputs(example_inputs: Sequence[Any]) -> bool:
    return any(is_dispatch_wrapper(t) for t in example_inputs)


class _Tree(NamedTuple):
    """How one value comes back from plain tensors: a plain tensor (``cls`` None, one tensor),
    a constant (``cls`` None, none), or a wrapper that ``__tensor_unflatten__`` rebuilds from
    its inner tensors' trees, each of which may be a wrapper again (rebuilt innermost first)."""

    cls: type | None
    leaves: int  # how many plain tensors
    names: tuple[str, ...] = ()
    ctx: Any = None
    size: tuple[int, ...] = ()
    stride: tuple[int, ...] = ()
    children: tuple[_Tree, ...] = ()
    constant: Any = None

    @property
    def tensor(self) -> bool:
        return self.cls is not None or self.leaves == 1


_PLAIN = _Tree(None, 1)


def _flatten(x: Any) -> tuple[_Tree, list[torch.Tensor]]:
    """``x``'s tree and its plain tensors, a wrapper's flattened through every level."""
    if not is_dispatch_wrapper(x):
        return (_PLAIN, [x]) if isinstance(x, torch.Tensor) else (_Tree(None, 0, constant=x), [])
    names, ctx = x.__tensor_flatten__()
    children, flat = [], []
    for name in names:
        tree, inner = _flatten(getattr(x, name))
        children.append(tree)
        flat += inner
    size, stride = tuple(x.shape), tuple(x.stride())
    return _Tree(type(x), len(flat), tuple(names), ctx, size, stride, tuple(children)), flat


def _build(tree: _Tree, flat: Sequence[torch.Tensor]) -> Any:
    if tree.cls is None:
        return flat[0] if tree.leaves else tree.constant
    inner, at = {}, 0
    for name, child in zip(tree.names, tree.children, strict=True):
        inner[name] = _build(child, flat[at : at + child.leaves])
        at += child.leaves
    return tree.cls.__tensor_unflatten__(inner, tree.ctx, tree.size, tree.stride)  # type: ignore[attr-defined]


def _key(tree: _Tree, flat: Sequence[torch.Tensor]) -> _Key:
    """What a program traced over ``flat`` assumed: each level's type, names, context and
    outer metadata, and the plain tensors' metadata."""
    return (tree, *(_meta(t) for t in flat))


def _meta(t: torch.Tensor) -> tuple[Any, ...]:
    return (t.dtype, t.device, tuple(t.shape), t.stride(), t.requires_grad)


def _flat_inputs(args: Sequence[Any]) -> tuple[list[torch.Tensor], _Key]:
    """The tensors a program over inner tensors takes, and what it assumed of them."""
    flat: list[torch.Tensor] = []
    key: list[Any] = []
    for a in args:
        tree, inner = _flatten(a)
        flat += inner
        if tree.cls is not None:
            key.append(_key(tree, inner))
    return flat, tuple(key)


def _flat_all(values: Sequence[Any]) -> list[torch.Tensor]:
    return [t for v in values for t in _flatten(v)[1]]


def _build_all(trees: Sequence[_Tree], flat: Sequence[torch.Tensor]) -> list[Any]:
    built, at = [], 0
    for tree in trees:
        built.append(_build(tree, flat[at : at + tree.leaves]))
        at += tree.leaves
    return built


class _Entry:
    def __init__(
        self,
        compiled: Callable[..., Any],
        rebuilds: list[_Tree],
        spec: Any,
        layout: list[_Tree],
    ) -> None:
        self.compiled = compiled
        self.rebuilds = rebuilds
        self.spec = spec
        self.layout = layout
        self.backwards: list[tuple[Any, Any]] = []  # per `wants` and kinds of gradients
        self.diffs: dict[tuple[int, ...], tuple[bool, ...]] = {}  # per `wants`: tensor outputs

    def run(self, flat: list[torch.Tensor]) -> Any:
        outs = _build_all(self.rebuilds, list(self.compiled(*flat)))
        return pytree.tree_unflatten(outs, self.spec)


TraceFlat = Callable[[Callable[..., Any], list[torch.Tensor]], fx.GraphModule]
CompileFlat = Callable[[fx.GraphModule, list[torch.Tensor]], Callable[..., Any]]


class SubclassProgram:
    """``gm`` compiled over the inner tensors of its wrapper subclass inputs; call it like
    ``gm``. ``trace_flat(fn, inner_reals)`` traces ``fn`` into an ATen graph,
    ``compile_flat(graph, inner_reals)`` compiles it (autograd_aot's own pipeline)."""

    def __init__(
        self, gm: fx.GraphModule, trace_flat: TraceFlat, compile_flat: CompileFlat
    ) -> None:
        self.gm = gm
        self.trace_flat = trace_flat
        self.compile_flat = compile_flat
        self.entries: list[tuple[_Key, _Entry]] = []

    def __call__(self, *args: Any) -> Any:
        flat, key = _flat_inputs(args)
        entry = next((e for k, e in self.entries if _same(k, key)), None)
        if entry is None:
            entry = self._compile(args, flat)
            self.entries.append((key, entry))
        if not torch.is_grad_enabled() or not any(t.requires_grad for t in flat + _outer(args)):
            return entry.run(flat)
        return _train(self, entry, args, flat)

    def _compile(self, args: Sequence[Any], flat: list[torch.Tensor]) -> _Entry:
        layout = [_flatten(a)[0] for a in args]
        found: dict[str, Any] = {}

        def run(*inner: torch.Tensor) -> list[torch.Tensor]:
            with torch.no_grad():
                out = self.gm(*_build_all(layout, inner))
            leaves, spec = pytree.tree_flatten(out)
            found["rebuilds"] = [_flatten(x)[0] for x in leaves]
            found["spec"] = spec
            return _flat_all(leaves)

        graph = self.trace_flat(run, flat)
        counters.bump("autograd_aot", "subclass_programs")
        log.debug("desugared wrapper subclass inputs:\n%s", graph.code)
        compiled = self.compile_flat(graph, flat)
        rebuilds = found["rebuilds"]
        return _Entry(compiled, rebuilds, found["spec"], layout)


def _outer(args: Sequence[Any]) -> list[torch.Tensor]:
    return [a for a in args if is_dispatch_wrapper(a)]


def _train(
    program: SubclassProgram, entry: _Entry, args: Sequence[Any], flat: list[torch.Tensor]
) -> Any:
    """Autograd over the outer tensors, as eager's: the compiled forward, and a backward traced
    from eager's own autograd over wrappers of the inner fakes (its forward recomputed)."""
    tensors = [i for i, r in enumerate(entry.rebuilds) if r.tensor]
    wants = tuple(i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.requires_grad)
    if wants not in entry.diffs:
        entry.diffs[wants] = _differentiable(program, entry, wants, flat)
    leaves: list[Any] = []  # every output, filled by the forward; the tensors replaced
    fn_outs = _OuterFunction.apply(
        program,
        entry,
        wants,
        (list(args), leaves, entry.diffs[wants]),
        *[a for a in args if isinstance(a, torch.Tensor)],
    )
    for i, o in zip(tensors, fn_outs, strict=True):
        leaves[i] = o
    return pytree.tree_unflatten(leaves, entry.spec)


class _OuterFunction(torch.autograd.Function):
    """The tensor outputs as functions of the graph's tensor inputs, wrappers included."""

    @staticmethod
    def forward(ctx: Any, program: Any, entry: Any, wants: Any, given: Any, *tensors: Any) -> Any:
        args, leaves, diff = given
        ctx.program, ctx.entry, ctx.wants, ctx.args, ctx.diff = program, entry, wants, args, diff
        flat = _flat_inputs(args)[0]
        ctx.versions = [(t, t._version) for t in flat]  # what the forward read, as autograd saves
        ctx.set_materialize_grads(False)  # an unused output adds nothing, as in eager
        outs = pytree.tree_leaves(entry.run(flat))
        leaves.extend(outs)
        results = tuple(
            o if r.cls is not None else o.detach()
            for o, r in zip(outs, entry.rebuilds, strict=True)
            if r.tensor
        )
        ctx.mark_non_differentiable(*(o for o, d in zip(results, diff, strict=True) if not d))
        return results

    @staticmethod
    def backward(ctx: Any, *grad_outputs: Any) -> Any:
        args, wants = ctx.args, ctx.wants
        flat = _flat_inputs(args)[0]
        given = [g for g, d in zip(grad_outputs, ctx.diff, strict=True) if d]  # the backward's
        which = tuple(i for i, g in enumerate(given) if g is not None)
        grads: list[torch.Tensor] = [given[i] for i in which]
        if not grads:
            return (None,) * (4 + sum(isinstance(a, torch.Tensor) for a in args))
        key = (wants, which, tuple(_flat_inputs([g])[1] for g in grads))
        bw = next((b for k, b in ctx.entry.backwards if _same(k, key)), None)
        if bw is None:
            bw = _trace_backward(ctx.program, ctx.entry, wants, which, flat, grads)
            ctx.entry.backwards.append((key, bw))
        run, rebuilds, reads = bw
        for t, version in (ctx.versions[i] for i in reads):
            if t._version != version:
                msg = (
                    "one of the variables needed for gradient computation has been modified by "
                    f"an inplace operation: a {tuple(t.shape)} input of a compiled program over "
                    f"wrapper subclasses is at version {t._version}; expected version {version}"
                )
                raise RuntimeError(msg)
        results = list(run(*flat, *_flat_inputs(grads)[0]))
        out: list[Any] = [None] * len(args)
        for i, g in zip(wants, _build_all(rebuilds, results), strict=True):
            out[i] = g
        tensor_positions = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
        return (None, None, None, None, *[out[i] for i in tensor_positions])


def _trace_backward(
    program: SubclassProgram,
    entry: _Entry,
    wants: tuple[int, ...],
    which: tuple[int, ...],
    flat: list[torch.Tensor],
    grads: list[torch.Tensor],
) -> Any:
    """The backward over the flat inputs and the flattened gradients of the ``which``
    differentiable outputs (a wrapper gradient rebuilt around its inner tensors)."""
    n, grad_layout, flat_grads = len(flat), [_flatten(g)[0] for g in grads], _flat_all(grads)
    found: dict[str, Any] = {}

    def backward(*inner: torch.Tensor) -> list[torch.Tensor]:
        with torch.enable_grad():
            sources, outs = _run_for_grad(program, entry, wants, inner[:n])
            outs = [o for o, d in zip(outs, entry.diffs[wants], strict=True) if d]
            outs = [outs[i] for i in which]
            given = _build_all(grad_layout, inner[n:])
            got = torch.autograd.grad(outs, sources, given, allow_unused=True)
        found["rebuilds"] = [_flatten(g)[0] for g in got]
        return _flat_all(got)

    graph = program.trace_flat(backward, [*flat, *flat_grads])
    log.debug("backward over wrapper subclass inputs:\n%s", graph.code)
    with torch.no_grad():
        compiled = program.compile_flat(graph, [t.detach() for t in [*flat, *flat_grads]])
    placeholders = [p for p in graph.graph.nodes if p.op == "placeholder"][:n]
    reads = [i for i, p in enumerate(placeholders) if p.users]  # the backward's saved inputs
    return compiled, found["rebuilds"], reads


def _run_for_grad(
    program: SubclassProgram, entry: _Entry, wants: tuple[int, ...], inner: Sequence[torch.Tensor]
) -> tuple[list[Any], list[torch.Tensor]]:
    """The graph run as eager would, ``wants`` inputs as leaves that require grad: those
    leaves, and the tensor outputs (carrying eager's ``requires_grad``)."""
    rebuilt = _build_all(entry.layout, inner)
    for i in wants:
        a = rebuilt[i]
        rebuilt[i] = a.requires_grad_() if is_dispatch_wrapper(a) else a.detach().requires_grad_()
    outs = pytree.tree_leaves(program.gm(*rebuilt))
    tensors = [o for o, r in zip(outs, entry.rebuilds, strict=True) if r.tensor]
    return [rebuilt[i] for i in wants], tensors


def _differentiable(
    program: SubclassProgram, entry: _Entry, wants: tuple[int, ...], flat: list[torch.Tensor]
) -> tuple[bool, ...]:
    """Which tensor outputs eager's autograd would make require grad (traced over fakes)."""
    found: dict[str, tuple[bool, ...]] = {}

    def probe(*inner: torch.Tensor) -> list[torch.Tensor]:
        with torch.enable_grad():
            _, outs = _run_for_grad(program, entry, wants, inner)
        found["diff"] = tuple(o.requires_grad for o in outs)
        return _flat_inputs([o.detach() for o in outs])[0]

    program.trace_flat(probe, flat)
    return found["diff"]


def _same(a: _Key, b: _Key) -> bool:
    try:
        return bool(a == b)
    except Exception:  # a context that does not compare (tensors): never reused
        return False
