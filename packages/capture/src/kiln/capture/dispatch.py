"""The evaluator's operations: one table per operation, keyed by the kind of value.

Everything capture evaluates on a tracked value (attribute and item access, calls, iteration,
truth, operators) goes through a function here, which looks the handler up by the value's
class along its MRO (a kind without its own entry takes its base class's, ``Value`` holding the
general case). The module that implements a behaviour registers its handler when it is imported:
tensors' attributes in ``torch_calls``, ndarrays' in ``numpy_calls``, Python objects' in
``attributes`` and so on. Opcode handlers and evaluator modules call one another's behaviour
only through these functions, so every dependency points here and none back (``torch_calls``
and ``numpy_calls``, which convert between tensors and arrays, are the one pair that import
each other), and a new value kind is added by registering handlers, not by editing
``isinstance`` chains in several modules. ``kiln.capture.evaluator`` imports every module that
registers, so the tables are complete before a frame is traced.

Binary and comparison operators involve both operands, and either operand's kind may answer, as
in Python, where ``a + b`` asks ``b.__radd__`` when ``a.__add__`` does not know ``b``. A kind
registers them with a priority: the operand whose kind has the higher priority is asked first
(the left one on a tie), its handler returns None for an operand it does not know, then the
other operand's kind is asked, and ``Value``'s handler, the general case, answers last. Tensors
outrank ndarrays, which outrank every Python value, so ``2 * t`` and ``arr + t`` are the
tensor's. :data:`BINARY` and :data:`COMPARE` list the operator symbols those two operations
take.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from kiln.capture.values.base import Value

if TYPE_CHECKING:
    from kiln.capture.tracer import Tracer
    from kiln.capture.values.iterators import IteratorValue

__all__ = [
    "BINARY",
    "BINARY_OP",
    "COMPARE",
    "CALL",
    "CALL_METHOD",
    "COMPARE_OP",
    "CONTAINS",
    "DELETE_ATTR",
    "DELETE_ITEM",
    "GET_ATTR",
    "GET_ITEM",
    "HAS_ATTR",
    "ITERATE",
    "LENGTH",
    "SET_ATTR",
    "SET_ITEM",
    "TRUTH",
    "UNARY_OP",
    "UNPACK",
    "Operation",
    "binary_op",
    "call",
    "call_method",
    "compare_op",
    "contains",
    "delete_attr",
    "delete_item",
    "get_attr",
    "get_item",
    "has_attr",
    "iterate",
    "length",
    "set_attr",
    "set_item",
    "truth",
    "unary_op",
    "unpack_iterable",
]

H = TypeVar("H", bound=Callable[..., Any])

BINARY: dict[str, Callable[[Any, Any], Any]] = {
    "+": operator.add,
    "-": operator.sub,
    "*": operator.mul,
    "/": operator.truediv,
    "//": operator.floordiv,
    "%": operator.mod,
    "**": operator.pow,
    "@": operator.matmul,
    "&": operator.and_,
    "|": operator.or_,
    "^": operator.xor,
    "<<": operator.lshift,
    ">>": operator.rshift,
    "+=": operator.iadd,
    "-=": operator.isub,
    "*=": operator.imul,
    "/=": operator.itruediv,
    "//=": operator.ifloordiv,
    "%=": operator.imod,
    "**=": operator.ipow,
    "@=": operator.imatmul,
    "&=": operator.iand,
    "|=": operator.ior,
    "^=": operator.ixor,
    "<<=": operator.ilshift,
    ">>=": operator.irshift,
}
COMPARE: dict[str, Callable[[Any, Any], Any]] = {
    "<": operator.lt,
    "<=": operator.le,
    "==": operator.eq,
    "!=": operator.ne,
    ">": operator.gt,
    ">=": operator.ge,
}


class Operation(Generic[H]):
    """One operation's handlers by value class; a lookup walks the value's MRO (memoized)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._handlers: dict[type, tuple[H, int]] = {}
        self._resolved: dict[type, tuple[H, int]] = {}
        self._pairs: dict[tuple[type, type], list[H]] = {}

    def register(self, *kinds: type[Value], priority: int = 0) -> Callable[[H], H]:
        """A decorator that makes ``fn`` the handler of each of ``kinds`` (one owner per kind).

        ``priority`` matters to operations of two operands only (:meth:`either`).
        """

        def add(fn: H) -> H:
            for kind in kinds:
                if kind in self._handlers:
                    msg = f"{self.name} already has a handler for {kind.__name__}"
                    raise ValueError(msg)
                self._handlers[kind] = (fn, priority)
            self._resolved.clear()
            self._pairs.clear()
            return fn

        return add

    def kinds(self) -> list[type]:
        """The classes with a handler of their own."""
        return list(self._handlers)

    def __getitem__(self, kind: type) -> H:
        return self._resolve(kind)[0]

    def answering(self, left: type, right: type) -> list[H]:
        """The handlers an operation of two operands asks, in order, each once: the operand
        kinds' own, the higher priority first (the left one on a tie), then ``Value``'s."""
        found = self._pairs.get((left, right))
        if found is None:
            first, second = self._resolve(left), self._resolve(right)
            if second[1] > first[1]:
                first, second = second, first
            general = self._resolve(Value)[0]
            found = []
            for fn in (first[0], second[0]):
                if fn is not general and fn not in found:
                    found.append(fn)
            found.append(general)
            self._pairs[(left, right)] = found
        return found

    def _resolve(self, kind: type) -> tuple[H, int]:
        found = self._resolved.get(kind)
        if found is None:
            for base in kind.__mro__:
                if base in self._handlers:
                    found = self._handlers[base]
                    break
            else:
                msg = f"no {self.name} handler for {kind.__name__} (kiln.capture.evaluator registers them)"
                raise LookupError(msg)
            self._resolved[kind] = found
        return found


# The handlers take the value as ``Any``: each is registered for one kind and reads its fields.
GET_ATTR: Operation[Callable[[Tracer, Any, str], Value]] = Operation("get_attr")
HAS_ATTR: Operation[Callable[[Tracer, Any, str], bool]] = Operation("has_attr")
SET_ATTR: Operation[Callable[[Tracer, Any, str, Value, bool], None]] = Operation("set_attr")
DELETE_ATTR: Operation[Callable[[Tracer, Any, str], None]] = Operation("delete_attr")
GET_ITEM: Operation[Callable[[Tracer, Any, Value], Value]] = Operation("get_item")
SET_ITEM: Operation[Callable[[Tracer, Any, Value, Value], None]] = Operation("set_item")
DELETE_ITEM: Operation[Callable[[Tracer, Any, Value], None]] = Operation("delete_item")
CALL: Operation[Callable[[Tracer, Any, list[Value], dict[str, Value]], Value]] = Operation("call")
CALL_METHOD: Operation[Callable[[Tracer, Any, str, list[Value], dict[str, Value]], Value]] = (
    Operation("call_method")
)
ITERATE: Operation[Callable[[Tracer, Any], IteratorValue]] = Operation("iterate")
UNPACK: Operation[Callable[[Tracer, Any], list[Value]]] = Operation("unpack_iterable")
LENGTH: Operation[Callable[[Tracer, Any], int]] = Operation("length")
TRUTH: Operation[Callable[[Tracer, Any], bool]] = Operation("truth")
UNARY_OP: Operation[Callable[[Tracer, str, Any], Value]] = Operation("unary_op")
# a handler of two operands returns None for an operand pair its kind does not know
BINARY_OP: Operation[Callable[[Tracer, str, Value, Value], Value | None]] = Operation("binary_op")
COMPARE_OP: Operation[Callable[[Tracer, str, Value, Value], Value | None]] = Operation("compare_op")
CONTAINS: Operation[Callable[[Tracer, Value, Any], bool]] = Operation("contains")


def get_attr(tr: Tracer, v: Value, name: str) -> Value:
    """``v.name``."""
    return GET_ATTR[type(v)](tr, v, name)


def has_attr(tr: Tracer, v: Value, name: str) -> bool:
    """``hasattr(v, name)``, without running user code that is not inlined."""
    return HAS_ATTR[type(v)](tr, v, name)


def set_attr(tr: Tracer, v: Value, name: str, value: Value, *, plain: bool = False) -> None:
    """``v.name = value`` (``plain``: ``object.__setattr__``, skipping a class's own hook)."""
    SET_ATTR[type(v)](tr, v, name, value, plain)


def delete_attr(tr: Tracer, v: Value, name: str) -> None:
    """``del v.name``."""
    DELETE_ATTR[type(v)](tr, v, name)


def get_item(tr: Tracer, v: Value, index: Value) -> Value:
    """``v[index]``."""
    return GET_ITEM[type(v)](tr, v, index)


def set_item(tr: Tracer, v: Value, index: Value, value: Value) -> None:
    """``v[index] = value``."""
    SET_ITEM[type(v)](tr, v, index, value)


def delete_item(tr: Tracer, v: Value, index: Value) -> None:
    """``del v[index]``."""
    DELETE_ITEM[type(v)](tr, v, index)


def call(tr: Tracer, fn: Value, args: list[Value], kwargs: dict[str, Value]) -> Value:
    """``fn(*args, **kwargs)``."""
    return CALL[type(fn)](tr, fn, args, kwargs)


def call_method(
    tr: Tracer, receiver: Value, name: str, args: list[Value], kwargs: dict[str, Value]
) -> Value:
    """``receiver.name(*args, **kwargs)`` for a builtin method of the receiver's own type."""
    return CALL_METHOD[type(receiver)](tr, receiver, name, args, kwargs)


def iterate(tr: Tracer, v: Value) -> IteratorValue:
    """``iter(v)``: an iterator the loop can unroll."""
    return ITERATE[type(v)](tr, v)


def unpack_iterable(tr: Tracer, v: Value) -> list[Value]:
    """All items of a finite iterable."""
    return UNPACK[type(v)](tr, v)


def length(tr: Tracer, v: Value) -> int:
    """``len(v)``."""
    return LENGTH[type(v)](tr, v)


def truth(tr: Tracer, v: Value) -> bool:
    """``bool(v)``, as a branch needs it (a tensor's truth is a data-dependent break)."""
    return TRUTH[type(v)](tr, v)


def unary_op(tr: Tracer, name: str, v: Value) -> Value:
    """``-v``, ``+v``, ``~v`` (``name`` is the ``operator`` function's name)."""
    return UNARY_OP[type(v)](tr, name, v)


def binary_op(tr: Tracer, sym: str, a: Value, b: Value) -> Value:
    """``a <sym> b`` for an arithmetic operator symbol (``+``, ``+=``, ...)."""
    return _answer(BINARY_OP, tr, sym, a, b)


def compare_op(tr: Tracer, sym: str, a: Value, b: Value) -> Value:
    """``a <sym> b`` for a comparison symbol."""
    return _answer(COMPARE_OP, tr, sym, a, b)


def _answer(
    op: Operation[Callable[[Tracer, str, Value, Value], Value | None]],
    tr: Tracer,
    sym: str,
    a: Value,
    b: Value,
) -> Value:
    for handler in op.answering(type(a), type(b)):
        result = handler(tr, sym, a, b)
        if result is not None:
            return result
    msg = f"the general {op.name} handler declined {a} {sym} {b}"
    raise LookupError(msg)


def contains(tr: Tracer, item: Value, container: Value) -> bool:
    """``item in container``: the container decides."""
    return CONTAINS[type(container)](tr, item, container)
