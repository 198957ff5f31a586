"""``torch.func`` transforms of user functions: the function traced as a subgraph, one node.

``torch.func.vmap(f)(x)``, ``grad``, ``grad_and_value``, ``jacrev``, ``jacfwd``, ``hessian``,
``vjp``, ``jvp`` and ``functional_call`` take a function and run it on tensors the transform
made (batched, or tracking gradients at their own level). Capture cannot inline ``f`` into
the frame's graph: the transform changes what each op means. It traces ``f`` instead on
stand-ins for what the transform hands it (learnt by running the transform on the fakes with a
probe for ``f`` that records its arguments and stops), cuts the ops that trace made out of the
frame's graph into a subgraph (:class:`Subgraph`), and records one node whose target applies
the same transform to the subgraph (:func:`_target`). Tensors ``f`` reads from outside its
arguments (parameters, closed-over tensors, values computed earlier in the frame) become
extra inputs of the subgraph, passed by the node: the transform treats them as eager does the
tensors ``f`` closes over (unbatched, not differentiated by the inner transform, still seen by
outer autograd). Run on real tensors (the ``eager`` backend) the node is the transform over
the subgraph; run under autograd_aot's ATen tracer, the transform turns into batched or
differentiated ATen ops, which the backend compiles like any others. Nested transforms nest
the same way: the inner one is a node of the outer one's subgraph.

``functional_call(module, params, args)`` traces the module's call the same way and hands
the subgraph the given tensors in place of the parameters and buffers they name.

What cannot be traced so (a side effect in ``f``, a graph break inside it, options that are
not constants, arguments that are not tensors, constants and containers of them, an error
the transform raises on the fakes) is a ``functorch`` graph break naming the transform; the
call then runs in Python.
"""

from __future__ import annotations

import dataclasses
import inspect
import operator
import types
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.func
from torch import fx
from torch.utils import _pytree as pytree

from kiln.capture import dispatch, subgraphs
from kiln.capture.autograd_function import TraceState
from kiln.capture.breaks.reasons import unsupported
from kiln.capture.errors import Unsupported
from kiln.capture.meta import fake_like
from kiln.capture.torch_functions import TRANSFORMS, made_by_transform
from kiln.capture.values.base import ConstantValue, Value, is_constant
from kiln.capture.values.containers import DictValue, ListValue, TupleValue
from kiln.capture.values.objects import ObjectValue
from kiln.capture.values.tensor import TensorValue
from kiln.capture.wrap import wrap

if TYPE_CHECKING:
    from kiln.capture.tracer import Tracer

__all__ = [
    "HANDLERS",
    "Subgraph",
    "TransformedValue",
    "VjpFnValue",
    "call_made",
    "trace_subgraph",
]

Args = list[Value]
Kwargs = dict[str, Value]
Make = Callable[[Callable[..., Any]], Callable[..., Any]]

# the transforms that run their function with grad mode on, whatever the caller's
_ENABLE_GRAD = frozenset({"grad", "grad_and_value", "jacrev", "hessian", "vjp"})


class TransformedValue(Value):
    """``torch.func.vmap(f, ...)`` and the like: a function a call of which is traced."""

    def __init__(self, name: str, func: Value, options: dict[str, Any]) -> None:
        self.name = name
        self.func = func
        self.options = options

    def python_type(self) -> type:
        return types.FunctionType

    def make(self) -> Make:
        transform, options = getattr(torch.func, self.name), self.options
        return lambda f: transform(f, **options)  # type: ignore[no-any-return]


@dataclasses.dataclass
class Subgraph:
    """A function traced on stand-ins for its arguments, cut out of the frame's graph.

    ``gm`` takes the tensors of the arguments (in ``pytree`` order of ``in_spec``), then the
    tensors it reads from outside them (``lifted``: values of the frame's graph); it returns
    the tensors of the function's result, which :meth:`rebuild` puts back in its structure.
    """

    gm: fx.GraphModule
    in_spec: pytree.TreeSpec
    in_leaves: list[Any]  # the arguments' leaves: None where a tensor goes
    lifted: list[TensorValue]
    out_spec: pytree.TreeSpec
    out_leaves: list[Any]  # the result's leaves: None where a tensor goes

    def function(self, lifted: tuple[torch.Tensor, ...]) -> Callable[..., Any]:
        """The traced function, closing over the values of ``lifted``."""

        def traced(*args: Any) -> Any:
            leaves = pytree.tree_leaves(args)
            tensors = [leaf for leaf, c in zip(leaves, self.in_leaves, strict=True) if c is None]
            return self.rebuild(self.gm(*tensors, *lifted))

        return traced

    def rebuild(self, tensors: Any) -> Any:
        it = iter(tensors)
        leaves = [next(it) if c is None else c for c in self.out_leaves]
        return pytree.tree_unflatten(leaves, self.out_spec)


class _Probed(Exception):
    """Raised by the probe standing for the user's function, once it has its arguments."""


def _example_input() -> None:
    """Target of the nodes standing for a subgraph's arguments while it is traced; they are
    cut out with the subgraph, so no graph keeps one."""


def _probe(tr: Tracer, name: str, make: Make, fakes: tuple[Any, ...]) -> tuple[Any, ...]:
    """What the transform hands its function when called with ``fakes``."""
    seen: list[tuple[Any, ...]] = []

    def probe(*args: Any, **kwargs: Any) -> Any:
        seen.append(args)
        raise _Probed

    try:
        with tr.out.fake_mode:
            make(probe)(*fakes)
    except _Probed:
        pass
    except Unsupported:
        raise
    except Exception as e:  # eager raises it too, or the transform needs data
        raise unsupported("functorch", f"{name}: {type(e).__name__}: {e}") from e
    if not seen:
        raise unsupported("functorch", f"{name} did not call its function")
    return seen[0]


def _stand_in(tr: Tracer, t: torch.Tensor) -> TensorValue:
    """A node and fake standing for a tensor the transform made (a batched tensor's example,
    one tracking gradients at the transform's level)."""
    try:
        stride = t.stride()
    except RuntimeError:
        stride = torch.empty(t.shape, device="meta").stride()
    meta = torch.empty_strided(t.shape, stride, dtype=t.dtype, device="meta")
    fake = fake_like(meta, t.device)
    if t.requires_grad and (t.dtype.is_floating_point or t.dtype.is_complex):
        fake.requires_grad_(True)
    node = tr.out.create_node("call_function", _example_input, (), {}, fake)
    return TensorValue(node, fake)


def _as_value(obj: Any) -> Value:
    """A Python structure of values (from ``tree_unflatten``) as one value."""
    if isinstance(obj, Value):
        return obj
    if isinstance(obj, tuple):
        return TupleValue([_as_value(x) for x in obj], type(obj))
    if isinstance(obj, list):
        return ListValue([_as_value(x) for x in obj])
    if isinstance(obj, dict) and type(obj) is dict:
        return DictValue({k: (ConstantValue(k), _as_value(v)) for k, v in obj.items()})
    if is_constant(obj):
        return ConstantValue(obj)
    raise unsupported("functorch", f"a {type(obj).__name__} among a transform's values")


def _flatten(value: Value) -> tuple[list[Any], pytree.TreeSpec]:
    """The leaves of a value's structure (values for tensors, Python constants otherwise)."""

    def plain(v: Value) -> Any:
        if isinstance(v, TensorValue):
            return v
        if isinstance(v, ConstantValue):
            return v.value
        if isinstance(v, TupleValue) and v.cls is tuple:
            return tuple(plain(x) for x in v.items)
        if isinstance(v, ListValue) and v.cls is list:
            return [plain(x) for x in v.items]
        if isinstance(v, DictValue) and v.cls is dict:
            return {k: plain(x) for k, (_, x) in v.items.items()}
        raise unsupported("functorch", f"{v} among a transformed function's values")

    return pytree.tree_flatten(plain(value))


def trace_subgraph(
    tr: Tracer, name: str, func: Value, example: tuple[Any, ...], kwargs: Kwargs
) -> Subgraph:
    """Trace ``func`` on stand-ins for ``example`` (what it is handed: tensors, constants and
    containers of them) and ``kwargs`` (read as it reads a closure), then take the ops out.

    The guards the trace records stay; side effects, which the subgraph cannot replay, break
    the graph (:meth:`Tracer.rollback` refuses them).
    """
    leaves, in_spec = pytree.tree_flatten(example)
    for leaf in leaves:
        if not (isinstance(leaf, torch.Tensor) or is_constant(leaf)):
            raise unsupported("functorch", f"{name} of a function given a {type(leaf).__name__}")
    cp = tr.checkpoint()
    before = TraceState(tr)
    grad_mode = torch.is_grad_enabled()
    stand_ins = [_stand_in(tr, t) if isinstance(t, torch.Tensor) else None for t in leaves]
    args = pytree.tree_unflatten(
        [s if s is not None else ConstantValue(c) for s, c in zip(stand_ins, leaves, strict=True)],
        in_spec,
    )
    try:
        if name in _ENABLE_GRAD:
            torch._C._set_grad_enabled(True)  # as the transform runs it; no node: it does so
        result = dispatch.call(tr, func, [_as_value(a) for a in args], kwargs)
        out_leaves, out_spec = _flatten(result)
        before.check(tr, f"{name} of {func}", kind="functorch")
    except Unsupported as e:
        if e.kind == "functorch":
            raise
        raise unsupported("functorch", f"{name} of {func}: {e.kind}: {e.explanation}") from e
    finally:
        torch._C._set_grad_enabled(grad_mode)
    entries = [s.node for s in stand_ins if s is not None]
    gm, lifted = subgraphs.cut(tr, cp.nodes, entries, [v.node for v in out_leaves if _is_tensor(v)])
    tr.rollback(cp)
    return Subgraph(
        gm,
        in_spec,
        [None if isinstance(x, torch.Tensor) else x for x in leaves],
        lifted,
        out_spec,
        [None if _is_tensor(v) else v for v in out_leaves],
    )


def _is_tensor(v: Any) -> bool:
    return isinstance(v, TensorValue)


@dataclasses.dataclass
class _Call:
    """How a node's tensor arguments become the transformed function's arguments: the
    leaves of their structure (None where a tensor goes), then the subgraph's lifted values."""

    spec: pytree.TreeSpec
    leaves: list[Any]

    @staticmethod
    def of(args: list[Value]) -> tuple[_Call, list[Any], Any]:
        """The call of ``args``, their leaves, and their structure with fakes for tensors."""
        leaves, spec = _flatten(TupleValue(list(args)))
        fakes = pytree.tree_unflatten([v.fake if _is_tensor(v) else v for v in leaves], spec)
        return _Call(spec, [None if _is_tensor(v) else v for v in leaves]), leaves, fakes

    def args(self, tensors: tuple[Any, ...]) -> Any:
        it = iter(tensors)
        return pytree.tree_unflatten([next(it) if c is None else c for c in self.leaves], self.spec)


def _target(name: str, make: Make, sub: Subgraph, call: _Call) -> Callable[..., Any]:
    """The node's target: the transform over the subgraph, its result's leaves as a tuple
    (tensors among them), its structure kept on the target for the trace to rebuild."""

    def run(*tensors: Any) -> tuple[Any, ...]:
        n = len(tensors) - len(sub.lifted)
        result = make(sub.function(tuple(tensors[n:])))(*call.args(tensors[:n]))
        out, spec = pytree.tree_flatten(result)
        run.out_spec = spec  # type: ignore[attr-defined]
        return tuple(out)

    run.__name__ = run.__qualname__ = f"functorch_{name}"
    run.subgraph = sub.gm  # type: ignore[attr-defined]
    return run


def _emit(
    tr: Tracer, name: str, make: Make, sub: Subgraph, call: _Call, inputs: list[TensorValue]
) -> Value:
    """One node applying ``make``'s transform to ``sub`` on ``inputs``; the result's value."""
    target = _target(name, make, sub, call)
    values = [*inputs, *sub.lifted]
    try:
        with tr.out.fake_mode:
            out = target(*[v.fake for v in values])
    except Unsupported:
        raise
    except Exception as e:  # eager raises it too (randomness="error"), or it needs data
        raise unsupported("functorch", f"{name}: {type(e).__name__}: {e}") from e
    node = tr.out.create_node("call_function", target, tuple(v.node for v in values), {}, out)
    leaves: list[Value] = []
    for i, o in enumerate(out):
        if isinstance(o, torch.Tensor):
            item = tr.out.create_node("call_function", operator.getitem, (node, i), {}, o)
            leaves.append(TensorValue(item, o))
        else:
            leaves.append(_as_value(o))
    return _as_value(pytree.tree_unflatten(leaves, target.out_spec))  # type: ignore[attr-defined]


def apply(tr: Tracer, name: str, make: Make, func: Value, args: Args, kwargs: Kwargs) -> Value:
    """``make(func)(*args)``: ``func`` (given ``kwargs`` as they are) traced as a subgraph,
    the call one node."""
    call, leaves, fakes = _Call.of(args)
    sub = trace_subgraph(tr, name, func, _probe(tr, name, make, fakes), kwargs)
    return _emit(tr, name, make, sub, call, [v for v in leaves if _is_tensor(v)])


def call_made(tr: Tracer, fv: ObjectValue, args: Args, kwargs: Kwargs) -> Value:
    """A call of a function a torch.func transform returned outside the compiled code
    (``batched = vmap(f)``), traced as that transform of its function."""
    made = made_by_transform(fv.obj)
    assert made is not None
    name, where, at = made
    cells = fv.obj.__closure__
    options = {k: cells[i].cell_contents for k, i in where.items()}
    if not all(is_constant(v) for v in options.values()):
        raise unsupported("functorch", f"{name} made with options that are not constants")
    src = fv.source.attr("__closure__").item(at).attr("cell_contents") if fv.source else None
    func = wrap(tr.out, cells[at].cell_contents, src)
    return _call_transformed(tr, TransformedValue(name, func, options), args, kwargs)


@dispatch.CALL.register(TransformedValue)
def _call_transformed(tr: Tracer, fn: TransformedValue, args: Args, kwargs: Kwargs) -> Value:
    return apply(tr, fn.name, fn.make(), fn.func, args, kwargs)


def _constant(v: Value, what: str) -> Any:
    """A transform's option as the Python constant it must be."""
    if isinstance(v, (TupleValue, ListValue)):
        items = [_constant(x, what) for x in v.items]
        return tuple(items) if isinstance(v, TupleValue) else items
    if isinstance(v, DictValue):
        return {k: _constant(x, what) for k, (_, x) in v.items.items()}
    if isinstance(v, ConstantValue):
        return v.value
    raise unsupported("functorch", f"{what}: {v} is not a constant")


def _bind(fn: Any, args: Args, kwargs: Kwargs) -> dict[str, Any]:
    try:
        return dict(inspect.signature(fn).bind(*args, **kwargs).arguments)
    except TypeError as e:
        raise unsupported("functorch", f"torch.func.{fn.__name__}: {e}") from e


def _options(bound: dict[str, Any], name: str, skip: tuple[str, ...]) -> dict[str, Any]:
    return {k: _constant(v, f"{name}'s {k}") for k, v in bound.items() if k not in skip}


def _wrapper_handler(fn: Any) -> Callable[[Tracer, Args, Kwargs], Value]:
    name = TRANSFORMS[fn]

    def handle(tr: Tracer, args: Args, kwargs: Kwargs) -> Value:
        bound = _bind(fn, args, kwargs)
        return TransformedValue(name, bound["func"], _options(bound, name, ("func",)))

    return handle


def _jvp(tr: Tracer, args: Args, kwargs: Kwargs) -> Value:
    bound = _bind(torch.func.jvp, args, kwargs)
    options = _options(bound, "jvp", ("func", "primals", "tangents"))

    def make(f: Callable[..., Any]) -> Callable[..., Any]:
        return lambda primals, tangents: torch.func.jvp(f, primals, tangents, **options)

    return apply(tr, "jvp", make, bound["func"], [bound["primals"], bound["tangents"]], {})


class VjpFnValue(Value):
    """The ``vjp_fn`` that ``torch.func.vjp`` returns. A call is one node that runs ``vjp``
    over the traced function again and applies its pullback (the forward's own node computed
    the primal outputs): a graph holds values, not functions."""

    def __init__(self, sub: Subgraph, primals: list[Value], has_aux: bool) -> None:
        self.sub = sub
        self.primals = primals
        self.has_aux = has_aux

    def python_type(self) -> type:
        return types.FunctionType


def _vjp(tr: Tracer, args: Args, kwargs: Kwargs) -> Value:
    bound = _bind(torch.func.vjp, args, kwargs)
    has_aux = bool(_options(bound, "vjp", ("func", "primals")).get("has_aux", False))
    primals = list(bound.get("primals", ()))
    call, leaves, fakes = _Call.of(primals)

    def make(f: Callable[..., Any]) -> Callable[..., Any]:
        return lambda *p: torch.func.vjp(f, *p, has_aux=has_aux)

    sub = trace_subgraph(tr, "vjp", bound["func"], _probe(tr, "vjp", make, fakes), {})
    out = _emit(tr, "vjp_forward", lambda f: f, sub, call, [v for v in leaves if _is_tensor(v)])
    fn = VjpFnValue(sub, primals, has_aux)
    if not has_aux:
        return TupleValue([out, fn])
    if not (isinstance(out, TupleValue) and len(out.items) == 2):
        raise unsupported("functorch", "vjp with has_aux=True of a function not returning a pair")
    return TupleValue([out.items[0], fn, out.items[1]])


@dispatch.CALL.register(VjpFnValue)
def _call_vjp_fn(tr: Tracer, fn: VjpFnValue, args: Args, kwargs: Kwargs) -> Value:
    if kwargs:
        raise unsupported("functorch", "vjp_fn called with keyword arguments")
    has_aux = fn.has_aux

    def make(f: Callable[..., Any]) -> Callable[..., Any]:
        def pullback(primals: tuple[Any, ...], cotangents: tuple[Any, ...]) -> Any:
            return torch.func.vjp(f, *primals, has_aux=has_aux)[1](*cotangents)

        return pullback

    call, leaves, _ = _Call.of([TupleValue(fn.primals), TupleValue(list(args))])
    return _emit(tr, "vjp", make, fn.sub, call, [v for v in leaves if _is_tensor(v)])


def _functional_call(tr: Tracer, args: Args, kwargs: Kwargs) -> Value:
    """``functional_call(module, tensors, args, kwargs)``: the module's call traced as a
    subgraph, handed the given tensors where it reads the parameters and buffers they name."""
    bound = _bind(torch.func.functional_call, args, kwargs)
    module = bound["module"]
    if not (isinstance(module, ObjectValue) and isinstance(module.obj, torch.nn.Module)):
        raise unsupported("functorch", f"functional_call of {module}, not a module")
    options = _options(
        bound, "functional_call", ("module", "parameter_and_buffer_dicts", "args", "kwargs")
    )
    given = _given_tensors(bound["parameter_and_buffer_dicts"])
    call_args = bound.get("args", ConstantValue(None))
    if isinstance(call_args, ConstantValue) and call_args.is_none():
        positional: list[Value] = []
    elif isinstance(call_args, TupleValue) and call_args.cls is tuple:
        positional = list(call_args.items)
    else:
        positional = [call_args]
    call_kwargs = bound.get("kwargs", ConstantValue(None))
    if isinstance(call_kwargs, DictValue):
        named = {str(k): v for k, (_, v) in call_kwargs.items.items()}
    elif isinstance(call_kwargs, ConstantValue) and call_kwargs.is_none():
        named = {}
    else:
        raise unsupported("functorch", f"functional_call with kwargs {call_kwargs}")
    call, leaves, fakes = _Call.of(positional)
    sub = trace_subgraph(tr, "functional_call", module, tuple(fakes), named)
    _substitute(tr, module.obj, sub, given, **options)
    return _emit(
        tr, "functional_call", lambda f: f, sub, call, [v for v in leaves if _is_tensor(v)]
    )


def _given_tensors(dicts: Value) -> dict[str, TensorValue]:
    parts = dicts.items if isinstance(dicts, (TupleValue, ListValue)) else [dicts]
    given: dict[str, TensorValue] = {}
    for part in parts:
        if not isinstance(part, DictValue):
            raise unsupported("functorch", f"functional_call given {part}, not a dict of tensors")
        for key, (_, v) in part.items.items():
            if not (isinstance(key, str) and isinstance(v, TensorValue)) or key in given:
                raise unsupported("functorch", f"functional_call given {key!r}: {v}")
            given[key] = v
    return given


def _substitute(
    tr: Tracer,
    module: torch.nn.Module,
    sub: Subgraph,
    given: dict[str, TensorValue],
    tie_weights: bool = True,
    strict: bool = False,
) -> None:
    """Hand ``sub`` the given tensors in place of the module's state they name (tied names:
    one tensor read through several, which ``tie_weights`` makes one)."""
    names: dict[int, list[str]] = {}
    state = [
        *module.named_parameters(remove_duplicate=False),
        *module.named_buffers(remove_duplicate=False),
    ]
    for name, t in state:
        names.setdefault(id(t), []).append(name)
    known = {name for name, _ in state}
    if not set(given) <= known or (strict and set(given) != known):
        raise unsupported("functorch", "functional_call's tensors do not match the module's")
    real_of = {i.node: i.real for i in tr.out.inputs}
    for i, v in enumerate(sub.lifted):
        real = real_of.get(v.node)
        found = [given[n] for n in names.get(id(real), []) if n in given]
        if not found:
            continue
        if len(found) != len(names[id(real)]) and not tie_weights:
            raise unsupported("functorch", "functional_call of tied weights given in part")
        new = found[0]
        same = (new.fake.shape, new.fake.dtype, new.fake.device)
        if same != (v.fake.shape, v.fake.dtype, v.fake.device):
            raise unsupported(
                "functorch", "functional_call given a tensor unlike the one it replaces"
            )
        sub.lifted[i] = new


HANDLERS: dict[Any, Callable[[Tracer, Args, Kwargs], Value]] = {
    **{fn: _wrapper_handler(fn) for fn in TRANSFORMS},
    torch.func.jvp: _jvp,
    torch.func.vjp: _vjp,
    torch.func.functional_call: _functional_call,
}
"""``torch.func``'s transforms by function, for ``builtin_calls``' table of handlers."""
