"""Numpy on arrays computed from tensors, recorded as torch ops (as Dynamo traces numpy).

``t.numpy()`` gives an :class:`NdarrayValue` over ``t``; numpy functions, ndarray methods,
attributes, indexing and operators on it become torch ops in the graph, and the emitted code
turns the graph's output back into the numpy object where Python code sees it. So a model
that takes a statistic through numpy keeps one graph up to the point where Python really needs
the number (``float(...)``), instead of breaking at ``.numpy()`` and at every numpy call.

Numpy itself decides each result's dtype and whether it is a scalar: the call first runs on
stand-ins (one-element arrays of the same dtypes and ranks, and the Python scalars as they
are), so promotion (``int32 / int32`` is ``float64``; a Python float is weak) follows the
installed numpy. The tensor arguments are cast to that dtype and torch computes the values.
Only arrays made inside the frame are tracked; an array passed in stays a Python object, and
anything this module does not model is a graph break (the call then runs in numpy).
"""

from __future__ import annotations

import operator
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from kiln.capture import dispatch, literals, torch_calls
from kiln.capture.breaks.reasons import unsupported
from kiln.capture.guard_data import GuardKind
from kiln.capture.values.base import ConstantValue, Value
from kiln.capture.values.containers import ListValue, TupleValue
from kiln.capture.values.functions import BuiltinMethodValue
from kiln.capture.values.ndarray import NdarrayValue, numpy_dtype
from kiln.capture.values.objects import ObjectValue
from kiln.capture.values.tensor import TensorValue

if TYPE_CHECKING:
    from kiln.capture.tracer import Tracer

__all__ = [
    "attribute",
    "binary_op",
    "call_function",
    "call_method",
    "from_tensor",
    "get_item",
    "is_numpy_function",
    "to_tensor",
    "unary_op",
]

# numpy name -> the torch callable that computes it elementwise
_ELEMENTWISE: dict[str, Callable[..., Any]] = {
    "abs": torch.abs, "absolute": torch.abs, "negative": operator.neg,
    "positive": operator.pos, "invert": operator.invert, "exp": torch.exp, "exp2": torch.exp2,
    "expm1": torch.expm1, "log": torch.log, "log2": torch.log2, "log10": torch.log10,
    "log1p": torch.log1p, "sqrt": torch.sqrt, "square": torch.square, "sin": torch.sin,
    "cos": torch.cos, "tan": torch.tan, "arcsin": torch.asin, "arccos": torch.acos,
    "arctan": torch.atan, "sinh": torch.sinh, "cosh": torch.cosh, "tanh": torch.tanh,
    "arcsinh": torch.asinh, "arccosh": torch.acosh, "arctanh": torch.atanh,
    "sign": torch.sign, "floor": torch.floor, "ceil": torch.ceil, "trunc": torch.trunc,
    "rint": torch.round, "reciprocal": torch.reciprocal, "isnan": torch.isnan,
    "isinf": torch.isinf, "isfinite": torch.isfinite, "logical_not": torch.logical_not,
    "add": operator.add, "subtract": operator.sub, "multiply": operator.mul,
    "divide": operator.truediv, "true_divide": operator.truediv,
    "floor_divide": operator.floordiv, "power": operator.pow, "remainder": operator.mod,
    "mod": operator.mod, "matmul": operator.matmul, "maximum": torch.maximum,
    "minimum": torch.minimum, "fmax": torch.fmax, "fmin": torch.fmin,
    "arctan2": torch.atan2, "hypot": torch.hypot, "logical_and": torch.logical_and,
    "logical_or": torch.logical_or, "logical_xor": torch.logical_xor,
    "greater": operator.gt, "greater_equal": operator.ge, "less": operator.lt,
    "less_equal": operator.le, "equal": operator.eq, "not_equal": operator.ne,
    "where": torch.where, "clip": torch.clamp,
}  # fmt: skip
# these take tensors only: a Python scalar argument becomes a 0-d tensor of the result dtype
_TENSORS_ONLY = frozenset(
    {"maximum", "minimum", "fmax", "fmin", "arctan2", "hypot", "logical_and", "logical_or"}
    | {"logical_xor"}
)
# Python operators on arrays, as the numpy functions they call
OPERATORS = {
    "+": "add", "-": "subtract", "*": "multiply", "/": "true_divide", "//": "floor_divide",
    "%": "remainder", "**": "power", "@": "matmul", "<": "less", "<=": "less_equal",
    "==": "equal", "!=": "not_equal", ">": "greater", ">=": "greater_equal",
    "neg": "negative", "pos": "positive", "invert": "invert", "abs": "absolute",
}  # fmt: skip
# reductions: the torch function and numpy's parameters after the array
_REDUCTIONS: dict[str, tuple[Callable[..., Any], tuple[str, ...]]] = {
    "sum": (torch.sum, ("axis", "dtype", "out", "keepdims")),
    "mean": (torch.mean, ("axis", "dtype", "out", "keepdims")),
    "prod": (torch.prod, ("axis", "dtype", "out", "keepdims")),
    "std": (torch.std, ("axis", "dtype", "out", "ddof", "keepdims")),
    "var": (torch.var, ("axis", "dtype", "out", "ddof", "keepdims")),
    "max": (torch.amax, ("axis", "out", "keepdims")),
    "min": (torch.amin, ("axis", "out", "keepdims")),
    "amax": (torch.amax, ("axis", "out", "keepdims")),
    "amin": (torch.amin, ("axis", "out", "keepdims")),
    "any": (torch.any, ("axis", "out", "keepdims")),
    "all": (torch.all, ("axis", "out", "keepdims")),
    "argmax": (torch.argmax, ("axis", "out", "keepdims")),
    "argmin": (torch.argmin, ("axis", "out", "keepdims")),
}
# shape functions: numpy's parameters after the array (methods take shapes as varargs too)
_SHAPES = {
    "reshape": ("shape",),
    "transpose": ("axes",),
    "squeeze": ("axis",),
    "expand_dims": ("axis",),
    "ravel": (),
    "flatten": (),
    "copy": (),
    "astype": ("dtype",),
}
_SEQUENCES = {"concatenate": ("axis",), "stack": ("axis",)}
_DATA_METHODS = frozenset({"item", "tolist", "tobytes", "__float__", "__int__", "__bool__"})


def is_numpy_function(obj: Any) -> bool:
    """Whether ``obj`` is a numpy function this module records (``np.tanh``, ``np.mean``)."""
    name = getattr(obj, "__name__", None)
    if not isinstance(name, str) or not (type(obj).__module__ or "").startswith("numpy"):
        return False
    if not any(
        name in table for table in (_ELEMENTWISE, _REDUCTIONS, _SHAPES, _SEQUENCES, {"dot"})
    ):
        return False
    import numpy

    return getattr(numpy, name, None) is obj


def _holds_array(v: Value) -> bool:
    if isinstance(v, NdarrayValue):
        return True
    if isinstance(v, (ListValue, TupleValue)):
        return any(_holds_array(x) for x in v.items)
    return False


def from_tensor(tr: Tracer, t: TensorValue, kwargs: dict[str, Value]) -> NdarrayValue:
    """``t.numpy(force=...)``: the array shares ``t``'s data, so it is ``t`` itself."""
    force = bool(kwargs["force"].as_constant()) if "force" in kwargs else False
    fake = t.fake
    try:
        numpy_dtype(fake.dtype)
    except TypeError as e:  # bfloat16 has no numpy dtype: the real call raises
        raise unsupported("data_dependent_value", f"Tensor.numpy() of {fake.dtype}") from e
    if force:
        t = _method(tr, _method(tr, t, "detach"), "cpu")
    elif fake.requires_grad or fake.device.type != "cpu":
        # eager raises here; the break runs the call for real so the user sees that error
        raise unsupported("data_dependent_value", "Tensor.numpy() of a tensor that "
                          "requires grad or is not on the CPU")  # fmt: skip
    return NdarrayValue(t)


def to_tensor(tr: Tracer, fn: Any, args: list[Value], kwargs: dict[str, Value]) -> Value:
    """``torch.from_numpy(a)``, ``torch.as_tensor(a)``, ``torch.asarray(a)``, ``torch.tensor(a)``."""
    allowed = {
        torch.from_numpy: (),
        torch.as_tensor: ("dtype", "device"),
        torch.asarray: ("dtype", "device"),
        torch.tensor: ("dtype", "device"),
    }.get(fn)
    if allowed is None or len(args) != 1 or not isinstance(args[0], NdarrayValue):
        raise unsupported("unsupported_call", f"{getattr(fn, '__name__', fn)} of a numpy array")
    if set(kwargs) - set(allowed) or (fn is torch.from_numpy and args[0].scalar):
        raise unsupported("unsupported_call", f"{fn.__name__} with these arguments")
    out: Value = args[0].tensor
    if fn is torch.tensor:  # a copy; the others share the array's memory
        out = _method(tr, args[0].tensor, "clone")
    if kwargs:
        return torch_calls.call_method(tr, _tensor(out), "to", [], kwargs)
    return out


# calls -----------------------------------------------------------------------
def call_function(
    tr: Tracer, fv: ObjectValue, args: list[Value], kwargs: dict[str, Value]
) -> Value:
    """``np.<name>(...)``: torch ops when an argument is a tracked array, else folded."""
    fn = fv.obj
    if fv.source is not None:
        tr.out.guard(fv.source, GuardKind.ID_MATCH, id(fn))
    if not any(_holds_array(v) for v in [*args, *kwargs.values()]):
        return _fold(fn, args, kwargs)
    name = fn.__name__
    if name in _REDUCTIONS or name in _SHAPES:
        if not args or not isinstance(args[0], NdarrayValue):
            raise unsupported("unsupported_call", f"numpy.{name} of a {args[0] if args else ''}")
        return call_method(tr, args[0], name, args[1:], kwargs, function=True)
    result = _numpy_result(fn, args, kwargs)
    if name in _SEQUENCES:
        return _sequence(tr, name, args, kwargs, result)
    if name == "dot":
        if any(isinstance(a, NdarrayValue) and a.tensor.fake.dim() > 2 for a in args):
            raise unsupported("unsupported_call", "numpy.dot of arrays with more than 2 dims")
        name = "matmul"
    if kwargs:
        raise unsupported("unsupported_call", f"numpy.{name} with keyword arguments")
    return _elementwise(tr, name, args, result)


def call_method(
    tr: Tracer,
    arr: NdarrayValue,
    name: str,
    args: list[Value],
    kwargs: dict[str, Value],
    *,
    function: bool = False,
) -> Value:
    """``arr.<name>(...)`` (or, with ``function``, ``np.<name>(arr, ...)``)."""
    if name in _DATA_METHODS:
        raise unsupported("data_dependent_value", f"ndarray.{name}()")
    if name in _REDUCTIONS:
        func, params = _REDUCTIONS[name]
        bound = _bind(name, params, args, kwargs)
        if bound.get("out") is not None:
            raise unsupported("unsupported_call", f"numpy.{name} with out=")
        result = _numpy_result(_numpy_callable(name, function, arr), [arr, *args], kwargs)
        return _reduce(tr, func, arr, bound, result)
    if name in _SHAPES:
        if not function and name in ("reshape", "transpose") and len(args) != 1:
            args = [TupleValue(list(args))]  # arr.reshape(2, 3) is arr.reshape((2, 3))
        return _reshape(tr, name, arr, _bind(name, _SHAPES[name], args, kwargs))
    if name in _ELEMENTWISE and name not in ("where",) and not kwargs:
        result = _numpy_result(_numpy_callable(name, function, arr), [arr, *args], {})
        return _elementwise(tr, name, [arr, *args], result)
    raise unsupported("unsupported_call", f"ndarray.{name}")


def _numpy_callable(name: str, function: bool, arr: NdarrayValue) -> Callable[..., Any]:
    """What the stand-in call runs: ``np.<name>`` or the method of the first stand-in."""
    import numpy

    if function:
        return getattr(numpy, name)  # type: ignore[no-any-return]
    return getattr(arr.python_type(), name)  # type: ignore[no-any-return]


def _fold(fn: Any, args: list[Value], kwargs: dict[str, Value]) -> Value:
    result = literals.fold(fn, args, kwargs)
    if isinstance(result, ConstantValue):
        return result
    kind = result.python_type().__name__
    raise unsupported("unsupported_call", f"numpy.{fn.__name__} giving a {kind}")


def _bind(
    name: str, params: tuple[str, ...], args: list[Value], kwargs: dict[str, Value]
) -> dict[str, Any]:
    """Numpy's arguments by name, as constants (tracked arrays are refused here).

    An explicit ``None`` is kept: ``concatenate(..., axis=None)`` flattens, unlike its default.
    """
    if len(args) > len(params) or set(kwargs) - set(params) - {"keepdims"}:
        raise unsupported("unsupported_call", f"numpy.{name} with these arguments")
    bound = {**dict(zip(params, args, strict=False)), **kwargs}
    return {k: v.obj if isinstance(v, ObjectValue) else _literal(v) for k, v in bound.items()}


def _literal(v: Value) -> Any:
    if _holds_array(v):
        raise unsupported("unsupported_call", "a numpy array where numpy wants a constant")
    return literals.literal(v)


# stand-ins -------------------------------------------------------------------
class _Result:
    """What numpy returns for the stand-ins: the torch dtype, the rank and scalar-ness."""

    def __init__(self, obj: Any) -> None:
        import numpy

        if not isinstance(obj, numpy.ndarray | numpy.generic):
            raise unsupported("unsupported_call", f"a numpy call returning {type(obj).__name__}")
        self.dtype = torch_dtype(obj.dtype)
        self.ndim = obj.ndim
        self.scalar = isinstance(obj, numpy.generic)


def torch_dtype(dtype: Any) -> torch.dtype:
    """The torch dtype of a numpy dtype (or scalar type)."""
    import numpy

    try:
        return torch.from_numpy(numpy.empty(0, dtype=dtype)).dtype
    except TypeError as e:
        raise unsupported("unsupported_call", f"numpy dtype {dtype}") from e


def _stand_in(v: Value) -> Any:
    import numpy

    if isinstance(v, NdarrayValue):
        fake = v.tensor.fake
        array: Any = numpy.ones((1,) * fake.dim(), dtype=numpy_dtype(fake.dtype))
        return array[()] if v.scalar else array
    if isinstance(v, (ListValue, TupleValue)):
        items = [_stand_in(x) for x in v.items]
        return items if isinstance(v, ListValue) else tuple(items)
    if isinstance(v, ObjectValue):
        return v.obj
    return _literal(v)


def _numpy_result(fn: Callable[..., Any], args: list[Value], kwargs: dict[str, Value]) -> _Result:
    import numpy

    try:
        # the stand-ins' values are ones, not the user's: their overflows say nothing
        with numpy.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = fn(*[_stand_in(a) for a in args], **{k: _stand_in(v) for k, v in kwargs.items()})
    except Exception as e:  # numpy refuses these arguments: the real call shows why
        raise unsupported("unsupported_call", f"numpy: {type(e).__name__}: {e}") from e
    return _Result(out)


# torch ops -------------------------------------------------------------------
def _tensor(v: Value) -> TensorValue:
    if not isinstance(v, TensorValue):
        raise unsupported("unsupported_call", f"a numpy result that is not an array: {v}")
    return v


def _method(tr: Tracer, t: TensorValue, name: str, *args: Any) -> TensorValue:
    """``t.name(*args)`` for constant ``args``, as a tensor."""
    return _tensor(torch_calls.call_method(tr, t, name, [ConstantValue(a) for a in args], {}))


def _cast(tr: Tracer, t: TensorValue, dtype: torch.dtype) -> TensorValue:
    return t if t.fake.dtype == dtype else _method(tr, t, "to", dtype)


def _finish(tr: Tracer, out: Value, result: _Result) -> NdarrayValue:
    t = _cast(tr, _tensor(out), result.dtype)
    if t.fake.dim() != result.ndim:
        raise unsupported("unsupported_call", "a numpy call whose rank torch does not match")
    return NdarrayValue(t, result.scalar)


def _elementwise(tr: Tracer, name: str, args: list[Value], result: _Result) -> NdarrayValue:
    # arrays are cast to the result's dtype, so torch computes in numpy's precision;
    # not for boolean results (comparisons, tests), where torch promotes as numpy does
    boolean = result.dtype == torch.bool
    targs: list[Value] = []
    for i, a in enumerate(args):
        if isinstance(a, NdarrayValue):
            keep = boolean or (name == "where" and i == 0)
            targs.append(a.tensor if keep else _cast(tr, a.tensor, result.dtype))
        elif isinstance(a, ConstantValue) and name in _TENSORS_ONLY:
            scalar: list[Value] = [ConstantValue(a.value)]
            dtype: dict[str, Value] = {"dtype": ConstantValue(result.dtype)}
            targs.append(torch_calls.call_function(tr, torch.scalar_tensor, scalar, dtype))
        elif isinstance(a, ConstantValue):
            targs.append(a)
        else:
            raise unsupported("unsupported_call", f"numpy.{name} of {a}")
    out = torch_calls.call_function(tr, _ELEMENTWISE[name], targs, {})
    return _finish(tr, out, result)


def _axes(axis: Any) -> tuple[int, ...] | None:
    if axis is None:
        return None
    axes = tuple(axis) if isinstance(axis, (tuple, list)) else (axis,)
    if not axes:  # numpy reduces nothing; torch would reduce everything
        raise unsupported("unsupported_call", "a numpy reduction over axis=()")
    return tuple(int(a) for a in axes)


def _reduce(
    tr: Tracer, func: Callable[..., Any], arr: NdarrayValue, bound: dict[str, Any], result: _Result
) -> NdarrayValue:
    x = arr.tensor
    if func in (torch.sum, torch.mean, torch.prod, torch.std, torch.var):
        x = _cast(tr, x, result.dtype)  # numpy accumulates in the result's dtype
    dims = _axes(bound.get("axis"))
    keep = bool(bound.get("keepdims", False))
    kw: dict[str, Value] = {"keepdim": ConstantValue(keep)}
    if func in (torch.std, torch.var):
        kw["correction"] = ConstantValue(bound.get("ddof") or 0)
    if func is torch.prod:  # one dim at a time: torch.prod takes a single dim
        out: Value = x
        for d in sorted(range(x.fake.dim()) if dims is None else dims, reverse=True):
            out = torch_calls.call_function(tr, func, [out, ConstantValue(d)], kw)
        return _finish(tr, out, result)
    if func in (torch.argmax, torch.argmin):
        if dims is not None and len(dims) != 1:
            raise unsupported("unsupported_call", "numpy.argmax over several axes")
        kw["dim"] = ConstantValue(None if dims is None else dims[0])
    else:
        kw["dim"] = ConstantValue(dims)
    return _finish(tr, torch_calls.call_function(tr, func, [x], kw), result)


def _reshape(tr: Tracer, name: str, arr: NdarrayValue, bound: dict[str, Any]) -> NdarrayValue:
    x = arr.tensor
    ndim = x.fake.dim()
    margs: list[Any] = [-1]
    method = "reshape"  # ravel, flatten
    if name == "reshape":
        shape = bound.get("shape")
        margs = [tuple(shape) if isinstance(shape, (list, tuple)) else (shape,)]
    elif name == "transpose":
        method, margs = "permute", [tuple(bound.get("axes") or reversed(range(ndim)))]
    elif name == "squeeze":
        axis = bound.get("axis")
        method, margs = "squeeze", [] if axis is None else [_axes(axis)]
    elif name == "expand_dims":
        axes = _axes(bound.get("axis")) or ()
        for a in sorted(a % (ndim + len(axes)) for a in axes):
            x = _method(tr, x, "unsqueeze", a)
        return NdarrayValue(x)
    elif name == "copy":
        method, margs = "clone", []
    elif name == "astype":
        method, margs = "to", [torch_dtype(bound["dtype"])]
    return NdarrayValue(_method(tr, x, method, *margs))


def _sequence(
    tr: Tracer, name: str, args: list[Value], kwargs: dict[str, Value], result: _Result
) -> NdarrayValue:
    seq = args[0] if args else None
    if not isinstance(seq, (ListValue, TupleValue)) or not all(
        isinstance(x, NdarrayValue) for x in seq.items
    ):
        raise unsupported("unsupported_call", f"numpy.{name} of something other than arrays")
    bound = _bind(name, ("axis",), args[1:], kwargs)
    axis = bound.get("axis", 0)
    arrays = [x for x in seq.items if isinstance(x, NdarrayValue)]
    tensors: list[Value] = [_cast(tr, x.tensor, result.dtype) for x in arrays]
    if axis is None:  # concatenate flattened arrays
        tensors = [_method(tr, _tensor(t), "reshape", -1) for t in tensors]
        axis = 0
    func = torch.cat if name == "concatenate" else torch.stack
    out = torch_calls.call_function(tr, func, [ListValue(tensors)], {"dim": ConstantValue(axis)})
    return _finish(tr, out, result)


# attributes, items and operators ---------------------------------------------
@dispatch.GET_ATTR.register(NdarrayValue)
def attribute(tr: Tracer, arr: NdarrayValue, name: str) -> Value:
    """``arr.shape``, ``arr.dtype``, ``arr.T`` ...; methods as bound method values."""
    import numpy

    fake = arr.tensor.fake
    simple = {"shape": tuple(fake.shape), "ndim": fake.dim(), "size": fake.numel()}
    simple.update({"itemsize": fake.element_size(), "nbytes": fake.numel() * fake.element_size()})
    if name in simple:
        return ConstantValue(simple[name])
    if name == "dtype":
        return ObjectValue(numpy.dtype(numpy_dtype(fake.dtype)))
    if name == "T":
        return _reshape(tr, "transpose", arr, {})
    if callable(getattr(arr.python_type(), name, None)):
        return BuiltinMethodValue(arr, name)
    raise unsupported("unsupported_attribute", f"ndarray.{name}")


@dispatch.GET_ITEM.register(NdarrayValue)
def get_item(tr: Tracer, arr: NdarrayValue, index: Value) -> NdarrayValue:
    """Basic indexing (ints, slices, ``None``, ``...``): a view, or a scalar when it picks one."""
    key = _literal(index)
    parts = key if isinstance(key, tuple) else (key,)
    if not all(p is None or p is Ellipsis or isinstance(p, (int, slice)) for p in parts):
        raise unsupported("unsupported_operator", "numpy indexing other than ints and slices")
    out = _tensor(torch_calls.call_function(tr, operator.getitem, [arr.tensor, index], {}))
    return NdarrayValue(out, out.fake.dim() == 0 and Ellipsis not in parts)


@dispatch.BINARY_OP.register(NdarrayValue, priority=1)
@dispatch.COMPARE_OP.register(NdarrayValue, priority=1)
def binary_op(tr: Tracer, sym: str, a: Value, b: Value) -> Value:
    """``a <sym> b`` where one side is a tracked array (``a += b`` would write the array)."""
    if sym.endswith("=") and sym not in OPERATORS:
        if isinstance(a, NdarrayValue):
            raise unsupported("side_effect", f"in-place numpy operator {sym}")
        sym = sym[:-1]
    if isinstance(a, TensorValue) or isinstance(b, TensorValue) or sym not in OPERATORS:
        raise unsupported("unsupported_operator", f"{a} {sym} {b}")
    name = OPERATORS[sym]
    import numpy

    return _elementwise(tr, name, [a, b], _numpy_result(getattr(numpy, name), [a, b], {}))


@dispatch.UNARY_OP.register(NdarrayValue)
def unary_op(tr: Tracer, name: str, v: NdarrayValue) -> NdarrayValue:
    """``-a``, ``+a``, ``~a``, ``abs(a)``."""
    import numpy

    func = OPERATORS[name]
    return _elementwise(tr, func, [v], _numpy_result(getattr(numpy, func), [v], {}))


@dispatch.TRUTH.register(NdarrayValue)
def _ndarray_truth(tr: Tracer, v: NdarrayValue) -> bool:
    raise unsupported("data_dependent_branch", f"the truth of a {v.python_type().__name__}")


@dispatch.LENGTH.register(NdarrayValue)
def _ndarray_length(tr: Tracer, v: NdarrayValue) -> int:
    # numpy scalars have no len(): the tensor's 0-d check raises for them too
    return dispatch.length(tr, v.tensor)


@dispatch.CALL_METHOD.register(NdarrayValue)
def _ndarray_method(
    tr: Tracer, arr: NdarrayValue, name: str, args: list[Value], kwargs: dict[str, Value]
) -> Value:
    return call_method(tr, arr, name, args, kwargs)
