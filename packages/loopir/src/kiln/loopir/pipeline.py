"""``compile_graph``: ATen graph → kernels → wrapper, as a script of named passes.

    lower → verify → schedule (fuse, order, codegen) → finalize → plan_memory → wrapper

Each pass's name and time show on this module's logger; the IR after lowering
is printed on ``kiln.loopir.ir``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
import torch.fx

from kiln.capture import artifacts, counters
from kiln.loopir import symbolic
from kiln.loopir.backend import Backend, configure, get_backend
from kiln.loopir.debug import dump_output_code
from kiln.loopir.decompositions import decompositions
from kiln.loopir.errors import StaticShapesOnly
from kiln.loopir.graph import GraphLowering
from kiln.loopir.ir.buffers import InputBuffer
from kiln.loopir.ir.layout import Layout
from kiln.loopir.ir.views import ReinterpretView
from kiln.loopir.memory import MemoryPlan, plan_memory
from kiln.loopir.printing import render_buffers, render_group
from kiln.loopir.reference import ReferenceBackend
from kiln.loopir.scheduler.nodes import SchedNode
from kiln.loopir.scheduler.order import KernelStep, Step, schedule
from kiln.loopir.wrapper import WrapperCode, base_globals, generate_wrapper, load_wrapper

__all__ = ["compile_graph", "compile_graph_reference", "CompiledGraph"]

log = logging.getLogger(__name__)
ir_log = logging.getLogger("kiln.loopir.ir")


@contextlib.contextmanager
def _pass(name: str) -> Iterator[None]:
    start = time.perf_counter()
    log.debug("pass %s: start", name)
    with counters.phase(f"loopir.{name}"):
        yield
    elapsed = (time.perf_counter() - start) * 1e3
    log.debug("pass %s: %.1f ms", name, elapsed)
    artifacts.note("loopir passes", f"{name}: {elapsed:.1f} ms")


@dataclasses.dataclass
class CompiledGraph:
    """The callable ``compile_graph`` returns, with what tests and tools inspect."""

    wrapper: WrapperCode
    steps: list[Step]
    memory: MemoryPlan
    input_names: tuple[str | None, ...] = ()
    """The buffer each positional input is bound to (None: a non-tensor input), so a graph
    wrapper (:mod:`kiln.loopir.entry`) can tell which buffers are the caller's tensors."""

    def __call__(self, *args: Any) -> Any:
        return self.wrapper.fn(list(args))

    def call_boxed(self, args: list[Any]) -> Any:
        """Run on ``args``, a list the call empties: each input dies after its last use
        unless the caller holds it elsewhere (a backward's saved activations)."""
        return self.wrapper.fn(args)

    @property
    def source(self) -> str:
        return self.wrapper.source

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled as the wrapper's source and the names it binds beyond the common ones
        (kernels, constants, ops), for a whole-graph cache; the IR steps and the memory plan
        (but its peak) stay behind, so a loaded graph has no steps."""
        common = base_globals()
        names = {k: v for k, v in self.wrapper.globals.items() if k not in common}
        peak = self.memory.peak_bytes
        return (_loaded_graph, (self.wrapper.source, names, self.input_names, peak))

    @property
    def kernel_count(self) -> int:
        return sum(isinstance(s, KernelStep) for s in self.steps)

    @property
    def peak_bytes(self) -> int:
        return self.memory.peak_bytes


def _loaded_graph(
    source: str, names: dict[str, Any], input_names: tuple[str | None, ...], peak: int
) -> CompiledGraph:
    return CompiledGraph(load_wrapper(source, names), [], MemoryPlan({}, {}, {}, peak), input_names)


def _default_device(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> torch.device:
    metas = [n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"]
    for value in [*metas, *example_inputs]:
        device = getattr(value, "device", None)
        if isinstance(device, torch.device) and device.type != "meta":
            return device
    return torch.device("cpu")


def compile_graph(
    aten_gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any],
    *,
    backend: Backend | None = None,
    fusion: bool = True,
    options: Mapping[str, Any] | None = None,
    channels_last: bool | None = None,
) -> CompiledGraph:
    """Compile an ATen graph (``meta["val"]`` on its nodes) into a Python callable.

    ``backend`` forces one backend for every device (tests use the reference one);
    by default each device type's registered backend is used. ``fusion=False`` gives
    every buffer its own kernel (to tell a fusion bug from a lowering bug).
    ``options`` go to each backend's ``with_options`` (see
    :mod:`kiln.loopir.backend`). ``channels_last`` forces (True) or forbids (False) NHWC
    4-D buffers; None decides by :func:`~kiln.loopir.layout_choice.prefers_channels_last`.
    """
    graph = GraphLowering(
        aten_gm,
        example_inputs,
        decompositions(),
        _default_device(aten_gm, example_inputs),
        channels_last=channels_last,
        backend=backend,
    )
    known = symbolic.SizeFacts(graph.size_hints, graph.size_ranges)
    with symbolic.facts(known):  # filled as lowering meets the inputs' symbols
        try:
            compiled = _compile(graph, backend, fusion, options)
        except StaticShapesOnly:
            raise
        except Exception as exc:
            if not graph.size_hints:
                raise
            # mostly sympy's answer to a yes/no question or int() of a symbolic size (a
            # lowering that decides on sizes as numbers); whatever it is, the graph compiled
            # per set of sizes is what ran before symbolic sizes reached loopir
            log.debug("symbolic compile failed", exc_info=True)
            msg = f"compiling with symbolic sizes failed ({type(exc).__name__}: {exc})"
            raise StaticShapesOnly(msg) from exc
    written = dump_output_code(compiled.wrapper, example_inputs)
    if written is not None:
        artifacts.note("loopir passes", f"(the passes above made {written.name})")
    return compiled


def _compile(
    graph: GraphLowering,
    backend: Backend | None,
    fusion: bool,
    options: Mapping[str, Any] | None,
) -> CompiledGraph:
    with _pass("lower"):
        graph.run()
        _check_bound(graph)
    with _pass("verify"):
        for buf in graph.buffers:
            buf.verify()
            buf.freeze_layout()
    if ir_log.isEnabledFor(logging.INFO) or artifacts.debug_dir() is not None:
        text = render_buffers(graph.buffers, "lower")
        ir_log.info("%s", text)
        artifacts.dump("loopir_ir.txt", text)

    def layout_of(name: str) -> Layout:
        return graph.name_to_buffer[name].layout

    used: dict[str, Backend] = {}

    def backend_for(node: SchedNode) -> Backend:
        device_type = node.device.type
        if device_type not in used:
            found = backend if backend is not None else get_backend(device_type)
            used[device_type] = configure(found, options or {})
        return used[device_type]

    keep = _output_names(graph.outputs)
    with _pass("schedule"):
        defined_by = graph.unbacked.defined_by
        steps = schedule(graph.buffers, layout_of, backend_for, keep, fusion, defined_by)
    if ir_log.isEnabledFor(logging.INFO) or artifacts.debug_dir() is not None:
        text = render_steps(steps, "schedule")
        ir_log.info("%s", text)
        artifacts.dump("loopir_kernels.txt", text)
    with _pass("finalize"):
        # build what a backend queued, so errors surface while compiling
        for found in {id(b): b for b in used.values()}.values():
            found.finalize()
    external = set(graph.input_buffers) | keep | set(graph.seed_devices)
    with _pass("plan_memory"):
        inputs = {name for name in graph.graph_inputs if name is not None}
        plan = plan_memory(steps, layout_of, external, inputs - keep)
    constants = {
        name: buf.constant
        for name, buf in graph.input_buffers.items()
        if isinstance(buf, InputBuffer) and buf.constant is not None
    }
    with _pass("wrapper"):
        wrapper = generate_wrapper(
            steps, plan, graph.graph_inputs, graph.outputs, graph.output_spec,
            constants, graph.seed_count, graph.seed_devices, graph.size_bindings,
            graph.unbacked,
        )  # fmt: skip
    compiled = CompiledGraph(wrapper, steps, plan, tuple(graph.graph_inputs))
    for step in steps:
        if isinstance(step, KernelStep):
            counters.bump("kernels", step.backend)
    log.info("compiled %d kernels, peak %d bytes", compiled.kernel_count, plan.peak_bytes)
    return compiled


def _check_bound(graph: GraphLowering) -> None:
    """Every size symbol a buffer's layout holds must be one the wrapper reads from an
    input: nothing else tells a call its value."""
    used = symbolic.size_symbols(
        e
        for buf in graph.name_to_buffer.values()
        for e in (*buf.layout.size, *buf.layout.stride, buf.layout.offset)
    )
    unbound = sorted(str(s) for s in used - graph.size_bindings.keys())
    if unbound:
        msg = f"size symbols {', '.join(unbound)} are no input's size"
        raise StaticShapesOnly(msg)


def render_steps(steps: Sequence[Step], made_by: str) -> str:
    """The scheduled program: each kernel's nodes, and the extern calls between them."""
    parts = [f"# loopir kernels after pass {made_by!r}"]
    for step in steps:
        if isinstance(step, KernelStep):
            parts.append(render_group(step.group))
        else:
            parts.append(f"# {step.buffer.describe()}")
    return "\n".join(parts)


def compile_graph_reference(
    aten_gm: torch.fx.GraphModule, example_inputs: Sequence[Any]
) -> CompiledGraph:
    """``compile_graph`` with the reference backend on every device (no code generation)."""
    return compile_graph(aten_gm, example_inputs, backend=ReferenceBackend())


def _output_names(outputs: Sequence[Any]) -> set[str]:
    names = set()
    for out in outputs:
        if isinstance(out, ReinterpretView) or hasattr(out, "get_name"):
            names.add(out.get_name())
    return names
