"""``export()``: capture one whole-program graph, then trace it to ATen with decompositions.

Capture (``kiln.capture.export``) gives the torch-level graph, the lifted state, the pytree
specs and the shape environment of the dynamic dimensions; autograd_aot traces that graph on
fakes carrying the captured symbols, so the ATen graph reads every dynamic size from its inputs
(``aten.sym_size.int``) and serves every size the recorded ranges and relations admit.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import sympy
import torch
from torch import fx
from torch.utils import _pytree as pytree

from kiln.autograd_aot import default_decompositions
from kiln.autograd_aot.decomp import for_training
from kiln.autograd_aot.inputs import fakes_of
from kiln.autograd_aot.joint import TracedProgram, trace_program
from kiln.autograd_aot.symbolic import is_symbolic
from kiln.capture import export as capture_export
from kiln.capture.export import ExportResult, _leaf_sources
from kiln.capture.guard_data import GuardKind
from kiln.capture.shapes import ShapeEnv, expr_of
from kiln.capture.shapes.exprs import INF
from kiln.export.program import (
    ExportedProgram,
    ExportError,
    ExportSignature,
    InputSpec,
    OutputSpec,
    SymbolSpec,
    TensorSpec,
)

__all__ = ["export"]


def export(
    model: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any] | None = None,
    dynamic_shapes: Any = None,
    *,
    joint: bool = False,
    decompositions: dict[Any, Any] | None = None,
) -> ExportedProgram:
    """Export ``model(*args, **kwargs)`` as one ATen graph (see ``kiln.export``).

    ``dynamic_shapes`` names the dimensions kept symbolic, as for ``kiln.capture.export``
    (``Dim("batch", min=2, max=64)``). ``joint=True`` traces the backward too: the graph then
    takes one tangent per differentiable output after the inputs and returns the gradients
    of the parameters and inputs that require grad after the outputs.
    """
    if not isinstance(args, tuple):
        msg = f"kiln.export.export takes the positional arguments as a tuple, got {type(args)}"
        raise TypeError(msg)
    kwargs = dict(kwargs or {})
    captured = capture_export(model, *args, dynamic_shapes=dynamic_shapes, **kwargs)
    table = default_decompositions() if decompositions is None else decompositions
    traced = _trace(captured, args, kwargs, table, joint)
    gm = traced.gm
    outputs = _user_outputs(gm, traced)
    state = {**captured.parameters, **captured.buffers}
    consts = {f"constant_{i}": t for i, t in enumerate(captured.constants.values())}
    fn = model.forward if isinstance(model, torch.nn.Module) else model
    leaves, names = _leaves(fn, args, kwargs)
    env = _shape_env(captured)
    vals = [n.meta["val"] for n in gm.graph.nodes if n.op == "placeholder"]
    user_vals = vals[len(state) + len(consts) : len(state) + len(consts) + len(names)]
    specs = [_tensor_spec(v, name, env) for v, name in zip(user_vals, names, strict=True)]
    real = [x for x in leaves if isinstance(x, torch.Tensor)]
    specs = [
        dataclasses.replace(spec, contiguous=x.is_contiguous())
        for spec, x in zip(specs, real, strict=True)
    ]
    it = iter(specs)
    leaf_specs = [next(it) if isinstance(x, torch.Tensor) else ("constant", x) for x in leaves]
    inputs = [
        *(InputSpec("parameter", n) for n in captured.parameters),
        *(InputSpec("buffer", n) for n in captured.buffers),
        *(InputSpec("constant", n) for n in consts),
        *(InputSpec("user_input", n) for n in names),
        *(InputSpec("tangent", f"tangent_{i}") for i in range(len(traced.diff_outputs))),
    ]
    n_state = len(captured.parameters) + len(captured.buffers) + len(consts)
    sig_outputs = [OutputSpec("user_output") for _ in range(outputs)]
    for i in traced.mutated_inputs:
        sig_outputs.append(_mutation(inputs[i], i - n_state))
    sig_outputs += [OutputSpec("gradient", _grad_target(inputs[i])) for i in traced.grad_inputs]
    symbols, relations = _symbols(env, specs, captured, fn, args, kwargs)
    return ExportedProgram(
        graph_module=gm,
        signature=ExportSignature(tuple(inputs), tuple(sig_outputs)),
        in_spec=captured.in_spec,
        out_spec=captured.out_spec,
        state_dict={**state, **consts},
        leaves=leaf_specs,
        symbols=symbols,
        relations=relations,
        joint=traced.is_joint,
    )


def _trace(
    captured: ExportResult,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    table: dict[Any, Any],
    joint: bool,
) -> TracedProgram:
    gm = captured.graph_module
    vals = [n.meta["val"] for n in gm.graph.nodes if n.op == "placeholder"]
    flat = pytree.tree_leaves((args, kwargs))
    real = [
        *captured.parameters.values(),
        *captured.buffers.values(),
        *captured.constants.values(),
        *(x for x in flat if isinstance(x, torch.Tensor)),
    ]
    templates = [v if is_symbolic(v) else None for v in vals]
    fakes, leaves = fakes_of(real, joint, templates)
    if joint:
        with torch.enable_grad():
            return trace_program(gm, fakes, for_training(table), joint=True, grad_leaves=leaves)
    with torch.no_grad():
        return trace_program(gm, fakes, table, joint=False)


def _user_outputs(gm: fx.GraphModule, traced: TracedProgram) -> int:
    """Make the graph return the result's leaves in order (constants included), then the
    mutations and gradients; return the number of result leaves."""
    out_node = next(n for n in gm.graph.nodes if n.op == "output")
    graph_outs = list(out_node.args[0])
    user: list[Any] = []
    for i, spec in enumerate(traced.outputs):
        if spec.kind == "graph":
            user.append(graph_outs[spec.index])
        elif spec.kind == "const" and spec.symbolic:
            msg = (
                f"kiln.export: output {i} of the program is a number computed from dynamic "
                "sizes (such as x.shape[0]), which an exported graph does not return yet; "
                "read it from an output's shape instead"
            )
            raise ExportError(msg)
        elif spec.kind == "const":
            user.append(spec.value)
        else:
            msg = (
                f"kiln.export: output {i} of the program is a view of one of its inputs or "
                "outputs, which an exported graph cannot return; return a clone of it"
            )
            raise ExportError(msg)
    out_node.args = (tuple(user + graph_outs[traced.num_user_outputs :]),)
    gm.recompile()
    return len(user)


def _mutation(spec: InputSpec, user_index: int) -> OutputSpec:
    if spec.kind in ("buffer", "parameter"):
        return OutputSpec("buffer_mutation", spec.name)
    if spec.kind == "user_input":
        return OutputSpec("user_input_mutation", str(user_index))
    msg = f"kiln.export: the program mutates {spec.name}, a tensor it read from a global"
    raise ExportError(msg)


def _grad_target(spec: InputSpec) -> str:
    return spec.name


def _leaves(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[list[Any], list[str]]:
    """The leaves of ``(args, kwargs)`` and a readable name for each tensor among them."""
    try:
        params = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        params = []
    leaves: list[Any] = []
    names: list[str] = []
    for path, leaf in pytree.tree_flatten_with_path((args, kwargs))[0]:
        leaves.append(leaf)
        if not isinstance(leaf, torch.Tensor):
            continue
        first = path[1]
        if isinstance(first, pytree.SequenceKey):
            i = first.idx
            root = params[i] if i < len(params) else f"args[{i}]"
        else:
            root = str(getattr(first, "key", first))
        names.append(root + pytree.keystr(path[2:]))
    return leaves, names


def _shape_env(captured: ExportResult) -> ShapeEnv | None:
    for g in captured.guards:
        if g.kind is GuardKind.SHAPE and isinstance(g.expected, ShapeEnv):
            return g.expected
    return None


def _tensor_spec(val: torch.Tensor, name: str, env: ShapeEnv | None) -> TensorSpec:
    sizes: list[int | str] = []
    for n in val.shape:
        if isinstance(n, torch.SymInt):
            expr = expr_of(n)
            expr = env.simplify(expr) if env is not None else expr
            sizes.append(int(expr) if expr.is_Integer else str(expr))
        else:
            sizes.append(int(n))
    return TensorSpec(name, val.dtype, str(val.device), tuple(sizes))


def _symbols(
    env: ShapeEnv | None,
    specs: list[TensorSpec],
    captured: ExportResult,
    fn: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> tuple[dict[str, SymbolSpec], list[str]]:
    """Where each symbol of the inputs' sizes is read, its range, and the relations left."""
    if env is None:
        return {}, []
    leaf_index = _leaf_sources(fn, args, kwargs)
    flat = pytree.tree_leaves((args, kwargs))
    tensor_index = {}
    for j, i in enumerate(k for k, x in enumerate(flat) if isinstance(x, torch.Tensor)):
        tensor_index[i] = j
    used: dict[str, tuple[int, int]] = {}
    for j, spec in enumerate(specs):  # first reads, as a fallback
        for d, size in enumerate(spec.sizes):
            if isinstance(size, str) and size.isidentifier():
                used.setdefault(size, (j, d))
    symbols: dict[str, SymbolSpec] = {}
    for name, first in sorted(used.items()):
        j, d = first
        symbol = sympy.Symbol(name, integer=True, nonnegative=True)
        info = env.symbols.get(symbol) or next(
            (v for s, v in env.symbols.items() if s.name == name), None
        )
        if info is not None:
            base = str(getattr(info.source, "base", ""))
            dim = getattr(info.source, "dim", None)
            if base in leaf_index and leaf_index[base] in tensor_index and dim is not None:
                j, d = tensor_index[leaf_index[base]], int(dim)
            r = env.range_of(info.symbol)
            lower, upper = int(r.lower), None if r.upper >= INF else int(r.upper)
        else:
            lower, upper = 0, None
        symbols[name] = SymbolSpec(j, d, lower, upper)
    relations = []
    for relation in env.relations:
        rel = env.simplify(relation)
        if rel is sympy.true or not rel.free_symbols:
            continue
        if {s.name for s in rel.free_symbols} <= symbols.keys():
            relations.append(str(rel))
    return symbols, relations
