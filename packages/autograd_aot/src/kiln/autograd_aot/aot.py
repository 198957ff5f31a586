"""``aot_compile``: torch-level graph in, a callable running compiled ATen graphs out.

The pipeline, per grad mode the program is called in:
``trace_program`` (ATen tracer: functionalization pass and decompositions, plus
the backward when inputs need grad) → ``partition_joint`` (min-cut) →
``fw_compiler``/``bw_compiler`` → the runtime wrapper. Parameters and buffers of
the module are lifted into graph inputs, so their gradients and in-place
updates (BatchNorm's running statistics) go through the same machinery.

A compiled program assumes the grad mode it was called in, whether any input
requires grad, and, when it mutates an input, which inputs share memory with the
mutated ones (``inputs.shared_memory``). Each call checks those (the last only for
programs that mutate an input) and runs the program compiled for them, compiling
another when none is; one that cannot be compiled then runs eagerly, with a warning.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import operator
import threading
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

import torch
from torch import fx

from kiln.autograd_aot.control_flow import (
    ControlFlowInterpreter,
    compile_branches,
    has_control_flow,
)
from kiln.autograd_aot.decomp import default_decompositions, describe_table, for_training
from kiln.autograd_aot.errors import AotError
from kiln.autograd_aot.freezing import compile_frozen, state_positions
from kiln.autograd_aot.inputs import Aliasing, InputLayout, fakes_of, shared_memory
from kiln.autograd_aot.joint import TracedProgram, trace_program
from kiln.autograd_aot.partition import PartitionStats, partition_joint
from kiln.autograd_aot.prune import exposed_saved, prune_backward
from kiln.autograd_aot.regions import call_marked, has_regions
from kiln.autograd_aot.runtime import Backward, CompiledProgram, run_inference, run_training
from kiln.autograd_aot.subclasses import SubclassProgram, has_wrapper_inputs
from kiln.autograd_aot.symbolic import is_symbolic, is_symbolic_value, symbol_reads
from kiln.autograd_aot.trace import trace_aten
from kiln.capture import artifacts, counters
from kiln.capture.graph import DATA_DEPENDENT_OPS
from kiln.capture.isolation import no_user_hooks
from kiln.capture.shapes import unbacked

__all__ = ["AotCompiled", "aot_compile"]

log = logging.getLogger("kiln.autograd_aot.aot")

Compiler = Callable[[fx.GraphModule, list[torch.Tensor]], Callable[..., Any]]


def _fake_inputs(gm: fx.GraphModule) -> list[torch.Tensor]:
    return [n.meta["val"] for n in gm.graph.nodes if n.op == "placeholder"]


def _output_nodes(gm: fx.GraphModule) -> list[Any]:
    return list(next(n for n in gm.graph.nodes if n.op == "output").args[0])


def _placeholder_values(gm: torch.nn.Module, positions: Sequence[int]) -> list[Any]:
    if not positions:
        return []
    assert isinstance(gm, fx.GraphModule)
    vals = [n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"]
    return [vals[i] for i in positions]


def _number_positions(gm: torch.nn.Module, example_inputs: Sequence[Any]) -> list[int]:
    """The inputs that are symbolic numbers in the captured graph (its placeholder's value is
    a ``SymInt``/``SymFloat``): they become graph inputs instead of constants."""
    if not isinstance(gm, fx.GraphModule):
        return []
    vals = [n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"]
    if len(vals) != len(example_inputs):
        return []
    return [
        i
        for i, (v, a) in enumerate(zip(vals, example_inputs, strict=True))
        if is_symbolic_value(v) and not isinstance(a, torch.Tensor)
    ]


def _is_nan(v: Any) -> bool:
    return isinstance(v, float) and math.isnan(v)


def _has_random_op(gm: fx.GraphModule) -> bool:
    return any(
        torch.Tag.nondeterministic_seeded in getattr(n.target, "tags", ())
        for n in gm.graph.nodes
        if n.op == "call_function"
    )


class _EmptyGraph(fx.GraphModule):
    """A snapshot's stand-in for its traced graphs, pickled as a reference to the one instance
    (a GraphModule pickles as its code, rebuilt by tracing it again when loaded)."""

    def __reduce__(self) -> tuple[Any, ...]:
        return _empty_graph, ()


def _empty_graph() -> fx.GraphModule:
    return _EMPTY_GRAPH


_EMPTY_GRAPH = _EmptyGraph(torch.nn.Module(), fx.Graph())


def _rerun_eagerly(*args: Any) -> Any:
    """Marks a snapshot's program that can run again eagerly (never called)."""
    raise AssertionError("a snapshot's placeholder for the eager program was called")


# (grad mode of the call, whether any input requires grad)
Mode = tuple[bool, bool]
_MISSING: Any = object()
_requires_grad = operator.attrgetter("requires_grad")


# One input's exact view: sizes, strides, storage offset.
_View = tuple[tuple[int, ...], tuple[int, ...], int]
# What selects a program within a mode: how inputs share memory with the mutated ones and,
# where some do in a graph with symbolic sizes, the views of the inputs with symbolic sizes
# outside those groups. A program over shared bases is traced on static fakes (its inputs'
# exact views), so every size it read is part of what it assumes, not the groups' alone.
_Key = tuple[Aliasing, tuple[_View, ...]]
_UNALIASED: _Key = ((), ())


@dataclasses.dataclass
class _ModePrograms:
    """The programs compiled for one mode, by how inputs share memory with mutated ones."""

    mutated: tuple[int, ...]  # the inputs the program writes (traced without shared memory)
    programs: dict[_Key, CompiledProgram | None]  # None: could not compile, runs eagerly


def _key(known: _ModePrograms, primals: Sequence[torch.Tensor], symbolic: Sequence[int]) -> _Key:
    """How inputs overlap the mutated ones now (not looked at when nothing is mutated) and,
    when some do, the views of the inputs at ``symbolic`` (those with symbolic sizes)."""
    if not known.mutated:
        return _UNALIASED
    aliasing = shared_memory(primals, known.mutated)
    if not aliasing or not symbolic:
        return aliasing, ()
    views = tuple(
        (tuple(t.shape), tuple(t.stride()), int(t.storage_offset()))
        for t in (primals[i] for i in symbolic)
    )
    return aliasing, views


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
        restored: Mapping[Mode, _ModePrograms] | None = None,
        prepare: Callable[[], None] | None = None,
        freezing: bool | None = False,
    ) -> None:
        self.gm = gm
        # the caller's rewrites of gm, deferred until gm first runs or is traced
        self._pending = prepare
        self._pending_lock = threading.Lock()
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
        # Symbolic Python numbers (capture's SymInt/SymFloat placeholders) are graph inputs
        # after the tensors; the other non-tensor inputs are baked into the graphs.
        self.number_positions = _number_positions(gm, example_inputs)
        self.constants = [None if isinstance(a, torch.Tensor) else a for a in example_inputs]
        self.constant_positions = [
            i
            for i, a in enumerate(example_inputs)
            if not isinstance(a, torch.Tensor) and i not in self.number_positions
        ]
        self.partition_stats: PartitionStats | None = None
        self._modes: dict[Mode, _ModePrograms] = {}
        # checkpointed regions and control flow: traced node by node, so their ATen ops
        # carry the marks, and cond/while_loop nodes trace their branches
        self._marked = has_regions(gm) or has_control_flow(gm)
        # the captured graph's fakes with symbolic sizes, by primal: traced as they are
        self._templates = self._symbolic_templates(gm, len(self.state_names))
        self._number_fakes = _placeholder_values(gm, self.number_positions)
        self._symbolic_primals = [i for i, t in enumerate(self._templates) if t is not None]
        # module state, taken as constants by forward-only programs (freezing.py)
        self._state_primals = (
            []
            if freezing is False
            else state_positions(gm, example_inputs, len(self.state_names), freezing is None)
        )
        self._warned = False
        if restored is not None:
            self._restore(restored)
            return
        primals = self._primals(example_inputs)
        self._get(self._mode(primals), primals, initial=True)

    def snapshot(self) -> dict[Mode, _ModePrograms]:
        """The programs compiled so far, for a whole-graph cache to pickle.

        What ties a program to this process stays behind: the traced graph (the runtime
        never reads it), the program's eager re-run (marked, and rebuilt over the restoring
        process's module by :meth:`_restore`) and the compiler of pruned backwards (a restored
        program runs the full backward, with zeros, for a set of gradients it had not met).
        """
        saved: dict[Mode, _ModePrograms] = {}
        for mode, known in self._modes.items():
            programs: dict[_Key, CompiledProgram | None] = {}
            for key, compiled in known.programs.items():
                if compiled is None:
                    continue
                program = dataclasses.replace(compiled.program, gm=_EMPTY_GRAPH)
                programs[key] = dataclasses.replace(
                    compiled,
                    program=program,
                    eager=None if compiled.eager is None else _rerun_eagerly,
                    prune=None,
                    _backwards=dict(compiled._backwards),
                )
            saved[mode] = _ModePrograms(known.mutated, programs)
        return saved

    def _restore(self, saved: Mapping[Mode, _ModePrograms]) -> None:
        for mode, known in saved.items():
            for compiled in known.programs.values():
                if compiled is not None and compiled.eager is _rerun_eagerly:
                    compiled.eager = self._rerun(compiled.layout)
            self._modes[mode] = known

    def _rerun(self, layout: InputLayout) -> Callable[..., Any]:
        """A restored program's eager re-run: the program over ``gm``, prepared first."""
        program = self._program_fn(layout)

        def rerun(*inputs: Any) -> Any:
            self._prepared()
            return program(*inputs)

        return rerun

    def _symbolic_templates(self, gm: torch.nn.Module, num_state: int) -> list[torch.Tensor | None]:
        """Per primal, the placeholder's fake when it has symbolic sizes; empty when none has
        (static graphs trace fakes of the real inputs, as always)."""
        if not isinstance(gm, fx.GraphModule):
            return []
        vals = [n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"]
        if len(vals) != len(self.constants) or not any(map(is_symbolic, vals)):
            return []
        templates: list[torch.Tensor | None] = [None] * num_state
        return templates + [
            vals[i] if is_symbolic(vals[i]) else None for i in self.tensor_positions
        ]

    def _primals(self, args: Sequence[Any]) -> list[torch.Tensor]:
        if not self._state_slots:  # the frontend's graphs take their parameters as inputs
            return [args[i] for i in self.tensor_positions]
        state = [getattr(module, attr) for module, attr in self._state_slots]
        return state + [args[i] for i in self.tensor_positions]

    @staticmethod
    def _mode(primals: Sequence[torch.Tensor]) -> Mode:
        # Under no_grad the program may still enable grad itself, so whether inputs require
        # grad matters in both modes (params come first: usually one look); with none that
        # does, the grad mode does not matter (both trace the same forward-only program).
        wants_grad = any(map(_requires_grad, primals))
        return wants_grad and torch.is_grad_enabled(), wants_grad

    def variants(self) -> list[CompiledProgram]:
        """Every program compiled so far (per grad mode and input aliasing)."""
        return [p for m in self._modes.values() for p in m.programs.values() if p is not None]

    def variant(self, joint: bool) -> CompiledProgram:
        """The first compiled program with (or without) a backward."""
        return next(p for p in self.variants() if p.program.is_joint == joint)

    def __call__(self, *args: Any) -> Any:
        if self.constant_positions or len(args) != len(self.constants):
            self._check_constants(args)
        primals = self._primals(args)
        mode = self._mode(primals)
        # a program that mutates no input is the one for its mode whatever shares memory
        known = self._modes.get(mode)
        if known is not None and not known.mutated:
            compiled = known.programs.get(_UNALIASED, _MISSING)
        else:
            compiled = _MISSING
        if compiled is _MISSING:
            compiled = self._get(mode, primals)
        if compiled is None:
            self._prepared()
            return self.gm(*args)
        if compiled.layout.groups:  # else the graph inputs are the primals (a fresh list)
            primals = compiled.layout.prepare(primals)
        if self.number_positions:
            primals += [args[i] for i in self.number_positions]
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
            if arg != example and not (_is_nan(arg) and _is_nan(example)):  # NaN is NaN
                msg = (
                    f"input {i} was {example!r} when compiled and is {arg!r} now; non-tensor "
                    "inputs are constants of the compiled graphs (the caller must guard them)"
                )
                raise AotError(msg)

    def _get(
        self, mode: Mode, primals: Sequence[torch.Tensor], *, initial: bool = False
    ) -> CompiledProgram | None:
        """The program for this call; None when it could not be compiled (run eagerly)."""
        known = self._modes.get(mode)
        if known is not None:
            found = known.programs.get(self._key(known, primals), _MISSING)
            if found is not _MISSING:
                return found
        try:
            self._prepared()
            # compiled where first called: maybe under the user's saved-tensor hooks
            with no_user_hooks():
                return self._compile_variant(mode, primals)
        except Exception as e:
            if initial:
                raise
            counters.bump("stats", "eager_fallbacks")
            if not self._warned:
                self._warned = True
                warnings.warn(
                    f"kiln: compiling a variant of a graph failed ({type(e).__name__}: {e}); "
                    "calls like this one run eagerly",
                    RuntimeWarning,
                    stacklevel=3,
                )
            known = self._modes.setdefault(mode, _ModePrograms((), {}))
            known.programs[self._key(known, primals)] = None
            return None

    def _key(self, known: _ModePrograms, primals: Sequence[torch.Tensor]) -> _Key:
        return _key(known, primals, self._symbolic_primals)

    def _program_fn(self, layout: InputLayout) -> Callable[..., Any]:
        """The program over its graph inputs: ``layout``'s tensors, then the numbers."""
        count = len(self.number_positions)
        if not count:
            return layout.wrap(self._call_module)

        def call(*inputs: Any) -> Any:
            numbers = inputs[len(inputs) - count :]
            with_numbers = functools.partial(self._call_module, numbers=numbers)
            return layout.wrap(with_numbers)(*inputs[: len(inputs) - count])

        return call

    def _prepared(self) -> None:
        """Run the deferred ``prepare`` once, before gm first runs or is traced (a restored
        program's, which most processes never need), and outside any trace: a rewrite may
        compute with real tensors."""
        if self._pending is not None:
            with self._pending_lock:
                if self._pending is not None:
                    self._pending()
                    self._pending = None

    def _call_module(self, *fakes: torch.Tensor, numbers: Sequence[Any] = ()) -> Any:
        n = len(self.state_names)
        state = dict(zip(self.state_names, fakes[:n], strict=True))
        args: list[Any] = list(self.constants)
        for pos, fake in zip(self.tensor_positions, fakes[n:], strict=True):
            args[pos] = fake
        for pos, number in zip(self.number_positions, numbers, strict=True):
            args[pos] = number
        # data-dependent ops run on fakes as capture ran them: their values are unbacked symbols
        with unbacked.allowing(getattr(self.gm, "meta", {}).get(DATA_DEPENDENT_OPS)):
            if self._marked:
                assert isinstance(self.gm, fx.GraphModule)
                return call_marked(self.gm, state, args, ControlFlowInterpreter)
            return torch.func.functional_call(self.gm, state, tuple(args))

    def _trace(
        self, mode: Mode, primals: Sequence[torch.Tensor], layout: InputLayout
    ) -> TracedProgram:
        grad_enabled, wants_grad = mode
        fn = self._program_fn(layout)

        def trace(table: Mapping[Any, Callable[..., Any]]) -> TracedProgram:
            # fresh fakes for each trace: a trace mutates its fakes in place, with history
            # symbolic sizes only where inputs are not traced over shared bases (an aliasing
            # program is chosen by the exact views of its inputs with symbolic sizes: _key)
            templates = self._templates if not layout.groups else []
            fakes, leaves = fakes_of(layout.prepare(primals), wants_grad, templates)
            fakes += self._number_fakes
            leaves += self._number_fakes
            return trace_program(fn, fakes, table, joint=wants_grad, grad_leaves=leaves)

        if grad_enabled and wants_grad:
            return trace(for_training(self.decompositions))
        program = trace(self.decompositions)
        if program.is_joint:  # grad enabled inside a program called under no_grad
            program = trace(for_training(self.decompositions))
        return program

    def _compile_variant(self, mode: Mode, primals: Sequence[torch.Tensor]) -> CompiledProgram:
        """Compile for this call's mode and aliasing; the first program of a mode is traced
        without shared memory, which tells the inputs it mutates."""
        identity = InputLayout.identity(len(primals))
        known = self._modes.get(mode)
        program = None
        if known is None:
            program = self._trace(mode, primals, identity)
            known = self._modes[mode] = _ModePrograms(tuple(program.mutated_inputs), {})
        key = self._key(known, primals)
        aliasing = key[0]
        layout = InputLayout.for_aliasing(primals, aliasing) or identity
        if aliasing:
            counters.bump("autograd_aot", "aliased_programs")
            log.info(
                "inputs %s share memory with a mutated input: traced over bases", layout.groups
            )
        if program is None or aliasing:
            program = self._trace(mode, primals, layout)
        compiled = known.programs[key] = self._compile(program, layout)
        return compiled

    def _compile(self, program: TracedProgram, layout: InputLayout) -> CompiledProgram:
        counters.bump("autograd_aot", "programs")
        eager = None if program.mutated_inputs else self._program_fn(layout)
        if eager is not None and _has_random_op(program.gm):
            eager = None
        if not program.is_joint:
            log.debug("forward-only graph:\n%s", program.gm.code)
            artifacts.dump("aot_inference.py", program.gm.code)
            compile_branches(program.gm, self.fw_compiler)
            forward: Callable[..., Any] | None = None
            if self._state_primals and not program.mutated_inputs and not layout.groups:
                forward = compile_frozen(program.gm, self._state_primals, self.fw_compiler)
            if forward is None:
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
        compile_branches(fw, self.fw_compiler)
        compile_branches(bw, self.bw_compiler)
        forward = self.fw_compiler(fw, _fake_inputs(fw))
        backward = self.bw_compiler(bw, _fake_inputs(bw))
        num_saved = stats.num_saved
        reads = symbol_reads(_fake_inputs(fw))
        fw_outputs = _output_nodes(fw)
        saved_vals = [n.meta.get("val") for n in fw_outputs[len(fw_outputs) - num_saved :]]
        exposed = exposed_saved(fw, program.num_user_outputs, num_saved)
        inputs = {n: i for i, n in enumerate(fw.graph.find_nodes(op="placeholder"))}
        saved_nodes = fw_outputs[len(fw_outputs) - num_saved :]
        return CompiledProgram(
            program,
            forward,
            backward,
            layout,
            eager,
            num_saved=num_saved,
            saved_sizes=tuple(
                i for i, v in enumerate(saved_vals) if not isinstance(v, torch.Tensor)
            ),
            exposed=exposed,
            exposed_inputs=tuple(inputs.get(saved_nodes[i], -1) for i in exposed),
            symbol_reads=tuple((i, d) for i, d, _ in reads),
            prune=functools.partial(self._compile_pruned, bw, num_saved, [v for _, _, v in reads]),
        )

    def _compile_pruned(
        self, bw: fx.GraphModule, num_saved: int, symbols: list[Any], present: tuple[int, ...]
    ) -> Backward | None:
        """The backward for the differentiable outputs at ``present`` only (the others got no
        gradient); None (the full one, with zero tangents) if it cannot be compiled.
        ``symbols``: the forward's size symbols, which the pruned backward takes too."""
        try:
            with no_user_hooks():
                pruned, used, grads = prune_backward(bw, num_saved, present, symbols)
                log.debug("backward for outputs %s:\n%s", present, pruned.code)
                fn = self.bw_compiler(pruned, _fake_inputs(pruned)) if grads else None
        except Exception as e:  # the full backward is right too, but reads every saved value
            log.warning(
                "compiling a backward for outputs %s failed (%s: %s); the full one runs",
                present,
                type(e).__name__,
                e,
            )
            return None
        counters.bump("autograd_aot", "pruned_backwards")
        return Backward(fn, used, list(present), grads, symbols=bool(symbols))


def _trace_flat(fn: Callable[..., Any], inner: list[torch.Tensor]) -> fx.GraphModule:
    """The ATen graph of ``fn`` over the inner tensors (``aot_compile`` decomposes it)."""
    return trace_aten(fn, inner, {})


def aot_compile(
    gm: torch.nn.Module,
    example_inputs: Sequence[Any],
    *,
    fw_compiler: Compiler,
    bw_compiler: Compiler | None = None,
    decompositions: Mapping[Any, Callable[..., Any]] | None = None,
    partitioner: str = "mincut",
    restored: Mapping[Mode, _ModePrograms] | None = None,
    prepare: Callable[[], None] | None = None,
    freezing: bool | None = False,
) -> AotCompiled:
    """Compile ``gm`` through ATen graphs; call the result like ``gm``.

    ``example_inputs`` are real tensors (non-tensor inputs are baked in).
    ``decompositions=None`` uses :func:`default_decompositions`. ``partitioner``
    is ``"mincut"`` or ``"save_all"``. ``restored``: the :meth:`AotCompiled.snapshot` of an
    earlier compile of the same graph for the same inputs, used instead of compiling now
    (other grad modes and aliasings still compile on first use). ``prepare``: rewrites of
    ``gm`` that keep its inputs, parameters and buffers, run once before ``gm`` is first run or
    traced, so a restored program that never needs ``gm`` never pays for them. ``freezing``:
    forward-only CPU programs take module state as constants (``freezing.py``); None: only
    where no parameter or buffer requires grad.
    """
    if restored is None and has_wrapper_inputs(example_inputs):

        def compile_flat(graph: fx.GraphModule, inner: list[torch.Tensor]) -> AotCompiled:
            return aot_compile(
                graph,
                inner,
                fw_compiler=fw_compiler,
                bw_compiler=bw_compiler,
                decompositions=decompositions,
                partitioner=partitioner,
            )

        program = SubclassProgram(gm, _trace_flat, compile_flat)  # type: ignore[arg-type]
        # called like one; nothing of it is stored across processes (save_fx refuses it)
        return cast(AotCompiled, program)
    table: Mapping[Any, Callable[..., Any]]
    if restored is not None and decompositions is not None:
        table = decompositions  # read only if another variant compiles: a lazy one stays unbuilt
    else:
        table = default_decompositions() if decompositions is None else dict(decompositions)
        log.info("decomposition table: %d entries", len(table))
        log.debug("%s", describe_table(table))
    return AotCompiled(
        gm,
        example_inputs,
        fw_compiler,
        bw_compiler or fw_compiler,
        table,
        partitioner,
        restored,
        prepare,
        freezing,
    )
