"""The wrapper: a generated Python function that runs one compiled graph.

It unpacks the inputs, draws seeds for random ops, allocates buffers with
``empty_strided``, launches kernels through the backends' callables, calls
extern ATen ops, frees buffers after their last use, and returns the outputs.
The source is printed on ``kiln.loopir.output_code`` and dumped as an artifact.

Under ``torch.profiler`` the wrapper runs as a named range (the user's function and graph
number, :func:`naming_region`) with each kernel launch a range of its own. The wrapper reads
one flag per call to choose: with the profiler off it runs the plain body, which holds no
per-kernel profiling work; with it on, a copy of the body whose launches sit in
``record_function`` ranges, generated from the plain source on the first profiled call.
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
import dataclasses
import itertools
import linecache
import logging
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import sympy
import torch
from torch.utils import _pytree as pytree

from kiln.capture import counters
from kiln.loopir import random_bits, sizes, symbolic, unbacked
from kiln.loopir.errors import StaticShapesOnly
from kiln.loopir.index_printer import IndexPrinter
from kiln.loopir.ir.buffers import Buffer, ComputedBuffer, ExternBuffer, InputBuffer, MultiOutput
from kiln.loopir.ir.layout import Layout
from kiln.loopir.ir.views import ReinterpretView
from kiln.loopir.memory import MemoryPlan
from kiln.loopir.scheduler.order import ExternStep, KernelStep, NopStep, Step
from kiln.loopir.symbolic import SizeBinding

__all__ = [
    "WrapperCode",
    "base_globals",
    "clone_strided",
    "current_region",
    "generate_wrapper",
    "load_wrapper",
    "naming_region",
]

log = logging.getLogger(__name__)
output_log = logging.getLogger("kiln.loopir.output_code")
_file_ids = itertools.count()
_region: contextvars.ContextVar[str] = contextvars.ContextVar("kiln_region", default="kiln graph")
_LAUNCH = "  # range "  # ends each kernel launch, then the name of its range when profiled
_PROFILING = "if _profiler._is_profiler_enabled:"


@contextlib.contextmanager
def naming_region(name: str) -> Iterator[None]:
    """Name the profiler range of the wrappers generated or loaded inside (a frontend passes
    the user's function and graph number, ``"kiln: Model.forward graph 0"``)."""
    token = _region.set(name)
    try:
        yield
    finally:
        _region.reset(token)


def current_region() -> str:
    """The range name :func:`naming_region` set here (for compiles that happen later)."""
    return _region.get()


class _Profiled:
    """The wrapper's body with profiler ranges, compiled on its first call.

    Built from the plain source: the body runs inside the graph's range, and each line
    marked as a kernel launch inside one named after its kernel. Nothing of it is made
    until a profiled call needs it, so unprofiled programs compile and print as before.
    """

    def __init__(self, source: str, names: dict[str, Any], region: str) -> None:
        self.source, self.names, self.region = source, names, region
        self.fn: Callable[[list[Any]], Any] | None = None

    def __call__(self, args: list[Any]) -> Any:
        if self.fn is None:
            self.fn = self._build()
        return self.fn(args)

    def _build(self) -> Callable[[list[Any]], Any]:
        lines = ["def call(args):", "    with _record(_region):"]
        for line in self.source.splitlines()[1:]:
            if line.strip() == _PROFILING or line.strip().startswith("return _profiled("):
                continue
            launch, _, name = line.strip().partition(_LAUNCH)
            lines.append(f"        with _record({name!r}): {launch}" if name else "    " + line)
        source = "\n".join(lines) + "\n"
        filename = f"<kiln.loopir profiled wrapper {next(_file_ids)}>"
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        namespace = {**self.names, "_region": self.region, "_record": _record_function}
        exec(compile(source, filename, "exec"), namespace)
        fn: Callable[[list[Any]], Any] = namespace["call"]
        return fn


def _record_function(name: str) -> Any:
    """A profiler range: torch's C++ one where this build has it, else ``record_function``."""
    fast = getattr(torch._C._profiler, "_RecordFunctionFast", None)
    if fast is not None:
        return fast(name)
    return torch.autograd.profiler.record_function(name)


def _reinterpret(
    t: torch.Tensor, size: Sequence[int], stride: Sequence[int], offset: int
) -> torch.Tensor:
    return torch.as_strided(t, size, stride, t.storage_offset() + offset)


def _binding(op: Any, kwargs: Iterable[str]) -> Any:
    """torch's own Python binding for ``op`` where it is sure to run that very overload, else
    ``op``: the binding parses its arguments in C++, where an ``OpOverload`` goes through
    the boxed path, which converts every argument through the schema: about half again the
    host time for a small cuDNN convolution, and small convolution nets make dozens a step.

    Only for an aten op's default overload, called with keyword arguments that are
    keyword-only in its schema (their names are the binding's too), and only when every
    other overload has a required argument the default lacks: a call that fits the default
    cannot reach it through the binding's overload resolution.
    """
    if not isinstance(op, torch._ops.OpOverload) or op.namespace != "aten":
        return op
    packet = op.overloadpacket
    name = packet.__name__
    fn = getattr(torch._C._VariableFunctions, name, None) or getattr(torch._C._nn, name, None)
    if op._overloadname != "default" or fn is None:
        return op
    schema = op._schema
    names = {a.name for a in schema.arguments}
    if not set(kwargs) <= {a.name for a in schema.arguments if a.kwarg_only}:
        return op
    for other in packet.overloads():
        if other == "default":
            continue
        required = {
            a.name for a in getattr(packet, other)._schema.arguments if not a.has_default_value()
        }
        if required <= names:
            return op
    return fn


def clone_strided(t: torch.Tensor) -> torch.Tensor:
    """A copy of ``t`` laid out exactly as ``t`` is: same sizes, strides and overlaps.

    A compiled kernel indexes its tensors with the strides it was generated for. ``clone``
    keeps strides only for dense tensors: a view with gaps (``x[:, 0]`` of a 3-d tensor)
    comes back contiguous and smaller, so a kernel given the clone in the original's place
    (an autotuning scratch output, a CUDA graph's static input) would read and write past
    its end. This copies the whole span of storage ``t`` reaches instead.
    """
    if t.numel() == 0:
        return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
    span = 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True))
    flat = t.as_strided((span,), (1,), t.storage_offset()).clone()
    return flat.as_strided(t.shape, t.stride())


_copies_warned: set[tuple[str, tuple[int, ...], tuple[int, ...]]] = set()


def _as_layout(t: Any, stride: tuple[int, ...], op: str = "", dtype: Any = None) -> Any:
    """``t`` with the strides (and dtype) loopir planned for it; a safety net that should
    never copy.

    An extern result's layout is planned by running its op on meta tensors laid out
    like its real inputs (``lowering/fallback.py``), so the ATen kernel produces the
    planned strides. Should a kernel disagree with its meta function, the result is
    copied (every later view and kernel indexes it with the planned strides and reads
    it as the planned dtype: CPU batch norm's statistics are bfloat16 where the meta
    function says float32), counted in ``extern_copies`` and logged: tests assert the
    count stays zero.
    """
    if dtype is not None and isinstance(t, torch.Tensor) and t.dtype is not dtype:
        t = _planned_dtype(t, dtype, op)
    if not isinstance(t, torch.Tensor) or t.stride() == stride or t.dim() != len(stride):
        return t  # the first test that passes is the one taken on every call, so it goes first
    if all(n == 1 or s == w for n, s, w in zip(t.shape, t.stride(), stride, strict=True)):
        return t
    counters.bump("extern_copies", op)
    key = (op, t.stride(), tuple(stride))
    if key not in _copies_warned:  # once, not on every call
        _copies_warned.add(key)
        log.warning("%s returned strides %s, planned %s: copied", op, t.stride(), tuple(stride))
    out = torch.empty_strided(t.shape, stride, device=t.device, dtype=t.dtype)
    return out.copy_(t)


def _planned_dtype(t: torch.Tensor, dtype: torch.dtype, op: str) -> torch.Tensor:
    counters.bump("extern_copies", op)
    key = (op, (), ())
    if key not in _copies_warned:
        _copies_warned.add(key)
        log.warning("%s returned %s, planned %s: converted", op, t.dtype, dtype)
    return t.to(dtype)


@dataclasses.dataclass
class WrapperCode:
    """Generated source plus the globals it runs with."""

    source: str
    globals: dict[str, Any]
    fn: Callable[[list[Any]], Any]


_GRAD_MODE_OPS = frozenset({"mkldnn_rnn_layer"})
"""ATen ops whose kernels read grad mode: oneDNN's RNN layer keeps the workspace its backward
reads only while grad mode is on, whatever its ``train`` flag says. A compiled forward runs
with grad mode off (inside an ``autograd.Function``), where it would hand back no workspace."""


def _with_grad_mode(op: Any, *args: Any, **kwargs: Any) -> Any:
    """``op(*args, **kwargs)`` with grad mode on, below autograd (nothing is recorded)."""
    with torch.enable_grad(), torch._C._AutoDispatchBelowAutograd():
        return op(*args, **kwargs)


def _reads_grad_mode(buf: ExternBuffer) -> bool:
    """Whether ``buf``'s op is one of ``_GRAD_MODE_OPS`` called with ``train=True``."""
    packet = getattr(buf.op, "_overloadpacket", None)
    if getattr(packet, "__name__", None) not in _GRAD_MODE_OPS:
        return False
    for i, arg in enumerate(buf.op._schema.arguments):
        if arg.name == "train":
            return bool(buf.args[i] if i < len(buf.args) else buf.kwargs.get("train", False))
    return False


class _Writer:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.globals: dict[str, Any] = {
            "torch": torch,
            "empty_strided": torch.empty_strided,
            "reinterpret": _reinterpret,
            "as_strided": torch.as_strided,
            "draw_seeds": random_bits.draw_seeds,
            "device": torch.device,
            "as_layout": _as_layout,
            "with_grad_mode": _with_grad_mode,
            "_profiler": torch.autograd.profiler,
        }
        self._consts = itertools.count()

    def line(self, text: str) -> None:
        self.lines.append("    " + text)

    def const(self, value: Any, hint: str = "c") -> str:
        if value is None or isinstance(value, (bool, int, float, str)):
            return repr(value)
        name = f"_{hint}{next(self._consts)}"
        self.globals[name] = value
        return name

    def expr(self, value: Any, whole: bool = True) -> str:
        """Python source for an argument of an extern call or an output; a view that is its
        whole buffer (:func:`_is_whole`) is the buffer itself unless ``whole`` is False."""
        if isinstance(value, ReinterpretView):
            if whole and _is_whole(value):
                return value.get_name()
            lay = value.layout
            size, stride = _ints(lay.size), _ints(lay.stride)
            off = _int(lay.offset)
            if off == 0:  # as_strided keeps the base's storage offset: no Python frame
                return f"as_strided({value.get_name()}, {size}, {stride})"
            return f"reinterpret({value.get_name()}, {size}, {stride}, {off})"
        if isinstance(value, Buffer):
            return value.get_name()
        if isinstance(value, sympy.Expr) and value.is_Number:  # a number input's value
            return repr(int(value) if value.is_Integer else float(value))
        if isinstance(value, sympy.Expr) and symbolic.is_symbolic(value):
            return _PRINTER.print(value)  # a size argument (a view's shape): this call's
        if isinstance(value, unbacked.Condition):  # a symbolic bool the graph returns
            return f"({unbacked.assert_source(value.expr, _PRINTER)})"
        if isinstance(value, (list, tuple)) and any(
            isinstance(v, (Buffer, ReinterpretView, sympy.Expr)) for v in pytree.tree_leaves(value)
        ):
            inner = ", ".join(self.expr(v) for v in value)
            return f"[{inner}]" if isinstance(value, list) else f"({inner},)"
        return self.const(value)


class _Sizes:
    """A tuple of sizes as the wrapper prints it: ints as they are (a static graph's source
    is what it always was), a symbolic size as Python over the symbols the wrapper bound."""

    def __init__(self, values: Sequence[sympy.Expr]) -> None:
        self.values = values

    def __str__(self) -> str:
        parts = [_PRINTER.print(v) for v in self.values]
        return f"({parts[0]},)" if len(parts) == 1 else f"({', '.join(parts)})"


class _SizePrinter(IndexPrinter):
    """Python for a size over the size symbols; what it cannot print stays static."""

    error = StaticShapesOnly


_PRINTER = _SizePrinter()


def _int(value: sympy.Expr) -> int | str:
    return _PRINTER.print(value) if symbolic.is_symbolic(value) else sizes.evaluate_int(value)


def _ints(values: Sequence[sympy.Expr]) -> tuple[int, ...] | _Sizes:
    if any(symbolic.is_symbolic(v) for v in values):
        return _Sizes(values)
    return tuple(sizes.evaluate_int(s) for s in values)


def _is_whole(view: ReinterpretView) -> bool:
    """Whether ``view`` is the very tensor the wrapper holds under its buffer's name, so no view
    need be made per call (``as_strided`` costs a microsecond or two of host time: a linear
    layer's backward passed its weight through one, and every gradient came back in one).

    Its offset must be 0 (``as_strided`` keeps the base's own), its sizes and strides the
    buffer's, static, and every size above 1: the wrapper's own allocations have their planned
    strides exactly, but an extern result is only checked (``_as_layout``) and an input only
    guarded on the strides of dimensions longer than 1, which is all that addressing memory
    reads. Mutations and slices write into another buffer's storage, and a multi-output call's
    name holds its tuple: those keep their view.
    """
    buffer = view.buffer
    if isinstance(buffer, ExternBuffer):  # (no subclasses)
        if buffer.multi_output:
            return False
    elif type(buffer) not in (InputBuffer, ComputedBuffer, MultiOutput):
        return False
    size, stride = _ints(view.layout.size), _ints(view.layout.stride)
    return (
        view.layout.offset == 0
        and isinstance(size, tuple)
        and all(n > 1 for n in size)
        and view.layout.dtype == buffer.layout.dtype
        and size == _ints(buffer.layout.size)
        and stride == _ints(buffer.layout.stride)
    )


def _output_exprs(w: _Writer, outputs: Sequence[Any], inputs: Sequence[str | None]) -> list[str]:
    """The returned values. An output view that is its whole buffer is returned as the buffer
    unless the buffer is a graph input (the caller would get its input back, not a tensor of its
    own) or another output names it too (each output stays an object of its own)."""
    named = collections.Counter(
        o.get_name() for o in outputs if isinstance(o, (Buffer, ReinterpretView))
    )
    taken = set(inputs)
    return [
        w.expr(o, whole=named[o.get_name()] == 1 and o.get_name() not in taken)
        if isinstance(o, ReinterpretView)
        else w.expr(o)
        for o in outputs
    ]


def _strides(layout: Layout) -> tuple[int, ...] | _Sizes:
    return _ints(layout.stride)


def _alloc(w: _Writer, layout: Layout) -> str:
    size, stride = _ints(layout.size), _ints(layout.stride)
    # a torch.device, not its name: one parse less per allocation (hundreds a training step)
    device = "_device_" + str(layout.device).replace(":", "")
    w.globals[device] = layout.device
    return f"empty_strided({size}, {stride}, device={device}, dtype={layout.dtype})"


def generate_wrapper(
    steps: Sequence[Step],
    plan: MemoryPlan,
    graph_inputs: Sequence[str | None],
    outputs: Sequence[Any],
    output_spec: Any,
    constants: dict[str, torch.Tensor],
    seed_count: int,
    seed_devices: dict[str, torch.device],
    size_bindings: Mapping[sympy.Symbol, SizeBinding] | None = None,
    data_dependent: unbacked.UnbackedDefs | None = None,
) -> WrapperCode:
    w = _Writer()
    defs = data_dependent or unbacked.UnbackedDefs()
    later = _Later(w, defs, size_bindings or {})
    params = [name or f"_unused{i}" for i, name in enumerate(graph_inputs)]
    header = "def call(args):"
    w.line(_PROFILING)  # the one check per call; kernel launches below carry no profiling
    w.line("    return _profiled(args)")
    if params:
        w.line(f"{', '.join(params)}, = args")
    w.line("args.clear()")
    for sym, binding in sorted((size_bindings or {}).items(), key=lambda kv: kv[0].name):
        if sym not in later.waiting:  # a value computed from data: bound after its step
            w.line(f"{sym.name} = {binding.source()}")  # once per call: sizes below use it
    later.check_asserts()
    for name, value in constants.items():
        w.line(f"{name} = {w.const(value, 'const')}")
    for name, device in seed_devices.items():
        w.line(f"{name} = draw_seeds({seed_count}, {str(device)!r})")
    for i, step in enumerate(steps):
        for name, layout in plan.allocate.get(i, []):
            w.line(f"{name} = {_alloc(w, layout)}")
        for new, old, why in plan.reuse.get(i, []):
            # in place: both names stay bound until the kernel ran; old dies after it
            tail = f"; del {old}" if why == "reuse" else ""
            w.line(f"{new} = {old}{tail}  # {why}")
        _emit_step(w, step, later)
        later.bind(step.writes)
        if plan.free.get(i):
            w.line(f"del {', '.join(plan.free[i])}")
    later.finish()
    returned = _output_exprs(w, outputs, graph_inputs)
    w.line(f"return {_output_tree(w, returned, output_spec)}")
    source = "\n".join([header, *w.lines]) + "\n"
    output_log.info("wrapper code (peak %d bytes):\n%s", plan.peak_bytes, source)
    return load_wrapper(source, w.globals)


class _Later:
    """The unbacked symbols bound after the step that computes them, and the runtime
    asserts, each written as soon as its symbols are bound."""

    def __init__(
        self, w: _Writer, defs: unbacked.UnbackedDefs, bindings: Mapping[sympy.Symbol, SizeBinding]
    ) -> None:
        self.w, self.bindings, self.defs = w, bindings, defs
        # a float computed from one (``float(t) * 2``) waits for it too
        names = "|".join(s.name for s in defs.defined_by)
        self.waiting = {
            sym: {s for s in defs.defined_by if re.search(rf"\b{s.name}\b", b.source())}
            for sym, b in bindings.items()
            if sym in defs.defined_by or (names and re.search(rf"\b({names})\b", b.source()))
        }
        self.bound = set(bindings) - set(self.waiting)
        self.asserts = list(defs.asserts)

    def defines(self, name: str, text: str) -> bool:
        """Whether ``text`` names a symbol read from buffer ``name`` (not bound yet)."""
        return any(
            n == name and re.search(rf"\b{s.name}\b", text)
            for s, n in self.defs.defined_by.items()
            if s not in self.bound
        )

    def bind(self, written: Iterable[str]) -> None:
        names = set(written)
        for sym, name in sorted(self.defs.defined_by.items(), key=lambda kv: kv[0].name):
            if name in names and sym not in self.bound:
                self.w.line(f"{sym.name} = {self.bindings[sym].source()}")
                self.bound.add(sym)
        for sym, needs in sorted(self.waiting.items(), key=lambda kv: kv[0].name):
            if sym not in self.bound and sym not in self.defs.defined_by and needs <= self.bound:
                self.w.line(f"{sym.name} = {self.bindings[sym].source()}")
                self.bound.add(sym)
        self.check_asserts()

    def check_asserts(self) -> None:
        ready = [a for a in self.asserts if symbolic.size_symbols([a.expr]) <= self.bound]
        for found in ready:
            self.asserts.remove(found)
            test = unbacked.assert_source(found.expr, _PRINTER)
            self.w.line(f"if not ({test}): raise RuntimeError({found.message!r})")

    def need(self, names: Sequence[str]) -> None:
        """Raise ``StaticShapesOnly`` unless every symbol named is bound by now (a value
        computed from data that no extern result shows as a whole dimension is never bound)."""
        if names and not set(names) <= {s.name for s in self.bound}:
            msg = f"sizes {', '.join(names)} used before the wrapper can bind them"
            raise StaticShapesOnly(msg)

    def finish(self) -> None:
        missing = sorted(s.name for s in set(self.waiting) - self.bound)
        if missing or self.asserts:
            msg = f"values computed from data never bound: {missing or self.asserts}"
            raise StaticShapesOnly(msg)


def base_globals() -> dict[str, Any]:
    """What every wrapper's source may name without its own definition (a stored wrapper
    keeps only the rest: its kernels, constants and ops)."""
    return _Writer().globals


def load_wrapper(source: str, names: dict[str, Any]) -> WrapperCode:
    """The wrapper ``source`` defines, run over :func:`base_globals` and ``names``."""
    filename = f"<kiln.loopir wrapper {next(_file_ids)}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    full = {**base_globals(), **names}
    namespace = dict(full)
    namespace["_profiled"] = _Profiled(source, full, _region.get())
    exec(compile(source, filename, "exec"), namespace)
    return WrapperCode(source, full, namespace["call"])


def _output_tree(w: _Writer, outs: list[str], spec: pytree.TreeSpec) -> str:
    """The expression that returns ``outs`` shaped as ``spec``: a literal list or tuple for
    the usual flat output (``tree_unflatten`` costs a microsecond per call)."""
    flat = all(spec.child(i).is_leaf() for i in range(spec.num_children))
    if flat and spec.type is list:
        return f"[{', '.join(outs)}]"
    if flat and spec.type is tuple:
        return f"({''.join(o + ', ' for o in outs)})"
    w.globals["_spec"] = spec
    w.globals["_unflatten"] = pytree.tree_unflatten
    return f"_unflatten([{', '.join(outs)}], _spec)"


def _range_name(step: KernelStep) -> str:
    """``kiln_<language>_<ops>_<n>``: the kernel's range in a profiler trace, named as
    the Triton code generator names its kernels (the first ATen ops it fuses)."""
    ops = [o.split(".")[1] if o.count(".") >= 2 else o for o in step.group.origins()]
    words = [re.sub(r"[^0-9A-Za-z]+", "_", op).strip("_") for op in ops[:3]]
    number = re.sub(r"\D", "", step.group.name) or "0"
    return "_".join(["kiln", step.code.language, *filter(None, words), number])


def _emit_checked(
    w: _Writer, name: str, call: str, layout: str, later: _Later, note: str = ""
) -> None:
    """``name = as_layout(call, layout)``; where the result defines a symbol its planned
    strides hold (``nonzero``'s ``(1, u0)``), the symbol is bound in between."""
    if not later.defines(name, layout):
        w.line(f"{name} = as_layout({call}, {layout}){note}")
        return
    w.line(f"{name} = {call}{note}")
    later.bind([name])
    w.line(f"{name} = as_layout({name}, {layout})")


def _emit_step(w: _Writer, step: Step, later: _Later) -> None:
    if isinstance(step, KernelStep):
        w.globals[step.code.name] = step.code.fn
        w.line(f"# {step.group.describe()}  [{', '.join(step.group.origins())}]")
        later.need(step.code.size_args)
        operands = ", ".join([*step.group.args, *step.code.size_args])
        w.line(f"{step.code.name}({operands}){_LAUNCH}{_range_name(step)}")
    elif isinstance(step, ExternStep):
        buf: ExternBuffer = step.buffer
        op = w.const(_binding(buf.op, buf.kwargs), "op")
        args = [w.expr(a) for a in buf.args]
        args += [f"{k}={w.expr(v)}" for k, v in buf.kwargs.items()]
        note = "fallback" if buf.fallback else "extern"
        leaves = [
            a for a in pytree.tree_leaves((buf.args, buf.kwargs)) if isinstance(a, sympy.Basic)
        ]
        later.need([s.name for s in symbolic.size_symbols(leaves)])
        call = f"{op}({', '.join(args)})"
        if _reads_grad_mode(buf):
            call = f"with_grad_mode({', '.join([op, *args])})"
        if buf.multi_output:
            w.line(f"{buf.name} = {call}  # {note} {buf.op}")
        else:
            layout = f"{_strides(buf.layout)}, {str(buf.op)!r}, {buf.layout.dtype}"
            _emit_checked(w, buf.name, call, layout, later, f"  # {note} {buf.op}")
    elif isinstance(step, NopStep):
        part = step.buffer.parent.name + "".join(f"[{i}]" for i in step.buffer.index)
        op = repr(str(step.buffer.parent.op))
        layout = f"{_strides(step.buffer.layout)}, {op}, {step.buffer.layout.dtype}"
        _emit_checked(w, step.buffer.name, part, layout, later)
