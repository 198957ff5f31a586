"""Sources: where a value captured from the frame can be loaded from again.

A source is a frozen dataclass that prints as an expression over the frame:
``L['x']`` (a local or argument), ``G['torch']`` (a global of the function's
module), ``C['scale']`` (a free variable's cell contents),
``L['self'].layers[0].weight``. Guards are generated from sources, capture
reloads values from them in emitted bytecode, and error messages print them.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

__all__ = [
    "Source",
    "LocalSource",
    "GlobalSource",
    "ClosureSource",
    "AttrSource",
    "ItemSource",
    "RawItemSource",
    "DefaultSource",
    "SizeSource",
    "StrideSource",
    "WeakRefCallSource",
    "MODULE_STORES",
    "root_of",
]

# The dicts an ``nn.Module`` keeps its parameters, buffers and submodules in. Sources read
# module state through them (``L['self']._modules['fc']._parameters['weight']``): a dict
# lookup, where the attribute goes through the Python-level ``Module.__getattr__``.
MODULE_STORES = ("_parameters", "_buffers", "_modules")


@dataclasses.dataclass(frozen=True)
class Source:
    """Base of every source; subclasses define ``__str__`` and ``resolve``."""

    def resolve(
        self, f_locals: dict[str, Any], f_globals: dict[str, Any], cells: dict[str, Any]
    ) -> Any:
        """Evaluate this source against a frame's locals, globals and closure cells."""
        raise NotImplementedError

    def attr(self, name: str) -> AttrSource:
        return AttrSource(self, name)

    def item(self, index: Any) -> ItemSource:
        return ItemSource(self, index)


@dataclasses.dataclass(frozen=True)
class LocalSource(Source):
    """An argument or local variable of the captured frame."""

    name: str

    def __str__(self) -> str:
        return f"L[{self.name!r}]"

    def resolve(
        self, f_locals: dict[str, Any], f_globals: dict[str, Any], cells: dict[str, Any]
    ) -> Any:
        return f_locals[self.name]


@dataclasses.dataclass(frozen=True)
class GlobalSource(Source):
    """A global of the captured function's module (``fn.__globals__``)."""

    name: str

    def __str__(self) -> str:
        return f"G[{self.name!r}]"

    def resolve(
        self, f_locals: dict[str, Any], f_globals: dict[str, Any], cells: dict[str, Any]
    ) -> Any:
        if self.name in f_globals:
            return f_globals[self.name]
        builtins = f_globals.get("__builtins__", {})
        return builtins[self.name] if isinstance(builtins, dict) else getattr(builtins, self.name)


@dataclasses.dataclass(frozen=True)
class ClosureSource(Source):
    """The contents of a free variable's cell of the captured function."""

    name: str

    def __str__(self) -> str:
        return f"C[{self.name!r}]"

    def resolve(
        self, f_locals: dict[str, Any], f_globals: dict[str, Any], cells: dict[str, Any]
    ) -> Any:
        return cells[self.name].cell_contents


class _Link:
    """What ``AttrSource`` and ``ItemSource`` share: one step below their ``base``."""

    base: Source

    @functools.cached_property
    def depth(self) -> int:
        """How many attributes and items this chain reads below its first other source."""
        return self.base.depth + 1 if isinstance(self.base, _Link) else 1


@dataclasses.dataclass(frozen=True)
class AttrSource(_Link, Source):
    """``base.name``."""

    base: Source
    name: str

    def __str__(self) -> str:
        return self._text

    @functools.cached_property
    def _text(self) -> str:  # guards print a chain's prefixes many times: once each
        return f"{self.base}.{self.name}"

    def resolve(
        self, f_locals: dict[str, Any], f_globals: dict[str, Any], cells: dict[str, Any]
    ) -> Any:
        return getattr(self.base.resolve(f_locals, f_globals, cells), self.name)


@dataclasses.dataclass(frozen=True)
class ItemSource(_Link, Source):
    """``base[index]`` for a constant index (int, str, or other hashable)."""

    base: Source
    index: Any

    def __str__(self) -> str:
        return self._text

    @functools.cached_property
    def _text(self) -> str:  # guards print a chain's prefixes many times: once each
        return f"{self.base}[{self.index!r}]"

    def resolve(
        self, f_locals: dict[str, Any], f_globals: dict[str, Any], cells: dict[str, Any]
    ) -> Any:
        return self.base.resolve(f_locals, f_globals, cells)[self.index]


@dataclasses.dataclass(frozen=True)
class RawItemSource(Source):
    """``owner.__getitem__(base, index)``: an item of a dict, list or tuple subclass instance
    read past the subclass's own ``__getitem__`` (which may compute, or build something new)."""

    base: Source
    index: Any
    owner: type

    def __str__(self) -> str:
        return f"{self.owner.__name__}.__getitem__({self.base}, {self.index!r})"

    def resolve(
        self, f_locals: dict[str, Any], f_globals: dict[str, Any], cells: dict[str, Any]
    ) -> Any:
        getitem = vars(self.owner)["__getitem__"]
        return getitem(self.base.resolve(f_locals, f_globals, cells), self.index)


@dataclasses.dataclass(frozen=True)
class DefaultSource(Source):
    """A default value of the captured function's parameter ``name``."""

    fn: Source | None
    name: str
    kwonly: bool = False

    def __str__(self) -> str:
        owner = f"{self.fn}." if self.fn is not None else ""
        attr = "__kwdefaults__" if self.kwonly else "__defaults__"
        return f"{owner}{attr}[{self.name!r}]"

    def resolve(
        self, f_locals: dict[str, Any], f_globals: dict[str, Any], cells: dict[str, Any]
    ) -> Any:
        raise NotImplementedError("defaults are resolved by capture, which holds the function")


@dataclasses.dataclass(frozen=True)
class SizeSource(Source):
    """``base.size()[dim]``: one size of a tensor, the source of a shape symbol."""

    base: Source
    dim: int

    def __str__(self) -> str:
        return f"{self.base}.size()[{self.dim}]"

    def resolve(
        self, f_locals: dict[str, Any], f_globals: dict[str, Any], cells: dict[str, Any]
    ) -> Any:
        return self.base.resolve(f_locals, f_globals, cells).size()[self.dim]


@dataclasses.dataclass(frozen=True)
class StrideSource(Source):
    """``base.stride()[dim]``: one stride of a tensor, the source of a stride symbol."""

    base: Source
    dim: int

    def __str__(self) -> str:
        return f"{self.base}.stride()[{self.dim}]"

    def resolve(
        self, f_locals: dict[str, Any], f_globals: dict[str, Any], cells: dict[str, Any]
    ) -> Any:
        return self.base.resolve(f_locals, f_globals, cells).stride()[self.dim]


@dataclasses.dataclass(frozen=True)
class WeakRefCallSource(Source):
    """``base()``: the referent of the weak reference at ``base`` (None once it died)."""

    base: Source

    def __str__(self) -> str:
        return f"{self.base}()"

    def resolve(
        self, f_locals: dict[str, Any], f_globals: dict[str, Any], cells: dict[str, Any]
    ) -> Any:
        return self.base.resolve(f_locals, f_globals, cells)()


def root_of(source: Source) -> Source:
    """The local, global or closure source a chain of attributes and items starts from."""
    chained = (AttrSource, ItemSource, RawItemSource, SizeSource, StrideSource, WeakRefCallSource)
    while isinstance(source, chained):
        source = source.base
    return source
