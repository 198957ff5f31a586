"""``itertools`` over tracked values.

Libraries reach these through small helpers (torch's ``_pair(x)`` is ``tuple(repeat(x, 2))``).
Each builds one of the iterators of :mod:`kiln.capture.values.iterators`, which read their
arguments lazily as Python's do; ``product`` and the combinatoric ones read their iterables
whole when made, as CPython does, so they are item lists. Arguments Python checks when the
iterator is made (counts, ``islice`` bounds) are checked by the real function on empty input,
so a bad one raises what Python raises. :mod:`kiln.capture.builtin_calls` dispatches to
:data:`HANDLERS`.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kiln.capture import dispatch, literals
from kiln.capture.breaks.reasons import raised, unsupported
from kiln.capture.values.base import ConstantValue, Value
from kiln.capture.values.containers import TupleValue
from kiln.capture.values.iterators import (
    AccumulateIterator,
    BatchedIterator,
    ChainIterator,
    CompressIterator,
    CountIterator,
    CycleIterator,
    IsliceIterator,
    ItemsIterator,
    MapIterator,
    PairwiseIterator,
    RepeatIterator,
    StarmapIterator,
    WhileIterator,
    ZipLongestIterator,
)
from kiln.capture.values.objects import ObjectValue

if TYPE_CHECKING:
    from kiln.capture.tracer import Tracer

__all__ = ["HANDLERS"]

Handler = Callable[["Tracer", list[Value], dict[str, Value]], Value]
HANDLERS: dict[Any, Handler] = {}


def _handles(obj: Any) -> Callable[[Handler], Handler]:
    def register(fn: Handler) -> Handler:
        HANDLERS[obj] = fn
        return fn

    return register


def _constants(fn: Any, args: list[Value], kwargs: dict[str, Value]) -> list[Any]:
    """The plain values of arguments Python checks at construction, checked as Python does."""
    if not all(literals.is_literal(a) for a in [*args, *kwargs.values()]):
        raise unsupported("unsupported_call", f"itertools.{fn.__name__} of non-constant counts")
    plain = [literals.literal(a) for a in args]
    try:
        fn((), *plain, **{k: literals.literal(v) for k, v in kwargs.items()})
    except (TypeError, ValueError) as e:
        raise raised(e) from e
    return plain


@_handles(itertools.repeat)
def _repeat(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
    obj, rest = (args[0], args[1:]) if args else (kwargs.pop("object"), [])
    times = rest[0] if rest else kwargs.get("times")
    if times is None:
        return RepeatIterator(obj, None)
    n = times.as_constant()
    try:
        itertools.repeat(None, n)
    except TypeError as e:
        raise raised(e) from e
    return RepeatIterator(obj, max(n, 0))


@_handles(itertools.count)
def _count(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
    plain = [literals.literal(a) for a in args if literals.is_literal(a)]
    named = {k: literals.literal(v) for k, v in kwargs.items() if literals.is_literal(v)}
    if len(plain) != len(args) or len(named) != len(kwargs):
        raise unsupported("unsupported_call", "itertools.count of values that are not constants")
    try:
        itertools.count(*plain, **named)
    except TypeError as e:
        raise raised(e) from e
    start = plain[0] if plain else named.get("start", 0)
    step = plain[1] if len(plain) > 1 else named.get("step", 1)
    return CountIterator(start, step)


@_handles(itertools.cycle)
def _cycle(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
    return CycleIterator(dispatch.iterate(tr, args[0]))


@_handles(itertools.chain)
def _chain(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
    return ChainIterator([dispatch.iterate(tr, a) for a in args])


@_handles(itertools.chain.from_iterable)
def _chain_from_iterable(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
    return ChainIterator([], dispatch.iterate(tr, args[0]), lambda v: dispatch.iterate(tr, v))


@_handles(itertools.islice)
def _islice(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
    bounds = _constants(itertools.islice, args[1:], kwargs)
    s = slice(*bounds)
    start, step = s.start or 0, 1 if s.step is None else s.step
    return IsliceIterator(dispatch.iterate(tr, args[0]), start, s.stop, step)


@_handles(itertools.accumulate)
def _accumulate(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
    func = args[1] if len(args) > 1 else kwargs.get("func", ConstantValue(None))
    if isinstance(func, ConstantValue) and func.is_none():
        func = ObjectValue(operator.add)
    initial = kwargs.get("initial")
    if isinstance(initial, ConstantValue) and initial.is_none():
        initial = None
    return AccumulateIterator(dispatch.iterate(tr, args[0]), func, initial)


@_handles(itertools.pairwise)
def _pairwise(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
    return PairwiseIterator(dispatch.iterate(tr, args[0]))


@_handles(itertools.zip_longest)
def _zip_longest(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
    fill = kwargs.get("fillvalue", ConstantValue(None))
    return ZipLongestIterator([dispatch.iterate(tr, a) for a in args], fill)


@_handles(itertools.compress)
def _compress(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
    data = args[0] if args else kwargs["data"]
    selectors = args[1] if len(args) > 1 else kwargs["selectors"]
    return CompressIterator(dispatch.iterate(tr, data), dispatch.iterate(tr, selectors))


def _while_handler(take: bool) -> Handler:
    def handler(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
        return WhileIterator(args[0], dispatch.iterate(tr, args[1]), take)

    return handler


HANDLERS[itertools.takewhile] = _while_handler(True)
HANDLERS[itertools.dropwhile] = _while_handler(False)


@_handles(itertools.filterfalse)
def _filterfalse(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
    fn = None if isinstance(args[0], ConstantValue) and args[0].is_none() else args[0]
    return MapIterator(fn, [dispatch.iterate(tr, args[1])], keep=True, invert=True)


@_handles(itertools.starmap)
def _starmap(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
    return StarmapIterator(args[0], dispatch.iterate(tr, args[1]), ObjectValue(tuple))


_BATCHED = getattr(itertools, "batched", None)  # Python 3.12


def _batched(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
    (n,) = _constants(_BATCHED, args[1:], kwargs)
    return BatchedIterator(dispatch.iterate(tr, args[0]), n)


if _BATCHED is not None:
    HANDLERS[_BATCHED] = _batched


@_handles(itertools.product)
def _product(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
    named = {k: v.as_constant() for k, v in kwargs.items()}
    pools = [dispatch.unpack_iterable(tr, a) for a in args]
    try:
        combos = list(itertools.product(*pools, **named))
    except (TypeError, ValueError) as e:
        raise raised(e) from e
    return ItemsIterator([TupleValue(list(p)) for p in combos])


def _combinatoric_handler(fn: Callable[..., Any]) -> Handler:
    """``combinations``, ``permutations`` and ``combinations_with_replacement``: the pool is
    read whole when the iterator is made, and the tuples are picked by position."""

    def handler(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
        rest = _constants(fn, args[1:], kwargs)
        named = {k: literals.literal(v) for k, v in kwargs.items()}
        pool = dispatch.unpack_iterable(tr, args[0])
        picks = fn(range(len(pool)), *rest, **named)
        return ItemsIterator([TupleValue([pool[i] for i in p]) for p in picks])

    return handler


for _fn in (
    itertools.combinations,
    itertools.permutations,
    itertools.combinations_with_replacement,
):
    HANDLERS[_fn] = _combinatoric_handler(_fn)
