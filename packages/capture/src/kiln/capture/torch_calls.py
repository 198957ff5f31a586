"""Torch functions, Tensor methods and tensor operators: graph nodes computed on fakes.

A call is evaluated once on fake tensors (under the frame's :class:`FakeMode`)
to learn the result's metadata; if the result holds tensors it becomes a node
(with ``operator.getitem`` nodes for tuple results), otherwise it is a
constant (``x.size()``, ``x.dim()``, ``torch.is_grad_enabled()``).
"""

from __future__ import annotations

import operator
import types
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import fx

from kiln.capture import dispatch, function_modes, numpy_calls, subclass_calls, tensor_constants
from kiln.capture.breaks.reasons import raised, unsupported
from kiln.capture.eager_errors import raises_in_eager
from kiln.capture.errors import EagerRaises, Unsupported
from kiln.capture.meta import RESTRIDES, DataDependentOp, MetadataMutation, reads_tensor_data
from kiln.capture.shapes import unbacked
from kiln.capture.shapes.dispatch import composites_in_python
from kiln.capture.tensor_subclasses import is_dispatch_wrapper, is_function_subclass
from kiln.capture.torch_functions import (
    COMPILING,
    CONSTANT_FOLDED,
    REFUSED,
    RESEEDS,
    compiling_answer,
    is_special,
    is_torch_callable,
    unwrapped,
)
from kiln.capture.values.base import ConstantValue, Value, is_constant
from kiln.capture.values.containers import DictValue, ListValue, TupleValue
from kiln.capture.values.iterators import ItemsIterator, IteratorValue
from kiln.capture.values.ndarray import NdarrayValue
from kiln.capture.values.objects import ObjectValue
from kiln.capture.values.symbolic import SymSliceValue, SymValue, is_symbolic
from kiln.capture.values.tensor import DispatchResult, TensorMethodValue, TensorValue

if TYPE_CHECKING:
    from kiln.capture.tracer import Tracer

__all__ = [
    "call_function",
    "call_method",
    "is_special",
    "is_torch_callable",
    "tensor_attribute",
]

# Python-visible results of these depend on tensor data: refuse rather than guess.
_DATA_METHODS = frozenset(
    {
        "item",
        "tolist",
        "__bool__",
        "__int__",
        "__float__",
        "__index__",
        "__complex__",
        "data_ptr",
        "untyped_storage",
        "storage",
        "backward",
        "register_hook",
        "retain_grad",
        "__array__",
        "__reduce_ex__",
    }
)


_RESTRIDE_METHODS = frozenset(op.__name__ for op in RESTRIDES)

# ops that draw from torch's generator, by function or method name
RANDOM_OPS = frozenset(
    {
        "rand", "randn", "randint", "randperm", "rand_like", "randn_like", "randint_like",
        "bernoulli", "bernoulli_", "multinomial", "normal", "normal_", "poisson", "uniform_",
        "random_", "exponential_", "geometric_", "log_normal_", "cauchy_", "dropout", "dropout_",
        "alpha_dropout", "feature_alpha_dropout", "dropout1d", "dropout2d", "dropout3d",
        "feature_dropout", "rrelu", "rrelu_", "native_dropout",
    }
)  # fmt: skip
_TENSOR_PROPERTIES = frozenset(
    {
        "shape",
        "dtype",
        "device",
        "ndim",
        "requires_grad",
        "is_cuda",
        "is_cpu",
        "is_meta",
        "is_sparse",
        "is_quantized",
        "layout",
        "is_leaf",
        "is_nested",
        "names",
        "itemsize",
        "nbytes",
    }
)


def _unpack(tr: Tracer, v: Value) -> tuple[Any, Any]:
    """(graph argument, fake argument) for a value passed to a torch op."""
    if isinstance(v, TensorValue):
        return v.node, v.fake
    if isinstance(v, SymValue):  # a size the graph computes from its inputs' sizes
        return tr.out.sym_arg(v.sym), v.sym
    if isinstance(v, SymSliceValue):
        s = v.sym_slice
        bounds = [tr.out.sym_arg(b) if is_symbolic(b) else b for b in (s.start, s.stop, s.step)]
        return slice(*bounds), s
    if isinstance(v, ConstantValue):
        if type(v.value).__module__ == "numpy":  # numpy.float64 is a float, but fx prints it
            return v.value.item(), v.value  # as ``np.float64(...)``, a name the graph lacks
        return v.value, v.value
    if isinstance(v, (ListValue, TupleValue)):
        pairs = [_unpack(tr, x) for x in v.items]
        seq: Callable[[Any], Any] = list if isinstance(v, ListValue) else tuple
        return seq(p[0] for p in pairs), seq(p[1] for p in pairs)
    if isinstance(v, DictValue) and v.cls is dict:
        pairs_d = {k: _unpack(tr, x) for k, (_, x) in v.items.items()}
        return {k: p[0] for k, p in pairs_d.items()}, {k: p[1] for k, p in pairs_d.items()}
    if isinstance(v, ObjectValue) and isinstance(v.obj, (torch.finfo, torch.iinfo)):
        return v.obj, v.obj
    if isinstance(v, ObjectValue) and isinstance(v.obj, type) and v.obj in _SCALAR_TYPE_DTYPES:
        # torch reads a Python scalar type as a dtype (``dtype=int``); the graph holds the dtype
        dtype = _SCALAR_TYPE_DTYPES[v.obj]
        return dtype, dtype
    raise unsupported("unsupported_value", f"{v} as an argument of a torch op")


_SCALAR_TYPE_DTYPES = {
    bool: torch.bool,
    int: torch.int64,
    float: torch.float64,
    complex: torch.complex128,
}


def _has_tensor(obj: Any) -> bool:
    if isinstance(obj, torch.Tensor):
        return True
    if isinstance(obj, (list, tuple)):
        return any(_has_tensor(x) for x in obj)
    return False


def _wrap_result(tr: Tracer, node: fx.Node, result: Any) -> Value:
    if isinstance(result, torch.Tensor):
        return TensorValue(node, result)
    if isinstance(result, (list, tuple)):
        items: list[Value] = []
        for i, r in enumerate(result):
            if _has_tensor(r):
                child = tr.out.create_node("call_function", operator.getitem, (node, i), {}, r)
                items.append(_wrap_result(tr, child, r))
            else:
                items.append(_constant(r))
        if isinstance(result, list):
            return ListValue(items)
        return TupleValue(items, type(result))
    return _constant(result)


def _constant(result: Any) -> Value:
    if is_symbolic(result):
        return SymValue(result)
    if is_constant(result):
        return ConstantValue(result)
    if isinstance(result, (list, tuple)):
        items = [_constant(r) for r in result]
        if isinstance(result, list):
            return ListValue(items)
        return TupleValue(items, torch.Size if isinstance(result, torch.Size) else type(result))
    return ObjectValue(result)


def _run(
    tr: Tracer,
    op: str,
    target: Any,
    fn: Callable[..., Any],
    args: list[Value],
    kwargs: dict[str, Value],
) -> Value:
    unpacked = [_unpack(tr, a) for a in args]
    unpacked_kw = {k: _unpack(tr, v) for k, v in kwargs.items()}
    fake_args = [u[1] for u in unpacked]
    fake_kwargs = {k: u[1] for k, u in unpacked_kw.items()}
    before = tr.out.unbacked_count()
    try:
        with (
            tr.out.fake_mode,
            unbacked.allowing(tr.out.data_dependent_ops()),
            composites_in_python(fake_args, fake_kwargs),
        ):
            result = fn(*fake_args, **fake_kwargs)
    except Unsupported:
        raise
    except Exception as e:  # a failure on fakes: eager would fail too, or it needs data
        name = getattr(target, "__name__", str(target))
        if reads_tensor_data(e):
            raise DataDependentOp(name) from e
        if raises_in_eager(tr, e, [*fake_args, *fake_kwargs.values()]):
            raise EagerRaises(f"{name}: {type(e).__name__}: {e}") from e
        raise unsupported("tensor_op_failed", f"{name}: {type(e).__name__}: {e}") from e
    touches_tensor = any(isinstance(u[1], torch.Tensor) for u in unpacked)
    data_dependent = tr.out.unbacked_count() > before  # ``item()``: a value from data
    if not _has_tensor(result) and not (result is None and touches_tensor) and not data_dependent:
        return _constant(result)
    node = tr.out.create_node(
        op,
        target,
        tuple(u[0] for u in unpacked),
        {k: u[0] for k, u in unpacked_kw.items()},
        result,
    )
    value = _wrap_result(tr, node, result)
    tr.out.bind_unbacked(before, node, result)
    if any(_from_dispatch(a) for a in [*args, *kwargs.values()]):
        _mark_dispatch_results(value)
    return value


def _from_dispatch(v: Value) -> bool:
    if isinstance(v, TensorValue):
        return v.real_type is DispatchResult or is_dispatch_wrapper(v.real_type)
    if isinstance(v, (ListValue, TupleValue)):
        return any(_from_dispatch(x) for x in v.items)
    return False


def _mark_dispatch_results(v: Value) -> None:
    if isinstance(v, TensorValue):
        v.real_type = DispatchResult
    elif isinstance(v, (ListValue, TupleValue)):
        for x in v.items:
            _mark_dispatch_results(x)


def call_function(tr: Tracer, fn: Any, args: list[Value], kwargs: dict[str, Value]) -> Value:
    """``fn(*args, **kwargs)`` for a torch function or an operator on tensors."""
    base = unwrapped(fn)
    if base in COMPILING:
        return ConstantValue(compiling_answer(tuple((t.code, t.ip) for t in tr.out.active)))
    if base in RESEEDS:
        raise unsupported("rng_reseeded", f"torch.{fn.__name__}")
    if base in REFUSED:
        raise unsupported("side_effect", f"torch.{fn.__name__} changes process state")
    if tr.out.eager_random and getattr(fn, "__name__", "") in RANDOM_OPS:
        raise unsupported("rng_reseeded", f"{fn.__name__} after the generator was reseeded")
    if base in CONSTANT_FOLDED:
        return ConstantValue(fn())
    stack_op = function_modes.intercept(tr, fn, args, kwargs)
    if stack_op is not None:
        return stack_op
    if isinstance(fn, (types.MethodDescriptorType, types.WrapperDescriptorType)):
        if args and isinstance(args[0], TensorValue):
            return call_method(tr, args[0], fn.__name__, args[1:], kwargs)
        raise unsupported("unsupported_call", f"Tensor.{fn.__name__} on a non-tensor")
    if any(isinstance(a, NdarrayValue) for a in [*args, *kwargs.values()]):
        return numpy_calls.to_tensor(tr, fn, args, kwargs)
    moded = function_modes.dispatch_to_mode(tr, fn, args, kwargs)
    if moded is not None:
        return moded
    overridden = subclass_calls.dispatch_to_subclass(tr, fn, args, kwargs)
    if overridden is not None:
        return overridden
    return _run(tr, "call_function", fn, fn, args, kwargs)


def call_method(
    tr: Tracer, tensor: TensorValue, name: str, args: list[Value], kwargs: dict[str, Value]
) -> Value:
    """``tensor.name(*args, **kwargs)`` as a ``call_method`` node."""
    if name in _SCALAR_METHODS and tr.out.dynamic.scalar_outputs:
        return _scalar_output(tr, tensor, name)
    if name in _DATA_METHODS:
        raise unsupported("data_dependent_value", f"Tensor.{name}()")
    if name in _RESTRIDE_METHODS:  # fakes mirror them, for composites; a graph cannot
        raise MetadataMutation(f"Tensor.{name}")
    if name == "numpy" and not args:
        return numpy_calls.from_tensor(tr, tensor, kwargs)
    if tr.out.eager_random and name in RANDOM_OPS:
        raise unsupported("rng_reseeded", f"Tensor.{name} after the generator was reseeded")
    method = getattr(torch.Tensor, name)
    moded = function_modes.dispatch_to_mode(tr, method, [tensor, *args], kwargs)
    if moded is not None:
        return moded
    overridden = subclass_calls.dispatch_to_subclass(tr, method, [tensor, *args], kwargs)
    if overridden is not None:
        return overridden
    if name == "as_subclass":
        return _as_subclass(tr, tensor, args, kwargs)
    return _run(tr, "call_method", name, method, [tensor, *args], kwargs)


def _as_subclass(
    tr: Tracer, tensor: TensorValue, args: list[Value], kwargs: dict[str, Value]
) -> Value:
    """``t.as_subclass(cls)``: an alias of the same data (autograd sees it as a view, as
    eager's object stays attached to the graph) that eager's code sees as a ``cls``."""
    given = [*args, *kwargs.values()]
    cls = given[0].obj if len(given) == 1 and isinstance(given[0], ObjectValue) else None
    if not isinstance(cls, type) or not (cls is torch.Tensor or is_function_subclass(cls)):
        raise unsupported("unsupported_call", f"Tensor.as_subclass({cls})")
    alias = _run(tr, "call_method", "view_as", torch.Tensor.view_as, [tensor, tensor], {})
    assert isinstance(alias, TensorValue)
    alias.real_type = cls
    return alias


_SCALAR_METHODS = frozenset({"item", "tolist", "__int__", "__float__", "__index__"})
# ``tolist()`` of a tensor this small becomes one ``item()`` per element
_TOLIST_LIMIT = 64


def _scalar_output(tr: Tracer, tensor: TensorValue, name: str) -> Value:
    """``t.item()`` (``int(t)``, ``t.tolist()``) under ``capture_scalar_outputs``: a number
    in the graph, an unbacked symbol, rather than a graph break."""
    fake = tensor.fake
    wanted = {"__int__": False, "__index__": False, "__float__": True}.get(name)
    if wanted is not None and fake.dtype.is_floating_point != wanted:
        raise unsupported("data_dependent_value", f"Tensor.{name}() of a {fake.dtype} tensor")
    if name != "tolist" or fake.dim() == 0:
        return _run(tr, "call_method", "item", torch.Tensor.item, [tensor], {})
    sizes = fake.shape
    if any(is_symbolic(n) for n in sizes) or fake.numel() > _TOLIST_LIMIT:
        raise unsupported("data_dependent_value", "Tensor.tolist() of a large or dynamic tensor")
    rows = [dispatch.get_item(tr, tensor, ConstantValue(i)) for i in range(sizes[0])]
    assert all(isinstance(r, TensorValue) for r in rows)
    return ListValue([_scalar_output(tr, r, "tolist") for r in rows])  # type: ignore[arg-type]


def is_symbolic_value(v: Value) -> bool:
    return isinstance(v, SymValue) and is_symbolic(v.sym)


def symbolic_check(tr: Tracer, fn: Any, cond: Value) -> Value:
    """``torch._check(cond)`` over a symbolic number: assumed, as TorchDynamo does. Over
    unbacked symbols it becomes a runtime assert (and narrows their ranges); over sizes a
    guard; a relation the trace shows false raises as eager does."""
    assert isinstance(cond, SymValue)
    sym: Any = cond.sym
    if fn is torch._check_is_size:
        sym = sym >= 0
    holds = sym.node.expect_true("", 0) if isinstance(sym, torch.SymBool) else bool(sym)
    if not holds:
        raise raised(RuntimeError("Expected cond to be True, but got False."))
    tr.out.add_runtime_asserts()
    return ConstantValue(None)


def tensor_attribute(tr: Tracer, tensor: TensorValue, name: str) -> Value | None:
    """A non-method attribute of a tensor, or None when ``name`` is a method."""
    fake = tensor.fake
    if name in _TENSOR_PROPERTIES or name in ("T", "mT", "mH", "H", "real", "imag", "data"):
        moded = function_modes.property_through_mode(tr, tensor, name)
        if moded is not None:
            return moded
        overridden = subclass_calls.property_through_subclass(tr, tensor, name)
        if overridden is not None:
            return overridden
    if name in _TENSOR_PROPERTIES:
        return _constant(getattr(fake, name))
    if name == "T":
        return call_method(
            tr, tensor, "permute", [ConstantValue(tuple(reversed(range(fake.dim()))))], {}
        )
    if name in ("mT", "mH"):
        return call_method(tr, tensor, "transpose", [ConstantValue(-2), ConstantValue(-1)], {})
    if name == "H":
        return call_method(tr, tensor, "adjoint", [], {})
    if name in ("real", "imag"):
        return call_function(tr, getattr(torch, name), [tensor], {})
    if name == "data":
        return call_method(tr, tensor, "detach", [], {})
    if name in ("grad", "grad_fn", "_base", "_version"):
        raise unsupported("unsupported_attribute", f"Tensor.{name}")
    if callable(getattr(torch.Tensor, name, None)):
        return None
    raise unsupported("unsupported_attribute", f"Tensor.{name}")


@dispatch.GET_ATTR.register(TensorValue)
def _tensor_attr(tr: Tracer, v: TensorValue, name: str) -> Value:
    found = tensor_attribute(tr, v, name)
    return found if found is not None else TensorMethodValue(v, name)


@dispatch.SET_ATTR.register(TensorValue)
def _set_tensor_attr(tr: Tracer, v: TensorValue, name: str, value: Value, plain: bool) -> None:
    """``t.requires_grad = flag`` on a tensor that does not require grad (a leaf, so eager
    allows it: audio encoders mark their input's view for gradient checkpointing) is
    ``t.requires_grad_(flag)``; other stores to a tensor break the graph and run in Python
    (eager refuses the flag on a non-leaf, which the fakes cannot tell)."""
    if name != "requires_grad" or v.fake.requires_grad:
        raise unsupported("side_effect", f"setting attribute {name!r} of {v}")
    dispatch.call(tr, TensorMethodValue(v, "requires_grad_"), [value], {})


@dispatch.HAS_ATTR.register(TensorValue)
def _tensor_has_attr(tr: Tracer, v: TensorValue, name: str) -> bool:
    return hasattr(v.fake, name)


@dispatch.GET_ITEM.register(TensorValue)
def _tensor_item(tr: Tracer, v: TensorValue, index: Value) -> Value:
    return call_function(tr, operator.getitem, [v, index], {})


@dispatch.SET_ITEM.register(TensorValue)
def _set_tensor_item(tr: Tracer, v: TensorValue, index: Value, value: Value) -> None:
    call_function(tr, operator.setitem, [v, index, value], {})


@dispatch.CALL.register(TensorMethodValue)
def _call_tensor_method(
    tr: Tracer, fn: TensorMethodValue, args: list[Value], kwargs: dict[str, Value]
) -> Value:
    return call_method(tr, fn.tensor, fn.name, args, kwargs)


@dispatch.TRUTH.register(TensorValue)
def _tensor_truth(tr: Tracer, v: TensorValue) -> bool:
    known = tensor_constants.value_of(tr, v)  # computed from constants alone
    if known is not None:
        return bool(known)
    raise unsupported("data_dependent_branch", f"the truth of a {v.python_type().__name__}")


@dispatch.UNARY_OP.register(TensorValue)
def _tensor_unary_op(tr: Tracer, name: str, v: TensorValue) -> Value:
    return call_function(tr, getattr(operator, name), [v], {})


@dispatch.ITERATE.register(TensorValue)
def _iterate_tensor(tr: Tracer, v: TensorValue) -> IteratorValue:
    if v.fake.dim() == 0:
        raise unsupported("user_exception", "iteration over a 0-d tensor")
    if function_modes.active(tr):
        # Tensor.__iter__ as torch writes it, so an open mode sees its dim() and unbind(0)
        call_method(tr, v, "dim", [], {})
        parts = call_method(tr, v, "unbind", [ConstantValue(0)], {})
        return ItemsIterator(dispatch.unpack_iterable(tr, parts))
    n = v.fake.shape[0]
    return ItemsIterator([dispatch.get_item(tr, v, ConstantValue(i)) for i in range(n)])


@dispatch.LENGTH.register(TensorValue)
def _tensor_length(tr: Tracer, v: TensorValue) -> int:
    if v.fake.dim() == 0:
        raise unsupported("user_exception", "len() of a 0-d tensor")
    moded = function_modes.dispatch_to_mode(tr, torch.Tensor.__len__, [v], {})
    if moded is not None:
        n = moded.as_constant() if moded.is_constant() else None
        if not isinstance(n, int):
            raise unsupported("unsupported_value", f"a torch-function mode's len() gave {moded}")
        return n
    return int(v.fake.shape[0])


# Tensors outrank every other operand: ``2 * t`` and ``arr + t`` are tensor ops.
@dispatch.BINARY_OP.register(TensorValue, priority=2)
def _tensor_binary_op(tr: Tracer, sym: str, a: Value, b: Value) -> Value:
    fn = dispatch.BINARY[sym]
    if sym.endswith("=") and not isinstance(a, TensorValue):
        fn = dispatch.BINARY[sym[:-1]]  # ``n += t`` for a number n is ``n + t``: nothing is updated
    return call_function(tr, fn, [a, b], {})


@dispatch.COMPARE_OP.register(TensorValue, priority=2)
def _tensor_compare_op(tr: Tracer, sym: str, a: Value, b: Value) -> Value:
    return call_function(tr, dispatch.COMPARE[sym], [a, b], {})
