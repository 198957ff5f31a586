"""Trace a program into one ATen graph: forward only, or forward and backward together.

The joint graph takes ``(*primals, *tangents)`` and returns the forward's tensor
outputs, then the new values of mutated inputs, then the gradients of the
primals that require grad. The backward is traced by running autograd itself on
the fake outputs under the tracer, with the tangents as fresh graph inputs.

Outputs that are views of inputs are not graph outputs: the runtime rebuilds
them as views of the real inputs (:class:`OutputSpec` ``kind="alias"``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import fx
from torch._dispatch.python import enable_python_dispatcher
from torch.utils import _pytree as pytree

from kiln.autograd_aot.decomp import DecompositionTable
from kiln.autograd_aot.mutation import ViewStep
from kiln.autograd_aot.symbolic import (
    SizeSources,
    as_exprs,
    from_data,
    has_symbolic,
    is_symbolic,
    is_symbolic_value,
    size_sources,
)
from kiln.autograd_aot.trace import AtenTracer
from kiln.capture.meta import FakeTensor

__all__ = ["OutputSpec", "TracedProgram", "trace_program"]

aten = torch.ops.aten
_LAZY_BIT_VIEWS = frozenset({aten._conj.default, aten._neg_view.default})
"""Views that set a lazy bit, which ``as_strided`` would not carry over."""


@dataclasses.dataclass(frozen=True)
class OutputSpec:
    """Where one (flattened) output of the program comes from at run time."""

    kind: str  # "graph": graph output ``index``; "alias": view of input ``index`` (by
    # ``steps`` if any, else as_strided); "view": ``steps`` applied to graph output ``index``;
    # "const": ``value``
    index: int = -1
    value: Any = None
    size: tuple[int, ...] = ()
    stride: tuple[int, ...] = ()
    offset: int = 0  # an alias's storage offset past its input's: calls pass other offsets
    requires_grad: bool = False
    same_object: bool = False
    steps: tuple[ViewStep, ...] = ()
    # whether a view was made with grad enabled: one made under no_grad may still require
    # grad (a view of a leaf that does) but has no path back to its base, as in eager
    grad_path: bool = True
    # ``steps`` or ``value`` hold symbolic sizes, made concrete from each call's inputs
    symbolic: bool = False


@dataclasses.dataclass
class TracedProgram:
    """A traced graph and what the runtime needs to call it like the original."""

    gm: fx.GraphModule
    num_primals: int
    outputs: list[OutputSpec]
    out_spec: pytree.TreeSpec
    num_user_outputs: int  # graph outputs that are user outputs
    mutated_inputs: list[int]  # their new values follow the user outputs
    grad_inputs: list[int]  # primals whose gradients end the joint graph's outputs
    diff_outputs: list[int]  # forward outputs that take a tangent, in tangent order
    non_differentiable: list[int]  # forward outputs that never require grad
    # primals that require grad but that no differentiable output depends on: the autograd
    # node takes them detached, so a backward never walks into their history (eager's
    # does not: an in-place change there, which its backward would reject, is not reached)
    cut_inputs: list[int] = dataclasses.field(default_factory=list)
    # user graph outputs and primals that eager's autograd saves (or a view of), each with
    # the bit mask of the differentiable outputs (positions in ``diff_outputs``) whose
    # gradient reaches a node that saved it: the runtime checks them so that its backward
    # raises where eager's does when one was changed in place since, and only where eager's
    # would run that node (the compiled graphs save other values, or none)
    watched_outputs: list[tuple[int, int]] = dataclasses.field(default_factory=list)
    watched_inputs: list[tuple[int, int]] = dataclasses.field(default_factory=list)
    # where the symbols of the inputs' sizes are read, for outputs rebuilt outside the graph
    size_sources: SizeSources = ()

    @property
    def num_forward_outputs(self) -> int:
        return self.num_user_outputs + len(self.mutated_inputs)

    @property
    def is_joint(self) -> bool:
        return bool(self.grad_inputs)

    @functools.cached_property
    def direct_outputs(self) -> tuple[int, ...] | None:
        """The graph outputs returned as they are, as one flat tuple, if that is all there is.

        Frames that break into several graphs call each graph per call, so the runtime takes
        this path instead of rebuilding the outputs through pytree.
        """
        if not all(spec.kind == "graph" for spec in self.outputs):
            return None
        if self.out_spec != pytree.tree_structure((0,) * len(self.outputs)):
            return None
        return tuple(spec.index for spec in self.outputs)


def _tangent_like(t: torch.Tensor) -> FakeTensor:
    meta = torch.empty(t.shape, dtype=t.dtype, device="meta")
    return FakeTensor(meta, t.device)


def trace_program(
    fn: Callable[..., Any],
    fakes: Sequence[torch.Tensor],
    decompositions: DecompositionTable,
    *,
    joint: bool,
    grad_leaves: Sequence[torch.Tensor] | None = None,
) -> TracedProgram:
    """Trace ``fn(*fakes)``; with ``joint``, trace its backward too.

    Gradients are taken with respect to ``grad_leaves`` (default: ``fakes``): an
    input that requires grad and is mutated is traced as a clone of its leaf, so
    autograd allows the mutation, as it does for the real non-leaf tensor. With
    ``joint`` the program runs in the caller's grad mode, and its own
    ``enable_grad``/``no_grad`` regions decide which outputs are differentiable.
    """
    # some torch versions' C++ composite kernels read sizes as plain ints (torch 2.11's matmul
    # calls numel()): with symbolic sizes their Python decompositions run in their place
    symbolic = any(
        isinstance(f, torch.Tensor) and any(isinstance(d, torch.SymInt) for d in f.shape)
        for f in fakes
    )
    with enable_python_dispatcher() if symbolic else contextlib.nullcontext():
        return _trace_program(fn, fakes, decompositions, joint=joint, grad_leaves=grad_leaves)


def _trace_program(
    fn: Callable[..., Any],
    fakes: Sequence[torch.Tensor],
    decompositions: DecompositionTable,
    *,
    joint: bool,
    grad_leaves: Sequence[torch.Tensor] | None = None,
) -> TracedProgram:
    tracer = AtenTracer(decompositions)
    for i, f in enumerate(fakes):
        tracer.placeholder(f, f"primals_{i + 1}")
    with torch.set_grad_enabled(joint and torch.is_grad_enabled()), tracer:
        out = fn(*fakes)
    leaves, out_spec = pytree.tree_flatten(out)
    specs, user = _output_specs(tracer, leaves, fakes)
    mutated = tracer.mutated_inputs()
    # A mutated input's own fake carries the autograd history of its mutations; the
    # tracer maps it to the input's new value.
    values = [*user, *(fakes[i] for i, _ in mutated)]
    outputs: list[Any] = list(values)
    # a mutated input made with history before the program is differentiable through the
    # program only if a write reached it with grad enabled
    with_grad = tracer.inputs_written_with_grad()
    recorded = [True] * len(user) + [i in with_grad for i, _ in mutated]
    diff = [
        i
        for i, t in enumerate(values)
        if isinstance(t, torch.Tensor) and t.requires_grad and t.grad_fn is not None and recorded[i]
    ]
    tensors = [f for f in fakes if isinstance(f, torch.Tensor)]  # symbolic numbers follow
    grad_inputs = [i for i, f in enumerate(tensors) if f.requires_grad] if joint and diff else []
    watched: tuple[list[tuple[int, int]], list[tuple[int, int]]] = ([], [])
    if grad_inputs:
        watched = _saved_by_autograd([values[i] for i in diff], user, [] if mutated else tensors)
        leaves = list(grad_leaves) if grad_leaves is not None else list(fakes)
        tangents = [_tangent_like(values[i]) for i in diff]
        for i, t in enumerate(tangents):
            tracer.placeholder(t, f"tangents_{i + 1}")
        with tracer:
            grads = torch.autograd.grad(
                [values[i] for i in diff],
                [leaves[i] for i in grad_inputs],
                tangents,
                allow_unused=True,
            )
        if any(g is not None for g in grads):
            grad_inputs = [i for i, g in zip(grad_inputs, grads, strict=True) if g is not None]
            grads = tuple(g for g in grads if g is not None)
        outputs += list(grads)
    else:
        diff = []
    non_diff = [i for i in range(len(values)) if i not in diff]
    cut = [i for i, f in enumerate(tensors) if f.requires_grad and i not in grad_inputs]
    return TracedProgram(
        gm=tracer.finish(outputs),
        num_primals=len(fakes),
        outputs=specs,
        out_spec=out_spec,
        num_user_outputs=len(user),
        mutated_inputs=[i for i, _ in mutated],
        grad_inputs=grad_inputs,
        diff_outputs=diff,
        non_differentiable=non_diff,
        cut_inputs=cut if grad_inputs else [],
        watched_outputs=watched[0] if grad_inputs else [],
        watched_inputs=watched[1] if grad_inputs else [],
        size_sources=size_sources(fakes) if any(s.symbolic for s in specs) else (),
    )


def _saved_by_autograd(
    roots: Sequence[torch.Tensor], user: Sequence[Any], inputs: Sequence[torch.Tensor]
) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """Which of ``user`` and of ``inputs`` eager's autograd saves for the backward of
    ``roots``, itself or through a view (views share their base's version counter), each
    with the bit mask of the roots whose backward runs a node that saved it.

    A saved input comes back as itself; a saved output as a new tensor of the same node and
    output number. The trace's mutations of inputs are written back after the node runs,
    so a program that mutates one passes no ``inputs``: the write would look like a change."""
    # Kept alive: their Python objects' ids are the keys. A node's Python object lives only
    # while referenced (torch 2.11 makes a new one at the next ``grad_fn`` read once the last
    # one died), so every node is held from its first read on.
    nodes: list[Any] = [t.grad_fn for t in roots if t.grad_fn is not None]
    reach: dict[int, int] = {}  # node id -> mask of the roots whose backward reaches it
    children: dict[int, list[Any]] = {}
    order: list[Any] = []  # depth-first post-order: a node after every node it leads to
    for bit, t in enumerate(roots):
        if t.grad_fn is not None:
            reach[id(t.grad_fn)] = reach.get(id(t.grad_fn), 0) | 1 << bit
    stack: list[tuple[Any, bool]] = [(node, False) for node in nodes]
    while stack:
        node, expanded = stack.pop()
        if expanded:
            order.append(node)
            continue
        if id(node) in children:
            continue
        nodes.append(node)
        children[id(node)] = [n for n, _ in node.next_functions if n is not None]
        stack.append((node, True))
        stack.extend((n, False) for n in children[id(node)] if id(n) not in children)
    saved: dict[int, int] = {}  # id of a saved tensor's version root -> mask
    saved_made_by: dict[tuple[int, int], int] = {}  # (its grad_fn id, output number) -> mask
    for node in reversed(order):  # every node before the nodes it leads to
        mask = reach.get(id(node), 0)
        for child in children[id(node)]:
            reach[id(child)] = reach.get(id(child), 0) | mask
        for t in _saved_tensors(node):
            root = _version_root(t)
            saved[id(root)] = saved.get(id(root), 0) | mask
            if root.grad_fn is not None:
                nodes.append(root.grad_fn)
                key = (id(root.grad_fn), root.output_nr)
                saved_made_by[key] = saved_made_by.get(key, 0) | mask

    def saved_mask(t: Any) -> int:
        if not isinstance(t, torch.Tensor):  # a number the program returns
            return 0
        root = _version_root(t)
        mask = saved.get(id(root), 0)
        if root.grad_fn is not None:
            mask |= saved_made_by.get((id(root.grad_fn), root.output_nr), 0)
        return mask

    def watched(ts: Sequence[Any]) -> list[tuple[int, int]]:
        masks = [saved_mask(t) for t in ts]
        return [(i, m) for i, m in enumerate(masks) if m]

    return watched(user), watched(inputs)


def _version_root(t: torch.Tensor) -> torch.Tensor:
    base = t._base if t._is_view() else None
    return t if base is None else base


_SAVED_NAMES: dict[type, list[str]] = {}


def _saved_tensors(node: Any) -> list[torch.Tensor]:
    """The tensors autograd node ``node`` saved (``_saved_*`` of a built-in node,
    ``saved_tensors`` of an ``autograd.Function``'s); none it can no longer give back."""
    names = _SAVED_NAMES.get(type(node))
    if names is None:
        names = _SAVED_NAMES[type(node)] = [
            n for n in dir(node) if n.startswith("_saved_") or n == "saved_tensors"
        ]
    found: list[torch.Tensor] = []
    for name in names:
        try:
            value = getattr(node, name)
        except RuntimeError:  # changed in place since (the backward trace raises), or freed
            continue
        items = value if isinstance(value, (tuple, list)) else (value,)
        found += [v for v in items if isinstance(v, torch.Tensor)]
    return found


def _output_specs(
    tracer: AtenTracer, leaves: list[Any], fakes: Sequence[torch.Tensor]
) -> tuple[list[OutputSpec], list[torch.Tensor]]:
    """Specs of the flattened outputs, and the tensors the graph must return.

    Views of inputs, views of another output that is its root's own value
    (``y, y.view(-1)``), and outputs that are views of one tensor the program made
    (``t.view(-1), t[0]``, see :func:`_shared_bases`) are rebuilt by the runtime outside
    the compiled graph, so they alias as in eager (and may be mutated in place, as in
    eager: autograd refuses that on views made inside an ``autograd.Function``).
    """
    bases: dict[int, torch.Tensor] = {}
    for leaf in leaves:
        found = tracer.view_of(leaf) if isinstance(leaf, torch.Tensor) else None
        if found is not None and not found[1] and tracer.input_root(leaf) is None:
            bases.setdefault(found[0], leaf)
    shared = _shared_bases(tracer, leaves)
    specs: list[OutputSpec] = []
    user: list[Any] = []  # tensors, and numbers computed from data
    index: dict[int, int] = {}

    def graph_index(t: Any) -> int:
        if id(t) not in index:
            index[id(t)] = len(user)
            user.append(t)
        return index[id(t)]

    for leaf in leaves:
        if from_data(leaf):  # no input gives it (as ``const`` sizes): the graph returns it
            specs.append(OutputSpec("graph", graph_index(leaf)))
            continue
        if not isinstance(leaf, torch.Tensor):
            symbolic = is_symbolic_value(leaf)
            specs.append(OutputSpec("const", value=as_exprs(leaf), symbolic=symbolic))
            continue
        source = tracer.input_root(leaf)
        if source is not None:
            chain = (tracer.view_of(leaf) or (-1, ()))[1]
            specs.append(_alias_spec(leaf, source, fakes[source], chain))
            continue
        root, chain = tracer.view_of(leaf) or (-1, ())
        base = bases.get(root)
        if id(leaf) in shared:
            base, chain = shared[id(leaf)]
        if chain and base is not None:
            spec = OutputSpec(
                "view",
                graph_index(base),
                requires_grad=leaf.requires_grad,
                steps=_symbolic_steps(chain),
                grad_path=leaf.grad_fn is not None,
                symbolic=has_symbolic([(s.args, s.kwargs) for s in chain]),
            )
            specs.append(spec)
            continue
        specs.append(OutputSpec("graph", graph_index(leaf), requires_grad=leaf.requires_grad))
    return specs, user


def _shared_bases(
    tracer: AtenTracer, leaves: list[Any]
) -> dict[int, tuple[torch.Tensor, tuple[ViewStep, ...]]]:
    """Outputs (by id) that view a tensor the program made which another output views or
    is, with that tensor and the view ops from it.

    Which tensor an output views is autograd's answer (``_base``), as in eager: the
    tracer's roots also hold tensors made inside decompositions (``amin(keepdim=True)``
    is a view of a reduced tensor there), which eager never shows the program. The
    tensor becomes a graph output (no user sees it unless one returned it), and the
    views are rebuilt from it at run time, so they alias each other as in eager (the
    compiled graph would return them as separate buffers or as views made inside the
    autograd node). A view made under ``no_grad`` of a tensor that requires grad is rebuilt
    from that tensor even when no other output views it: it requires grad with no path back
    to it, which a view made inside the autograd node cannot be."""
    groups: dict[int, tuple[torch.Tensor, dict[int, torch.Tensor]]] = {}
    for leaf in leaves:
        if not isinstance(leaf, torch.Tensor) or tracer.input_root(leaf) is not None:
            continue
        base = leaf._base if leaf._is_view() else leaf
        if base is not None:
            groups.setdefault(id(base), (base, {}))[1][id(leaf)] = leaf
    found: dict[int, tuple[torch.Tensor, tuple[ViewStep, ...]]] = {}
    for base, members in groups.values():
        base_view = tracer.view_of(base)
        alone = len(members) < 2 and not any(map(_no_grad_view, members.values()))
        if alone or base_view is None:
            continue
        root, prefix = base_view
        for key, leaf in members.items():
            view = tracer.view_of(leaf)
            if leaf is base or view is None or view[0] != root:
                continue
            chain = view[1]
            if len(chain) > len(prefix) and chain[: len(prefix)] == prefix:
                found[key] = (base, chain[len(prefix) :])
    return found


def _no_grad_view(t: torch.Tensor) -> bool:
    """A view made under ``no_grad`` of a tensor that requires grad (so it requires grad too)."""
    return t._is_view() and t.requires_grad and t.grad_fn is None


def _symbolic_steps(chain: tuple[ViewStep, ...]) -> tuple[ViewStep, ...]:
    """``chain`` with its symbolic sizes as expressions, made concrete per call."""
    if not has_symbolic([(s.args, s.kwargs) for s in chain]):
        return chain
    return tuple(
        dataclasses.replace(s, args=as_exprs(s.args), kwargs=as_exprs(s.kwargs)) for s in chain
    )


def _alias_spec(
    leaf: torch.Tensor, source: int, base: torch.Tensor, chain: tuple[ViewStep, ...]
) -> OutputSpec:
    """A view of input ``source``: ``as_strided`` on it, or its view ops replayed where
    ``as_strided`` cannot say what they do (another dtype: ``view_as_complex``, ``real``,
    ``view(torch.int32)``; a lazy conjugate or negative bit: ``conj``)."""
    replay = leaf.dtype != base.dtype or any(step.func in _LAZY_BIT_VIEWS for step in chain)
    if is_symbolic(leaf) or is_symbolic(base):
        # its sizes, strides and offset vary with the call: its view ops are replayed
        return OutputSpec(
            "alias",
            index=source,
            requires_grad=leaf.requires_grad,
            same_object=leaf is base,
            steps=_symbolic_steps(chain),
            grad_path=leaf is base or leaf.grad_fn is not None,
            symbolic=has_symbolic([(s.args, s.kwargs) for s in chain]),
        )
    return OutputSpec(
        "alias",
        index=source,
        size=tuple(leaf.shape),
        stride=tuple(leaf.stride()),
        offset=int(leaf.storage_offset()) - int(base.storage_offset()),
        requires_grad=leaf.requires_grad,
        same_object=leaf is base,
        steps=chain if replay else (),
        grad_path=leaf is base or leaf.grad_fn is not None,
    )
