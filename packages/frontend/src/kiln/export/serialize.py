"""``save`` and ``load``: an exported program as one file that needs none of the user's code.

The file is in safetensors format: the state (parameters, buffers, constants, and the graph's
own constant tensors) as its tensors, and the program as JSON in its metadata: the graph as a
list of nodes whose targets are ATen operators or functions of ``operator``, ``math`` and
``torch`` (resolved by name on load, never by unpickling), its readable code, the signature,
the pytree specs (``treespec_dumps``) and the input checks. Results of classes the loading
process may not know (a model's output dataclass) are saved as dicts keyed by their fields,
namedtuples as tuples.
"""

from __future__ import annotations

import builtins
import json
import math
import operator
import os
from collections import OrderedDict, defaultdict
from typing import Any

import torch
from torch import fx
from torch.utils import _pytree as pytree

from kiln.export.program import (
    ExportedProgram,
    ExportError,
    ExportSignature,
    InputSpec,
    OutputSpec,
    SymbolSpec,
    TensorSpec,
)
from kiln.export.safetensors import read_safetensors, write_safetensors

__all__ = ["load", "save"]

FORMAT = "kiln.export/1"
_MODULES = {"operator": operator, "math": math, "builtins": builtins, "torch": torch}


def _dtype(name: str) -> torch.dtype:
    value = getattr(torch, name, None)
    if not isinstance(value, torch.dtype):
        msg = f"kiln.export.load: unknown dtype {name!r}"
        raise ExportError(msg)
    return value


def _encode(value: Any) -> Any:
    """A graph argument as JSON: nodes by name, torch's enum-like values tagged."""
    if isinstance(value, fx.Node):
        return {"node": value.name}
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"float": repr(value)}
    if isinstance(value, (list, tuple)):
        items = [_encode(v) for v in value]
        return items if isinstance(value, list) else {"tuple": items}
    if isinstance(value, torch.dtype):
        return {"dtype": str(value).removeprefix("torch.")}
    if isinstance(value, torch.device):
        return {"device": str(value)}
    if isinstance(value, torch.layout):
        return {"layout": str(value).removeprefix("torch.")}
    if isinstance(value, torch.memory_format):
        return {"memory_format": str(value).removeprefix("torch.")}
    msg = f"kiln.export.save: cannot write the graph argument {value!r} ({type(value).__name__})"
    raise ExportError(msg)


def _decode(value: Any, nodes: dict[str, fx.Node]) -> Any:
    if isinstance(value, list):
        return [_decode(v, nodes) for v in value]
    if not isinstance(value, dict):
        return value
    ((tag, data),) = value.items()
    if tag == "node":
        return nodes[data]
    if tag == "tuple":
        return tuple(_decode(v, nodes) for v in data)
    if tag == "float":
        return float(data)
    if tag == "dtype":
        return _dtype(data)
    if tag == "device":
        return torch.device(data)
    if tag in ("layout", "memory_format"):
        return getattr(torch, data)
    msg = f"kiln.export.load: unknown graph argument tag {tag!r}"
    raise ExportError(msg)


def _target_name(target: Any) -> str:
    if isinstance(target, torch._ops.OpOverload):
        return f"ops.{target.namespace}.{target._opname}.{target._overloadname}"
    module = getattr(target, "__module__", None)
    name = getattr(target, "__qualname__", getattr(target, "__name__", None))
    if module in ("_operator", "operator"):
        module = "operator"
    if module in _MODULES and name is not None and _resolve(f"{module}:{name}") is target:
        return f"{module}:{name}"
    msg = f"kiln.export.save: cannot write a graph calling {target!r}"
    raise ExportError(msg)


def _resolve(name: str) -> Any:
    if name.startswith("ops."):
        _, namespace, op, overload = name.split(".")
        return getattr(getattr(getattr(torch.ops, namespace), op), overload)
    module, _, path = name.partition(":")
    value: Any = _MODULES[module]
    for part in path.split("."):
        value = getattr(value, part)
    return value


def graph_to_json(gm: fx.GraphModule) -> tuple[list[dict[str, Any]], dict[str, torch.Tensor]]:
    """The graph's nodes as JSON, and the tensors its ``get_attr`` nodes read."""
    nodes: list[dict[str, Any]] = []
    attrs: dict[str, torch.Tensor] = {}
    for node in gm.graph.nodes:
        entry: dict[str, Any] = {"name": node.name, "op": node.op}
        if node.op == "call_function":
            entry["target"] = _target_name(node.target)
        elif node.op == "get_attr":
            value = getattr(gm, node.target)
            if not isinstance(value, torch.Tensor):
                msg = f"kiln.export.save: the graph reads {node.target}, not a tensor"
                raise ExportError(msg)
            attrs[node.target] = value
            entry["target"] = node.target
        elif node.op not in ("placeholder", "output"):
            msg = f"kiln.export.save: cannot write a {node.op} node ({node.format_node()})"
            raise ExportError(msg)
        if node.args:
            entry["args"] = _encode(list(node.args))
        if node.kwargs:
            entry["kwargs"] = {k: _encode(v) for k, v in node.kwargs.items()}
        nodes.append(entry)
    return nodes, attrs


def graph_from_json(nodes: list[dict[str, Any]], attrs: dict[str, torch.Tensor]) -> fx.GraphModule:
    graph = fx.Graph()
    root = torch.nn.Module()
    made: dict[str, fx.Node] = {}
    for entry in nodes:
        args = tuple(_decode(entry.get("args", []), made))
        kwargs = {k: _decode(v, made) for k, v in entry.get("kwargs", {}).items()}
        op, name = entry["op"], entry["name"]
        if op == "output":
            node = graph.output(args[0])
        elif op == "get_attr":
            root.register_buffer(entry["target"], attrs[entry["target"]])
            node = graph.create_node(op, entry["target"], name=name)
        elif op == "placeholder":
            node = graph.create_node(op, name, name=name)
        else:
            node = graph.create_node(op, _resolve(entry["target"]), args, kwargs, name=name)
        made[entry["name"]] = node
    graph.lint()
    return fx.GraphModule(root, graph)


def portable_spec(spec: pytree.TreeSpec) -> pytree.TreeSpec:
    """``spec`` over builtin containers only: dict-like classes become dicts keyed by their
    context's keys, other sequence-like ones tuples."""
    if spec.is_leaf():
        return spec
    children = [portable_spec(c) for c in spec.children()]
    kind, context = spec.type, spec.context
    if kind in (list, tuple, dict, type(None)):
        return pytree.TreeSpec(kind, context, children)
    if kind in (OrderedDict, defaultdict):
        context = context[1] if kind is defaultdict else context
        return pytree.TreeSpec(dict, list(context), children)
    keys = list(context) if isinstance(context, (list, tuple)) else None
    if keys is not None and len(keys) == len(children) and all(isinstance(k, str) for k in keys):
        return pytree.TreeSpec(dict, keys, children)
    return pytree.TreeSpec(tuple, None, children)


def _leaf_json(leaf: TensorSpec | tuple[str, Any]) -> dict[str, Any]:
    if isinstance(leaf, TensorSpec):
        dtype = str(leaf.dtype).removeprefix("torch.")
        return {
            "tensor": leaf.name,
            "dtype": dtype,
            "device": leaf.device,
            "sizes": leaf.sizes,
            "contiguous": leaf.contiguous,
        }
    return {"constant": _encode(leaf[1])}


def _leaf_from_json(entry: dict[str, Any]) -> TensorSpec | tuple[str, Any]:
    if "tensor" in entry:
        sizes = tuple(entry["sizes"])
        dtype, contiguous = _dtype(entry["dtype"]), bool(entry["contiguous"])
        return TensorSpec(entry["tensor"], dtype, entry["device"], sizes, contiguous)
    return ("constant", _decode(entry["constant"], {}))


def save(program: ExportedProgram, path: str | os.PathLike[str]) -> None:
    """Write ``program`` to one file at ``path``, which :func:`load` reads in any process."""
    nodes, attrs = graph_to_json(program.graph_module)
    sig = program.signature
    doc = {
        "format": FORMAT,
        "graph": nodes,
        "code": program.graph_module.code,
        "inputs": [[s.kind, s.name] for s in sig.inputs],
        "outputs": [[s.kind, s.target] for s in sig.outputs],
        "in_spec": pytree.treespec_dumps(portable_spec(program.in_spec)),
        "out_spec": pytree.treespec_dumps(portable_spec(program.out_spec)),
        "leaves": [_leaf_json(leaf) for leaf in program.leaves],
        "symbols": {k: [s.input, s.dim, s.min, s.max] for k, s in program.symbols.items()},
        "relations": program.relations,
        "joint": program.joint,
        "devices": {k: str(v.device) for k, v in program.state_dict.items()},
        "graph_devices": {k: str(v.device) for k, v in attrs.items()},
    }
    tensors = {f"state.{k}": v for k, v in program.state_dict.items()}
    tensors.update({f"graph.{k}": v for k, v in attrs.items()})
    write_safetensors(path, tensors, {"kiln.export": json.dumps(doc)})


def load(path: str | os.PathLike[str]) -> ExportedProgram:
    """Read a program :func:`save` wrote; it runs eagerly or through ``kiln.compile``."""
    tensors, metadata = read_safetensors(path)
    if "kiln.export" not in metadata:
        msg = f"{path} holds no kiln.export program (a safetensors file without one)"
        raise ExportError(msg)
    doc = json.loads(metadata["kiln.export"])
    if doc.get("format") != FORMAT:
        msg = f"{path} is in format {doc.get('format')!r}; this Kiln reads {FORMAT!r}"
        raise ExportError(msg)
    attrs = {k.removeprefix("graph."): v for k, v in tensors.items() if k.startswith("graph.")}
    state = {k.removeprefix("state."): v for k, v in tensors.items() if k.startswith("state.")}
    for name, device in doc["devices"].items():  # the graph's ops name the device it ran on
        state[name] = state[name].to(device)
    for name, device in doc["graph_devices"].items():
        attrs[name] = attrs[name].to(device)
    inputs = tuple(InputSpec(kind, name) for kind, name in doc["inputs"])
    for spec in inputs:
        if spec.kind == "parameter":
            state[spec.name] = torch.nn.Parameter(state[spec.name], requires_grad=doc["joint"])
    return ExportedProgram(
        graph_module=graph_from_json(doc["graph"], attrs),
        signature=ExportSignature(inputs, tuple(OutputSpec(k, t) for k, t in doc["outputs"])),
        in_spec=pytree.treespec_loads(doc["in_spec"]),
        out_spec=pytree.treespec_loads(doc["out_spec"]),
        state_dict=state,
        leaves=[_leaf_from_json(e) for e in doc["leaves"]],
        symbols={k: SymbolSpec(*v) for k, v in doc["symbols"].items()},
        relations=list(doc["relations"]),
        joint=bool(doc["joint"]),
    )
