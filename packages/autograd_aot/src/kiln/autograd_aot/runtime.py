"""Run compiled graphs like the original program: autograd, mutations, aliases.

Training runs the compiled forward and backward inside a
``torch.autograd.Function``. Around it (never inside a compiled graph), the
wrapper copies new values into mutated inputs and rebuilds outputs that are
views of inputs, so autograd sees them as eager would.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.autograd.function import once_differentiable
from torch.utils import _pytree as pytree

from kiln.autograd_aot.inputs import InputLayout
from kiln.autograd_aot.joint import TracedProgram
from kiln.autograd_aot.mutation import apply_view

__all__ = ["CompiledProgram", "run_inference", "run_training"]

Compiled = Callable[..., Any]


@dataclasses.dataclass
class CompiledProgram:
    """A traced program's signature with its compiled forward (and backward)."""

    program: TracedProgram
    forward: Compiled
    backward: Compiled | None = None
    layout: InputLayout = dataclasses.field(default_factory=lambda: InputLayout.identity(0))


class _AotFunction(torch.autograd.Function):
    """The compiled forward and backward as one autograd node."""

    @staticmethod
    def forward(ctx: Any, compiled: CompiledProgram, *primals: torch.Tensor) -> Any:  # type: ignore[override]
        program = compiled.program
        results = list(compiled.forward(*primals))
        n = program.num_forward_outputs
        outputs, saved = results[:n], results[n:]
        ctx.compiled = compiled
        ctx.save_for_backward(*saved)
        ctx.mark_non_differentiable(*(outputs[i] for i in program.non_differentiable))
        # Autograd would hand backward a zero tensor for every output the loss does not
        # reach, non-differentiable ones included (BatchNorm's new running statistics: three
        # allocations and fills per layer and step); only the tangents are made, when missing.
        ctx.set_materialize_grads(False)
        ctx.tangent_specs = [
            (o.shape, o.dtype, o.device) for o in map(outputs.__getitem__, program.diff_outputs)
        ]
        return tuple(outputs)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, *grads: torch.Tensor) -> Any:  # type: ignore[override]
        compiled: CompiledProgram = ctx.compiled
        program = compiled.program
        assert compiled.backward is not None
        tangents = [
            torch.zeros(shape, dtype=dtype, device=device) if g is None else g.contiguous()
            for g, (shape, dtype, device) in zip(
                map(grads.__getitem__, program.diff_outputs), ctx.tangent_specs, strict=True
            )
        ]
        args = [*ctx.saved_tensors, *tangents]
        del tangents
        # autograd's references go now, not when backward returns (unless the graph is
        # retained); a compiled backward that takes its arguments as a list (``call_boxed``)
        # then frees each activation after its last use, as eager's backward does
        ctx.maybe_clear_saved_tensors()
        boxed = getattr(compiled.backward, "call_boxed", None)
        results = boxed(args) if boxed is not None else compiled.backward(*args)
        out: list[torch.Tensor | None] = [None] * program.num_primals
        for i, g in zip(program.grad_inputs, results, strict=True):
            out[i] = g
        return (None, *out)


def run_training(compiled: CompiledProgram, primals: Sequence[torch.Tensor]) -> Any:
    """Call the compiled program with autograd recording one node for it."""
    outputs = _AotFunction.apply(compiled, *primals)
    return _finish(compiled.program, primals, list(outputs))


def run_inference(compiled: CompiledProgram, primals: Sequence[torch.Tensor]) -> Any:
    """Call the compiled forward graph (no autograd involved)."""
    return _finish(compiled.program, primals, list(compiled.forward(*primals)))


def _finish(program: TracedProgram, primals: Sequence[torch.Tensor], outputs: list[Any]) -> Any:
    n = program.num_user_outputs
    if program.mutated_inputs:
        _write_back(primals, program.mutated_inputs, outputs[n:])
    direct = program.direct_outputs
    if direct is not None:
        return tuple([outputs[i] for i in direct])
    flat: list[Any] = []
    for spec in program.outputs:
        if spec.kind == "graph":
            flat.append(outputs[spec.index])
        elif spec.kind == "const":
            flat.append(spec.value)
        elif spec.kind == "view":
            view = outputs[spec.index]
            for step in spec.steps:
                view = apply_view(step, view)
            flat.append(view if spec.requires_grad else view.detach())
        elif spec.same_object:
            flat.append(primals[spec.index])
        else:
            view = primals[spec.index].as_strided(spec.size, spec.stride, spec.offset)
            flat.append(view if spec.requires_grad else view.detach())
    return pytree.tree_unflatten(flat, program.out_spec)


def _write_back(
    primals: Sequence[torch.Tensor], mutated: Sequence[int], values: Sequence[torch.Tensor]
) -> None:
    """Copy the new values of mutated inputs into them. Those without history (BatchNorm's
    running statistics: three per layer) go in one foreach copy, a launch or two for all
    of them instead of one each. Mutated inputs never share memory here (aliased ones are
    traced over their bases), so the order of the copies does not matter."""
    dsts, srcs = [], []
    for i, value in zip(mutated, values, strict=True):
        if value.requires_grad:  # keeps its history through the copy, as in eager
            primals[i].copy_(value)
        else:
            dsts.append(primals[i])
            srcs.append(value)
    if dsts:
        with torch.no_grad():
            torch._foreach_copy_(dsts, srcs)
