"""``export()``: one whole-program graph with pytree input/output specs and lifted state.

Export traces like :func:`~kiln.capture.capture` but needs no backend and
emits no code: it returns the fx graph with parameters, buffers and captured
constant tensors lifted to leading inputs, the user's tensor inputs after
them in pytree order, and the pytree specs to flatten arguments and rebuild
results. Anything that would break the graph raises ``Unsupported``.
"""

from __future__ import annotations

import dataclasses
import inspect
import itertools
from typing import Any

import torch
from torch import fx
from torch.utils import _pytree as pytree

from kiln.capture.breaks.reasons import unsupported
from kiln.capture.dynamic_dims import DimRange, DynamicDims, dynamic_dims
from kiln.capture.export_shapes import check_kept_dynamic, dims_by_source
from kiln.capture.frame_capture import trace_frame
from kiln.capture.graph import GraphInput, OutputGraph
from kiln.capture.guard_data import GlobalState, GuardKind, GuardSpec
from kiln.capture.isolation import no_user_hooks
from kiln.capture.model_output import is_model_output
from kiln.capture.side_effects import SideEffects
from kiln.capture.source import MODULE_STORES, AttrSource, ItemSource, LocalSource, Source
from kiln.capture.values.base import ConstantValue, Value
from kiln.capture.values.containers import DictValue, ListValue, TupleValue
from kiln.capture.values.symbolic import SymValue, is_symbolic
from kiln.capture.values.tensor import TensorValue
from kiln.capture.wrap import is_namedtuple

__all__ = ["ExportResult", "export"]


@dataclasses.dataclass
class ExportResult:
    """An exported program: call it like the original (``result(*args, **kwargs)``).

    The graph's inputs are, in order: ``parameters``, ``buffers``, ``constants``
    (tensors the program read from globals or closures), then the tensor leaves
    of ``(args, kwargs)`` flattened with ``in_spec``. Its outputs are the leaves
    of the result, rebuilt with ``out_spec``.
    """

    graph_module: fx.GraphModule
    in_spec: pytree.TreeSpec
    out_spec: pytree.TreeSpec
    parameters: dict[str, torch.nn.Parameter]
    buffers: dict[str, torch.Tensor]
    constants: dict[str, torch.Tensor]
    guards: list[GuardSpec]
    # input source -> {dim: (min, max)} the graph keeps symbolic (its SHAPE guard says how)
    dynamic_dims: dict[str, dict[int, DimRange]] = dataclasses.field(default_factory=dict)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        flat, spec = pytree.tree_flatten((args, kwargs))
        if spec != self.in_spec:
            msg = f"exported for inputs shaped {self.in_spec}, called with {spec}"
            raise TypeError(msg)
        tensors = [x for x in flat if isinstance(x, torch.Tensor)]
        lifted = [*self.parameters.values(), *self.buffers.values(), *self.constants.values()]
        out = self.graph_module(*lifted, *tensors)
        return pytree.tree_unflatten(list(out), self.out_spec)


def _materialize(v: Value, graph: OutputGraph) -> Any:
    """The result as a Python structure whose tensor leaves are graph nodes (and symbolic
    numbers nodes computing them: read as constants, they would hold at one size only)."""
    if isinstance(v, TensorValue):
        return v.node
    if isinstance(v, SymValue) and is_symbolic(v.sym):
        return graph.sym_arg(v.sym)
    if isinstance(v, ConstantValue):
        return v.value
    if isinstance(v, (ListValue, TupleValue)):
        items = [_materialize(x, graph) for x in v.items]
        if isinstance(v, ListValue):
            return items
        if v.cls is tuple:
            return tuple(items)
        return v.cls(*items) if is_namedtuple(v.cls) else v.cls(items)
    if isinstance(v, DictValue):
        items_d = {k: _materialize(x, graph) for k, (_, x) in v.items.items()}
        if v.cls is dict:
            return items_d
        return v.cls(**items_d) if is_model_output(v.cls) else v.cls(items_d)
    raise unsupported("unsupported_value", f"exporting a result containing {v}")


def _leaf_sources(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, int]:
    """Where each flat input leaf lives in the traced frame: ``str(source)`` -> flat index."""
    func = fn.__func__ if inspect.ismethod(fn) else fn
    code = func.__code__
    names = list(code.co_varnames[: code.co_argcount])
    if inspect.ismethod(fn):
        names = names[1:]
    rest = code.co_argcount + code.co_kwonlyargcount
    varargs = code.co_varnames[rest] if code.co_flags & 0x04 else None
    varkw = code.co_varnames[rest + (1 if varargs else 0)] if code.co_flags & 0x08 else None
    params = set(code.co_varnames[: code.co_argcount + code.co_kwonlyargcount])
    out: dict[str, int] = {}
    for index, (path, _) in enumerate(pytree.tree_flatten_with_path((args, kwargs))[0]):
        part = path[0].idx if isinstance(path[0], pytree.SequenceKey) else -1
        src = _root_source(part, path[1], names, params, varargs, varkw)
        if src is None:
            continue
        for key in path[2:]:
            if isinstance(key, pytree.SequenceKey):
                src = src.item(key.idx)
            elif isinstance(key, pytree.MappingKey):
                src = src.item(key.key)
            elif isinstance(key, pytree.GetAttrKey):
                src = src.attr(key.name)
        out[str(src)] = index
    return out


def _root_source(
    part: int, key: Any, names: list[str], params: set[str], varargs: str | None, varkw: str | None
) -> Source | None:
    if part == 0:
        i = key.idx
        if i < len(names):
            return LocalSource(names[i])
        return LocalSource(varargs).item(i - len(names)) if varargs else None
    name = key.key
    if name in params:
        return LocalSource(name)
    return LocalSource(varkw).item(name) if varkw else None


def _state_name(source: Source, fallback: str) -> str:
    """``L['self'].layers._modules['0']._parameters['weight']`` -> ``layers.0.weight``."""
    parts: list[str] = []
    while isinstance(source, (AttrSource, ItemSource)):
        if isinstance(source, ItemSource):
            parts.append(str(source.index))
        elif source.name not in MODULE_STORES:  # the dicts are not part of state_dict names
            parts.append(source.name)
        source = source.base
    if source == LocalSource("self") and parts:
        return ".".join(reversed(parts))
    return fallback


def _classify(
    inputs: list[GraphInput],
    module: torch.nn.Module | None,
    leaf_sources: dict[str, int],
) -> tuple[
    dict[str, GraphInput], dict[str, GraphInput], dict[str, GraphInput], dict[int, GraphInput]
]:
    params: dict[int, str] = {}
    buffers: dict[int, str] = {}
    if module is not None:
        params = {id(p): n for n, p in module.named_parameters(remove_duplicate=False)}
        buffers = {id(b): n for n, b in module.named_buffers(remove_duplicate=False)}
    lifted_p: dict[str, GraphInput] = {}
    lifted_b: dict[str, GraphInput] = {}
    consts: dict[str, GraphInput] = {}
    by_index: dict[int, GraphInput] = {}
    for inp in inputs:
        key = id(inp.real)
        index = leaf_sources.get(str(inp.source))
        if index is not None:
            by_index[index] = inp
        elif key in params:
            lifted_p[_state_name(inp.source, params[key])] = inp
        elif key in buffers:
            lifted_b[_state_name(inp.source, buffers[key])] = inp
        else:
            consts[str(inp.source)] = inp
    return lifted_p, lifted_b, consts, by_index


_ABSENT = object()


def _changes_state(effects: SideEffects) -> bool:
    """Whether replaying the recorded effects would change anything.

    A store that leaves an attribute holding the constant it held before (a context
    variable set for the call and reset in a ``finally``) changes nothing.
    """
    for target, stores in effects.attr_stores.values():
        obj = getattr(target, "obj", _ABSENT)
        for name, value in stores.items():
            before = getattr(obj, name, _ABSENT)
            if not isinstance(value, ConstantValue) or type(before) is not type(value.value):
                return True
            if before is not value.value and before != value.value:
                return True
    return bool(effects.mutated_containers() or effects.calls)


def export(
    fn_or_module: Any, *args: Any, dynamic_shapes: Any = None, **kwargs: Any
) -> ExportResult:
    """Export one call of a function or module as a single graph, or raise ``Unsupported``.

    ``dynamic_shapes`` (see ``export_shapes``) names the input dimensions the graph keeps
    symbolic: it then runs at any size its guards admit, and ``dynamic_dims`` records them.
    """
    module = fn_or_module if isinstance(fn_or_module, torch.nn.Module) else None
    fn = fn_or_module.forward if module is not None else fn_or_module
    wanted = {} if dynamic_shapes is None else dims_by_source(fn, args, kwargs, dynamic_shapes)
    policy = DynamicDims(by_source=wanted)  # and the marks tensors carry
    with no_user_hooks(), dynamic_dims(policy):
        traced = trace_frame(fn, args, kwargs)
    out = traced.out
    if _changes_state(out.side_effects):
        raise unsupported("side_effect", "an exported program cannot mutate Python state")
    flat_out, out_spec = pytree.tree_flatten(_materialize(traced.result, out))
    check_kept_dynamic(wanted, out.inputs, out.shape_env)  # after the result's numbers
    flat_in, in_spec = pytree.tree_flatten((args, kwargs))
    leaf_sources = _leaf_sources(fn, args, kwargs)
    params, buffers, consts, by_index = _classify(out.inputs, module, leaf_sources)
    graph = out.graph
    order: list[fx.Node] = [i.node for i in (*params.values(), *buffers.values())]
    order.extend(i.node for i in consts.values())
    for index, leaf in enumerate(flat_in):
        if not isinstance(leaf, torch.Tensor):
            continue
        found = by_index.get(index)
        if found is not None:
            order.append(found.node)
        else:
            node = graph.placeholder(f"unused_input_{index}")
            node.meta["val"] = out.fake_mode.to_fake(leaf)
            order.append(node)
    if order:
        _order_placeholders(graph, order)
    graph.output(tuple(flat_out))
    gm = fx.GraphModule(torch.nn.Module(), graph)
    gm.graph.lint()
    guards = [*out.guards(), GuardSpec(None, GuardKind.GLOBAL_STATE, GlobalState.current())]
    return ExportResult(
        graph_module=gm,
        in_spec=in_spec,
        out_spec=out_spec,
        parameters={n: i.real for n, i in params.items()},  # type: ignore[misc]
        buffers={n: i.real for n, i in buffers.items()},
        constants={n: i.real for n, i in consts.items()},
        guards=guards,
        dynamic_dims={k: dict(v) for k, v in wanted.items()},
    )


def _order_placeholders(graph: fx.Graph, order: list[fx.Node]) -> None:
    """Put ``order``'s placeholders first, in that order."""
    anchor = next(iter(graph.nodes))
    if anchor is not order[0]:
        anchor.prepend(order[0])
    for prev, node in itertools.pairwise(order):
        prev.append(node)
