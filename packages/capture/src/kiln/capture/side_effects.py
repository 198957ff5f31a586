"""Effects on the world outside the call, recorded during tracing and replayed after the graph.

Capture does not mutate real objects while tracing. A store to an attribute
of an object from the frame is kept here (later reads in the trace see it)
and the emitted code performs it after the graph has run, as eager code
would have. Containers from the frame that were mutated are written back
whole (``lst[:] = ...``, ``d.clear(); d.update(...)``). Logging, ``warnings.warn``
and ``print`` calls with constant arguments are made again, in order; a warning or a log
record names the user's line the capture saw it on (:func:`warn_at`, :func:`log_at`), as eager's
does, not the emitted code's.
"""

from __future__ import annotations

import logging
import warnings
from typing import Any

from kiln.capture.values.base import Value
from kiln.capture.values.containers import DictValue, ListValue

__all__ = ["SideEffects", "log_at", "warn_at"]


class SideEffects:
    """Attribute stores on real objects, and the frame's containers the trace mutated."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, tuple[Any, ...], dict[str, Any]]] = []
        self.version = 0  # bumped by every recorded effect (checkpoints compare it)
        self.attr_stores: dict[int, tuple[Value, dict[str, Value]]] = {}
        self.containers: list[ListValue | DictValue] = []
        self._wrapped: dict[int, tuple[Any, Value]] = {}
        # id(globals dict) -> (the dict, name -> value); last write wins
        self.global_stores: dict[int, tuple[dict[str, Any], dict[str, Value]]] = {}
        self.cell_stores: dict[int, tuple[Any, Value]] = {}  # id(real cell) -> (cell, value)

    def store_global(self, f_globals: dict[str, Any], name: str, value: Value) -> None:
        """``global name; name = value`` in the module whose namespace is ``f_globals``."""
        self.global_stores.setdefault(id(f_globals), (f_globals, {}))[1][name] = value
        self.version += 1

    def pending_global(self, f_globals: dict[str, Any], name: str) -> Value | None:
        entry = self.global_stores.get(id(f_globals))
        return entry[1].get(name) if entry is not None else None

    def store_cell(self, cell: Any, value: Value) -> None:
        """A write to a closure cell created outside the captured call."""
        self.cell_stores[id(cell)] = (cell, value)
        self.version += 1

    def record_call(self, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """A call with constant arguments (a log line, a warning) to make after the graph."""
        self.calls.append((fn, args, kwargs))
        self.version += 1

    def store_attr(self, target: Value, obj: Any, name: str, value: Value) -> None:
        entry = self.attr_stores.setdefault(id(obj), (target, {}))
        entry[1][name] = value
        self.version += 1

    def pending_attr(self, obj: Any, name: str) -> Value | None:
        entry = self.attr_stores.get(id(obj))
        return entry[1].get(name) if entry is not None else None

    def known(self, obj: Any) -> Value | None:
        """The value already standing for the real mutable object ``obj``, if any."""
        found = self._wrapped.get(id(obj))
        return found[1] if found is not None and found[0] is obj else None

    def remember(self, obj: Any, value: Value) -> None:
        self._wrapped[id(obj)] = (obj, value)
        if isinstance(value, (ListValue, DictValue)):
            self.containers.append(value)

    def mutated_containers(self) -> list[ListValue | DictValue]:
        return [c for c in self.containers if c.mutated]

    def describe(self) -> list[str]:
        out = [
            f"{target.source}.{name} = ..."
            for target, stores in self.attr_stores.values()
            for name in stores
        ]
        out.extend(f"global {n} = ..." for _, st in self.global_stores.values() for n in st)
        out.extend("closure cell = ..." for _ in self.cell_stores)
        out.extend(f"{c.source} mutated" for c in self.mutated_containers())
        out.extend(f"call {getattr(fn, '__qualname__', fn)!s}" for fn, _, _ in self.calls)
        return out


def warn_at(
    where: tuple[str, int, dict[str, Any]],
    message: Any,
    category: type[Warning] | None = None,
    stacklevel: int = 1,
    source: Any = None,
) -> None:
    """``warnings.warn`` reported at ``where`` (file, line, module globals), as the user's frame
    would report it: same text, filters, once-per-location registry."""
    filename, lineno, module_globals = where
    if isinstance(message, Warning):
        category = type(message)
    module = module_globals.get("__name__", "<string>")
    registry = module_globals.setdefault("__warningregistry__", {})
    warnings.warn_explicit(
        message, category or UserWarning, filename, lineno, module, registry, module_globals, source
    )


def log_at(
    logger: logging.Logger,
    level: int,
    where: tuple[str, int, str],
    msg: Any,
    *args: Any,
    extra: dict[str, Any] | None = None,
) -> None:
    """``logger.<level>(msg, *args)`` with the record's file, line and function the user's."""
    if logger.isEnabledFor(level):
        filename, lineno, func = where
        record = logger.makeRecord(
            logger.name, level, filename, lineno, msg, args, None, func, extra, None
        )
        logger.handle(record)
