"""The fx graph under construction, its inputs and the guards recorded so far.

One :class:`OutputGraph` is shared by the frame being captured and every
function inlined into it. Graph inputs are placeholders keyed by the tensor
they came from (so an aliased tensor is one input); each carries its fake
value in ``meta["val"]`` and its source in ``meta["source"]``; every other
node records the user's stack in ``meta["stack_trace"]`` and the innermost
user line as a :class:`~kiln.capture.errors.UserFrame` in ``meta["user_frame"]``.
"""

from __future__ import annotations

import dataclasses
import operator
import re
import weakref
from typing import Any

import torch
from torch import fx
from torch.fx._lazy_graph_module import _LazyGraphModule

from kiln.capture import dynamic_dims
from kiln.capture.breaks.reasons import unsupported
from kiln.capture.guard_data import (
    ClassAttr,
    GuardKind,
    GuardSpec,
    TensorMeta,
    dedupe,
    storage_fits,
)
from kiln.capture.meta import FakeMode, FakeTensor, fake_like, to_fake, with_history
from kiln.capture.shapes import ShapeEnv, SymNode, expr_of, symbolic_meta, wrap
from kiln.capture.shapes.materialize import CannotMaterialize, Materializer, WithDivision
from kiln.capture.shapes.tensors import dense_order
from kiln.capture.shapes.unbacked import DataDependentOps
from kiln.capture.side_effects import SideEffects
from kiln.capture.source import SizeSource, Source, StrideSource
from kiln.capture.tensor_subclasses import as_plain, is_dispatch_wrapper, is_function_subclass
from kiln.capture.values.symbolic import SymValue, is_symbolic, specialize
from kiln.capture.values.tensor import TensorValue

__all__ = [
    "DATA_ARGUMENTS",
    "DATA_DEPENDENT_OPS",
    "EAGER_RANDOM",
    "GraphInput",
    "NumberOutput",
    "OutputGraph",
]

# ``Py_TPFLAGS_IMMUTABLETYPE``: builtin and extension types refuse ``cls.name = ...``
_IMMUTABLE_TYPE = 1 << 8


def _tensor_meta(real: torch.Tensor, fake: torch.Tensor, real_type: type) -> TensorMeta:
    """What the graph assumes of ``real`` (an input of type ``real_type``): its metadata, less
    the sizes and strides that are symbols in ``fake`` (the SHAPE guard states those)."""
    meta = TensorMeta.of(real, real_type)
    sizes = tuple(None if is_symbolic(n) else n for n in fake.shape)
    strides = tuple(None if is_symbolic(n) else n for n in fake.stride())
    if sizes == meta.sizes and strides == meta.strides:
        return meta
    order = dense_order(real) if None in strides else None
    return dataclasses.replace(meta, sizes=sizes, strides=strides, dense_order=order)


def _plain_stand_in(real: torch.Tensor) -> torch.Tensor:
    """What the fake of an input is made from: a ``__torch_function__`` subclass's plain data
    (read without its override), an empty meta tensor of a dispatch wrapper's outer sizes and
    strides (it has no data of its own; autograd_aot traces through its inner tensors)."""
    if is_function_subclass(type(real)):
        return as_plain(real)
    if is_dispatch_wrapper(type(real)):
        meta = torch.empty_strided(real.shape, real.stride(), dtype=real.dtype, device="meta")
        return fake_like(meta, real.device).requires_grad_(real.requires_grad)
    return real


def _user_line(graph: OutputGraph | None) -> str:
    """``file:line`` of the traced program's line being evaluated, while a trace runs."""
    if graph is None or not graph.active:
        return ""
    frame = graph.active[-1].user_frame()
    return f"{frame.filename}:{frame.lineno}"


def _tensor_results(node: fx.Node, result: Any) -> list[tuple[fx.Node, torch.Tensor]]:
    """The tensors among an op's results, each with the node that reads it from ``node``
    (the ``getitem`` users capture made for a tuple result)."""
    if isinstance(result, torch.Tensor):
        return [(node, result)]
    found = []
    if isinstance(result, (list, tuple)):
        items = {u.args[1]: u for u in node.users if u.target is operator.getitem}
        for i, r in enumerate(result):
            if isinstance(r, torch.Tensor) and i in items:
                found.append((items[i], r))
    return found


class GraphInput:
    """One placeholder: where the real value comes from, and the value at capture time (a
    tensor, or a Python number traced as a symbol)."""

    def __init__(
        self,
        source: Source,
        real: Any,
        value: TensorValue | SymValue,
        node: fx.Node,
    ) -> None:
        self.source = source
        self.real = real
        self.value = value
        self.node = node


@dataclasses.dataclass(frozen=True)
class NumberOutput:
    """A number computed from tensor data (an expression over unbacked symbols) that leaves
    the graph: returned by the frame, or live at a graph break. No source computes it from
    the frame's arguments (as emit's prelude does for sizes), so the graph returns it:
    ``node`` is the output, the Python number at run time, of type ``python_type`` once
    converted (``convert``: ``float(n)`` of an int the graph computes)."""

    value: SymValue
    node: fx.Node
    convert: bool


#: the ``GraphModule.meta`` key holding a graph's ``DataDependentOps`` when it has unbacked
#: symbols (autograd_aot's retrace runs its data-dependent ops under the same permission)
DATA_DEPENDENT_OPS = "kiln_data_dependent_ops"

#: the attribute marking a continuation made after torch's generator was reseeded in the frame
EAGER_RANDOM = "__kiln_eager_random__"

#: the attribute of a continuation naming its arguments computed from tensor data before the
#: break (see ``OutputGraph.from_data``): they are symbolic from its first capture
DATA_ARGUMENTS = "__kiln_data_arguments__"


class OutputGraph:
    """Accumulates the graph, its inputs and guards while one frame is traced."""

    def __init__(self) -> None:
        self.graph = fx.Graph()
        self.inputs: list[GraphInput] = []
        self._by_source: dict[str, TensorValue] = {}
        self._seen: set[int] = set()
        self._guards: list[GuardSpec] = []
        self.fake_mode = FakeMode()
        self.active: list[Any] = []  # the tracers running, innermost last
        self.side_effects = SideEffects()
        self.entered: list[Any] = []  # real context managers entered while tracing
        # the frame runs after torch's generator was reseeded in it: random ops break the graph
        # and run eagerly, so they draw eager's numbers (Kiln's compiled ones differ)
        self.eager_random = False
        self.steps = 0  # instructions run, for the capture-wide budget
        self._names: set[str] = set()
        self._last_placeholder: fx.Node | None = None  # see _move_placeholders_first
        # which input sizes are symbols (kiln.capture.dynamic_dims), and their environment
        self.dynamic = dynamic_dims.current()
        self.shape_env: ShapeEnv | None = None
        self._materialize = Materializer(self._symbol_node, self._expr_node)
        # numbers the graph returns may divide (``correct / total``): sizes passed to ops may not
        self._materialize_output = WithDivision(self._symbol_node, self._expr_node)
        self._symbol_nodes: dict[Any, fx.Node] = {}
        self._numbers: dict[str, SymValue] = {}
        # unbacked symbol -> the node computing it, and the dim of that node's tensor it
        # is the size of (None: the node's value itself, as ``item()``'s)
        self._unbacked: dict[Any, tuple[fx.Node, int | None]] = {}
        self._asserted = 0

    # guards ----------------------------------------------------------------
    def guard(self, source: Source | None, kind: GuardKind, expected: Any = None) -> None:
        self._guards.append(GuardSpec(source, kind, expected))

    def guard_class_attr(self, cls: type, name: str) -> None:
        """Guard that ``cls.name`` stays what the trace found and inlined.

        The instance's source cannot carry it: a method lives on the class, which a program
        may change after a call (``A.forward = patched``, monkey-patching a library class),
        and one guard per (class, name) serves every instance.
        """
        if cls.__flags__ & _IMMUTABLE_TYPE:
            return
        try:
            value = getattr(cls, name)
        except Exception:  # a metaclass's own lookup raising: nothing stable to compare with
            return
        found = ClassAttr(cls, name, value)
        if found.holds():  # a lookup that makes a new object each time pins nothing
            self.guard(None, GuardKind.CLASS_ATTR, found)

    def guards(self) -> list[GuardSpec]:
        shape = []
        if self.shape_env is not None and self.shape_env.guards:
            shape = [GuardSpec(None, GuardKind.SHAPE, self.shape_env)]
        return dedupe(self._guards + shape)

    # inputs ----------------------------------------------------------------
    def add_input(self, source: Source, real: torch.Tensor) -> TensorValue:
        """The tensor value for ``real`` read from ``source``: one placeholder per source.

        A tensor reached through two sources (``f(x, x)``, tied weights) gets two
        placeholders with separate fakes: guards do not check aliasing, so the
        graph must not assume it.
        """
        given, real_type = real, type(real)
        with torch._C.DisableTorchFunctionSubclass():  # read without the user's override
            real = _plain_stand_in(real)
            history = given.requires_grad and not given.is_leaf
        if real.layout is not torch.strided or real.is_nested or real.is_quantized:
            # no fake models them (sparse and nested tensors have no strides, a quantized
            # one's scale is not part of its metadata), and kernels read plain storage
            layout = "nested" if real.is_nested else str(real.layout).removeprefix("torch.")
            kind = f"quantized {real.dtype}" if real.is_quantized else f"{layout} layout"
            raise unsupported("unsupported_tensor", f"{source} ({kind})")
        if real.device.type != "meta" and not storage_fits(real):
            detail = f"{source}: its storage is smaller than its sizes and strides need"
            raise unsupported("unsupported_value", detail)
        known = self._by_source.get(str(source))
        if known is not None:
            self.guard(source, GuardKind.TENSOR_MATCH, _tensor_meta(real, known.fake, real_type))
            return known
        node = self.graph.placeholder(self._unique_name(str(source)))
        fake = self._symbolic_fake(source, real)
        if fake is None:
            fake = self.fake_mode.to_fake(real) if id(real) not in self._seen else to_fake(real)
        self.guard(source, GuardKind.TENSOR_MATCH, _tensor_meta(real, fake, real_type))
        if history:  # a non-leaf that requires grad: in-place ops on it are allowed
            fake = with_history(fake)
        self._seen.add(id(real))
        node.meta["val"] = fake
        node.meta["source"] = source
        value = TensorValue(node, fake, source, real_type)
        self._by_source[str(source)] = value
        # the graph runs on the plain data; a dispatch wrapper's backend desugars the object
        self.inputs.append(
            GraphInput(source, given if is_dispatch_wrapper(real_type) else real, value, node)
        )
        self._move_placeholders_first(node)
        return value

    def _symbolic_fake(self, source: Source, real: torch.Tensor) -> FakeTensor | None:
        """A fake whose sizes are symbols where the capture's policy wants them; None for a
        fully static input."""
        dims = dynamic_dims.dims_of(self.dynamic, source, real)
        if not dims:
            return None
        meta = symbolic_meta(real, source, self._env(), dims.keys(), dims)
        meta.requires_grad_(False)
        fake = FakeTensor(meta, real.device, requires_grad=real.requires_grad)
        if not any(is_symbolic(n) for n in (*fake.shape, *fake.stride())):
            return None  # every size specialized (0 or 1): a plain fake shares storages
        self.fake_mode._fakes[real] = fake
        return fake

    def number_input(self, source: Source, value: int | float) -> SymValue | None:
        """A Python int or float argument as a symbolic graph input, where the capture's policy
        makes it one (it changed between calls, or ``dynamic=True`` for ints); else None."""
        if not dynamic_dims.number_is_dynamic(self.dynamic, source, value):
            return None
        known = self._numbers.get(str(source))
        if known is not None:
            return known
        env = self._env()
        expr = env.create_scalar(value, source)
        sym = wrap(SymNode(expr, env, type(value), value))
        node = self.graph.placeholder(self._unique_name(str(source)))
        node.meta["val"] = sym
        node.meta["source"] = source
        self._symbol_nodes[expr] = node
        number = self._numbers[str(source)] = SymValue(sym)  # type: ignore[arg-type]
        self.inputs.append(GraphInput(source, value, number, node))
        self._move_placeholders_first(node)
        self.guard(source, GuardKind.TYPE_MATCH, type(value))
        if type(value) is float:
            self.guard(source, GuardKind.FINITE, None)
        return number

    def _env(self) -> ShapeEnv:
        if self.shape_env is None:
            self.shape_env = ShapeEnv()
            # weakly: the env outlives the capture in its SHAPE guard, and this graph holds
            # the frame's real tensors and modules
            graph = weakref.ref(self)
            self.shape_env.user_line = lambda: _user_line(graph())
        return self.shape_env

    # data-dependent values --------------------------------------------------------------------
    def data_dependent_ops(self) -> DataDependentOps | None:
        """What data-dependent ops may run on fakes in this capture (its options), or None."""
        if not (self.dynamic.scalar_outputs or self.dynamic.dynamic_output_shapes):
            return None
        return DataDependentOps(
            self._env(), self.dynamic.scalar_outputs, self.dynamic.dynamic_output_shapes
        )

    def unbacked_count(self) -> int:
        return 0 if self.shape_env is None else len(self.shape_env.unbacked)

    def bind_unbacked(self, before: int, node: fx.Node, result: Any) -> None:
        """Record where the graph reads the unbacked symbols an op just made (those past
        ``before``): ``node``'s value itself, or a size of a tensor among its results; then
        add the runtime asserts the op's kernels assumed of them."""
        env = self.shape_env
        if env is None:
            return
        fresh = list(env.unbacked)[before:]
        if fresh:
            if is_symbolic(result):
                for s in expr_of(result).free_symbols & set(fresh):
                    self._unbacked.setdefault(s, (node, None))
            for producer, fake in _tensor_results(node, result):
                for d, n in enumerate(fake.shape):
                    if is_symbolic(n) and expr_of(n) in fresh:
                        self._unbacked.setdefault(expr_of(n), (producer, d))
        self.add_runtime_asserts()

    def add_runtime_asserts(self) -> None:
        """An ``aten._assert_scalar`` node for each fact assumed of unbacked symbols since the
        last call: a wrong assumption raises when the graph runs, never a wrong answer."""
        env = self.shape_env
        if env is None:
            return
        for guard in env.deferred[self._asserted :]:
            try:
                cond = self._materialize(guard.expr)
            except CannotMaterialize:
                continue  # not readable from the graph's values: torch's kernels check it
            if isinstance(cond, fx.Node):
                message = f"Runtime assertion failed for expression {guard.expr}"
                self.create_node(
                    "call_function",
                    torch.ops.aten._assert_scalar.default,
                    (cond, message),
                    {},
                    None,
                )
        self._asserted = len(env.deferred)

    def number_output(self, v: SymValue) -> NumberOutput | None:
        """``v`` as a graph output where it is computed from tensor data (no source gives
        it), or None: a number of sizes and inputs, or one with no node form (it breaks)."""
        env, expr = self.shape_env, expr_of(v.sym)
        if env is None or not env.is_unbacked(expr):
            return None
        # the value an op made itself (a bool's ``item()``: ``Eq(u0, 1)`` is that node)
        made = [n for n, dim in self._unbacked.values() if dim is None]
        node = next((n for n in made if expr_of(n.meta["val"]) == expr), None)
        try:
            node = self._materialize_output(expr) if node is None else node
        except CannotMaterialize:
            return None
        if not isinstance(node, fx.Node):
            return None
        val = node.meta.get("val")
        return NumberOutput(v, node, not is_symbolic(val) or type(val) is not type(v.sym))

    def from_data(self, v: Any) -> tuple[int, ...] | None:
        """Whether ``v`` is computed from tensor data: ``()`` for a number (or a list or
        tuple holding one, ``tolist()``), the dims whose sizes are for a tensor; else None.
        Handed to a continuation, such a value changes from call to call."""
        env = self.shape_env
        if env is None or not env.unbacked:
            return None
        if isinstance(v, SymValue):
            return () if is_symbolic(v.sym) and env.is_unbacked(expr_of(v.sym)) else None
        if isinstance(v, TensorValue):
            shape = v.fake.shape
            dims = tuple(d for d, n in enumerate(shape) if env.is_unbacked(expr_of(n)))
            return dims or None
        items = getattr(v, "items", None) if v.source is None else None
        if isinstance(items, list) and any(self.from_data(x) == () for x in items):
            return ()
        return None

    # symbolic numbers as graph values ---------------------------------------------------------
    def sym_arg(self, sym: Any) -> Any:
        """The graph argument for a symbolic number: nodes computing it from the inputs'
        sizes; a plain number (with a guard) where it has no node form."""
        expr = expr_of(sym)
        # a float (``s ** 2``, ``n / 3``) may divide and take any power; a size may not
        build = self._materialize_output if isinstance(sym, torch.SymFloat) else self._materialize
        try:
            return build(expr)
        except CannotMaterialize:
            return specialize(sym)

    def _symbol_node(self, symbol: Any) -> fx.Node:
        assert self.shape_env is not None
        if symbol in self._symbol_nodes:  # a number the graph takes as an input
            return self._symbol_nodes[symbol]
        if symbol in self._unbacked:  # a value the graph computes from data
            node, dim = self._unbacked[symbol]
            if dim is None:
                return node
            return self._expr_node(torch.ops.aten.sym_size.int, (node, dim), symbol)
        source = self.shape_env.source_of(symbol)
        if not isinstance(source, (SizeSource, StrideSource)):
            raise CannotMaterialize(str(source))
        tensor = self._by_source.get(str(source.base))
        if tensor is None:
            raise CannotMaterialize(str(source))
        op = torch.ops.aten.sym_size.int if isinstance(source, SizeSource) else None
        op = op or torch.ops.aten.sym_stride.int
        return self._expr_node(op, (tensor.node, source.dim), symbol)

    def _expr_node(self, target: Any, args: tuple[Any, ...], expr: Any) -> fx.Node:
        assert self.shape_env is not None
        env = self.shape_env
        kind = bool if expr.is_Boolean else int if expr.is_integer else float
        val = wrap(SymNode(expr, env, kind, env.hint_or_none(expr)))
        return self.create_node("call_function", target, args, {}, val)

    def _move_placeholders_first(self, node: fx.Node) -> None:
        """Keep placeholders ahead of ops, in input order (inputs appear mid-trace)."""
        last_placeholder = self._last_placeholder
        if (  # the one this moved last, while it still is the last: no walk over the graph
            last_placeholder is None
            or last_placeholder._erased
            or last_placeholder.graph is not self.graph
            or (last_placeholder.next.op == "placeholder" and last_placeholder.next is not node)
        ):
            last_placeholder = None
            for n in self.graph.nodes:
                if n.op == "placeholder" and n is not node:
                    last_placeholder = n
        self._last_placeholder = node
        first = next(iter(self.graph.nodes))
        if last_placeholder is not None:
            last_placeholder.append(node)
        elif first is not node:
            first.prepend(node)

    def _unique_name(self, text: str) -> str:
        base = re.sub(r"[^0-9a-zA-Z_]+", "_", text).strip("_").lower() or "input"
        name, i = base, 1
        while name in self._names:
            name, i = f"{base}_{i}", i + 1
        self._names.add(name)
        return name

    # ops -------------------------------------------------------------------
    def create_node(
        self, op: str, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any], fake: Any
    ) -> fx.Node:
        node = self.graph.create_node(op, target, args, kwargs)
        node.meta["val"] = fake
        if self.active:
            node.meta["stack_trace"] = self.active[-1].stack_trace()
            node.meta["user_frame"] = self.active[-1].user_frame()
        return node

    def has_ops(self) -> bool:
        return any(
            n.op in ("call_function", "call_method", "call_module") for n in self.graph.nodes
        )

    def finish(self, outputs: list[TensorValue | NumberOutput]) -> fx.GraphModule:
        """Close the graph with a tuple output of ``outputs``.

        Unused ops stay: random ops among them advance the generator as in eager. Its Python
        code (fx's codegen and ``exec``, costly for large graphs) is written on first use of
        ``forward`` or ``code``: a program the whole-graph cache loads never needs it.
        """
        self.graph.output(tuple(v.node for v in outputs))
        gm = _LazyGraphModule(torch.nn.Module(), self.graph)
        gm.graph.lint()
        if self.unbacked_count():  # a backend retracing the graph runs its ops the same way
            gm.meta[DATA_DEPENDENT_OPS] = self.data_dependent_ops()
        return gm
