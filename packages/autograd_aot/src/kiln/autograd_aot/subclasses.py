"""``__torch_dispatch__`` wrapper subclasses (float8- and quantized-style tensors) desugared.

A graph input that is a wrapper subclass with the flatten protocol (``__tensor_flatten__``
returning the names of its inner tensors and a context, ``__tensor_unflatten__(inner, ctx,
outer_size, outer_stride)`` rebuilding it) is compiled as its inner tensors: the graph is run
once on wrappers rebuilt around the inner tensors' fakes under :class:`AtenTracer`, which
steps aside for them (a mode's ``NotImplemented``), so the subclass's ``__torch_dispatch__``
runs and only its ops on the inner tensors are recorded. That plain ATen graph over the inner
tensors is compiled as any other (gradients of plain inputs included); each call flattens its
wrapper inputs and rebuilds the wrapper outputs with ``__tensor_unflatten__``.

One compiled program serves the calls whose flatten contexts and inner tensors' metadata equal
those it was traced with; another is traced for others. In training the forward is that
program and the backward is traced, on first use, from eager's own autograd over wrappers of
the inner fakes (the graph run again with the inputs that need gradients as leaves, and
``torch.autograd.grad`` of its outputs): the ATen ops of the outer tensors' backward,
which differentiating the program over the inner tensors would not give. As in AOTAutograd,
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
from typing import Any

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


def _flatten(t: torch.Tensor) -> tuple[list[str], Any, list[torch.Tensor]]:
    names, ctx = t.__tensor_flatten__()  # type: ignore[attr-defined]
    inner = [getattr(t, n) for n in names]
    if not all(isinstance(x, torch.Tensor) and not is_dispatch_wrapper(x) for x in inner):
        msg = f"{type(t).__name__}: nested wrapper subclasses are not desugared"
        raise TypeError(msg)
    return list(names), ctx, inner


def _meta(t: torch.Tensor) -> tuple[Any, ...]:
    return (t.dtype, t.device, tuple(t.shape), t.stride(), t.requires_grad)


def _flat_inputs(args: Sequence[Any]) -> tuple[list[torch.Tensor], _Key]:
    """The tensors a program over inner tensors takes, and what it assumed of them."""
    flat: list[torch.Tensor] = []
    key: list[Any] = []
    for a in args:
        if is_dispatch_wrapper(a):
            names, ctx, inner = _flatten(a)
            flat += inner
            key.append((type(a), tuple(names), ctx, *(_meta(x) for x in inner)))
        elif isinstance(a, torch.Tensor):
            flat.append(a)
    return flat, tuple(key)


class _Rebuild:
    """How one output of the graph comes back from the program's flat outputs."""

    def __init__(self, out: Any) -> None:
        self.cls: type | None = None
        self.count, self.tensor = 1, isinstance(out, torch.Tensor)
        self.constant: Any = None
        if is_dispatch_wrapper(out):
            names, ctx, inner = _flatten(out)
            self.cls, self.names, self.ctx = type(out), names, ctx
            self.size, self.stride = tuple(out.shape), out.stride()
            self.count = len(inner)
        elif not isinstance(out, torch.Tensor):
            self.count, self.constant = 0, out

    def flat(self, out: Any) -> list[torch.Tensor]:
        if self.cls is not None:
            return _flatten(out)[2]
        return [out] if self.count else []

    def build(self, flat: Sequence[torch.Tensor]) -> Any:
        if self.cls is None:
            return flat[0] if self.count else self.constant
        inner = dict(zip(self.names, flat, strict=True))
        return self.cls.__tensor_unflatten__(inner, self.ctx, self.size, self.stride)  # type: ignore[attr-defined]


class _Entry:
    def __init__(
        self,
        compiled: Callable[..., Any],
        rebuilds: list[_Rebuild],
        spec: Any,
        layout: list[tuple[Any, int]],
    ) -> None:
        self.compiled = compiled
        self.rebuilds = rebuilds
        self.spec = spec
        self.layout = layout
        self.backwards: list[tuple[Any, Any]] = []  # per `wants` and kinds of gradients
        self.diffs: dict[tuple[int, ...], tuple[bool, ...]] = {}  # per `wants`: tensor outputs

    def run(self, flat: list[torch.Tensor]) -> Any:
        results = list(self.compiled(*flat))
        outs, at = [], 0
        for r in self.rebuilds:
            outs.append(r.build(results[at : at + r.count]))
            at += r.count
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
        try:
            flat, key = _flat_inputs(args)
        except TypeError:  # a wrapper inside a wrapper: not desugared
            return self._as_captured(args)
        entry = next((e for k, e in self.entries if _same(k, key)), None)
        if entry is None:
            entry = self._compile(args, flat)
            self.entries.append((key, entry))
        if not torch.is_grad_enabled() or not any(t.requires_grad for t in flat + _outer(args)):
            return entry.run(flat)
        return _train(self, entry, args, flat)

    def _as_captured(self, args: Sequence[Any]) -> Any:
        counters.bump("autograd_aot", "subclass_graphs_run_as_captured")
        return self.gm(*args)

    def _compile(self, args: Sequence[Any], flat: list[torch.Tensor]) -> _Entry:
        layout = _layout(args)
        found: dict[str, Any] = {}

        def run(*inner: torch.Tensor) -> list[torch.Tensor]:
            with torch.no_grad():
                out = self.gm(*_rebuild_inputs(layout, inner))
            leaves, spec = pytree.tree_flatten(out)
            rebuilds = [_Rebuild(x) for x in leaves]
            found["rebuilds"], found["spec"] = rebuilds, spec
            return [t for r, x in zip(rebuilds, leaves, strict=True) for t in r.flat(x)]

        graph = self.trace_flat(run, flat)
        log.debug("desugared wrapper subclass inputs:\n%s", graph.code)
        compiled = self.compile_flat(graph, flat)
        rebuilds = found["rebuilds"]
        return _Entry(compiled, rebuilds, found["spec"], layout)


def _layout(args: Sequence[Any]) -> list[tuple[Any, int]]:
    """Per input: how to rebuild it from the flat tensors (None: a plain tensor) and how many."""
    layout: list[tuple[Any, int]] = []
    for a in args:
        if is_dispatch_wrapper(a):
            names, ctx, inner = _flatten(a)
            layout.append(((type(a), names, ctx, tuple(a.shape), a.stride()), len(inner)))
        elif isinstance(a, torch.Tensor):
            layout.append((None, 1))
        else:
            layout.append((("constant", a), 0))
    return layout


def _rebuild_inputs(layout: list[tuple[Any, int]], inner: Sequence[torch.Tensor]) -> list[Any]:
    rebuilt, at = [], 0
    for how, n in layout:
        part = inner[at : at + n]
        at += n
        if how is None:
            rebuilt.append(part[0])
        elif how[0] == "constant":
            rebuilt.append(how[1])
        else:
            cls, names, ctx, size, stride = how
            parts = dict(zip(names, part, strict=True))
            rebuilt.append(cls.__tensor_unflatten__(parts, ctx, size, stride))
    return rebuilt


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
            o if r.cls else o.detach()
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
        at = 0
        for i, r in zip(wants, rebuilds, strict=True):
            out[i] = r.build(results[at : at + r.count])
            at += r.count
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
    n, grad_layout, flat_grads = len(flat), _layout(grads), _flat_inputs(grads)[0]
    found: dict[str, Any] = {}

    def backward(*inner: torch.Tensor) -> list[torch.Tensor]:
        with torch.enable_grad():
            sources, outs = _run_for_grad(program, entry, wants, inner[:n])
            outs = [o for o, d in zip(outs, entry.diffs[wants], strict=True) if d]
            outs = [outs[i] for i in which]
            given = _rebuild_inputs(grad_layout, inner[n:])
            got = torch.autograd.grad(outs, sources, given, allow_unused=True)
        rebuilds = [_Rebuild(g) for g in got]
        found["rebuilds"] = rebuilds
        return [t for r, g in zip(rebuilds, got, strict=True) for t in r.flat(g)]

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
    rebuilt = _rebuild_inputs(entry.layout, inner)
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
