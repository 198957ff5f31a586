"""Run compiled graphs like the original program: autograd, mutations, aliases.

Training runs the compiled forward and backward inside a
``torch.autograd.Function``. Around it (never inside a compiled graph), the
wrapper copies new values into mutated inputs and rebuilds outputs that are
views of inputs, so autograd sees them as eager would.

Eager's backward runs only the nodes a gradient reaches, and checks only their saved
tensors for in-place changes. The node runs the backward compiled for the outputs that
got a gradient (``prune.py``) and checks the saved values the user can reach, and the
tensors eager's autograd saved, only where that backward or eager's would read them.

A backward with ``create_graph=True`` must itself be differentiable, and the
compiled backward is not (its saved values carry no history). It runs the
program again eagerly on the inputs instead and differentiates that, so double
backward (gradient penalties) gets eager's answer. The node keeps its inputs for
that until a plain backward ran; a program that mutates an input or draws random
numbers cannot be run again to the same values, and raises there instead.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.utils import _pytree as pytree

from kiln.autograd_aot.errors import AotError
from kiln.autograd_aot.inputs import InputLayout
from kiln.autograd_aot.joint import OutputSpec, TracedProgram
from kiln.autograd_aot.mutation import apply_view
from kiln.autograd_aot.symbolic import SizeSources, concrete
from kiln.capture.meta import storage_key

__all__ = ["CompiledProgram", "run_inference", "run_training"]

Compiled = Callable[..., Any]


@dataclasses.dataclass
class Backward:
    """A compiled backward: takes the saved values at positions ``saved``, then the tangents
    of the differentiable outputs at positions ``tangents`` (a missing gradient becomes
    zeros), and returns the gradients of ``program.grad_inputs`` at positions ``grads``."""

    fn: Compiled | None  # None: no gradient reaches an input
    saved: list[int]
    tangents: list[int]
    grads: list[int]
    # it takes the call's size symbols after the tangents (``CompiledProgram.symbol_reads``)
    symbols: bool = False
    # the held values (positions in the node's ``held``) whose versions a run of this backward
    # checks, per mask of present gradients (``_checked``): the same on every step
    checks: dict[int, tuple[int, ...]] = dataclasses.field(default_factory=dict)

    @functools.cached_property
    def takes_all_saved(self) -> bool:
        """Whether it takes every saved value in order (the full backward): the node's list
        of saved values is then its argument list as it is."""
        return self.saved == list(range(len(self.saved)))


@dataclasses.dataclass
class CompiledProgram:
    """A traced program's signature with its compiled forward (and backward)."""

    program: TracedProgram
    forward: Compiled
    backward: Compiled | None = None
    layout: InputLayout = dataclasses.field(default_factory=lambda: InputLayout.identity(0))
    # The program itself, run eagerly on the graph inputs, for a differentiable backward;
    # None when running it again would not give the same values (mutations, random ops).
    eager: Compiled | None = None
    num_saved: int = 0  # values the compiled forward saves for the backward
    # the saved values (positions) that are sizes, not tensors: a symbolic size the backward
    # reads that no saved tensor holds (kept on the node, as autograd saves tensors only)
    saved_sizes: tuple[int, ...] = ()
    # where each size symbol of the forward's inputs is read (input, dim; dim None for a
    # number input), for the backwards that take them (``Backward.symbols``)
    symbol_reads: tuple[tuple[int, int | None], ...] = ()
    # the saved values (positions) that are, or view, an input or a returned output
    exposed: list[int] = dataclasses.field(default_factory=list)
    # per exposed saved value, the forward's input it is (position), or -1 (a view, an output)
    exposed_inputs: tuple[int, ...] = ()
    # the backward for the differentiable outputs (positions in ``diff_outputs``) that got a
    # gradient; None: the full backward, with zeros for the others
    prune: Callable[[tuple[int, ...]], Backward | None] | None = None
    _backwards: dict[tuple[int, ...], Backward] = dataclasses.field(default_factory=dict)

    def backward_for(self, present: tuple[int, ...]) -> Backward:
        """The backward to run when the outputs at ``present`` got a gradient (compiled on
        first use: most programs only ever see all of them get one)."""
        found = self._backwards.get(present)
        if found is None:
            n = len(self.program.diff_outputs)
            if len(present) < n and self.prune is not None:
                found = self.prune(present)
            if found is None:
                grads = list(range(len(self.program.grad_inputs)))
                found = Backward(self.backward, list(range(self.num_saved)), list(range(n)), grads)
            self._backwards[present] = found
        return found

    @functools.cached_property
    def all_present(self) -> tuple[tuple[int, ...], int]:
        """``present`` and its bit mask when every differentiable output got a gradient."""
        n = len(self.program.diff_outputs)
        return tuple(range(n)), (1 << n) - 1

    @functools.cached_property
    def rebase_candidates(self) -> tuple[int, ...]:
        """The mutated inputs whose new value is no differentiable output (none for most
        programs): those ``_rebase_hidden_writes`` may have to rebase."""
        n, diff = self.program.num_user_outputs, self.program.diff_outputs
        return tuple(i for k, i in enumerate(self.program.mutated_inputs) if n + k not in diff)


class _AotFunction(torch.autograd.Function):
    """The compiled forward and backward as one autograd node."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, compiled: CompiledProgram, rebased: tuple[int, ...], *primals: torch.Tensor
    ) -> Any:
        program = compiled.program
        results = list(compiled.forward(*primals))
        n = program.num_forward_outputs
        outputs, saved = _fresh(results[:n]), results[n:]
        ctx.compiled = compiled
        # Saved values the user can change in place (inputs, returned outputs), and those
        # eager's autograd saves, are checked here, not by autograd: its check of saved
        # tensors would fire whatever the backward reads, where eager's fires only for the
        # nodes a gradient reaches. Outputs are held detached (same memory and version
        # counter), as the outputs themselves would reference this node: a cycle.
        # (a saved input is held as itself: it cannot reference this node)
        inputs = compiled.exposed_inputs or (-1,) * len(compiled.exposed)
        held = [
            saved[i].detach() if j < 0 else primals[j]
            for i, j in zip(compiled.exposed, inputs, strict=True)
        ]
        held += [outputs[i].detach() for i, _ in program.watched_outputs]
        held += [primals[i] for i, _ in program.watched_inputs]
        ctx.held = held
        ctx.versions = [t._version for t in held]
        for k, t in enumerate(held if rebased else ()):
            # a saved view of an input rewritten after this call holds its old value: its
            # version was bumped before the call (``_rebase_hidden_writes``), not after
            if any(storage_key(t) == storage_key(primals[i]) for i in rebased):
                ctx.versions[k] -= 1
        for i in compiled.exposed:
            saved[i] = None
        if compiled.symbol_reads:
            ctx.symbol_values = [
                primals[i] if d is None else primals[i].shape[d] for i, d in compiled.symbol_reads
            ]
        if compiled.saved_sizes:
            ctx.saved_sizes = [saved[i] for i in compiled.saved_sizes]
            for i in compiled.saved_sizes:
                saved[i] = None
        ctx.save_for_backward(*saved)
        if program.non_differentiable:
            ctx.mark_non_differentiable(
                *[o for o in map(outputs.__getitem__, program.non_differentiable) if _is_tensor(o)]
            )
        # Autograd would hand backward a zero tensor for every output the loss does not
        # reach, non-differentiable ones included (BatchNorm's new running statistics: three
        # allocations and fills per layer and step); the backward run depends on which got one.
        ctx.set_materialize_grads(False)
        ctx.tangent_specs = [
            (o.shape, o.dtype, o.device) for o in map(outputs.__getitem__, program.diff_outputs)
        ]
        if compiled.eager is not None:
            # for a backward with create_graph=True; the versions tell whether they changed
            ctx.primals = primals
            ctx.primal_versions = _versions(primals)
        return tuple(outputs)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> Any:  # type: ignore[override]
        compiled: CompiledProgram = ctx.compiled
        program = compiled.program
        diff = program.diff_outputs
        present, mask = compiled.all_present
        for i in diff:
            if grads[i] is None:  # some output got no gradient: which did
                present = tuple(k for k, i in enumerate(diff) if grads[i] is not None)
                mask = sum(1 << k for k in present)
                break
        if not present:
            return (None,) * (2 + program.num_primals)
        # unpacking checks the versions of the saved values the user cannot reach (and
        # raises if a backward without retain_graph freed them)
        saved = list(ctx.saved_tensors)
        if torch.is_grad_enabled():  # create_graph=True: the result must be differentiable
            # it reads no saved value: it runs the program again
            _check_versions(ctx, _checked(compiled, (), mask))
            return (None, None, *_differentiable_backward(ctx, grads))
        bw = compiled.backward_for(present)
        checks = bw.checks.get(mask)
        if checks is None:
            checks = bw.checks[mask] = _checked(compiled, bw.saved, mask)
        _check_versions(ctx, checks)
        # the inputs are kept for a differentiable backward only until a plain one ran
        # (with retain_graph a later create_graph=True backward then raises)
        ctx.primals = None
        for i, t in zip(compiled.exposed, ctx.held, strict=False):
            saved[i] = t
        if compiled.saved_sizes:
            for i, size in zip(compiled.saved_sizes, ctx.saved_sizes, strict=True):
                saved[i] = size
        # the full backward takes the saved list as it is, then the tangents
        args = saved if bw.takes_all_saved and len(bw.saved) == len(saved) else None
        if args is None:
            args = [saved[i] for i in bw.saved]
        for k in bw.tangents:
            g = grads[diff[k]]
            if g is None:
                shape, dtype, device = ctx.tangent_specs[k]
                g = torch.zeros(shape, dtype=dtype, device=device)
            args.append(g.contiguous())
        if bw.symbols:
            args.extend(ctx.symbol_values)
        del saved
        # autograd's references go now, not when backward returns (unless the graph is
        # retained); a compiled backward that takes its arguments as a list (``call_boxed``)
        # then frees each activation after its last use, as eager's backward does
        ctx.maybe_clear_saved_tensors()
        if _saved_freed(ctx):
            ctx.held = None
        out: list[torch.Tensor | None] = [None] * program.num_primals
        if bw.fn is None:
            return (None, None, *out)
        boxed = getattr(bw.fn, "call_boxed", None)
        results = boxed(args) if boxed is not None else bw.fn(*args)
        for j, g in zip(bw.grads, results, strict=True):
            out[program.grad_inputs[j]] = g
        return (None, None, *out)


def _is_tensor(o: Any) -> bool:
    return isinstance(o, torch.Tensor)  # not a number computed from data (item())


def _versions(primals: Sequence[Any]) -> list[int]:
    """The inputs' version counters (a symbolic number input has none: 0)."""
    return [getattr(p, "_version", 0) for p in primals]


_keeps_graph: Callable[[], bool] | None = getattr(
    torch._C._autograd, "_get_current_graph_task_keep_graph", None
)


def _saved_freed(ctx: Any) -> bool:
    """Whether autograd freed the node's saved tensors (no ``retain_graph``), called in its
    backward after ``maybe_clear_saved_tensors``: the running backward's own flag, where torch
    has it; else by reading them, which raises once they are freed (a C++ exception, tens of
    microseconds: every compiled node pays it on every backward)."""
    if _keeps_graph is not None:
        return not _keeps_graph()
    try:
        ctx._raw_saved_tensors  # noqa: B018  (raises once they are freed)
    except RuntimeError:
        return True
    return False


def _checked(compiled: CompiledProgram, reads: Sequence[int], present: int) -> tuple[int, ...]:
    """The positions in a node's ``held`` whose versions a backward checks, as eager's would:
    the values eager's autograd saved for a node the ``present`` gradients reach, and the
    saved values at ``reads`` (what the backward run reads) that the user can reach."""
    program = compiled.program
    read = set(reads)
    wanted = [i in read for i in compiled.exposed]
    wanted += [bool(m & present) for _, m in program.watched_outputs]
    wanted += [bool(m & present) for _, m in program.watched_inputs]
    return tuple(k for k, want in enumerate(wanted) if want)


def _check_versions(ctx: Any, checks: tuple[int, ...]) -> None:
    """Raise as eager's backward would where a value it needs (``checks``, from
    :func:`_checked`) was changed in place."""
    held: list[torch.Tensor] | None = ctx.held
    if held is None:
        return  # freed: autograd's own unpacking raises the backward-twice error
    versions = ctx.versions
    for k in checks:
        t = held[k]
        version = versions[k]
        if t._version != version:
            msg = (
                "one of the variables needed for gradient computation has been modified by an "
                f"inplace operation: [{t.type()} {list(t.shape)}], which a compiled graph "
                f"saved for its backward, is at version {t._version}; expected version "
                f"{version} instead. Hint: the tensor was changed in place after the compiled "
                "call that returned (or took) it, and before this backward."
            )
            raise RuntimeError(msg)


def _differentiable_backward(ctx: Any, grads: Sequence[torch.Tensor | None]) -> list[Any]:
    """The gradients of the program's inputs by eager autograd over the program run again,
    with their own history (``create_graph=True``)."""
    compiled: CompiledProgram = ctx.compiled
    program = compiled.program
    eager = compiled.eager
    primals: Sequence[torch.Tensor] | None = getattr(ctx, "primals", None)
    if eager is None:
        why = "mutates an input or draws random numbers, so it cannot be run again"
    elif primals is None:
        why = "was already differentiated without create_graph=True (retain_graph)"
    elif _versions(primals) != ctx.primal_versions:
        why = "has an input that was modified in place after the forward"
    else:
        why = ""
    if eager is None or primals is None or why:
        msg = (
            f"a backward with create_graph=True (double backward) reached a compiled graph that "
            f"{why}; Kiln cannot differentiate its backward. Run that part eagerly "
            "(kiln.disable) or compute the gradient penalty outside the compiled function."
        )
        raise AotError(msg)
    with torch.enable_grad():
        flat = pytree.tree_leaves(eager(*primals))
    # graph output -> the eager tensor it stands for: a returned one, or the base that
    # returned views of it share (a tensor the program made and did not return)
    value: dict[int, torch.Tensor] = {}
    for leaf, spec in zip(flat, program.outputs, strict=True):
        if spec.kind == "graph":
            value.setdefault(spec.index, leaf)
        elif spec.kind == "view" and isinstance(leaf, torch.Tensor) and leaf._base is not None:
            value.setdefault(spec.index, leaf._base)
    pairs = [
        (value[i], grads[i])
        for i in program.diff_outputs
        if grads[i] is not None and value[i].requires_grad
    ]
    out: list[torch.Tensor | None] = [None] * program.num_primals
    if not pairs:
        return out
    wanted = [primals[i] for i in program.grad_inputs]
    found = torch.autograd.grad(
        [o for o, _ in pairs],
        wanted,
        [g for _, g in pairs],
        create_graph=True,
        allow_unused=True,
    )
    for i, g in zip(program.grad_inputs, found, strict=True):
        out[i] = g
    return out


def run_training(compiled: CompiledProgram, primals: Sequence[torch.Tensor]) -> Any:
    """Call the compiled program with autograd recording one node for it (also under
    ``no_grad``: the program enabled grad itself for the outputs that require it)."""
    args = primals
    if compiled.program.cut_inputs:
        args = list(primals)
        for i in compiled.program.cut_inputs:
            args[i] = args[i].detach()
    rebased = _rebase_hidden_writes(compiled.rebase_candidates, args)
    if torch.is_grad_enabled():
        outputs = _AotFunction.apply(compiled, rebased, *args)
    else:
        with torch.enable_grad():
            outputs = _AotFunction.apply(compiled, rebased, *args)
    return _finish(compiled.program, primals, list(outputs), rebased)


def _rebase_hidden_writes(
    candidates: tuple[int, ...], args: Sequence[torch.Tensor]
) -> tuple[int, ...]:
    """The mutated inputs that are views requiring grad, written where autograd does not
    see it (under ``no_grad``), made ready for the node to take them.

    Eager's in-place write bumps the view's version, so its next use regenerates its
    ``grad_fn`` (a view of its base again), and the ops after the write, and a later
    ``autograd.grad(out, view)``, meet that new node. The compiled node takes the view before
    its new value is written back; a write-back after it would regenerate the node once more
    and leave the node's edge on a node no gradient asks for (``grad(out, view)`` is None).
    So the version is bumped, and the node regenerated, before the call, and the new value
    is written back without a bump (``_write_back``): the same one bump eager makes, seen
    by every tensor saved before the call (``candidates``: ``CompiledProgram``'s)."""
    if not candidates:
        return ()
    rebased = tuple(i for i in candidates if args[i].requires_grad and args[i]._is_view())
    for i in rebased:
        torch.autograd.graph.increment_version(args[i])
        args[i].grad_fn  # noqa: B018  (reading it regenerates it for the new version)
    return rebased


def run_inference(compiled: CompiledProgram, primals: Sequence[torch.Tensor]) -> Any:
    """Call the compiled forward graph (no autograd involved: no output is differentiable,
    even where its ATen ops would record history on inputs that require grad)."""
    if not torch.is_grad_enabled():
        return _finish(compiled.program, primals, _fresh(list(compiled.forward(*primals))))
    with torch.no_grad():
        outputs = _fresh(list(compiled.forward(*primals)))
    return _finish(compiled.program, primals, outputs)


def _fresh(outputs: list[Any]) -> list[Any]:
    """The graph's outputs, none of them an autograd view.

    A graph output is a tensor of its own in the program (views of inputs and of other
    outputs are rebuilt outside the graph), but a compiled graph may return it as a view
    of a buffer (a reduction with ``keepdim`` as a view of the reduced one, an ATen view
    op run eagerly). Autograd refuses in-place ops on views that an ``autograd.Function``
    returns, and on views made under ``no_grad`` once they need grad, where eager's fresh
    tensor takes them; ``detach`` gives the same memory, and version counter (autograd's
    check of tensors saved for backward still sees in-place changes), as a non-view."""
    for i, out in enumerate(outputs):
        if isinstance(out, torch.Tensor) and out._is_view():
            outputs[i] = out.detach()
    return outputs


def _finish(
    program: TracedProgram,
    primals: Sequence[torch.Tensor],
    outputs: list[Any],
    rebased: tuple[int, ...] = (),
) -> Any:
    n = program.num_user_outputs
    if program.mutated_inputs:
        _write_back(primals, program.mutated_inputs, outputs[n:], rebased)
    direct = program.direct_outputs
    if direct is not None:
        return tuple([outputs[i] for i in direct])
    flat: list[Any] = []
    for spec in program.outputs:
        if spec.kind == "graph":
            flat.append(outputs[spec.index])
        elif spec.kind == "const":
            value = spec.value
            if spec.symbolic:
                value = concrete(value, program.size_sources, primals)
            flat.append(value)
        elif spec.same_object:
            flat.append(primals[spec.index])
        else:
            # the program may have enabled grad itself, or made the view under no_grad:
            # the traced view's own grad mode decides, not the caller's
            with torch.set_grad_enabled(spec.requires_grad and spec.grad_path):
                view = _rebuild_view(spec, primals, outputs, program.size_sources)
            flat.append(view if spec.requires_grad else view.detach())
    return pytree.tree_unflatten(flat, program.out_spec)


def _rebuild_view(
    spec: OutputSpec,
    primals: Sequence[torch.Tensor],
    outputs: list[Any],
    sources: SizeSources = (),
) -> torch.Tensor:
    """The view ``spec`` describes, of this call's input or graph output."""
    if spec.kind == "view" or spec.steps or spec.symbolic:
        view = outputs[spec.index] if spec.kind == "view" else primals[spec.index]
        steps = spec.steps
        if spec.symbolic:
            steps = tuple(
                dataclasses.replace(
                    s,
                    args=concrete(s.args, sources, primals),
                    kwargs=concrete(s.kwargs, sources, primals),
                )
                for s in steps
            )
        for step in steps:
            view = apply_view(step, view)
        return view
    # guards match sizes and strides, not the storage offset: a view of another part of
    # the same storage is at the traced distance from this call's input
    primal = primals[spec.index]
    return primal.as_strided(spec.size, spec.stride, primal.storage_offset() + spec.offset)


def _distinct_elements(dst: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``dst`` and ``value`` without ``dst``'s broadcast dims (stride 0, size > 1): an
    expanded input (``y.expand(3, -1)`` made before a graph break, then ``zero_()``) holds each
    element at several positions, which ``copy_`` refuses to write. Eager's in-place ops
    that accept such a tensor write one value to all of them, the value at position 0."""
    for d in range(dst.dim()):
        if dst.stride(d) == 0 and dst.size(d) > 1:
            dst, value = dst.narrow(d, 0, 1), value.narrow(d, 0, 1)
    return dst, value


def _write_back(
    primals: Sequence[torch.Tensor],
    mutated: Sequence[int],
    values: Sequence[torch.Tensor],
    rebased: tuple[int, ...] = (),
) -> None:
    """Copy the new values of mutated inputs into them. Those without history (BatchNorm's
    running statistics: three per layer) go in one foreach copy, a launch or two for all
    of them instead of one each; ATen's foreach ops refuse an input with a lazy conjugate
    or negative bit, which ``copy_`` writes through. Mutated inputs never share memory here
    (aliased ones are traced over their bases), so the order of the copies does not matter."""
    dsts, srcs = [], []
    for i, new in zip(mutated, values, strict=True):
        dst, value = _distinct_elements(primals[i], new)
        if i in rebased:  # its version was bumped before the call
            with torch.no_grad():
                dst.data.copy_(value)
        elif value.requires_grad:  # keeps its history through the copy, as in eager
            with torch.enable_grad():
                dst.copy_(value)
        elif dst.is_conj() or dst.is_neg():
            with torch.no_grad():
                dst.copy_(value)
        else:
            dsts.append(dst)
            srcs.append(value)
    if dsts:
        with torch.no_grad():
            torch._foreach_copy_(dsts, srcs)
