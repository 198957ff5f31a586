"""``ExportedProgram``: one ATen graph with its signature, pytree specs and input checks.

The graph takes the lifted state first (parameters, buffers, then constant tensors the program
read), then the tensor leaves of ``(args, kwargs)``; it returns the result's leaves, then the
new values of the buffers and inputs the program mutated (and, for a joint program, the
gradients). The program checks every call against what the graph was traced for: the
arguments' structure, the constants among them, each tensor's dtype, device, rank and static
sizes, and the dynamic sizes' ranges and relations. A graph run on inputs it was not traced for
may give a wrong result rather than an error, so a call that fails a check raises
:class:`ExportInputError` naming the input and the dimension.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence
from typing import Any

import sympy
import torch
from torch import fx
from torch.utils import _pytree as pytree

from kiln.api import disable
from kiln.capture import KilnError
from kiln.capture.shapes.exprs import FloorDiv, Mod, Trunc

__all__ = [
    "ExportError",
    "ExportInputError",
    "ExportSignature",
    "ExportedModule",
    "ExportedProgram",
    "InputSpec",
    "OutputSpec",
    "SymbolSpec",
    "TensorSpec",
]


class ExportError(KilnError, RuntimeError):
    """A program ``kiln.export`` cannot export or save as asked."""


class ExportInputError(KilnError, ValueError):
    """A call of an exported program with inputs its graph was not traced for."""


@dataclasses.dataclass(frozen=True)
class InputSpec:
    """One graph input: ``kind`` is parameter, buffer, constant, user_input or tangent."""

    kind: str
    name: str


@dataclasses.dataclass(frozen=True)
class OutputSpec:
    """One graph output: ``kind`` is user_output, buffer_mutation, user_input_mutation or
    gradient; ``target`` names the buffer, input or parameter it belongs to."""

    kind: str
    target: str = ""


@dataclasses.dataclass(frozen=True)
class ExportSignature:
    """The graph's inputs and outputs, in order, with what each one is."""

    inputs: tuple[InputSpec, ...]
    outputs: tuple[OutputSpec, ...]

    def names(self, kind: str) -> list[str]:
        return [i.name for i in self.inputs if i.kind == kind]


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """What a tensor argument must be: ``sizes`` holds ints and symbolic expressions (text).
    ``contiguous``: the graph was traced for a contiguous tensor (a call passes others as
    contiguous copies, since decomposed views may assume the traced strides)."""

    name: str
    dtype: torch.dtype
    device: str
    sizes: tuple[int | str, ...]
    contiguous: bool = True


@dataclasses.dataclass(frozen=True)
class SymbolSpec:
    """A dynamic size: read from dimension ``dim`` of tensor argument ``input``, in
    ``[min, max]`` (``max`` None: unbounded)."""

    input: int
    dim: int
    min: int
    max: int | None


_SYMPY_NAMES = {"FloorDiv": FloorDiv, "Mod": Mod, "Trunc": Trunc}


@functools.lru_cache(maxsize=1024)
def _parse(text: str, symbols: tuple[str, ...]) -> Any:
    names: dict[str, Any] = {s: sympy.Symbol(s, integer=True) for s in symbols}
    return sympy.sympify(text, locals={**_SYMPY_NAMES, **names})


@dataclasses.dataclass
class ExportedProgram:
    """An exported program; call it like the original (``program(*args, **kwargs)``).

    ``leaves`` describes each leaf of ``(args, kwargs)`` flattened with ``in_spec``: a
    :class:`TensorSpec`, or ``("constant", value)`` for a value the graph was specialized to.
    """

    graph_module: fx.GraphModule
    signature: ExportSignature
    in_spec: pytree.TreeSpec
    out_spec: pytree.TreeSpec
    state_dict: dict[str, torch.Tensor]
    leaves: list[TensorSpec | tuple[str, Any]]
    symbols: dict[str, SymbolSpec]
    relations: list[str]
    joint: bool = False

    @property
    def graph(self) -> fx.Graph:
        return self.graph_module.graph

    @property
    def range_constraints(self) -> dict[str, tuple[int, int | None]]:
        """Each dynamic size's symbol and its range ``(min, max)``; ``max`` None: unbounded."""
        return {name: (s.min, s.max) for name, s in self.symbols.items()}

    @property
    def tensor_specs(self) -> list[TensorSpec]:
        return [leaf for leaf in self.leaves if isinstance(leaf, TensorSpec)]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._module(*args, **kwargs)

    @functools.cached_property
    def _module(self) -> ExportedModule:
        return self.module()

    def module(self) -> ExportedModule:
        """An ``nn.Module`` running the program over its own copy of the state (by reference:
        the same tensors), which ``kiln.compile`` compiles like any module."""
        if self.joint:
            msg = (
                "a joint program takes tangents after its inputs: call its graph_module with "
                "the state, the inputs (check_inputs) and one tangent per differentiable output"
            )
            raise ExportError(msg)
        return ExportedModule(self)

    def check_inputs(self, args: Sequence[Any], kwargs: dict[str, Any]) -> list[torch.Tensor]:
        """The tensor leaves of ``(args, kwargs)``, or :class:`ExportInputError`."""
        flat, spec = pytree.tree_flatten((tuple(args), kwargs))
        if spec != self.in_spec:
            raise ExportInputError(self._structure_message(spec))
        tensors: list[torch.Tensor] = []
        specs: list[TensorSpec] = []
        for value, leaf in zip(flat, self.leaves, strict=True):
            if isinstance(leaf, TensorSpec):
                _check_tensor(value, leaf)
                tensors.append(value.contiguous() if leaf.contiguous else value)
                specs.append(leaf)
            elif not _same_constant(value, leaf[1]):
                msg = (
                    f"exported program: argument {value!r} differs from {leaf[1]!r}, the value "
                    "it was exported with (non-tensor arguments are constants of the graph)"
                )
                raise ExportInputError(msg)
        self._check_sizes(tensors, specs)
        return tensors

    def _structure_message(self, spec: pytree.TreeSpec) -> str:
        want_args, want_kwargs = self.in_spec.children()
        got_args, got_kwargs = spec.children()
        names = ", ".join(leaf.name for leaf in self.tensor_specs)
        if got_args.num_children != want_args.num_children:
            return (
                f"exported program takes {want_args.num_children} positional arguments, got "
                f"{got_args.num_children} (tensor arguments: {names})"
            )
        if got_kwargs.context != want_kwargs.context:
            return (
                f"exported program takes the keyword arguments {want_kwargs.context}, got "
                f"{got_kwargs.context}"
            )
        pairs = [
            *(
                (f"positional argument {i}", g, w)
                for i, (g, w) in enumerate(
                    zip(got_args.children(), want_args.children(), strict=True)
                )
            ),
            *(
                (f"keyword argument {k!r}", g, w)
                for k, g, w in zip(
                    want_kwargs.context, got_kwargs.children(), want_kwargs.children(), strict=True
                )
            ),
        ]
        for where, got, want in pairs:
            if got != want:
                return (
                    f"exported program: {where} is {_shape_of(got)}, but the program was exported "
                    f"for {_shape_of(want)}"
                )
        return f"exported program called with arguments shaped {spec}, exported for {self.in_spec}"

    def _check_sizes(self, tensors: list[torch.Tensor], specs: list[TensorSpec]) -> None:
        values: dict[str, int] = {}
        for name, sym in self.symbols.items():
            n = int(tensors[sym.input].shape[sym.dim])
            where = f"dimension {sym.dim} of {specs[sym.input].name}"
            if n < sym.min or (sym.max is not None and n > sym.max):
                upper = "inf" if sym.max is None else sym.max
                msg = (
                    f"exported program: {where} is {n}, outside the range [{sym.min}, {upper}] "
                    f"of its dynamic size {name}"
                )
                raise ExportInputError(msg)
            values[name] = n
        names = tuple(self.symbols)
        bound = {sympy.Symbol(k, integer=True): v for k, v in values.items()}
        for t, spec in zip(tensors, specs, strict=True):
            for d, want in enumerate(spec.sizes):
                if not isinstance(want, str):
                    continue
                need = int(_parse(want, names).xreplace(bound))
                if int(t.shape[d]) != need:
                    msg = (
                        f"exported program: dimension {d} of {spec.name} is {t.shape[d]}, but the "
                        f"program needs it to be {want} = {need} ({_describe(values)})"
                    )
                    raise ExportInputError(msg)
        for text in self.relations:
            if not bool(_parse(text, names).xreplace(bound)):
                msg = (
                    f"exported program: the input sizes break the relation {text} the graph was "
                    f"traced under ({_describe(values)})"
                )
                raise ExportInputError(msg)


def _shape_of(spec: pytree.TreeSpec) -> str:
    if spec.is_leaf():
        return "a tensor or a number"
    name = getattr(spec.type, "__name__", str(spec.type))
    return f"a {name} of {spec.num_children} items: {spec}"


def _describe(values: dict[str, int]) -> str:
    return ", ".join(f"{k} = {v}" for k, v in values.items())


def _same_constant(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    return bool(a == b)


def _check_tensor(value: Any, spec: TensorSpec) -> None:
    where = f"exported program: {spec.name}"
    if not isinstance(value, torch.Tensor):
        msg = f"{where} must be a tensor, got {type(value).__name__}"
        raise ExportInputError(msg)
    if value.dtype != spec.dtype:
        msg = f"{where} has dtype {value.dtype}, but the program was exported for {spec.dtype}"
        raise ExportInputError(msg)
    if value.device.type != torch.device(spec.device).type:
        msg = f"{where} is on {value.device}, but the program was exported for {spec.device}"
        raise ExportInputError(msg)
    if value.dim() != len(spec.sizes):
        shape = "[" + ", ".join(map(str, spec.sizes)) + "]"
        msg = (
            f"{where} has {value.dim()} dimensions (shape {list(value.shape)}), but the program "
            f"was exported for {len(spec.sizes)}: {shape}"
        )
        raise ExportInputError(msg)
    for d, want in enumerate(spec.sizes):
        if isinstance(want, int) and value.shape[d] != want:
            msg = (
                f"{where}: dimension {d} is {value.shape[d]}, but the program was exported for "
                f"{want} (pass dynamic_shapes= to kiln.export.export to keep it dynamic)"
            )
            raise ExportInputError(msg)


class ExportedModule(torch.nn.Module):
    """An exported program as a module: its state as parameters and buffers under their
    original names, ``forward`` checks the arguments and runs the graph."""

    def __init__(self, program: ExportedProgram) -> None:
        super().__init__()
        self.graph_module = program.graph_module
        self._program = program
        self._slots: list[tuple[torch.nn.Module, str]] = []
        for spec in program.signature.inputs:
            if spec.kind in ("user_input", "tangent"):
                continue
            owner, _, attr = spec.name.rpartition(".")
            module = self._submodule(owner)
            value = program.state_dict[spec.name]
            if spec.kind == "parameter" and not hasattr(module, attr):
                if not isinstance(value, torch.nn.Parameter):
                    value = torch.nn.Parameter(value, requires_grad=False)
                module.register_parameter(attr, value)
            elif not hasattr(module, attr):
                module.register_buffer(attr, value, persistent=spec.kind == "buffer")
            self._slots.append((module, attr))

    def _submodule(self, path: str) -> torch.nn.Module:
        module: torch.nn.Module = self
        for part in path.split(".") if path else []:
            if not hasattr(module, part):
                module.add_module(part, torch.nn.Module())
            module = getattr(module, part)
        return module

    @disable
    def _checked(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[torch.Tensor]:
        # runs eagerly under kiln.compile too: the checks are Python over sympy, once a call
        return self._program.check_inputs(args, kwargs)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        tensors = self._checked(args, kwargs)
        given = [x for x in pytree.tree_leaves((args, kwargs)) if isinstance(x, torch.Tensor)]
        state = [getattr(module, attr) for module, attr in self._slots]
        out = self.graph_module(*state, *tensors)
        n = self._program.out_spec.num_leaves
        with torch.no_grad():
            for spec, value in zip(self._program.signature.outputs[n:], out[n:], strict=False):
                if spec.kind == "buffer_mutation":
                    self.get_buffer(spec.target).copy_(value)
                elif spec.kind == "user_input_mutation":
                    given[int(spec.target)].copy_(value)
        return pytree.tree_unflatten(list(out[:n]), self._program.out_spec)
