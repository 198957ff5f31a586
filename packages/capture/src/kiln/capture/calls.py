"""Calling tracked values: inline Python code, record torch ops, fold pure builtins.

:func:`call` is the one entry for every call the bytecode makes (CALL,
CALL_FUNCTION_EX, operators' dunder methods, iterator helpers). Python
functions are inlined by a child tracer; ``nn.Module`` calls inline
``forward`` (with hooks); classes are constructed symbolically; torch
callables become nodes; other C callables are folded when every argument is
constant and the callable is known to be pure.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import inspect
import random
import types
import warnings
import weakref
from typing import TYPE_CHECKING, Any

import torch

from kiln.capture import (
    autograd_function,
    builtin_calls,
    builtin_types,
    contexts,
    control_flow,
    dispatch,
    function_modes,
    functorch_calls,
    literals,
    numpy_calls,
    parallel_modules,
    torch_calls,
    torch_functions,
)
from kiln.capture.breaks.reasons import raised, unsupported
from kiln.capture.descriptors import class_static, class_static_unless
from kiln.capture.guard_data import CachedCall, GuardKind
from kiln.capture.model_output import is_model_output
from kiln.capture.source import WeakRefCallSource
from kiln.capture.values.base import ConstantValue, Value, is_constant
from kiln.capture.values.containers import DictValue, ListValue, TupleValue
from kiln.capture.values.functions import (
    BoundMethodValue,
    PartialValue,
    ReplayedCallValue,
    UserFunctionValue,
)
from kiln.capture.values.iterators import IteratorValue
from kiln.capture.values.objects import NewObjectValue, ObjectValue
from kiln.capture.values.tensor import TensorValue
from kiln.capture.wrap import function_value, is_namedtuple, wrap

if TYPE_CHECKING:
    from kiln.capture.tracer import Tracer

__all__ = ["call_module"]

_IMPURE_BUILTINS = frozenset(
    {
        "print", "open", "input", "exec", "eval", "compile", "setattr", "delattr",
        "globals", "locals", "vars", "breakpoint", "__import__", "exit", "quit", "help",
        "id", "hash", "next", "iter",
    }
)  # fmt: skip
_PURE_MODULES = frozenset({"math", "operator", "_operator", "builtins", "cmath", "string"})


# ``fn(*args, **kwargs)`` by the kind of ``fn``; tensor methods, builtin methods and context
# managers are registered by torch_calls, container_methods and contexts.
Args = list[Value]
Kwargs = dict[str, Value]


@dispatch.CALL.register(Value)
def _not_callable(tr: Tracer, fn: Value, args: Args, kwargs: Kwargs) -> Value:
    raise unsupported("unsupported_call", f"calling {fn}")


@dispatch.CALL.register(UserFunctionValue)
def _call_function(tr: Tracer, fn: UserFunctionValue, args: Args, kwargs: Kwargs) -> Value:
    handler = builtin_calls.handler_for(fn.real) if fn.real is not None else None
    if handler is not None:
        return handler(tr, args, kwargs)
    return tr.inline(fn, args, kwargs)


@dispatch.CALL.register(BoundMethodValue)
def _call_bound(tr: Tracer, fn: BoundMethodValue, args: Args, kwargs: Kwargs) -> Value:
    return dispatch.call(tr, fn.func, [fn.self_value, *args], kwargs)


@dispatch.CALL.register(ReplayedCallValue)
def _call_replayed(tr: Tracer, fn: ReplayedCallValue, args: Args, kwargs: Kwargs) -> Value:
    if fn.located:
        where = (tr.code.co_filename, tr.lineno, tr.code.co_name)
        return literals.replay_call(tr, functools.partial(fn.fn, where), args, kwargs)
    return literals.replay_call(tr, fn.fn, args, kwargs)


@dispatch.CALL.register(PartialValue)
def _call_partial(tr: Tracer, fn: PartialValue, args: Args, kwargs: Kwargs) -> Value:
    return dispatch.call(tr, fn.func, [*fn.args, *args], {**fn.kwargs, **kwargs})


@dispatch.CALL.register(NewObjectValue)
def _call_new_object(tr: Tracer, fn: NewObjectValue, args: Args, kwargs: Kwargs) -> Value:
    method = _find_python_method(fn.cls, "__call__")
    if method is None:
        raise unsupported("unsupported_call", f"calling {fn}")
    return dispatch.call(tr, function_value(method, None), [fn, *args], kwargs)


def _find_python_method(cls: type, name: str) -> types.FunctionType | None:
    found = class_static(cls, name, None)
    return found if isinstance(found, types.FunctionType) else None


@dispatch.CALL.register(ObjectValue)
def _call_object(tr: Tracer, fv: ObjectValue, args: list[Value], kwargs: dict[str, Value]) -> Value:
    obj = fv.obj
    handler = builtin_calls.handler_for(obj)
    if handler is not None:
        return handler(tr, args, kwargs)
    if isinstance(obj, weakref.ref) and type(obj).__call__ is weakref.ref.__call__:
        return _call_weak_reference(tr, fv, args, kwargs)
    if autograd_function.is_apply(obj):
        return autograd_function.call_apply(tr, fv, args, kwargs)
    if torch_functions.made_by_transform(obj) is not None:
        return functorch_calls.call_made(tr, fv, args, kwargs)
    if torch_functions.is_control_flow(obj):
        return control_flow.call(tr, obj, args, kwargs)
    owned = builtin_types.descriptor(obj)  # dict.get(d, k), super().__setitem__(k, v)
    if owned is not None:
        return builtin_types.call_descriptor(tr, *owned, args, kwargs)
    if numpy_calls.is_numpy_function(obj):
        return numpy_calls.call_function(tr, fv, args, kwargs)
    ctx = contexts.make_context(obj, args, kwargs)
    if ctx is not None:
        if isinstance(ctx, contexts.ContextValue) and ctx.applied_at_creation:
            contexts.apply_now(tr, ctx)
        return ctx
    if isinstance(obj, torch.nn.Module):
        return call_module(tr, fv, args, kwargs)
    if torch_functions.is_special(obj):
        return torch_calls.call_function(tr, obj, args, kwargs)
    if obj in torch_functions.CHECKS and args and torch_calls.is_symbolic_value(args[0]):
        return torch_calls.symbolic_check(tr, obj, args[0])
    block = function_modes.make_block(obj, args, kwargs)
    if block is not None:
        return block
    if isinstance(obj, type):
        return _construct(tr, fv, args, kwargs)
    if torch_functions.is_torch_callable(obj):
        return torch_calls.call_function(tr, obj, args, kwargs)
    if isinstance(obj, types.FunctionType):
        return dispatch.call(tr, function_value(obj, fv.source), args, kwargs)
    if isinstance(obj, types.MethodType):
        src = fv.source
        func = (
            function_value(obj.__func__, src.attr("__func__") if src else None)
            if isinstance(obj.__func__, types.FunctionType)
            else ObjectValue(obj.__func__)
        )
        self_v = wrap(tr.out, obj.__self__, src.attr("__self__") if src else None)
        return dispatch.call(tr, func, [self_v, *args], kwargs)
    if isinstance(obj, functools.partial):
        src = fv.source
        func_v = wrap(tr.out, obj.func, src.attr("func") if src else None)
        bound = [
            wrap(tr.out, a, src.attr("args").item(i) if src else None)
            for i, a in enumerate(obj.args)
        ]
        keywords = {
            k: wrap(tr.out, a, src.attr("keywords").item(k) if src else None)
            for k, a in obj.keywords.items()
        }
        return dispatch.call(tr, func_v, [*bound, *args], {**keywords, **kwargs})
    if isinstance(obj, functools._lru_cache_wrapper):
        return _call_cached(tr, fv, args, kwargs)
    if _foldable(obj):
        # a pure builtin consumes iterators whole: hand it their items
        args = [
            ListValue(dispatch.unpack_iterable(tr, a)) if isinstance(a, IteratorValue) else a
            for a in args
        ]
        if all(literals.is_literal(a) for a in [*args, *kwargs.values()]):
            return literals.fold(obj, args, kwargs)
    method = _find_python_method(type(obj), "__call__")
    if method is not None:
        return dispatch.call(tr, function_value(method, None), [fv, *args], kwargs)
    raise unsupported("unsupported_call", getattr(obj, "__qualname__", repr(obj)))


def _call_weak_reference(tr: Tracer, fv: ObjectValue, args: Args, kwargs: Kwargs) -> Value:
    """``ref()`` of a weak reference from the frame: its referent, read again through the call.

    The reference is pinned by identity. That pins the referent too: a weak reference's
    target never changes, it only dies, and the referent (``None`` once dead) is guarded like
    any value read from the frame. ``nn.RNNBase`` keeps one per weight, to see whether a
    weight was swapped since its last call.
    """
    if args or kwargs:
        raise raised(TypeError("weakref.ReferenceType() takes no arguments"))
    if fv.source is None:
        return wrap(tr.out, fv.obj(), None)
    tr.out.guard(fv.source, GuardKind.ID_MATCH, id(fv.obj))
    return wrap(tr.out, fv.obj(), WeakRefCallSource(fv.source))


def _call_cached(tr: Tracer, fv: ObjectValue, args: Args, kwargs: Kwargs) -> Value:
    """A call of a ``functools.lru_cache``/``cache`` function, answered as eager's cache would.

    When every argument is a constant or an object the guards pin by identity, the real cached
    function runs now, so its cache fills and hits as in eager: a constant result is what eager
    gets on every later call with those arguments, even after the state the function read has
    changed, and a guard calls it again (a hit) to see that the cache still hands back that
    constant (after ``cache_clear`` or an eviction it recomputes, as eager would).
    With tensors among the arguments ``__wrapped__`` is traced: a tensor hashes by identity, so
    eager's cache misses for every new tensor; passed the very tensor of an earlier call, it
    hands back that call's result, which differs from the traced one only where the tensor (or
    that result) was written in place since. Other arguments (unhashable ones, on which eager
    raises; objects hashed by value) run the call as it is, after a graph break.
    """
    values = [*args, *kwargs.values()]
    if all(_pinnable(a) for a in values):
        for a in values:
            if isinstance(a, ObjectValue) and a.source is not None:
                tr.out.guard(a.source, GuardKind.ID_MATCH, id(a.obj))
        plain = [_real(a) for a in args]
        plain_kw = {k: _real(a) for k, a in kwargs.items()}
        try:
            result = fv.obj(*plain, **plain_kw)
        except Exception as e:
            raise raised(e) from e
        if is_constant(result):
            cached = CachedCall(fv.obj, tuple(plain), tuple(plain_kw.items()), result)
            tr.out.guard(None, GuardKind.CACHED_CALL, cached)
            return ConstantValue(result)
        # eager hands back the very object it cached; traced, an equal one is built from the
        # state the function reads now (the same while that state is unchanged)
    elif not all(_traceable(a) for a in values):
        name = getattr(fv.obj, "__qualname__", repr(fv.obj))
        raise unsupported("unsupported_call", f"{name} (a functools cache) on these arguments")
    src = fv.source.attr("__wrapped__") if fv.source is not None else None
    return dispatch.call(tr, wrap(tr.out, fv.obj.__wrapped__, src), args, kwargs)


def _pinnable(v: Value) -> bool:
    """A constant, or a frame's object hashed by identity (its guard can pin it)."""
    if isinstance(v, ObjectValue) and v.source is not None:
        return _by_identity(type(v.obj))
    return literals.is_literal(v)


def _by_identity(cls: type) -> bool:
    """Whether instances of ``cls`` hash (and so meet a cache's keys) by identity."""
    found: Any = getattr(cls, "__hash__", None)
    return found is object.__hash__


def _real(v: Value) -> Any:
    return v.obj if isinstance(v, ObjectValue) else literals.literal(v)


def _traceable(v: Value) -> bool:
    """Whether eager's cache keys ``v`` by constants and tensors alone (tensors by identity)."""
    if isinstance(v, TupleValue) and v.cls is tuple:
        return all(_traceable(x) for x in v.items)
    if isinstance(v, TensorValue):
        return True
    if isinstance(v, NewObjectValue):  # made in this call: a new object each time
        return _by_identity(v.cls)
    return literals.is_literal(v) and not isinstance(v, (ListValue, DictValue))


def _const(obj: Any) -> Value:
    if not is_constant(obj):
        raise unsupported("unsupported_value", f"partial argument {obj!r}")
    return ConstantValue(obj)


def _foldable(obj: Any) -> bool:
    if not isinstance(
        obj,
        (
            types.BuiltinFunctionType,
            types.BuiltinMethodType,
            types.MethodWrapperType,
            types.MethodDescriptorType,
        ),
    ):
        return False
    owner = getattr(obj, "__self__", None)
    if owner is not None and not isinstance(owner, types.ModuleType):
        return is_constant(owner)
    module = getattr(obj, "__module__", None) or getattr(owner, "__name__", "")
    return module in _PURE_MODULES and obj.__name__ not in _IMPURE_BUILTINS


# classes ---------------------------------------------------------------------
def _construct(tr: Tracer, cv: ObjectValue, args: list[Value], kwargs: dict[str, Value]) -> Value:
    cls = cv.obj
    if issubclass(cls, enum.Enum) and all(
        literals.is_literal(a) for a in [*args, *kwargs.values()]
    ):
        return literals.fold(cls, args, kwargs)
    if is_namedtuple(cls):
        bound = _bind_signature(cls, args, kwargs)
        return TupleValue(list(bound.values()), cls)
    if issubclass(cls, tuple) and hasattr(cls, "n_fields") and len(args) == 1 and not kwargs:
        # a structseq (``torch.return_types.max``) from a sequence: a subclass's results
        return TupleValue(dispatch.unpack_iterable(tr, args[0]), cls)
    if issubclass(cls, torch.nn.Module):
        return _stateless_module(cls, args, kwargs)
    if is_model_output(cls):
        return _model_output(cls, args, kwargs)
    foldable = cls in (torch.Size, torch.device, torch.dtype, torch.finfo, torch.iinfo) or (
        issubclass(cls, BaseException)
    )
    if foldable and all(literals.is_literal(a) for a in [*args, *kwargs.values()]):
        return literals.fold(cls, args, kwargs)
    made = builtin_types.construct(tr, cls, args, kwargs)
    if made is not None:
        return made
    if _is_plain_python_class(cls):
        instance = NewObjectValue(cls)
        init = _find_python_method(cls, "__init__")
        if init is not None:
            dispatch.call(tr, function_value(init, None), [instance, *args], kwargs)
        elif args or kwargs:
            raise unsupported("user_exception", f"{cls.__name__}() takes no arguments")
        return instance
    if torch_functions.is_torch_callable(cls) or cls is torch.Tensor:
        return torch_calls.call_function(tr, cls, args, kwargs)
    raise unsupported("unsupported_call", f"constructing {cls.__qualname__}")


def _stateless_module(cls: type, args: list[Value], kwargs: dict[str, Value]) -> Value:
    """A module without state built in the traced code from constants: built for real, then
    inlined (``ACT2FN["gelu"]`` builds transformers' GELUActivation in ``forward``).

    Built from the same constants, such a module does the same on every call, so one built at
    capture stands for the one eager builds each time. A module that holds tensors (parameters,
    buffers, plain attributes), draws random numbers or warns while built is not one.
    """
    literal_args = all(literals.is_literal(a) for a in [*args, *kwargs.values()])
    if not literal_args:
        raise unsupported("unsupported_call", f"creating the module {cls.__name__} while tracing")
    rng = (torch.random.get_rng_state(), random.getstate())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = literals.fold(cls, args, kwargs)
    assert isinstance(module, ObjectValue)
    drew = not torch.equal(rng[0], torch.random.get_rng_state()) or rng[1] != random.getstate()
    tensors = any(
        isinstance(x, torch.Tensor) for m in module.obj.modules() for x in vars(m).values()
    )
    if drew:  # eager draws these numbers when it builds the module
        torch.random.set_rng_state(rng[0])
        random.setstate(rng[1])
    if caught or drew or tensors or _holds_state(module.obj):
        raise unsupported("unsupported_call", f"creating the module {cls.__name__} while tracing")
    return module


def _holds_state(module: torch.nn.Module) -> bool:
    return any(True for _ in module.parameters()) or any(True for _ in module.buffers())


def _is_plain_python_class(cls: type) -> bool:
    if type(cls) is not type and not issubclass(type(cls), type):
        return False
    if inspect.getattr_static(type(cls), "__call__") is not type.__call__:
        return False
    if any(k.__module__ == "builtins" and k is not object for k in cls.__mro__):
        return False
    new: Any = cls.__new__
    return new is object.__new__


def _bind_signature(fn: Any, args: list[Value], kwargs: dict[str, Value]) -> dict[str, Value]:
    try:
        bound = inspect.signature(fn).bind(*args, **kwargs)
    except TypeError as e:
        raise unsupported("user_exception", f"TypeError: {e}") from e
    out: dict[str, Value] = {}
    for name, param in inspect.signature(fn).parameters.items():
        if name in bound.arguments:
            out[name] = bound.arguments[name]
        else:
            out[name] = _const(param.default)
    return out


def _model_output(cls: Any, args: list[Value], kwargs: dict[str, Value]) -> Value:
    """transformers' ModelOutput (see :mod:`~kiln.capture.model_output`): items are its
    fields that are not None."""
    names = [f.name for f in dataclasses.fields(cls)]
    given = dict(zip(names, args, strict=False))
    given.update(kwargs)
    first = given.get(names[0])
    if all(_is_none(given.get(n, ConstantValue(None))) for n in names[1:]):
        # ``__post_init__`` reads a lone first field that is a mapping or (key, value) pairs
        # as the fields themselves
        if isinstance(first, DictValue):
            given = {str(k): x for k, (_, x) in first.items.items()}
        elif isinstance(first, (ListValue, TupleValue)) and any(
            isinstance(e, TupleValue) and len(e.items) == 2 for e in first.items[:1]
        ):
            raise unsupported("unsupported_call", f"{cls.__name__} built from key-value pairs")
    items: dict[Any, tuple[Value, Value]] = {}
    for name in names:
        v = given.get(name)
        if v is None or (isinstance(v, ConstantValue) and v.is_none()):
            continue
        items[name] = (ConstantValue(name), v)
    return DictValue(items, cls)


# modules ---------------------------------------------------------------------
def _global_hooks() -> bool:
    m = torch.nn.modules.module
    names = (
        "_global_forward_hooks",
        "_global_forward_pre_hooks",
        "_global_backward_hooks",
        "_global_backward_pre_hooks",
    )
    return any(getattr(m, n, None) for n in names)


def call_module(tr: Tracer, mv: ObjectValue, args: list[Value], kwargs: dict[str, Value]) -> Value:
    """``module(*args, **kwargs)``: pre-hooks, ``forward`` and forward hooks, all inlined."""
    mod = mv.obj
    if parallel_modules.wrapped_module(mod) is not None:  # its own Python runs; forward compiled
        raise unsupported("distributed_module", type(mod).__name__)
    custom_call = class_static_unless(type(mod), "__call__", torch.nn.Module.__call__)
    tr.out.guard_class_attr(type(mod), "__call__")
    if custom_call is not torch.nn.Module.__call__ and isinstance(custom_call, types.FunctionType):
        return dispatch.call(tr, function_value(custom_call, None), [mv, *args], kwargs)
    if mod._backward_hooks or mod._backward_pre_hooks or _global_hooks():
        raise unsupported("module_hooks", f"backward or global hooks on {type(mod).__name__}")
    if mv.source is not None and not _has_hooks(mod):
        tr.out.guard(mv.source, GuardKind.HOOKS_EMPTY)
    elif mv.source is not None:
        # the inlined hooks are these: hook handles are unique ids, so the keys pin them
        for table in ("_forward_pre_hooks", "_forward_hooks"):
            keys = tuple(getattr(mod, table).keys())
            tr.out.guard(mv.source.attr(table), GuardKind.DICT_KEYS, keys)
    for hook_id, hook in list(mod._forward_pre_hooks.items()):
        with_kwargs = mod._forward_pre_hooks_with_kwargs.get(hook_id, False)
        hv = _hook_value(hook)
        if with_kwargs:
            result = dispatch.call(tr, hv, [mv, TupleValue(args), _kw(kwargs)], {})
            if not _is_none(result):
                args, kwargs = _unpack_pair(result)
        else:
            result = dispatch.call(tr, hv, [mv, TupleValue(args)], {})
            if not _is_none(result):
                args = list(result.items) if isinstance(result, TupleValue) else [result]
    forward = mod.__dict__.get("forward")
    if forward is None:
        fwd = class_static(type(mod), "forward")
        tr.out.guard_class_attr(type(mod), "forward")
        if mv.source is not None:  # ``m.forward = other`` after the call would win over it
            tr.out.guard(mv.source, GuardKind.NOT_IN_INSTANCE_DICT, "forward")
        src = mv.source.attr("forward").attr("__func__") if mv.source is not None else None
        out = dispatch.call(tr, function_value(fwd, src), [mv, *args], kwargs)
    else:
        src = mv.source.attr("forward") if mv.source is not None else None
        out = dispatch.call(tr, ObjectValue(forward, src), args, kwargs)
    for hook_id, hook in list(mod._forward_hooks.items()):
        with_kwargs = mod._forward_hooks_with_kwargs.get(hook_id, False)
        hook_args = (
            [mv, TupleValue(args), _kw(kwargs), out] if with_kwargs else [mv, TupleValue(args), out]
        )
        result = dispatch.call(tr, _hook_value(hook), hook_args, {})
        if not _is_none(result):
            out = result
    return out


def _has_hooks(mod: torch.nn.Module) -> bool:
    return bool(mod._forward_hooks or mod._forward_pre_hooks)


def _hook_value(hook: Any) -> Value:
    if isinstance(hook, types.FunctionType):
        return function_value(hook, None)
    return ObjectValue(hook)


def _kw(kwargs: dict[str, Value]) -> DictValue:
    return DictValue({k: (ConstantValue(k), v) for k, v in kwargs.items()})


def _is_none(v: Value) -> bool:
    return isinstance(v, ConstantValue) and v.is_none()


def _unpack_pair(result: Value) -> tuple[list[Value], dict[str, Value]]:
    if not (isinstance(result, TupleValue) and len(result.items) == 2):
        raise unsupported("module_hooks", "a kwargs pre-hook must return (args, kwargs)")
    a, k = result.items
    if not isinstance(a, TupleValue) or not isinstance(k, DictValue):
        raise unsupported("module_hooks", "a kwargs pre-hook must return (args, kwargs)")
    return list(a.items), {str(key): v for key, (_, v) in k.items.items()}
