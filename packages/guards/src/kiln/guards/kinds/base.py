"""What kiln.guards knows about one guard kind, and the registry that holds each kind's.

Capture names the kinds (:class:`~kiln.capture.guard_data.GuardKind`: what each asserts and
what its ``expected`` holds) and cannot import kiln.guards; everything kiln.guards does with a
kind lives in one :class:`Kind` subclass registered for it: where it runs in the check
(:attr:`Kind.rank`), the Python expression the check evaluates (:meth:`Kind.condition`), the
failure in words (:meth:`Kind.explain`), which other guards make it redundant, and whether the
module stamp protects it. The planner, the code generator and ``explain`` only look kinds up
here, so a kind is checked, ordered and explained by the one class that declares it.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Literal, Protocol, TypeVar

from kiln.capture.guard_data import GuardKind, GuardSpec
from kiln.capture.source import Source
from kiln.guards.errors import UnsupportedGuard

__all__ = ["KINDS", "Emitter", "Kind", "Rank", "Reach", "kind_of", "register"]


class Rank(enum.IntEnum):
    """Where a kind's guards run in a check: cheapest and likeliest to fail first."""

    COMPARISON = 0
    """One comparison: constants, identities, types, module roots."""
    GLOBAL_STATE = 1
    """Process-wide torch state (grad mode, default dtype, autocast...)."""
    CONTAINER = 2
    """Container lengths and keys, ``hasattr``."""
    TENSOR = 3
    """Every tensor, in one expression."""
    SHAPE = 4
    """Relations between symbolic sizes: they read sizes by index, so every tensor's rank is
    checked first."""
    HOOKS = 5
    """Hook registries: several dicts each."""
    CALL = 6
    """Calls into user code (a cached function's answer): only once every other guard of the
    check passed, so the call made is the one the run it admits makes in eager."""


Reach = Literal["module", "tensor", "value", "object"]
"""How a value hangs off module state (:func:`kiln.guards.module_tree.reach`)."""


class Emitter(Protocol):
    """What a kind's condition may ask of the check being generated
    (:class:`kiln.guards.codegen.CheckSource`)."""

    varkw: set[str]
    """The names of the ``**kwargs`` parameters (always a fresh dict)."""
    in_group: bool
    """Whether the guard runs in a module tree's group (only after the stamp moved)."""

    def bind(self, obj: Any, stem: str) -> str:
        """A name in the check's namespace holding ``obj`` (a type, a dtype, a function)."""
        ...

    def held(self, obj: Any, stem: str) -> str:
        """An expression for the user object ``obj``, held weakly where it can be."""
        ...

    def held_source(self, source: Source, expected_id: int) -> str | None:
        """An expression for the object ``source`` held when the check was built, when it
        can be read without a frame and has id ``expected_id``; else None."""
        ...

    def literal(self, value: Any, stem: str = "k") -> str:
        """``value`` as Python text: its repr where that rebuilds it, else a bound name."""
        ...

    def expr(self, source: Source) -> str:
        """Python text reading ``source`` in the check (a size source through what an earlier
        condition kept, see :meth:`keep`)."""
        ...

    def keep(self, text: str, stem: str) -> tuple[str, str]:
        """A local that keeps the value of ``text`` (``v.shape``, ``v.stride()``) for later
        readers: ``(first, name)``, where ``first`` (``(name := text)``) must stand where it
        is evaluated on every path that reaches a reader, and ``name`` reads it there.
        ``text`` kept before gives its name twice."""
        ...

    def in_scope(self, name: str, obj: Any) -> None:
        """Make the bare ``name`` read ``obj`` in the check (for text printed elsewhere that
        names a module, such as ``math.floor``); :class:`UnsupportedGuard` when a parameter
        or the check's own name would shadow it."""
        ...


class Kind:
    """How kiln.guards checks, orders and explains one :class:`GuardKind`.

    Subclass it, set the class attributes that differ from the defaults, implement
    :meth:`condition` and :meth:`explain`, and decorate the class with
    ``@register(GuardKind.X)``.
    """

    kind: ClassVar[GuardKind]
    """The kind this class handles (set by :func:`register`)."""
    rank: ClassVar[Rank]
    """Where its guards run in the check; within a rank, shallower sources first."""
    has_source: ClassVar[bool] = True
    """False for a kind about the process rather than a value of the frame (source None)."""
    reads_twice: ClassVar[bool] = False
    """Its condition names the source more than once: the source goes into a local first."""
    batched: ClassVar[bool] = False
    """All its guards join one ``and`` expression at the place of the first (no jump per
    guard: every tensor of a frame is checked in one test)."""
    reads_frame: ClassVar[bool] = False
    """A kind without a source whose guard still reads the call's values: :meth:`explain`
    then gets, as its value, a function reading a source in the call."""
    tests_type: ClassVar[bool] = False
    """Its condition compares ``type(value)`` with :meth:`known_type` itself."""
    stamp_protects: ClassVar[frozenset[Reach]] = frozenset()
    """The ways of hanging off module state (see :data:`Reach`) under which the module stamp
    sees every change that could make the guard fail: there it joins the tree's group."""

    def accepts(self, expected: Any) -> bool:
        """Whether ``expected`` is well formed for this kind (else the guard is refused)."""
        return True

    def known_type(self, expected: Any) -> type | None:
        """The exact type a value must have to pass, when the guard pins one."""
        return None

    def implied(self, guard: GuardSpec, others: Sequence[GuardSpec]) -> bool:
        """Whether ``others`` (the other guards on the same source) already check ``guard``."""
        return False

    def condition(self, out: Emitter, guard: GuardSpec, v: str) -> str:
        """The Python expression, true when ``guard`` holds for the value ``v`` names
        (``v`` is ``""`` for a kind without a source)."""
        raise NotImplementedError

    def explain(self, guard: GuardSpec, where: str, value: Any) -> str | None:
        """Why ``guard`` fails for ``value`` (its source's current value, named ``where``),
        in words; None when it holds. Mirrors :meth:`condition`."""
        raise NotImplementedError


KINDS: dict[GuardKind, Kind] = {}
"""Every kind kiln.guards checks (the modules of :mod:`kiln.guards.kinds` fill it)."""

_K = TypeVar("_K", bound=Kind)


def register(kind: GuardKind) -> Callable[[type[_K]], type[_K]]:
    """Class decorator: ``cls`` handles ``kind`` from now on."""

    def decorate(cls: type[_K]) -> type[_K]:
        if kind in KINDS:
            msg = f"guard kind {kind} is registered twice: {type(KINDS[kind]).__name__}, {cls.__name__}"
            raise ValueError(msg)
        cls.kind = kind
        KINDS[kind] = cls()
        return cls

    return decorate


def kind_of(kind: GuardKind) -> Kind:
    """The registered handling of ``kind``; :class:`UnsupportedGuard` when there is none."""
    found = KINDS.get(kind)
    if found is None:
        msg = f"kiln.guards has no check for guard kind {kind}"
        raise UnsupportedGuard(msg)
    return found
