"""FX → IR: walk an ATen graph, lowering each node into buffers and computations.

Ops with a lowering are lowered; ops with a decomposition in loopir's table are
decomposed on the fly (the decomposition runs on tensors that carry IR, so each
ATen call inside it is lowered in turn); anything else becomes a fallback kernel
that calls the ATen op from the wrapper. Pointwise results stay unrealized and
are inlined into consumers until duplicated work or an output forces a buffer.
"""

from __future__ import annotations

import itertools
import logging
import math
import operator
from collections.abc import Callable, Sequence
from typing import Any

import sympy
import torch
import torch.fx
from torch.utils import _pytree as pytree

from kiln.capture import counters
from kiln.capture.control_flow import CondCall, WhileLoopCall
from kiln.capture.shapes import Range
from kiln.loopir import sizes, symbolic, unbacked
from kiln.loopir.backend import Backend, get_backend
from kiln.loopir.decompose import run_decomposition
from kiln.loopir.decompositions import declined_decomposition
from kiln.loopir.errors import LoweringError, StaticShapesOnly, Unlowerable
from kiln.loopir.ir.buffers import Buffer, InputBuffer
from kiln.loopir.ir.layout import (
    Layout,
    channels_last_layout,
    contiguous_layout,
    is_dense,
    layout_of_tensor,
    ordered_layout,
)
from kiln.loopir.ir.loops import Pointwise
from kiln.loopir.ir.strided import (
    as_strided_view,
    channels_last_io,
    copy_like,
    realize_as_tensor,
    realize_like,
    stored_hint,
)
from kiln.loopir.ir.views import ReinterpretView, StorageBox, TensorBox
from kiln.loopir.kernel import SEEDS
from kiln.loopir.layout_choice import prefers_channels_last
from kiln.loopir.lowering.fallback import chosen_extern, fallback, packet_name
from kiln.loopir.lowering.registry import LOWERINGS
from kiln.loopir.traits import BackendTraits
from kiln.loopir.virtualized import V

__all__ = ["GraphLowering"]

log = logging.getLogger(__name__)
aten = torch.ops.aten

SYMBOLIC = (torch.SymInt, torch.SymFloat, torch.SymBool)


NUMBER_OPS = frozenset({
    "add", "sub", "rsub", "mul", "div", "true_divide", "pow", "clamp", "clamp_min",
    "clamp_max", "where", "masked_fill", "lerp", "eq", "ne", "lt", "le", "gt", "ge",
    "maximum", "minimum", "full", "full_like", "new_full", "scalar_tensor", "fill",
    "hardtanh", "leaky_relu", "leaky_relu_backward", "addcmul", "addcdiv",
})  # fmt: skip
"""The ops whose lowerings take a symbolic float (a Python float input) as a scalar
argument; any other op given one raises ``StaticShapesOnly`` (the graph compiles per value)."""


_FLOAT_ARITHMETIC: dict[Any, str] = {
    operator.add: "({} + {})",
    operator.sub: "({} - {})",
    operator.mul: "({} * {})",
    operator.truediv: "({} / {})",
    operator.neg: "(-{})",
    operator.abs: "abs({})",
    operator.pow: "({} ** {})",
    torch.sym_float: "float({})",
}
"""Python arithmetic a graph may do on its number inputs, as the wrapper writes it: the same
operations on the same doubles as eager's Python, so the same value (no reassociation)."""


def _refuse_number_symbols(op: Any, args: Any, kwargs: Any) -> None:
    for leaf in pytree.tree_leaves((args, kwargs)):
        if isinstance(leaf, sympy.Basic) and any(
            symbolic.is_number_symbol(s) for s in leaf.free_symbols
        ):
            msg = f"{packet_name(op)} takes a symbolic float ({leaf}) only as a constant"
            raise StaticShapesOnly(msg)


class GraphLowering:
    """Lowers one ATen ``fx.GraphModule``; afterwards holds its buffers and outputs."""

    def __init__(
        self,
        gm: torch.fx.GraphModule,
        example_inputs: Sequence[Any],
        decompositions: dict[Any, Callable[..., Any]],
        default_device: torch.device,
        *,
        channels_last: bool | None = None,
        backend: Backend | None = None,
    ) -> None:
        self.gm = gm
        self.backend = backend
        """The backend forced for every device, else None: each device type's own."""
        self.example_inputs = list(example_inputs)
        self.decompositions = decompositions
        self.default_device = default_device
        self.buffers: list[Buffer] = []
        self.name_to_buffer: dict[str, Buffer] = {}
        self.graph_inputs: list[str | None] = []
        self.input_buffers: dict[str, InputBuffer] = {}
        self.input_metas: dict[str, torch.Tensor] = {}
        """Each tensor placeholder's traced value, by name: which outputs may alias it."""
        self.row_major_copies: dict[tuple[str, ...], Buffer] = {}
        """Row-major copies of stored values that attention reads, by value and layout."""
        self.outputs: list[Any] = []
        self.output_spec: pytree.TreeSpec | None = None
        self.seed_count = 0
        self.seed_devices: dict[str, torch.device] = {}
        self.current_meta: Any = None
        self.current_op: Any = None
        self.current_node: torch.fx.Node | None = None  # being lowered: who reads its result
        self.layout_hints: dict[int, Any] = {}
        self.returned_args: set[int] = set()
        """``id`` of each argument of the node being lowered that the graph also returns."""
        self.size_bindings: dict[sympy.Symbol, symbolic.SizeBinding] = {}
        """Where the wrapper reads each size symbol of a graph with symbolic sizes."""
        self.size_hints: dict[sympy.Symbol, int | float] = {}
        """Each size symbol's value in the call being compiled (:func:`symbolic.hint`)."""
        self.size_ranges: dict[sympy.Symbol, Range] = {}
        """Each size symbol's range in every call its guards admit."""
        self.unbacked = unbacked.UnbackedDefs()
        """The buffer each value computed from data is read from, and the runtime asserts."""
        self._ids = itertools.count()
        self._number_ids = itertools.count(1_000_000)
        self._number_sources: dict[torch.fx.Node, str] = {}
        """Python for each number input and each float computed from them, in the wrapper."""
        self._const_ids = itertools.count()
        self.channels_last = (
            prefers_channels_last(gm, default_device) if channels_last is None else channels_last
        )
        """New 4-D buffers are laid out NHWC (see :func:`prefers_channels_last`)."""
        self.stores_nchw = not self.channels_last and not channels_last_io(gm)
        """A 4-D value eager laid out NHWC is stored NCHW where eager's strides would be
        kept (extern inputs, values read often): here NHWC comes from a permute inside the
        graph (poolformerv2's LayerNorm2d), not from the inputs or what is returned, and
        kept it makes the kernels after it (GroupNorm's reductions over C, H, W, pooling)
        gather and scatter across NCHW rows, and NCHW convolution results mix with it."""

    def backend_traits(self, device: torch.device) -> BackendTraits:
        """The traits of the backend that generates ``device``'s kernels."""
        backend = self.backend if self.backend is not None else get_backend(device.type)
        return backend.traits

    # -- naming and registration --------------------------------------------
    def register_buffer(self, buf: Buffer) -> str:
        self.register_storage(buf)
        self.buffers.append(buf)
        return buf.name

    def register_storage(self, buf: Buffer) -> str:
        """Name a buffer that no step computes: kernels of ``SliceBuffer`` s fill it,
        and the wrapper allocates it before the first of them."""
        if not buf.name:
            buf.name = f"buf{next(self._ids)}"
        self.name_to_buffer[buf.name] = buf
        return buf.name

    def add_constant(self, value: torch.Tensor) -> TensorBox:
        """A tensor the graph holds (``get_attr`` or made inside a decomposition).

        A 0-dim CPU constant in a graph on another device (``x[:, 0] = 2`` fills from
        one) is a scalar ATen accepts on any device, but a kernel there cannot read CPU
        memory: it moves to the graph's device once, here.
        """
        if value.dim() == 0 and value.device.type == "cpu" and self.default_device.type != "cpu":
            value = value.to(self.default_device)
        name = f"const{next(self._const_ids)}"
        layout = self._fix_device(layout_of_tensor(value))
        buf = InputBuffer(name, layout, constant=value)
        self.input_buffers[name] = buf
        self.name_to_buffer[name] = buf
        return TensorBox(StorageBox(buf))

    def next_seed(self, device: torch.device) -> tuple[str, int]:
        """The seeds buffer a random op on ``device`` reads, and its fresh seed's index.

        The wrapper draws one seeds tensor per device a random op runs on: ``SEEDS`` on
        the graph's device, ``SEEDS_<type>`` on another (BART's CPU ``torch.rand([])``
        in a CUDA graph), since a kernel reads only memory of its own device.
        """
        index = self.seed_count
        self.seed_count += 1
        name = SEEDS if device == self.default_device else f"{SEEDS}_{device.type}"
        self.seed_devices[name] = device
        for seeds, where in self.seed_devices.items():
            size = (sympy.Integer(self.seed_count),)
            layout = Layout(where, torch.int64, size, (sympy.S.One,))
            self.name_to_buffer[seeds] = InputBuffer(seeds, layout)
        return name, index

    def new_layout(
        self,
        device: torch.device,
        dtype: torch.dtype,
        size: Sequence[sympy.Expr],
        read_order: Sequence[int] | None = None,
    ) -> Layout:
        """The (flexible) layout of a buffer a kernel will fill.

        In a channels-last graph a 4-D buffer is NHWC, unless the kernel reads a 4-D
        source in another dim order (``read_order``, outermost first: ConvNeXt's
        LayerNorm over an NHWC permutation, attention heads): then it is laid out in that
        order, so its reads and writes both walk memory in order.
        """
        if self.channels_last and len(size) == 4:
            if read_order is not None:
                return ordered_layout(device, dtype, size, read_order)
            return channels_last_layout(device, dtype, size)
        return contiguous_layout(device, dtype, size)

    def _fix_device(self, layout: Layout) -> Layout:
        if layout.device.type != "meta":
            return layout
        return Layout(self.default_device, layout.dtype, layout.size, layout.stride, layout.offset)

    def device_of(self, meta: Any) -> torch.device:
        device = getattr(meta, "device", None)
        if device is None or device.type == "meta":
            return self.default_device
        return device  # type: ignore[no-any-return]

    # -- running ------------------------------------------------------------
    def run(self) -> None:
        env: dict[torch.fx.Node, Any] = {}
        placeholders = iter(self.example_inputs)
        returned = {n for out in self.gm.graph.find_nodes(op="output") for n in out.all_input_nodes}
        with V.set_graph(self):
            for node in self.gm.graph.nodes:
                if node.op == "placeholder":
                    env[node] = self._placeholder(node, next(placeholders, None))
                elif node.op == "get_attr":
                    env[node] = self.add_constant(getattr(self.gm, node.target))
                elif node.target is aten._local_scalar_dense.default:
                    env[node] = unbacked.read_scalar(env[node.args[0]], node.meta["val"])
                    self._number_sources[node] = str(env[node])
                elif node.target is aten._assert_scalar.default:
                    unbacked.runtime_assert(env[node.args[0]], node.args[1])
                elif node.op == "call_function" and isinstance(node.meta.get("val"), SYMBOLIC):
                    env[node] = self._size_value(node)
                elif node.op == "call_function":
                    args, kwargs = torch.fx.map_arg((node.args, node.kwargs), env.__getitem__)
                    self.layout_hints = {
                        id(env[n]): stored_hint(n.meta.get("val")) for n in node.all_input_nodes
                    }
                    self.returned_args = {id(env[n]) for n in node.all_input_nodes if n in returned}
                    before = len(self.buffers)
                    env[node] = self._call(node, args, kwargs)
                    if symbolic.unbacked_in(node.meta.get("val")):
                        unbacked.bind_new_outputs(node.meta["val"], self.buffers[before:])
                elif node.op == "output":
                    self._output(torch.fx.map_arg(node.args[0], env.__getitem__), node)
                else:
                    msg = f"loopir lowers ATen graphs of call_function nodes, not {node.op}"
                    raise LoweringError(msg)

    def _placeholder(self, node: torch.fx.Node, example: Any) -> Any:
        val = node.meta.get("val", example)
        if isinstance(val, (torch.SymInt, torch.SymFloat)):
            # a size a backward receives (saved by its forward), or a Python number input:
            # the wrapper binds it once per call and kernels take it as a scalar argument
            self.graph_inputs.append(node.name)
            expr = self.note_symbols(val)
            self._number_sources[node] = node.name
            if isinstance(val, torch.SymFloat) and not isinstance(expr, sympy.Symbol):
                # a float its forward computed (``s0 + 3.5``, saved for the backward): a
                # number symbol of its own, as the symbols it was computed from are not inputs
                sym = sympy.Symbol(f"{symbolic.SIZE_PREFIX}{next(self._number_ids)}", real=True)
                self.size_bindings[sym] = symbolic.SizeBinding(node.name, None)
                return sym
            self._bind(expr, symbolic.SizeBinding(node.name, None))
            return expr
        if isinstance(val, torch.SymBool):
            msg = f"{node.name}: a symbolic bool input"
            raise StaticShapesOnly(msg)
        if not isinstance(val, torch.Tensor):
            self.graph_inputs.append(None)
            return val
        for d, n in enumerate(val.shape):
            if isinstance(n, torch.SymInt):
                self._bind(self.note_symbols(n), symbolic.SizeBinding(node.name, d))
        buf = InputBuffer(node.name, self._fix_device(layout_of_tensor(val)))
        self.graph_inputs.append(node.name)
        self.input_buffers[node.name] = buf
        self.input_metas[node.name] = val
        self.name_to_buffer[node.name] = buf
        return TensorBox(StorageBox(buf))

    def note_symbols(self, value: torch.SymInt | torch.SymFloat) -> sympy.Expr:
        """``value``'s expression, noting the hints of the symbols it holds (an unbacked
        one, computed from data, has none: :func:`symbolic.unbacked_hint` of its range)."""
        expr = sizes.sympify(value)
        env = getattr(value.node, "env", None)
        for sym in symbolic.size_symbols([expr]):
            if sym not in self.size_hints and env is not None:
                self.size_ranges[sym] = env.range_of(sym)
                if symbolic.is_unbacked(sym):
                    found = symbolic.unbacked_hint(self.size_ranges[sym])
                else:
                    found = env.size_hint(sym)
                self.size_hints[sym] = found if symbolic.is_number_symbol(sym) else int(found)
        return expr

    def _bind(self, expr: sympy.Expr, binding: symbolic.SizeBinding) -> None:
        if isinstance(expr, sympy.Symbol) and expr not in self.size_bindings:
            self.size_bindings[expr] = binding

    def _size_value(self, node: torch.fx.Node) -> Any:
        """A node computing a size (``sym_size``, arithmetic over sizes): its expression.

        Sizes are not computed in the wrapper: what reads one (a view's shape, a factory's
        size) holds its expression over the size symbols the wrapper binds from the inputs.
        """
        val = node.meta["val"]
        if isinstance(val, torch.SymBool):
            return unbacked.condition(val)
        if isinstance(val, torch.SymFloat):
            return self._computed_float(node)
        if not isinstance(val, torch.SymInt):
            msg = f"{node.format_node()}: a symbolic {type(val).__name__} is not supported"
            raise StaticShapesOnly(msg)
        return self.note_symbols(val)

    def _computed_float(self, node: torch.fx.Node) -> sympy.Symbol:
        """A float the graph computes from its number inputs (``lo + 0.5``): a new number
        symbol the wrapper computes once per call as eager's Python does."""
        form = _FLOAT_ARITHMETIC.get(node.target)
        if form is None or node.kwargs:
            msg = f"{node.format_node()}: a symbolic float computed by {node.target}"
            raise StaticShapesOnly(msg)
        source = form.format(*[self._number_source(a) for a in node.args])
        self._number_sources[node] = source
        sym = sympy.Symbol(f"{symbolic.SIZE_PREFIX}{next(self._number_ids)}", real=True)
        self.size_bindings[sym] = symbolic.SizeBinding(source, None)
        return sym

    def _number_source(self, arg: Any) -> str:
        if isinstance(arg, torch.fx.Node) and arg in self._number_sources:
            return self._number_sources[arg]
        if isinstance(arg, (int, float)) and not isinstance(arg, bool):
            return repr(arg) if math.isfinite(arg) else f"float({str(arg)!r})"
        msg = f"a symbolic float computed from {arg}"
        raise StaticShapesOnly(msg)

    def _call(self, node: torch.fx.Node, args: Any, kwargs: Any) -> Any:
        meta = node.meta.get("val")
        unbacked.refuse_conditions(node, (args, kwargs))
        if node.target is operator.getitem:
            # one result of a multi-result lowering (max pool's values): its users count
            result = args[0][args[1]]
        else:
            if meta is None:
                meta = self.meta_of(node.target, args, kwargs)
            self.current_node = node
            result = self.lower(node.target, args, kwargs, meta)
        self._maybe_realize(result, len(node.users), meta)
        return result

    def lower(self, op: Any, args: Any, kwargs: Any, meta: Any) -> Any:
        """Lower one op call: lowering, else decomposition (also when the lowering
        declines the call), else ATen fallback."""
        saved = self.current_meta, self.current_op
        self.current_meta, self.current_op = meta, op
        try:
            if isinstance(op, (CondCall, WhileLoopCall)):  # runs the branches compiled apart
                return chosen_extern(op, args, kwargs)
            if _touches_complex(args, kwargs, meta) or _has_lazy_bit(meta):
                return _complex_call(op, args, kwargs, meta)
            if op not in LOWERINGS or packet_name(op) not in NUMBER_OPS:
                _refuse_number_symbols(op, args, kwargs)
            decomposition = self.decompositions.get(op)
            if packet_name(op) in self.backend_traits(self._device_of(args)).extern_ops:
                return chosen_extern(op, args, kwargs)
            if op in LOWERINGS:
                try:
                    return LOWERINGS[op](*args, **kwargs)
                except Unlowerable as exc:
                    log.debug("lowering of %s declined: %s", op, exc)
                    decomposition = declined_decomposition(op)
            if decomposition is not None:
                result = run_decomposition(self, decomposition, args, kwargs)
                if result is not NotImplemented:
                    return result
            return fallback(op, args, kwargs)
        finally:
            self.current_meta, self.current_op = saved

    def _device_of(self, args: Any) -> torch.device:
        """The device of an op's first tensor argument (the graph's default without one)."""
        for arg in pytree.tree_leaves(args):
            if isinstance(arg, TensorBox):
                return arg.get_device()
        return self.default_device

    def layout_hint(self, value: Any) -> Any:
        """The traced value (a meta tensor) of an argument of the node being lowered, or
        None: extern calls realize their inputs with eager's strides where they may."""
        return self.layout_hints.get(id(value))

    def meta_of(self, op: Any, args: Any, kwargs: Any) -> Any:
        """Run ``op`` on meta tensors shaped like the IR arguments."""

        def to_meta(x: Any) -> Any:
            if isinstance(x, TensorBox):
                size = [sizes.evaluate_int(s) for s in x.get_size()]
                return torch.empty(size, dtype=x.get_dtype(), device="meta")
            return x

        margs, mkwargs = pytree.tree_map(to_meta, (args, kwargs))
        return op(*margs, **mkwargs)

    # -- realization ----------------------------------------------------------
    def _maybe_realize(self, result: Any, users: int, meta: Any) -> None:
        values = pytree.tree_leaves(result)
        metas = pytree.tree_leaves(meta) if meta is not None else []
        if len(metas) != len(values):
            metas = [None] * len(values)
        for value, traced in zip(values, metas, strict=True):
            if not isinstance(value, TensorBox):
                continue
            box = value.storage()
            if box is not None and box.repeats_too_much(users):
                realize_like(value, stored_hint(traced))
                box.realize()

    def _output(self, value: Any, node: torch.fx.Node) -> None:
        leaves, self.output_spec = pytree.tree_flatten(value)
        metas = node.meta.get("val")
        if metas is None:  # graphs from autograd_aot: the values live on the returned nodes
            metas = torch.fx.map_arg(node.args[0], lambda n: n.meta.get("val"))
        meta_leaves = pytree.tree_leaves(metas) if metas is not None else [None] * len(leaves)
        if len(meta_leaves) != len(leaves):
            meta_leaves = [None] * len(leaves)
        for leaf, meta in zip(leaves, meta_leaves, strict=True):
            self.outputs.append(self._realize_output(leaf, meta))

    def _realize_output(self, value: Any, meta: Any) -> Any:
        if not isinstance(value, TensorBox):
            return value
        box = value.data
        if isinstance(box, StorageBox) and isinstance(box.data, Pointwise):
            dense = isinstance(meta, torch.Tensor) and is_dense(meta)
            return box.realize(meta.stride() if dense else None)
        found = as_strided_view(value)
        if found is not None and self._aliases_input_unlike_traced(found, meta):
            # an op that is an identity read here (flip or roll over a size-1 dim) must
            # still return a tensor of its own: writing to it must not change the input
            return copy_like(value, meta, "output of a non-view op")
        if found is not None and _strides_match(found.layout, meta):
            return found
        if not isinstance(meta, torch.Tensor) or not (is_dense(meta) or _gaps_only(meta)):
            return found if found is not None else realize_as_tensor(value, "output")
        # a later graph (the backward reading saved tensors) was traced with the
        # meta's strides: an extern result or a view laid out otherwise is copied
        if found is not None:
            counters.bump("output_copies", found.get_name())
            log.debug("output %s copied to its traced strides %s", found.get_name(), meta.stride())
        return copy_like(value, meta, "output relayout")

    def _aliases_input_unlike_traced(self, found: Buffer | ReinterpretView, meta: Any) -> bool:
        """Whether ``found`` lies on a graph input whose traced value ``meta`` does not alias."""
        buf = found.buffer if isinstance(found, ReinterpretView) else found
        traced = self.input_metas.get(buf.get_name())
        if not isinstance(traced, torch.Tensor) or not isinstance(meta, torch.Tensor):
            return False
        return not torch._C._is_alias_of(meta, traced)  # type: ignore[attr-defined]


_ATEN_ONLY_DTYPES = frozenset(
    {torch.uint16, torch.uint32, torch.uint64, torch.float8_e4m3fn, torch.float8_e5m2}
)
"""Dtypes whose values only ATen computes, as for complex ones: eager implements few ops for
them (no ``add`` or ``index_put`` of ``uint16``, no arithmetic on float8), so each call stays
the ATen call eager makes, with eager's result or error, and no kernel loads them."""


def _touches_complex(args: Any, kwargs: Any, meta: Any) -> bool:
    """Whether a call reads or makes a complex tensor (or takes a complex scalar), or one of
    another dtype only ATen computes."""
    for x in pytree.tree_leaves((args, kwargs, meta)):
        if isinstance(x, complex):
            return True
        dtype = x.get_dtype() if isinstance(x, TensorBox) else getattr(x, "dtype", None)
        if isinstance(dtype, torch.dtype) and (dtype.is_complex or dtype in _ATEN_ONLY_DTYPES):
            return True
    return False


def _has_lazy_bit(meta: Any) -> bool:
    return isinstance(meta, torch.Tensor) and (meta.is_conj() or meta.is_neg())


def _complex_call(op: Any, args: Any, kwargs: Any, meta: Any) -> Any:
    """A call on complex values, or one making a lazy bit, left to ATen: no kernel computes
    complex numbers.

    ATen's complex tensors carry lazy conjugate and negative bits (``_conj``, ``imag`` of
    a conjugate) that only ATen resolves; a kernel loading the storage would drop them.
    Every consumer of a complex value is an ATen call here too, and a real result with
    the negative bit (``imag`` of a conjugate, or the ``_neg_view`` of its storage's
    imaginary parts it decomposes to) is copied before a kernel loads it: IR layouts
    carry no such bit.
    """
    result = fallback(op, args, kwargs)
    real_with_bit = _has_lazy_bit(meta) and not meta.dtype.is_complex
    if op is not aten.imag.default and not real_with_bit:
        return result
    return chosen_extern(aten.clone.default, (result,), {})


def _gaps_only(meta: torch.Tensor) -> bool:
    """Whether ``meta``'s strides leave gaps but never overlap (a row of a transposed
    matrix, a slice with a step): a buffer can be laid out so, as the output eager gives."""
    dims = sorted((s, n) for n, s in zip(meta.shape, meta.stride(), strict=True) if n > 1)
    reach = 1
    for stride, n in dims:
        if stride < reach:
            return False
        reach = stride * n
    return True


def _strides_match(layout: Layout, meta: Any) -> bool:
    if not isinstance(meta, torch.Tensor) or meta.dim() != len(layout.size):
        return True
    return layout.strides_match(meta)
