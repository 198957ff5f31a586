"""The output code object: load graph inputs, call the compiled graph, rebuild the result.

The new code has ``fn``'s signature, globals and free variables, so the
function built from it binds arguments exactly as ``fn`` does. It is
generated as Python source (portable across 3.11 and 3.12) and compiled;
objects the code needs (the compiled graph, classes, constants without a
literal) are string placeholders in the source, swapped for the objects in
``co_consts``, so they are loaded with LOAD_CONST and nothing is added to the
user's globals.
"""

from __future__ import annotations

import collections
import keyword
import math
import types
from collections.abc import Callable
from typing import Any

import torch
from torch import fx

from kiln.capture.breaks.reasons import unsupported
from kiln.capture.errors import CaptureError, Unsupported
from kiln.capture.graph import GraphInput, NumberOutput, OutputGraph
from kiln.capture.model_output import is_model_output
from kiln.capture.shapes import expr_of
from kiln.capture.shapes.guards import expr_code
from kiln.capture.shapes.node import SymNode
from kiln.capture.side_effects import SideEffects
from kiln.capture.source import (
    AttrSource,
    ClosureSource,
    GlobalSource,
    ItemSource,
    LocalSource,
    RawItemSource,
    SizeSource,
    Source,
    StrideSource,
    WeakRefCallSource,
)
from kiln.capture.tensor_subclasses import as_plain, is_function_subclass
from kiln.capture.values.base import ConstantValue, Value
from kiln.capture.values.containers import (
    CellValue,
    DictValue,
    DictViewValue,
    ListValue,
    SetValue,
    TupleValue,
)
from kiln.capture.values.functions import BoundMethodValue, UserFunctionValue
from kiln.capture.values.ndarray import NdarrayValue, as_numpy
from kiln.capture.values.objects import NewObjectValue, ObjectValue
from kiln.capture.values.symbolic import SymValue, is_symbolic
from kiln.capture.values.tensor import TensorValue
from kiln.capture.wrap import is_namedtuple

__all__ = [
    "emit_code",
    "grad_mode_after",
    "graph_outputs",
    "make_closure",
    "side_effect_values",
]

CO_VARARGS = 0x04
CO_VARKEYWORDS = 0x08
_LITERAL_TYPES = (int, str, bool, bytes, type(None))
# values with a source the output code reads again from the frame rather than rebuilds
_RELOADED = (
    ListValue,
    DictValue,
    TupleValue,
    ObjectValue,
    SetValue,
    UserFunctionValue,
    BoundMethodValue,
)


def side_effect_values(effects: SideEffects) -> list[Value]:
    """Every value the replayed side effects write."""
    values: list[Value] = [v for _, stores in effects.attr_stores.values() for v in stores.values()]
    values.extend(v for _, stores in effects.global_stores.values() for v in stores.values())
    values.extend(v for _, v in effects.cell_stores.values())
    for c in effects.mutated_containers():
        values.append(ListValue(c.items) if isinstance(c, ListValue) else DictValue(c.items))
    return values


Output = TensorValue | NumberOutput


def graph_outputs(
    result: Value, effects: SideEffects, out: OutputGraph | None = None
) -> list[Output]:
    """The computed tensors the graph must return (for the result and side effects), once
    each; with ``out``, the numbers computed from tensor data as well (see NumberOutput)."""
    found: dict[object, Output] = {}
    seen: set[int] = set()  # cells visited (closures may refer to themselves)

    def visit(v: Value) -> None:
        if isinstance(v, TensorValue):
            if v.node.op != "placeholder":
                found.setdefault(id(v.node), v)
        elif isinstance(v, SymValue) and out is not None and is_symbolic(v.sym):
            if _number_key(v) not in found:
                number = out.number_output(v)
                if number is not None:
                    found[_number_key(v)] = number
        elif isinstance(v, NdarrayValue):
            visit(v.tensor)
        elif isinstance(v, TupleValue) and v.source is None:
            for x in v.items:
                visit(x)
        elif isinstance(v, (ListValue, DictValue, SetValue)) and v.source is None:
            pairs = v.items.values() if isinstance(v, DictValue) else []
            for x in [*(x for _, x in pairs), *v.attrs.values()]:
                visit(x)
            for x in v.items if isinstance(v, ListValue) else []:
                visit(x)
            for x in v.items.values() if isinstance(v, SetValue) else []:
                visit(x)
        elif isinstance(v, DictViewValue):
            visit(v.dict)
        elif isinstance(v, NewObjectValue):
            for x in v.attrs.values():
                visit(x)
        elif isinstance(v, UserFunctionValue) and v.real is None:
            for x in (*v.defaults, *v.kwdefaults.values()):
                visit(x)
            for cell in v.closure:
                if cell.real is None and cell.contents is not None and id(cell) not in seen:
                    seen.add(id(cell))
                    visit(cell.contents)

    visit(result)
    for v in side_effect_values(effects):
        visit(v)
    return list(found.values())


def _number_key(v: SymValue) -> tuple[str, type]:
    return str(expr_of(v.sym)), v.python_type()


def make_closure(
    code: types.CodeType,
    f_globals: dict[str, Any],
    name: str,
    defaults: tuple[Any, ...],
    kwdefaults: dict[str, Any],
    cells: tuple[types.CellType, ...],
) -> types.FunctionType:
    """A function made during the trace that outlives it (returned, stored, live at a break)."""
    fn = types.FunctionType(code, f_globals, name, defaults or None, cells or None)
    if kwdefaults:
        fn.__kwdefaults__ = kwdefaults
    return fn


def _build_object(cls: type, attrs: dict[str, Any]) -> Any:
    """Recreate an instance made during tracing: its class and attribute values."""
    obj: Any = object.__new__(cls)
    for name, value in attrs.items():
        object.__setattr__(obj, name, value)
    return obj


def _build_container(cls: Any, items: Any, attrs: dict[str, Any] | None = None) -> Any:
    """Recreate a dict, list or set subclass instance made in the trace, without its ``__init__``:
    its items, then its instance attributes."""
    if cls is types.MappingProxyType:
        return types.MappingProxyType(dict(items))
    obj: Any = cls.__new__(cls)
    base = next(k for k in cls.__mro__ if k in (collections.OrderedDict, dict, list, set))
    if base is collections.OrderedDict:  # its ``update`` stores through ``self[k] = v``
        for key, value in items.items():
            collections.OrderedDict.__setitem__(obj, key, value)
    else:
        (base.extend if base is list else base.update)(obj, items)  # the base's, not overrides
    for name, value in (attrs or {}).items():
        object.__setattr__(obj, name, value)
    return obj


def _refill_dict(target: dict[Any, Any], items: dict[Any, Any]) -> None:
    """Give ``target`` exactly ``items`` (a mutated dict written back in place)."""
    target.clear()
    target.update(items)


class _Writer:
    """Collects placeholder constants and the text of expressions over the new frame."""

    def __init__(self, fn: types.FunctionType, outputs: list[Output]) -> None:
        self.fn = fn
        self.consts: list[Any] = []
        self.set_outputs(outputs)
        code = fn.__code__
        self.reserved = set(code.co_varnames) | set(code.co_freevars)
        self.cells: list[CellValue] = []  # cells made during the trace that closures share
        self._cell_index: dict[int, int] = {}
        # called with each closure rebuilt (the graph-break handler checks it can be shared)
        self.on_closure: Callable[[UserFunctionValue], None] | None = None
        # str(path) -> the local it was loaded into (see graph_call); sources print uniquely
        # and, unlike them, strings hash even when an index is a slice
        self._hoisted: dict[str, str] = {}
        # lines computing symbolic numbers from the frame's arguments, run first (see number)
        self.prelude: list[str] = []
        self._numbers: dict[str, str] = {}

    def set_outputs(self, outputs: list[Output]) -> None:
        """Where each of the graph's outputs lies in ``__kiln_out``."""
        self.output_index = {id(v.node): i for i, v in enumerate(outputs)}
        self.number_index = {
            _number_key(v.value): (i, v.convert)
            for i, v in enumerate(outputs)
            if isinstance(v, NumberOutput)
        }

    def cell(self, c: CellValue) -> str:
        """A real cell for ``c``: the frame's own, or one of ``__kiln_cells`` (see cell_lines)."""
        if c.real is not None:
            return self.const(c.real)
        i = self._cell_index.get(id(c))
        if i is None:
            i = self._cell_index[id(c)] = len(self.cells)
            self.cells.append(c)
        return f"__kiln_cells[{i}]"

    def cell_lines(
        self, value_of: Callable[[Value], str] | None = None
    ) -> tuple[list[str], list[str]]:
        """Lines making the cells :meth:`cell` named (all empty), and lines filling them.

        Call it after every other expression is written; the making lines go
        before those expressions, the filling ones after the names they use.
        ``value_of`` writes the contents (default :meth:`value`).
        """
        write = value_of or self.value
        fills = []
        i = 0
        while i < len(self.cells):  # contents may name further cells
            contents = self.cells[i].contents
            if contents is not None:
                fills.append(f"__kiln_cells[{i}].cell_contents = {write(contents)}")
            i += 1
        if not self.cells:
            return [], []
        make = f"{self.const(types.CellType)}() for _ in range({len(self.cells)})"
        return [f"__kiln_cells = [{make}]"], fills

    def closure(self, v: UserFunctionValue) -> str:
        if self.on_closure is not None:
            self.on_closure(v)
        defaults = "".join(f"{self.value(d)}, " for d in v.defaults)
        kwdefaults = ", ".join(f"{k!r}: {self.value(d)}" for k, d in v.kwdefaults.items())
        cells = "".join(f"{self.cell(c)}, " for c in v.closure)
        parts = [self.const(v.code), self.const(v.f_globals), repr(v.name)]
        parts += [f"({defaults})", f"{{{kwdefaults}}}", f"({cells})"]
        return f"{self.const(make_closure)}({', '.join(parts)})"

    def const(self, obj: Any) -> str:
        self.consts.append(obj)
        return f"__kiln_k{len(self.consts) - 1}"

    def graph_call(
        self,
        compiled: Any,
        inputs: list[GraphInput],
        mode_after: bool | None = None,
        unwind: bool | None = None,
    ) -> list[str]:
        """Lines that load the graph's inputs and call it, leaving the result in ``__kiln_out``.

        ``mode_after`` (see ``grad_mode_after``) is set once the graph returns. ``unwind`` is
        the grad mode an exception raised in the graph leaves, as the ``with`` blocks the
        graph's code entered or left would on their way out (the mode where the graph ends,
        with the grad-mode blocks still open there left): the graph itself switches modes
        while tracing, or at each switch when it runs eagerly, and restores none when it
        raises. A bare ``torch.set_grad_enabled(b)`` in the graph counts as done.

        Paths that several inputs share are loaded once into locals (``__kiln_s0 =
        self._modules``, ``__kiln_s1 = __kiln_s0['0']._parameters``, then
        ``__kiln_s1['weight']``): a deep model's parameters cost one dict lookup each.
        The locals serve this call only: writes replayed after the graph may change
        what the paths lead to.
        """
        sources = [i.source for i in inputs]
        lines = []
        for prefix in _shared_prefixes(sources):
            name = f"__kiln_s{len(self._hoisted)}"
            lines.append(f"{name} = {self.source(prefix)}")
            self._hoisted[str(prefix)] = name
        args = ", ".join(self._graph_arg(i) for i in inputs)
        self._hoisted.clear()
        call = f"__kiln_out = {self.const(compiled)}({args})"
        needed = mode_after is not None or unwind is not None
        switch = self.const(torch._C._set_grad_enabled) if needed else ""
        if unwind is None:
            lines.append(call)
        else:
            lines += ["try:", f"    {call}", "except BaseException:", f"    {switch}({unwind})"]
            lines.append("    raise")
        if mode_after is not None:
            lines.append(f"{switch}({mode_after})")
        return lines

    def _graph_arg(self, given: GraphInput) -> str:
        """A graph input: a ``__torch_function__`` subclass's as its plain data (the graph holds
        the override's ops already)."""
        if isinstance(given.value, TensorValue) and is_function_subclass(given.value.real_type):
            return f"{self.const(as_plain)}({self.source(given.source)})"
        return self.source(given.source)

    def source(self, src: Source) -> str:
        hoisted = self._hoisted.get(str(src)) if self._hoisted else None
        if hoisted is not None:
            return hoisted
        if isinstance(src, (LocalSource, ClosureSource)):
            return src.name
        if isinstance(src, GlobalSource):
            if src.name in self.reserved or not src.name.isidentifier():
                return f"{self.const(self.fn.__globals__)}[{src.name!r}]"
            return src.name
        if isinstance(src, AttrSource):
            base = self.source(src.base)
            if src.name.isidentifier() and not keyword.iskeyword(src.name):
                return f"{base}.{src.name}"
            return f"{self.const(getattr)}({base}, {src.name!r})"
        if isinstance(src, ItemSource):
            base = self.source(src.base)
            if isinstance(src.index, _LITERAL_TYPES):
                return f"{base}[{src.index!r}]"
            return f"{base}[{self.const(src.index)}]"
        if isinstance(src, RawItemSource):
            getitem = self.const(vars(src.owner)["__getitem__"])
            return f"{getitem}({self.source(src.base)}, {self.const(src.index)})"
        if isinstance(src, SizeSource):
            return f"{self.source(src.base)}.size()[{src.dim}]"
        if isinstance(src, StrideSource):
            return f"{self.source(src.base)}.stride()[{src.dim}]"
        if isinstance(src, WeakRefCallSource):
            return f"{self.source(src.base)}()"
        raise unsupported("unsupported_value", f"reloading {src}")

    def value(self, v: Value) -> str:
        if isinstance(v, TensorValue):
            if v.node.op == "placeholder" and v.source is not None:
                return self.source(v.source)
            out = f"__kiln_out[{self.output_index[id(v.node)]}]"
            if is_function_subclass(v.real_type):  # the graph computed its plain data
                return f"{out}.as_subclass({self.const(v.real_type)})"
            return out
        if isinstance(v, NdarrayValue):
            return f"{self.const(as_numpy)}({self.value(v.tensor)}, {v.scalar})"
        if isinstance(v, SymValue) and is_symbolic(v.sym):
            computed = self.number_index.get(_number_key(v))
            if computed is not None:  # a number from data: the graph returned it
                i, convert = computed
                out = f"__kiln_out[{i}]"
                return f"{self.const(v.python_type())}({out})" if convert else out
            number = self.number(v)
            if number is not None:
                return number
        if isinstance(v, ConstantValue):
            return self.constant(v.value)
        if v.source is not None and isinstance(v, _RELOADED):
            return self.source(v.source)
        if isinstance(v, TupleValue):
            items = ", ".join(self.value(x) for x in v.items)
            if v.cls is tuple:
                return f"({items}{',' if len(v.items) == 1 else ''})"
            if is_namedtuple(v.cls):
                return f"{self.const(v.cls)}({items})"
            packed = f"({items}{',' if len(v.items) == 1 else ''})"
            if any(isinstance(vars(k).get("__new__"), staticmethod) for k in v.cls.__mro__):
                # a Python ``__new__`` takes other arguments: tuple's own, as capture's
                return f"{self.const(tuple.__new__)}({self.const(v.cls)}, {packed})"
            return f"{self.const(v.cls)}({packed})"
        if isinstance(v, ListValue):
            items = f"[{', '.join(self.value(x) for x in v.items)}]"
            return (
                items
                if v.cls is list
                else f"{self.const(_build_container)}({self.const(v.cls)}, {items}{self.attrs(v)})"
            )
        if isinstance(v, SetValue):
            members = ", ".join(self.value(x) for x in v.items.values())
            if v.cls is not set:
                return f"{self.const(_build_container)}({self.const(v.cls)}, [{members}]{self.attrs(v)})"
            return f"{{{members}}}" if v.items else "set()"
        if isinstance(v, DictValue):
            pairs = ", ".join(f"{self.value(k)}: {self.value(x)}" for k, x in v.items.values())
            if v.cls is dict:
                return f"{{{pairs}}}"
            if not is_model_output(v.cls) and v.cls is not collections.OrderedDict:
                return f"{self.const(_build_container)}({self.const(v.cls)}, {{{pairs}}}{self.attrs(v)})"
            return (
                f"{self.const(v.cls)}(**{{{pairs}}})"
                if _kwargs_ctor(v)
                else (f"{self.const(v.cls)}({{{pairs}}})")
            )
        if isinstance(v, DictViewValue):  # dict's own method: a subclass may override it
            return f"{self.const(getattr(dict, v.kind))}({self.value(v.dict)})"
        if isinstance(v, ObjectValue):
            return self.const(v.obj)
        if isinstance(v, NewObjectValue):
            attrs = ", ".join(f"{k!r}: {self.value(x)}" for k, x in v.attrs.items())
            return f"{self.const(_build_object)}({self.const(v.cls)}, {{{attrs}}})"
        if isinstance(v, UserFunctionValue):
            return self.const(v.real) if v.real is not None else self.closure(v)
        raise unsupported("unsupported_value", f"returning {v}")

    def number(self, v: SymValue) -> str | None:
        """A local holding ``v`` computed from this call's sizes and numbers, or None where
        its expression cannot be read back from the frame's arguments.

        A symbolic number handed on (to a continuation after a graph break, or returned)
        takes this call's value; written as the value it had at capture, a guard would fix
        it there, and the next frame would compile once per value. The line runs first,
        before anything the frame's code writes, as the guards read the same sources.
        """
        node = v.sym.node
        if not isinstance(node, SymNode):
            return None
        key = str(node.expr)
        name = self._numbers.get(key)
        if name is not None:
            return name
        try:
            text = expr_code(node.env, node.expr, self.source)
        except (Unsupported, KeyError):  # a symbol with no source (data-dependent)
            return None
        if "math." in text:  # floor and ceiling print as math functions the frame may lack
            return None
        name = self._numbers[key] = f"__kiln_n{len(self._numbers)}"
        self.prelude.append(f"{name} = {self.const(v.python_type())}({text})")
        return name

    def attrs(self, v: ListValue | DictValue | SetValue) -> str:
        """The instance attributes argument of ``_build_container``, where there are any."""
        if not v.attrs:
            return ""
        return ", {" + ", ".join(f"{k!r}: {self.value(x)}" for k, x in v.attrs.items()) + "}"

    def constant(self, obj: Any) -> str:
        if isinstance(obj, _LITERAL_TYPES) or (isinstance(obj, float) and math.isfinite(obj)):
            return repr(obj)
        return self.const(obj)


def _shared_prefixes(sources: list[Source]) -> list[Source]:
    """The attribute/item paths worth loading once, shallowest first.

    A path is shared when two or more of ``sources`` run through it; of a chain of paths
    that serve the same sources (``self._modules['0']`` and ``self._modules['0']._parameters``
    for ``weight`` and ``bias``) only the deepest is kept.
    """
    paths: dict[str, AttrSource | ItemSource] = {}  # keyed by text: indices may not hash
    uses: dict[str, int] = {}
    for src in {str(s): s for s in sources}.values():  # each input once
        base = src.base if isinstance(src, (AttrSource, ItemSource)) else None
        while isinstance(base, (AttrSource, ItemSource)):
            text = str(base)
            paths[text] = base
            uses[text] = uses.get(text, 0) + 1
            base = base.base
    covered = {str(p.base) for k, p in paths.items() if uses.get(str(p.base)) == uses[k]}
    shared = [p for k, p in paths.items() if uses[k] > 1 and k not in covered]
    return sorted(shared, key=_depth)


def _depth(src: Source) -> int:
    depth = 0
    while isinstance(src, (AttrSource, ItemSource)):
        depth, src = depth + 1, src.base
    return depth


def _replay(writer: _Writer, effects: SideEffects) -> list[str]:
    lines = []
    for fn, args, kwargs in effects.calls:
        arg_text = [writer.const(a) for a in args]
        arg_text.extend(f"{k}={writer.const(v)}" for k, v in kwargs.items())
        lines.append(f"{writer.const(fn)}({', '.join(arg_text)})")
    for target, stores in effects.attr_stores.values():
        assert target.source is not None
        obj = writer.source(target.source)
        for name, value in stores.items():
            lines.append(f"{writer.const(setattr)}({obj}, {name!r}, {writer.value(value)})")
    for namespace, stores in effects.global_stores.values():
        for name, value in stores.items():
            lines.append(f"{writer.const(namespace)}[{name!r}] = {writer.value(value)}")
    for cell, value in effects.cell_stores.values():
        lines.append(f"{writer.const(cell)}.cell_contents = {writer.value(value)}")
    for c in effects.mutated_containers():
        assert c.source is not None
        where = writer.source(c.source)
        if isinstance(c, ListValue):
            lines.append(f"{where}[:] = {writer.value(ListValue(c.items))}")
        else:
            # the new items are built before the dict is cleared: they may read it
            new_items = writer.value(DictValue(c.items))
            lines.append(f"{writer.const(_refill_dict)}({where}, {new_items})")
    return lines


def _kwargs_ctor(v: DictValue) -> bool:
    return is_model_output(v.cls) and all(isinstance(k, str) for k in v.items)


def _signature(code: types.CodeType) -> str:
    names = code.co_varnames
    npos, nkw, nposonly = code.co_argcount, code.co_kwonlyargcount, code.co_posonlyargcount
    parts = list(names[:nposonly])
    if nposonly:
        parts.append("/")
    parts.extend(names[nposonly:npos])
    rest = npos + nkw
    if code.co_flags & CO_VARARGS:
        parts.append("*" + names[rest])
        rest += 1
    elif nkw:
        parts.append("*")
    parts.extend(names[npos : npos + nkw])
    if code.co_flags & CO_VARKEYWORDS:
        parts.append("**" + names[rest])
    return ", ".join(parts)


def grad_mode_after(gm: fx.GraphModule) -> bool | None:
    """The grad mode a graph leaves set, or None when it switches none.

    Backends that trace the graph (autograd_aot) apply its ``_set_grad_enabled`` nodes while
    tracing, not when the compiled graph runs, so the emitted code sets this mode after the
    call, as the eager code would have left it (at a graph break or at the frame's return).
    """
    mode = None
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target is torch._C._set_grad_enabled:
            mode = bool(node.args[0])
    return mode


def emit_code(
    fn: types.FunctionType,
    compiled: Any,
    inputs: list[GraphInput],
    outputs: list[Output],
    result: Value,
    effects: SideEffects,
    mode_after: bool | None = None,
) -> types.CodeType:
    """The code object that replaces ``fn.__code__`` for calls this capture covers."""
    code = fn.__code__
    writer = _Writer(fn, outputs)
    head: list[str] = []
    if compiled is not None:
        # the frame returns with every block it entered left: an exception leaves the same mode
        head.extend(writer.graph_call(compiled, inputs, mode_after, unwind=mode_after))
    replay = _replay(writer, effects)
    ret = f"return {writer.value(result)}"
    make_cells, fill_cells = writer.cell_lines()
    body = [*head, *make_cells, *fill_cells, *replay, ret]
    return assemble(code, writer, body)


def assemble(code: types.CodeType, writer: _Writer, body: list[str]) -> types.CodeType:
    """Compile ``body`` as a function with ``code``'s signature and free variables."""
    lines = [f"def __kiln_outer__({', '.join(code.co_freevars)}):"]
    lines.append(f"    def __kiln_fn__({_signature(code)}):")
    if code.co_freevars:
        lines.append(f"        if 0:\n            ({', '.join(code.co_freevars)},)")
    for i in range(len(writer.consts)):
        lines.append(f"        __kiln_k{i} = '__kiln_const_{i}__'")
    lines.extend("        " + line for line in [*writer.prelude, *body])
    lines.append("    return __kiln_fn__")
    source = "\n".join(lines)
    outer = compile(source, f"<kiln {code.co_filename}:{code.co_firstlineno}>", "exec")
    inner = next(c for c in outer.co_consts[0].co_consts if isinstance(c, types.CodeType))
    placeholders = {f"__kiln_const_{i}__": obj for i, obj in enumerate(writer.consts)}
    consts = tuple(placeholders.get(c, c) if isinstance(c, str) else c for c in inner.co_consts)
    new = inner.replace(co_consts=consts, co_name=code.co_name, co_qualname=code.co_qualname)
    if new.co_freevars != code.co_freevars:
        msg = f"emitted free variables {new.co_freevars} differ from {code.co_freevars}"
        raise CaptureError(msg)
    return new
