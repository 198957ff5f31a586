"""``aot_compile``: torch-level graph in, a callable running compiled ATen graphs out.

The pipeline, per grad mode the program is called in:
``trace_program`` (ATen tracer: functionalization pass and decompositions, plus
the backward when inputs need grad) → ``partition_joint`` (min-cut) →
``fw_compiler``/``bw_compiler`` → the runtime wrapper. Parameters and buffers of
the module are lifted into graph inputs, so their gradients and in-place
updates (BatchNorm's running statistics) go through the same machinery.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import fx

from kiln.autograd_aot.decomp import default_decompositions, describe_table, for_training
from kiln.autograd_aot.errors import AotError
from kiln.autograd_aot.inputs import InputLayout, fakes_of
from kiln.autograd_aot.joint import TracedProgram, trace_program
from kiln.autograd_aot.partition import PartitionStats, partition_joint
from kiln.autograd_aot.runtime import CompiledProgram, run_inference, run_training
from kiln.capture import artifacts
from kiln.capture.isolation import no_user_hooks

__all__ = ["AotCompiled", "aot_compile"]

log = logging.getLogger("kiln.autograd_aot.aot")

Compiler = Callable[[fx.GraphModule, list[torch.Tensor]], Callable[..., Any]]


def _fake_inputs(gm: fx.GraphModule) -> list[torch.Tensor]:
    return [n.meta["val"] for n in gm.graph.nodes if n.op == "placeholder"]


class AotCompiled:
    """The callable ``aot_compile`` returns; same calling convention as the graph."""

    def __init__(
        self,
        gm: torch.nn.Module,
        example_inputs: Sequence[Any],
        fw_compiler: Compiler,
        bw_compiler: Compiler,
        decompositions: Mapping[Any, Callable[..., Any]],
        partitioner: str,
    ) -> None:
        self.gm = gm
        self.fw_compiler = fw_compiler
        self.bw_compiler = bw_compiler
        self.decompositions = decompositions
        self.partitioner = partitioner
        self.state_names = [n for n, _ in gm.named_parameters()] + [
            n for n, _ in gm.named_buffers()
        ]
        # (owning module, attribute) per state tensor: read each call, so reassigned
        # or updated parameters are seen, without walking the module tree.
        self._state_slots = [
            (gm.get_submodule(owner), attr)
            for owner, _, attr in (n.rpartition(".") for n in self.state_names)
        ]
        self.tensor_positions = [
            i for i, a in enumerate(example_inputs) if isinstance(a, torch.Tensor)
        ]
        # The non-tensor inputs (baked into the graphs); tensors are not kept alive.
        self.constants = [None if isinstance(a, torch.Tensor) else a for a in example_inputs]
        self.constant_positions = [
            i for i, a in enumerate(example_inputs) if not isinstance(a, torch.Tensor)
        ]
        self.partition_stats: PartitionStats | None = None
        self._compiled: dict[bool, CompiledProgram] = {}
        primals = self._primals(example_inputs)
        self._get(self._needs_grad(primals), primals)

    def _primals(self, args: Sequence[Any]) -> list[torch.Tensor]:
        state = [getattr(module, attr) for module, attr in self._state_slots]
        return state + [args[i] for i in self.tensor_positions]

    @staticmethod
    def _needs_grad(primals: Sequence[torch.Tensor]) -> bool:
        return torch.is_grad_enabled() and any(p.requires_grad for p in primals)

    def __call__(self, *args: Any) -> Any:
        if self.constant_positions or len(args) != len(self.constants):
            self._check_constants(args)
        primals = self._primals(args)
        compiled = self._get(self._needs_grad(primals), primals)
        primals = compiled.layout.prepare(primals)
        if compiled.program.is_joint:
            return run_training(compiled, primals)
        return run_inference(compiled, primals)

    def _check_constants(self, args: Sequence[Any]) -> None:
        """Non-tensor inputs were baked into the graphs: they must not change."""
        if len(args) != len(self.constants):
            msg = f"compiled for {len(self.constants)} inputs, called with {len(args)}"
            raise AotError(msg)
        for i in self.constant_positions:
            arg, example = args[i], self.constants[i]
            if arg != example:
                msg = (
                    f"input {i} was {example!r} when compiled and is {arg!r} now; non-tensor "
                    "inputs are constants of the compiled graphs (the caller must guard them)"
                )
                raise AotError(msg)

    def _get(self, needs_grad: bool, primals: Sequence[torch.Tensor]) -> CompiledProgram:
        found = self._compiled.get(needs_grad)
        if found is None:
            # compiled where first called: maybe under the user's saved-tensor hooks
            with no_user_hooks():
                found = self._compiled[needs_grad] = self._compile(needs_grad, primals)
        return found

    def _call_module(self, *fakes: torch.Tensor) -> Any:
        n = len(self.state_names)
        state = dict(zip(self.state_names, fakes[:n], strict=True))
        args: list[Any] = list(self.constants)
        for pos, fake in zip(self.tensor_positions, fakes[n:], strict=True):
            args[pos] = fake
        return torch.func.functional_call(self.gm, state, tuple(args))

    def _trace(
        self, needs_grad: bool, primals: Sequence[torch.Tensor], layout: InputLayout
    ) -> TracedProgram:
        fakes, leaves = fakes_of(layout.prepare(primals), needs_grad)
        table = for_training(self.decompositions) if needs_grad else self.decompositions
        fn = layout.wrap(self._call_module)
        return trace_program(fn, fakes, table, joint=needs_grad, grad_leaves=leaves)

    def _compile(self, needs_grad: bool, primals: Sequence[torch.Tensor]) -> CompiledProgram:
        layout = InputLayout.identity(len(primals))
        program = self._trace(needs_grad, primals, layout)
        with_bases = InputLayout.for_mutations(primals, program.mutated_inputs)
        if with_bases is not None:
            log.info(
                "inputs %s share memory with a mutated input: traced again over bases",
                with_bases.groups,
            )
            layout = with_bases
            program = self._trace(needs_grad, primals, layout)
        if not program.is_joint:
            log.debug("forward-only graph:\n%s", program.gm.code)
            artifacts.dump("aot_inference.py", program.gm.code)
            forward = self.fw_compiler(program.gm, _fake_inputs(program.gm))
            return CompiledProgram(program, forward, layout=layout)
        log.debug("joint graph:\n%s", program.gm.code)
        artifacts.dump("aot_joint.py", program.gm.code)
        fw, bw, stats = partition_joint(
            program.gm,
            program.num_primals,
            program.num_forward_outputs,
            mincut=self.partitioner == "mincut",
            mutated_inputs=program.mutated_inputs,
        )
        self.partition_stats = stats
        log.info("partition (%s): %s", self.partitioner, stats)
        log.debug("forward graph:\n%s\nbackward graph:\n%s", fw.code, bw.code)
        artifacts.dump("aot_forward.py", fw.code)
        artifacts.dump("aot_backward.py", bw.code)
        forward = self.fw_compiler(fw, _fake_inputs(fw))
        backward = self.bw_compiler(bw, _fake_inputs(bw))
        return CompiledProgram(program, forward, backward, layout)


def aot_compile(
    gm: torch.nn.Module,
    example_inputs: Sequence[Any],
    *,
    fw_compiler: Compiler,
    bw_compiler: Compiler | None = None,
    decompositions: Mapping[Any, Callable[..., Any]] | None = None,
    partitioner: str = "mincut",
) -> AotCompiled:
    """Compile ``gm`` through ATen graphs; call the result like ``gm``.

    ``example_inputs`` are real tensors (non-tensor inputs are baked in).
    ``decompositions=None`` uses :func:`default_decompositions`. ``partitioner``
    is ``"mincut"`` or ``"save_all"``.
    """
    table = default_decompositions() if decompositions is None else dict(decompositions)
    log.info("decomposition table: %d entries", len(table))
    log.debug("%s", describe_table(table))
    return AotCompiled(
        gm, example_inputs, fw_compiler, bw_compiler or fw_compiler, table, partitioner
    )
