"""Guards as data: what capture assumed about the frame, for kiln.guards to check.

Capture records one :class:`GuardSpec` per assumption; kiln.guards turns the
list into a single check function. Keeping guards as plain data lets tests,
``explain`` and export tools read them without running anything.
"""

from __future__ import annotations

import builtins
import dataclasses
import enum
import types
from collections.abc import Collection
from typing import Any

import torch
from torch.utils._device import DeviceContext

from kiln.capture.source import Source

__all__ = [
    "CachedCall",
    "ClassAttr",
    "GuardKind",
    "GuardSpec",
    "TensorMeta",
    "GlobalState",
    "dedupe",
    "dense_in_order",
    "storage_fits",
    "user_function_modes",
]


class GuardKind(enum.Enum):
    """What a guard checks; the comment says what ``GuardSpec.expected`` holds.

    Capture only names kinds; how each is checked, ordered and explained is declared once
    per kind in ``kiln.guards.kinds`` (a kind without a declaration there is refused).
    """

    TENSOR_MATCH = "tensor_match"  # TensorMeta
    TYPE_MATCH = "type_match"  # the exact type object
    ID_MATCH = "id_match"  # id() of the object; the object is kept alive by the guard
    EQUALS = "equals"  # a constant compared with ==, type included
    IS_NONE = "is_none"  # None
    NOT_NONE = "not_none"  # None
    BOOL = "bool"  # True or False: the value's truth
    # None: a float neither infinite nor NaN. A float argument traced as a symbol holds only
    # finite values (sympy's reals are finite: ``p == inf`` folds to False with no guard)
    FINITE = "finite"
    DICT_KEYS = "dict_keys"  # tuple of keys, in order
    SEQUENCE_LENGTH = "sequence_length"  # int
    MODULE_MATCH = "module_match"  # id() of an nn.Module, plus its training flag via a BOOL guard
    HOOKS_EMPTY = "hooks_empty"  # None: the module has no forward/pre-hooks, nor do globals
    HASATTR = "hasattr"  # (attribute name, bool)
    # the attribute name: absent from the value's own ``__dict__``, where an attribute set
    # later would shadow the method (or other non-data descriptor) the trace found on its class
    NOT_IN_INSTANCE_DICT = "not_in_instance_dict"
    # A functools cache function's answer the trace used as a constant: ``expected`` is a
    # CachedCall. Source None: the check calls the function again (a cache hit), so a cache
    # cleared or evicted since, which would recompute from the state now, is seen.
    CACHED_CALL = "cached_call"
    GLOBAL_STATE = "global_state"  # GlobalState; source is None
    # The nn.Module object itself: its whole subtree (submodules, parameters and buffers
    # by identity and metadata, plain attributes, training flags, hooks) must be as it was
    # when the check was built. kiln.guards checks it in O(1) while no module changed.
    MODULE_TREE = "module_tree"
    # A method, property or static/class method the trace found on a class: ``expected`` is
    # a ClassAttr. Source None: one guard per
    # (class, name) however many instances share it, so reassigning ``A.f = g`` after a call
    # is seen without a guard per object.
    CLASS_ATTR = "class_attr"
    # Relations over input sizes that a graph traced with symbolic sizes assumes: ``expected``
    # is the capture's ``kiln.capture.shapes.ShapeEnv`` (no longer changed once capture
    # returns; ``guard_code``/``failing_guards``/``describe_failure`` read it). Source None.
    SHAPE = "shape"

    # members are singletons compared by identity: hash them like any object, in C, not by
    # Enum's Python-level ``hash(self._name_)`` (plans and dedupes hash kinds thousands of times)
    __hash__ = object.__hash__


@dataclasses.dataclass(frozen=True)
class TensorMeta:
    """Everything a compiled graph assumes about one input tensor.

    A size or stride that is ``None`` is symbolic (a dynamic dimension): the frame's
    ``SHAPE`` guard states what it may be. ``dense_order``, when given, says the strides are
    those of a dense tensor whose dims, innermost first, come in this order (a dim of size 1
    may have any stride; a dim whose stride here is 0, a broadcast one, is left out): the
    strides of a dynamic input follow its sizes.
    """

    type: type
    dtype: torch.dtype
    device: torch.device
    requires_grad: bool
    sizes: tuple[int | None, ...]
    strides: tuple[int | None, ...]
    dispatch_keys: frozenset[str] = frozenset()
    # lazy bits ATen alone resolves (``z.conj()``, ``z.conj().imag``): a graph compiled for a
    # tensor without them reads a tensor with them wrongly
    conj: bool = False
    neg: bool = False
    dense_order: tuple[int, ...] | None = None

    @classmethod
    def of(cls, t: torch.Tensor, as_type: builtins.type | None = None) -> TensorMeta:
        """``t``'s metadata; ``as_type``: the type to record instead of ``type(t)``."""
        return cls(
            type(t) if as_type is None else as_type,
            t.dtype,
            t.device,
            t.requires_grad,
            tuple(t.shape),
            tuple(t.stride()),
            conj=t.is_conj(),
            neg=t.is_neg(),
        )


def dense_in_order(
    t: torch.Tensor, order: tuple[int, ...], broadcast: Collection[int] = ()
) -> bool:
    """Whether ``t``'s strides are a dense layout with dims ``order`` innermost first (the
    strides ``TensorMeta.dense_order`` promises); a dim of size 1 may have any stride, and a
    tensor without elements any strides (none is ever read). Dims in ``broadcast`` are left
    out: the meta pins their stride to 0 (an expanded input), which is tested on its own."""
    if t.numel() == 0:
        return True
    expected = 1
    sizes = t.shape
    strides = t.stride()
    for d in order:
        n = sizes[d]
        if d in broadcast:
            continue
        if n != 1 and strides[d] != expected:
            return False
        expected *= n
    return True


def storage_fits(t: torch.Tensor) -> bool:
    """Whether every element of ``t`` lies inside its storage.

    A storage resized under its tensor (``t.untyped_storage().resize_(0)``) leaves sizes and
    strides as they were; eager's views of it raise (``setStorage: ... out of bounds``) and
    its kernels read freed memory. A compiled graph must never read past a storage's end:
    capture refuses such an input, and kiln.guards re-checks module state, whose guards run
    only after the module stamp moved. Tensors without a plain storage count as fitting.
    """
    numel = t.numel()
    if t.layout is not torch.strided or numel == 0:
        return True
    try:
        nbytes = t.untyped_storage().nbytes()
    except (RuntimeError, NotImplementedError, TypeError):
        return True
    if t.is_contiguous():  # most parameters: no walk over the dims
        last = t.storage_offset() + numel - 1
    else:
        last = t.storage_offset() + sum(
            (n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True)
        )
    return bool(nbytes >= (last + 1) * t.element_size())


@dataclasses.dataclass(frozen=True)
class GlobalState:
    """Process state a graph's meaning depends on."""

    grad_enabled: bool
    default_dtype: torch.dtype
    autocast_cpu: bool
    autocast_cuda: bool
    deterministic: bool
    inference_mode: bool
    default_device: torch.device | None = None  # None: not checked
    # torch-function modes active at the call (user_function_modes): a graph runs its ops
    # without them, so one traced with none must not serve a call under a mode
    function_modes: int = 0

    @classmethod
    def current(cls) -> GlobalState:
        return cls(
            torch.is_grad_enabled(),
            torch.get_default_dtype(),
            torch.is_autocast_enabled("cpu"),
            torch.is_autocast_enabled("cuda"),
            torch.are_deterministic_algorithms_enabled(),
            torch.is_inference_mode_enabled(),
            torch.get_default_device(),
            user_function_modes(),
        )


def user_function_modes() -> int:
    """The torch-function modes on torch's stack, device contexts aside.

    ``with torch.device(d)`` is a mode too, but the default device it sets is guarded on its own.
    """
    c: Any = torch._C
    n: int = c._len_torch_function_stack()
    return sum(not isinstance(c._get_function_stack_at(i), DeviceContext) for i in range(n))


@dataclasses.dataclass(frozen=True, eq=False)
class ClassAttr:
    """What looking ``name`` up on the class ``owner`` gave while tracing (a function, the
    function a staticmethod wraps, a classmethod bound to ``owner``, a property). The trace
    inlined that code, so a later ``owner.name = other`` must fail the guard."""

    owner: type
    name: str
    value: Any

    def __repr__(self) -> str:
        # the class's id: two classes made by one ``class`` statement print alike
        return f"{self.owner.__qualname__}.{self.name} (class at {id(self.owner):#x}) is {self.value!r}"

    def holds(self) -> bool:
        """Whether the lookup still gives the same thing (a bound classmethod by ``==``)."""
        try:
            now = getattr(self.owner, self.name)
        except AttributeError:
            return False
        return now is self.value or (isinstance(now, types.MethodType) and now == self.value)


@dataclasses.dataclass(frozen=True, eq=False)
class CachedCall:
    """``fn(*args, **kwargs)`` of a ``functools.lru_cache``/``cache`` function gave the
    constant ``result`` while tracing, and the compiled code uses it as that constant."""

    fn: Any
    args: tuple[Any, ...]
    kwargs: tuple[tuple[str, Any], ...]
    result: Any

    def __repr__(self) -> str:
        name = getattr(self.fn, "__qualname__", "?")
        call = ", ".join([*map(repr, self.args), *(f"{k}={v!r}" for k, v in self.kwargs)])
        return f"{name}({call}) (function at {id(self.fn):#x}) is {self.result!r}"

    def holds(self) -> bool:
        """Whether calling it now gives the same constant (its type included)."""
        try:
            now = self.fn(*self.args, **dict(self.kwargs)) if self.kwargs else self.fn(*self.args)
        except Exception:
            return False
        return now is self.result or (type(now) is type(self.result) and now == self.result)


@dataclasses.dataclass(frozen=True)
class GuardSpec:
    """One assumption: ``source`` has property ``kind`` with value ``expected``."""

    source: Source | None
    kind: GuardKind
    expected: Any = None

    def __str__(self) -> str:
        where = str(self.source) if self.source is not None else "<global state>"
        return f"{self.kind.value}({where}, {self.expected!r})"


# types whose values compare equal exactly when they print alike: their guards' expected
# values key the dedupe as they are, not through a repr (a TensorMeta's is long)
_KEYED_BY_VALUE = frozenset({type(None), bool, int, str, bytes, TensorMeta})


def _expected_key(expected: Any) -> Any:
    kind = type(expected)
    if kind in _KEYED_BY_VALUE:
        return kind, expected
    if kind is type:  # a class without a metaclass: by identity
        return "class", expected
    if isinstance(expected, torch.nn.Module):
        return "module", id(expected)
    return "repr", repr(expected)


def dedupe(guards: list[GuardSpec]) -> list[GuardSpec]:
    """Drop repeated guards, keeping first-seen order.

    ``expected`` values compare by value where equal values print alike (constants,
    TensorMetas), by identity for classes and modules (a module prints its whole tree, slowly,
    and two modules may print alike), and by their repr otherwise.
    """
    seen: set[tuple[str, GuardKind, Any]] = set()
    out: list[GuardSpec] = []
    for g in guards:
        key = (str(g.source), g.kind, _expected_key(g.expected))
        if key not in seen:
            seen.add(key)
            out.append(g)
    return out
