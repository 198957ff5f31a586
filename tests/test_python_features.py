"""The Python features real libraries use, captured in one graph and equal to eager.

Each program runs under ``kiln.explain`` (graphs and breaks asserted), then through
``kiln.compile`` over several calls with fresh inputs, each result compared with eager's
(values, types, and the attributes of returned objects); a fallback to eager fails the test.
Sections: the attribute protocol of user classes (descriptors, properties, ``__getattr__``,
``__getattribute__``, ``__setattr__``, ``__slots__``, ``__dict__``); functools (``lru_cache``,
``cache``, ``partial``, ``reduce``); ModelOutput (a lookalike and transformers' own); builtin
types' subclasses (namedtuples, tuple, dict, OrderedDict, list and set subclasses through
``super()``, unbound calls and directly, with instance attributes; frame instances with their
own ``__getitem__``); inspect; dataclasses and enum; warnings, logging and the compiler
queries; contextlib.
"""

from __future__ import annotations

import collections
import contextlib
import copy
import dataclasses
import enum
import functools
import inspect
import logging
import typing
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch

import kiln
from kiln.capture import counters


@pytest.fixture(autouse=True)
def _fresh():
    kiln.reset()
    yield
    kiln.reset()


def assert_same(got: Any, want: Any) -> None:
    """Equal values and types; containers item by item, user objects attribute by attribute."""
    assert type(got) is type(want), (type(got), type(want))
    if isinstance(want, torch.Tensor):
        torch.testing.assert_close(got, want)
    elif isinstance(want, dict):
        assert list(got) == list(want)
        for k in want:
            assert_same(got[k], want[k])
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want)
        for a, b in zip(got, want, strict=True):
            assert_same(a, b)
    if isinstance(want, (int, float, str, bool, type(None), enum.Enum)):
        assert got == want
    if dataclasses.is_dataclass(want) or hasattr(want, "__dict__"):
        assert_same(dict(vars(got)), dict(vars(want)))
    for slot in getattr(type(want), "__slots__", ()):
        assert hasattr(got, slot) == hasattr(want, slot)
        if hasattr(want, slot):
            assert_same(getattr(got, slot), getattr(want, slot))


def differential(
    fn: Callable[..., Any],
    make_args: Callable[[], tuple[Any, ...]] = lambda: (torch.randn(4),),
    *,
    graphs: int = 1,
    breaks: int = 0,
    calls: int = 3,
) -> None:
    """``fn`` under explain has ``graphs`` graphs and ``breaks`` breaks, and compiled it
    matches eager over ``calls`` calls with fresh arguments, with no fallback to eager."""
    explained = kiln.explain(fn)(*make_args())
    reasons = [f"{b.kind}: {b.explanation}" for b in explained.breaks]
    assert (explained.graph_count, explained.graph_break_count) == (graphs, breaks), reasons
    kiln.reset()
    compiled = kiln.compile(fn, backend="eager")
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="kiln:")
        for _ in range(calls):
            args = make_args()
            assert_same(compiled(*args), fn(*args))
    assert counters.counters["stats"]["eager_fallbacks"] == 0


# the attribute protocol --------------------------------------------------------------------
class Doubling:
    """A data descriptor: ``__set_name__`` picks the backing slot, ``__set__`` transforms."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.slot = "_" + name

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        return self if obj is None else getattr(obj, self.slot, 1)

    def __set__(self, obj: Any, value: Any) -> None:
        setattr(obj, self.slot, value * 2)


class Five:
    """A non-data descriptor: an instance attribute of the same name hides it."""

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        return self if obj is None else 5


class Holder:
    scale = Doubling()
    five = Five()

    def __init__(self, x: torch.Tensor) -> None:
        self.x = x
        self.scale = 3  # through Doubling.__set__

    @property
    def shifted(self) -> torch.Tensor:
        return self.x + self._shift

    @shifted.setter
    def shifted(self, value: torch.Tensor) -> None:
        self._shift = value.sum()

    @property
    def read_only(self) -> int:
        return 1

    @functools.cached_property
    def expensive(self) -> torch.Tensor:
        self.computed = getattr(self, "computed", 0) + 1
        return self.x.cos()

    @classmethod
    def make(cls, x: torch.Tensor) -> Holder:
        return cls(x * 2)

    @staticmethod
    def helper(x: torch.Tensor) -> torch.Tensor:
        return x - 1


class Shadowed:
    five = Five()

    def __init__(self) -> None:
        self.five = 7  # a non-data descriptor loses to the instance's own attribute


def test_data_and_non_data_descriptors_on_new_objects():
    def fn(x):
        h = Holder(x)
        h.scale = h.scale + 1  # read 6, stored 14
        return x * h.scale, x * h.five, h._scale, x * Shadowed().five, type(Holder.five).__name__

    differential(fn)


def test_property_setter_and_read_only_property():
    def fn(x):
        h = Holder(x)
        h.shifted = x * 2
        try:
            h.read_only = 3
        except AttributeError:
            failed = True
        return h.shifted, failed

    differential(fn)


def test_cached_property_computes_once_and_is_returned_with_the_object():
    def fn(x):
        h = Holder(x)
        return h.expensive + h.expensive, h.computed, Holder.make(x).helper(x), h

    differential(fn)


class Config:
    """Settings read through ``__getattr__``, as configs and registries do."""

    def __init__(self, **values: Any) -> None:
        self.values = values

    def __getattr__(self, name: str) -> Any:
        try:
            return self.values[name]
        except KeyError:
            raise AttributeError(name) from None


class Counted:
    """``__getattribute__`` answers one name itself and defers the rest to ``object``'s."""

    def __init__(self) -> None:
        self.base = 2

    def __getattribute__(self, name: str) -> Any:
        if name == "magic":
            return 10
        return object.__getattribute__(self, name)


class Validating:
    """``__setattr__`` transforms every store, ``__init__``'s included."""

    def __init__(self, x: torch.Tensor) -> None:
        self.x = x
        self.n = 2

    def __setattr__(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value * 2 if isinstance(value, int) else value)


def test_getattr_getattribute_and_setattr_hooks():
    def fn(x):
        c = Config(width=3)
        v = Validating(x)
        v.m = 5
        k = Counted()
        return (
            x * c.width,
            hasattr(c, "depth"),
            getattr(c, "depth", 4),
            x * k.magic * k.base,
            x * v.n * v.m,
            v,
        )

    differential(fn)


class Point:
    __slots__ = ("a", "b")

    def __init__(self, a: torch.Tensor) -> None:
        self.a = a


def test_slots():
    def fn(x):
        p = Point(x)
        try:
            missing = p.b
        except AttributeError:
            missing = None
        p.b = x + 1
        return p.a * p.b, missing, hasattr(Point(x), "b"), p

    differential(fn)


GLOBAL_HOLDER = Holder(torch.ones(()))


def test_setters_of_a_frame_object_run_and_their_stores_replay():
    def fn(x):
        GLOBAL_HOLDER.scale = 4
        GLOBAL_HOLDER.shifted = x
        return x * GLOBAL_HOLDER.scale, GLOBAL_HOLDER.shifted

    differential(fn)
    assert GLOBAL_HOLDER._scale == 8


# functools ---------------------------------------------------------------------------------
@functools.lru_cache
def _widths(n: int) -> tuple[int, ...]:
    return tuple(range(1, n + 1))


@functools.cache
def _scale(n: int) -> float:
    return n / 2


@functools.lru_cache(maxsize=8)
def _doubled(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@functools.lru_cache
def _torch_major() -> int:
    # package metadata is beyond tracing: the cached result, a constant, is used
    import importlib.metadata

    return int(importlib.metadata.version("torch").split(".")[0])


_STATE = {"k": 1}


@functools.lru_cache
def _stateful(n: int) -> int:
    return n * _STATE["k"]


class Layer:
    @functools.lru_cache  # noqa: B019 (a cache on a method, as libraries write it)
    def shape(self, n: int) -> int:
        return n + 1


LAYER = Layer()


def test_lru_cache_and_cache_helpers_are_traced_through():
    def fn(x):
        return (
            x * sum(_widths(3)) * _scale(4),
            _doubled(x) + 1,
            x * LAYER.shape(2),
            x + _torch_major(),
        )

    differential(fn)


def test_lru_cache_helper_reading_state_follows_the_state():
    """Each call clears the cache: eager computes from the new state, and Kiln's guard, which
    calls the cached function again, sees the new answer and captures again."""

    def fn(x):
        return x * _stateful(3)

    compiled = kiln.compile(fn, backend="eager")
    for k in (1, 2, 2, 5):
        _STATE["k"] = k
        _stateful.cache_clear()
        x = torch.randn(3)
        assert_same(compiled(x), fn(x))
    _STATE["k"] = 1


def test_partial_and_reduce():
    def fn(x):
        mul = functools.partial(torch.mul, other=3)
        return (
            mul(x),
            functools.reduce(lambda a, b: a * b, [x, x, 2]),
            functools.reduce(max, [1, 5, 2]),
        )

    differential(fn)


# ModelOutput: an OrderedDict subclass that is a dataclass -------------------------------------
class OutputBase(collections.OrderedDict):
    """transformers' ModelOutput pattern, written out: fields that are not None are the items."""

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is not None:
                self[f.name] = value

    def __getitem__(self, k: Any) -> Any:
        return dict(self.items())[k] if isinstance(k, str) else self.to_tuple()[k]

    def __setitem__(self, key: str, value: Any) -> None:
        super().__setitem__(key, value)
        super().__setattr__(key, value)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self.keys() and value is not None:  # an older ModelOutput's rule
            super().__setitem__(name, value)
        super().__setattr__(name, value)

    def to_tuple(self) -> tuple[Any, ...]:
        return tuple(self[k] for k in self.keys())


@dataclasses.dataclass
class EncoderOutput(OutputBase):
    last: torch.Tensor | None = None
    hidden: tuple[torch.Tensor, ...] | None = None
    attn: torch.Tensor | None = None


def test_model_output_lookalike():
    def fn(x):
        o = EncoderOutput(last=x * 2, attn=x)
        o.attn = x + 1  # a key it has: item and attribute
        return o["last"] + o[1], o.last, o.attn, len(o), o.to_tuple(), list(o.keys()), o

    differential(fn)


def test_model_output_lookalike_store_that_splits_item_and_attribute():
    """Under this ``__setattr__`` a new field is an attribute only: the lookalike's own code is
    traced (it is not transformers' ModelOutput), keeping item and attribute apart."""

    def fn(x):
        o = EncoderOutput(last=x)
        o.hidden = (x,)
        return o.to_tuple(), o.hidden, len(o)

    differential(fn, graphs=0, breaks=0)


def test_transformers_model_output():
    from transformers.modeling_outputs import BaseModelOutput

    def fn(x):
        o = BaseModelOutput(last_hidden_state=x * 2)
        o.hidden_states = (x, x + 1)  # transformers' __setattr__ adds a field as an item
        o.attentions = None  # neither an item nor a break
        from_dict = BaseModelOutput({"last_hidden_state": x})  # __post_init__ unpacks a mapping
        return (
            o[0] + o.last_hidden_state + o["last_hidden_state"],
            o.to_tuple(),
            "hidden_states" in o,
            o.get("attentions"),
            from_dict.last_hidden_state + 1,
            len(from_dict),
            o,
        )

    differential(fn)


# builtin types' subclasses -----------------------------------------------------------------
class Span(typing.NamedTuple):
    start: torch.Tensor
    width: int = 3

    def end(self) -> torch.Tensor:
        return self.start + self.width


class Pair(collections.namedtuple("Pair", "a b")):
    __slots__ = ()

    def total(self) -> Any:
        return self.a + self.b


def test_namedtuple_methods_replace_make_and_asdict():
    def fn(x):
        s = Span(x)
        t = s._replace(width=5)
        p = Pair._make([x, 2])
        return s.end(), t.end(), t, s._asdict()["width"], p.total(), p._replace(b=x).total(), p

    differential(fn)


class Interval(tuple):
    """A tuple subclass with its own ``__new__`` and methods."""

    def __new__(cls, lo: Any, hi: Any) -> Interval:
        return super().__new__(cls, (lo, hi))

    def length(self) -> Any:
        return self[1] - self[0]


class Row(tuple):
    def first(self) -> Any:
        return super().__getitem__(0)


def test_tuple_subclasses():
    def fn(x):
        i = Interval(x, x * 3)
        r = Row((x, 2))
        return i.length(), len(i), i[1], i, r.first() + 1, r

    differential(fn)


class Base:
    @classmethod
    def name(cls) -> str:
        return cls.__name__

    @classmethod
    def scaled(cls, x: torch.Tensor) -> torch.Tensor:
        return x * len(cls.__name__)


class Derived(Base):
    def describe(self) -> str:
        return super().name()

    @classmethod
    def scaled(cls, x: torch.Tensor) -> torch.Tensor:
        return super().scaled(x) + 1


class Leaf(Derived):
    pass


def test_super_reaches_classmethods_bound_to_the_class_read_through():
    def fn(x):
        return Leaf.scaled(x), Leaf().describe(), Derived().describe()

    differential(fn)


# inspect -----------------------------------------------------------------------------------
def _signature_target(a: Any, b: int, c: int = 1, *rest: Any, key: str = "k") -> Any:
    return a


def test_inspect_signature_parameters_and_predicates():
    """``"mask" in inspect.signature(f).parameters``: libraries pick arguments this way."""

    def fn(x):
        params = inspect.signature(_signature_target).parameters
        return (
            x * params["c"].default,
            "b" in params,
            "missing" in params,
            list(params),
            len(params),
            [p.kind == inspect.Parameter.VAR_POSITIONAL for p in params.values()],
            params.get("key").default,
            "input" in inspect.signature(torch.nn.Linear.forward).parameters,
            inspect.isclass(Holder),
            inspect.isfunction(_signature_target),
            inspect.ismethod(LAYER.shape),
        )

    differential(fn)


# dataclasses and enum ----------------------------------------------------------------------
@dataclasses.dataclass
class Batch:
    x: torch.Tensor
    scale: int = 2
    tags: list[int] = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        self.tags.append(self.scale)


@dataclasses.dataclass(frozen=True)
class Frozen:
    x: torch.Tensor
    n: int = 3


def test_dataclasses_fields_replace_asdict_astuple():
    def fn(x):
        b = Batch(x)
        c = dataclasses.replace(b, scale=5)
        return (
            b.x * b.scale,
            c.x * c.scale,
            c.tags,
            [f.name for f in dataclasses.fields(b)],
            dataclasses.is_dataclass(b),
            dataclasses.asdict(b)["x"] + 1,
            dataclasses.astuple(c)[0] * 2,
            b,
        )

    differential(fn)


def test_frozen_dataclass():
    def fn(x):
        f = Frozen(x)
        try:
            f.n = 4
        except dataclasses.FrozenInstanceError:
            frozen = True
        return f.x * f.n, dataclasses.replace(f, n=5).n * x, frozen, f

    differential(fn)


class Color(enum.Enum):
    RED = 1
    GREEN = 2


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 3


class Mode(enum.Flag):
    READ = enum.auto()
    WRITE = enum.auto()


class Kind(str, enum.Enum):  # noqa: UP042 (as transformers writes its enums)
    DENSE = "dense"
    SPARSE = "sparse"


def test_enum_members_lookup_iteration_and_flags():
    def fn(x):
        rw = Mode.READ | Mode.WRITE
        return (
            x * Color.GREEN.value,
            Color(2) is Color.GREEN,
            Color["RED"].name,
            [c.name for c in Color],
            len(Color),
            Color.RED in Color,
            x * Level.HIGH + Level.LOW,
            Level(3) is Level.HIGH,
            Mode.WRITE in rw,
            bool(rw & Mode.READ),
            Kind("dense") is Kind.DENSE,
            Kind.SPARSE == "sparse",
            {Color.RED: 1}[Color.RED],
        )

    differential(fn)


# warnings, logging and the compiler queries ------------------------------------------------
_log = logging.getLogger("kiln.tests.python_features")


def _warns(x: torch.Tensor) -> torch.Tensor:
    warnings.warn("deprecated helper", DeprecationWarning, stacklevel=2)
    return x + 1


def test_warnings_and_logging_are_replayed_at_the_users_line(caplog):
    """No break; each call warns and logs once, naming the same file and line as eager."""

    def fn(x):
        warnings.warn(f"width {x.shape[0]}")
        _log.warning("scaled by %d", 3)
        _log.debug("not shown at this level %s", x.shape)
        return _warns(x) * 2

    differential(fn, calls=1)

    def run(f):
        caplog.clear()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            f(torch.randn(4))
        seen = [(w.category, str(w.message), w.filename, w.lineno) for w in caught]
        logged = [(r.getMessage(), r.pathname, r.lineno, r.funcName) for r in caplog.records]
        return seen, logged

    caplog.set_level(logging.INFO, logger=_log.name)
    kiln.reset()
    compiled = kiln.compile(fn, backend="eager")
    assert run(compiled) == run(fn)
    assert run(compiled) == run(fn)


def test_transformers_warning_once_does_not_break():
    from transformers.utils import logging as hf_logging

    logger = hf_logging.get_logger("transformers.kiln_tests")

    def fn(x):
        logger.warning_once("this argument is deprecated")
        return x + 1

    differential(fn)


def test_compiler_and_jit_queries():
    """Under Kiln, as under torch.compile, ``is_compiling`` is True; scripting and tracing
    are not happening."""

    def fn(x):
        return (
            x + 1 if torch.compiler.is_compiling() else x,
            torch.compiler.is_dynamo_compiling(),
            torch.compiler.is_exporting(),
            torch.jit.is_scripting(),
            torch.jit.is_tracing(),
            torch._C._get_tracing_state() is None,
        )

    explained = kiln.explain(fn)(torch.randn(4))
    assert (explained.graph_count, explained.graph_break_count) == (1, 0)
    x = torch.randn(4)
    got = kiln.compile(fn, backend="eager")(x)
    torch.testing.assert_close(got[0], x + 1)
    assert got[1:] == (True, False, False, False, True)


class Registry(dict):
    """Overrides reached through ``super()`` (zero- and two-argument) and unbound calls."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super(Registry, self).__init__(*args, **kwargs)  # noqa: UP008 (the two-argument form)

    def __getitem__(self, key: str) -> Any:
        return dict.__getitem__(self, key) * 2

    def __contains__(self, key: object) -> bool:
        return key != "hidden" and super().__contains__(key)

    def __iter__(self) -> Any:
        return iter(sorted(super().keys()))

    def __len__(self) -> int:
        return super().__len__() + 100

    def update(self, *args: Any, **kwargs: Any) -> None:
        super().update(*args, **kwargs)

    def setdefault(self, key: str, default: Any = None) -> Any:
        return super().setdefault(key, default)

    def pop(self, key: str, *default: Any) -> Any:
        return super().pop(key, *default)


class Ordered(collections.OrderedDict):
    def __setitem__(self, key: str, value: Any) -> None:
        super().__setitem__(key, value + 1)


class Doubled(list):
    def append(self, value: Any) -> None:
        super().append(value * 2)

    def __iter__(self) -> Any:
        return iter(list(super().__iter__())[::-1])


class Lower(set):
    def add(self, item: str) -> None:
        super().add(item.lower())


def test_dict_list_and_set_subclass_methods():
    def fn(x):
        r = Registry(b=x, a=x + 1)
        r.update(c=2)
        kept = r.setdefault("d", 4)
        popped = r.pop("c")
        o = Ordered()
        o["k"] = x
        o["j"] = 2
        o["i"] = 3
        o.move_to_end("k")
        first = o.popitem(last=False)
        d = Doubled([x])
        d.append(x)
        d.sort(key=lambda t: 0)  # a stable sort on equal keys keeps the order
        nums = Doubled([3, 1, 2])
        nums.sort(reverse=True)
        s = Lower()
        s.add("A")
        return (
            r["a"],
            "a" in r,
            "hidden" in r,
            list(r),
            len(r),
            kept,
            popped,
            list(r.items())[0][1],
            list(o),
            first,
            [t for t in d],
            nums,
            "a" in s,
            r,
            o,
        )

    differential(fn)


class Instantiating(collections.OrderedDict):
    """transformers' ``ClassInstantier``: reading a key builds a new object from the entry."""

    def __getitem__(self, key: str) -> Any:
        content = super().__getitem__(key)
        cls, kwargs = content if isinstance(content, tuple) else (content, {})
        return cls(**kwargs)


ACTIVATIONS = Instantiating(gelu=torch.nn.GELU, tanh_gelu=(torch.nn.GELU, {"approximate": "tanh"}))


class Shifted(list):
    def __getitem__(self, i: int) -> Any:
        return super().__getitem__(i) + 1


SHIFTED = Shifted([1, 2, 3])


def test_frame_subclass_instances_read_past_their_getitem():
    """Guards and reloads read the items with dict's or list's own ``__getitem__``."""

    def fn(x):
        return ACTIVATIONS["gelu"](x), ACTIVATIONS["tanh_gelu"](x), x * SHIFTED[0], len(SHIFTED)

    differential(fn)
    compiled = kiln.compile(fn, backend="eager")
    x = torch.randn(4)
    compiled(x)
    SHIFTED.append(4)  # a new length: captured again, still equal
    ACTIVATIONS["gelu"] = torch.nn.SiLU  # a new entry under the same key
    try:
        assert_same(compiled(x), fn(x))
    finally:
        SHIFTED.pop()
        ACTIVATIONS["gelu"] = torch.nn.GELU


class Tagged(dict):
    """A dict subclass with instance attributes, set in ``__init__`` and later."""

    def __init__(self, name: str, **items: Any) -> None:
        super().__init__(**items)
        self.name = name
        self.scale = items.get("x")


class AttrDict(dict):
    """Attribute access as item access, as config containers do."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def __setattr__(self, name: str, value: Any) -> None:
        self[name] = value


class Trail(list):
    def __init__(self, items: Any) -> None:
        super().__init__(items)
        self.count = len(items)


def test_instance_attributes_of_container_subclasses():
    def fn(x):
        t = Tagged("t", x=x, y=2)
        t.extra = x * 3
        a = AttrDict(w=x)
        a.v = x + 1
        tr = Trail([x, x * 2])
        tr.last = tr[-1]
        c = copy.copy(t)
        return (
            t.scale * t["y"] + t.extra,
            t.name,
            a.w * a.v,
            "v" in a,
            hasattr(a, "missing"),
            tr.count,
            tr.last,
            c.extra,
            type(t.copy()),
            t,
            a,
            tr,
        )

    differential(fn)


# contextlib --------------------------------------------------------------------------------
@contextlib.contextmanager
def _shifted(x: torch.Tensor) -> Any:
    try:
        yield x + 1
    finally:
        _log.debug("left the block")


def test_contextlib_managers():
    def fn(x):
        with _shifted(x) as y:
            a = y * 2
        with contextlib.nullcontext(x) as z:
            b = z - 1
        with contextlib.suppress(KeyError):
            b = b + 1
            {}["missing"]
        return a, b

    differential(fn)


class Options:
    """Settings kept in the instance dict and read back through it, as configs do."""

    def __init__(self, **values: Any) -> None:
        self.__dict__.update(values)
        self.__dict__["frozen"] = False


def test_instance_dict_of_new_objects_is_live():
    def fn(x):
        o = Options(scale=2, name="o")
        d = vars(o)
        o.extra = 3  # seen through the dict read before
        d["late"] = x  # seen as an attribute
        return x * o.scale * d["extra"], o.late + 1, "name" in o.__dict__, sorted(d), o

    differential(fn)


def test_torch_distribution_made_in_forward():
    """``Distribution.__init__`` checks its parameters in ``self.__dict__``."""

    def fn(x):
        normal = torch.distributions.Normal(x, torch.ones_like(x), validate_args=False)
        return normal.mean * 2, normal.stddev + 1

    differential(fn)


class Scaled(torch.nn.Module):
    """A module without state, built in ``forward`` from constants."""

    def __init__(self, factor: float) -> None:
        super().__init__()
        self.factor = factor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.factor


class Noisy(torch.nn.Module):
    """Holds a random tensor drawn when built: each eager call builds a new one."""

    def __init__(self) -> None:
        super().__init__()
        self.noise = torch.randn(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.noise


def test_modules_without_state_built_in_forward():
    from transformers.activations import ACT2FN

    def fn(x):
        return ACT2FN["gelu"](x), ACT2FN["silu"](x), Scaled(2.0)(x), torch.nn.ReLU()(x)

    differential(fn)


def test_module_holding_a_random_tensor_is_built_by_python():
    def fn(x):
        return Noisy()(x * 2)

    explained = kiln.explain(fn)(torch.randn(4))
    assert explained.graph_break_count == 1
    compiled = kiln.compile(fn, backend="eager")
    x = torch.randn(4)
    torch.manual_seed(0)
    got = compiled(x)
    torch.manual_seed(0)
    torch.testing.assert_close(got, fn(x))


_ANNOTATED = """
import collections.abc, typing, torch

def annotated(x):
    def pick(
        x: torch.Tensor,
        is_leaf: collections.abc.Callable[[int], bool] | None = None,
        y: typing.Optional[int] | str = None,
        z: int | None = None,
    ) -> torch.Tensor | None:
        return x.sin()

    return pick(x) * 2
"""


def test_union_annotations_of_a_nested_def_fold() -> None:
    """A nested ``def`` evaluates its annotations where it runs (torch's pytree helpers, as
    vmap's internals define them: ``is_leaf: Callable[[PyTree], bool] | None``); the unions
    of classes and typing forms fold instead of breaking the graph."""
    namespace: dict[str, Any] = {}
    exec(compile(_ANNOTATED, "<annotated>", "exec"), namespace)  # no postponed annotations
    differential(namespace["annotated"])
