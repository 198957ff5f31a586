"""Cache entries per code object, newest first, and the recompile limit.

The hot path is :meth:`CodeCache.lookup`: call each entry's generated check with the
frame's own arguments until one passes. A miss returns None and the caller
captures and :meth:`~CodeCache.insert`\\ s; each insert after the first is a
recompile, logged on ``kiln.guards.recompiles`` with the guard that failed. Past
the limit, counted per module object (:meth:`~CodeCache.over_limit`), the caller runs
the frame eagerly, warned once (:meth:`~CodeCache.warn_limit_once`) or raising
(:meth:`~CodeCache.raise_limit_error`).

Threads: lookups read an immutable tuple of checks, so they never lock. Callers that miss hold
:attr:`CodeCache.lock` while they compile and insert, and look again under it when
:attr:`CodeCache.version` moved since their miss, so threads that miss together on one input
install one entry, and the entry count toward the limit counts real recompiles only.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import sys
import threading
import types
import warnings
import weakref
from collections.abc import Callable
from typing import Any

from kiln.capture import counters
from kiln.capture.user_words import frame_label
from kiln.guards.check import GuardCheck
from kiln.guards.config import config
from kiln.guards.errors import RecompileLimitExceeded

__all__ = ["CacheEntry", "CodeCache", "cache_for", "reset"]

recompiles_log = logging.getLogger("kiln.guards.recompiles")


@dataclasses.dataclass(eq=False)
class CacheEntry:
    """A compiled artifact and the check that says when it may run."""

    check: GuardCheck
    fn: Callable[..., Any]

    @property
    def guard_source(self) -> str:
        """The generated check, as Python source."""
        return self.check.source


class CodeCache:
    """The entries of one code object, newest first."""

    def __init__(self, code: types.CodeType, keep: tuple[Any, ...] = ()) -> None:
        self.code = code
        self.keep = keep  # objects the owner needs alive while the cache lives
        self.entries: list[CacheEntry] = []
        self._checks: tuple[tuple[Callable[..., bool], CacheEntry], ...] = ()
        self._pending_reason: str | None = None
        self._warned = False
        self.lock = threading.RLock()
        """Held while compiling an entry; re-entrant, since a frame's compile or eager run
        may call the same code again on the same thread."""
        self.version = 0
        """Bumped by every change of the entries: a miss is stale once it moved."""

    @property
    def name(self) -> str:
        return frame_label(self.code)  # the user's function, file:line and source text

    def lookup(self, *args: Any, **kwargs: Any) -> CacheEntry | None:
        """The newest entry whose guards pass for this call, or None (capture, then insert)."""
        if config.skip_guards and self.entries:
            return self.entries[0]  # unsafe by request: inputs are promised not to change
        for check, entry in self._checks:
            if check(*args, **kwargs):
                return entry
        if self._checks:
            counters.bump("guards", "misses")
            if recompiles_log.isEnabledFor(logging.DEBUG):
                self._pending_reason = self._reasons(args, kwargs, users_words=True)
            elif recompiles_log.isEnabledFor(logging.INFO):
                self._pending_reason = self._newest_reason(args, kwargs)
        return None

    def insert(
        self, check: GuardCheck, fn: Callable[..., Any], *, passes_through: bool = False
    ) -> CacheEntry:
        """Add a new newest entry; an insert into a non-empty cache is a recompile.

        ``passes_through``: the entry runs no graph, only a callee compiled and guarded on
        its own, whose recompile is the one the user sees; this one is logged at debug level
        and counted apart (``pass_through_recompiles``), so one recompile counts once.
        """
        entry = CacheEntry(check, fn)
        check.on_death.append(functools.partial(_drop, weakref.ref(self), weakref.ref(entry)))
        if self.entries:
            counters.bump("guards", "pass_through_recompiles" if passes_through else "recompiles")
            if self._pending_reason is not None:
                recompiles_log.log(
                    logging.DEBUG if passes_through else logging.INFO,
                    "recompiling %s (entry %d): %s",
                    self.name,
                    len(self.entries) + 1,
                    self._pending_reason,
                )
        self._pending_reason = None
        self.entries.insert(0, entry)
        self._checks = tuple((e.check.fn, e) for e in self.entries)
        self.version += 1
        return entry

    def drop(self, entry: CacheEntry) -> None:
        """Forget ``entry``: an object its check compares by identity died, so it can never
        pass, and its artifacts need not live on."""
        if any(e is entry for e in self.entries):
            self.entries = [e for e in self.entries if e is not entry]
            self._checks = tuple((e.check.fn, e) for e in self.entries)

    def failure_reason(self, *args: Any, **kwargs: Any) -> str | None:
        """Why no entry matches this call (the first failing guard of each), or None if one does."""
        return self._reasons(args, kwargs)

    def _reasons(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], *, users_words: bool = False
    ) -> str | None:
        if not self.entries:
            return "no compiled entries yet"
        reasons = []
        for i, entry in enumerate(self.entries):
            reason = entry.check.first_failure(args, kwargs, users_words=users_words)
            if reason is None:
                return None
            reasons.append(reason if len(self.entries) == 1 else f"entry {i}: {reason}")
        return "; ".join(reasons)

    def over_limit(
        self,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
        limit: int | None = None,
    ) -> bool:
        """Whether this call may not compile another entry.

        ``limit`` (default ``config.recompile_limit``) bounds the entries for the call's own
        modules (:meth:`GuardCheck.same_modules`): the layers of a loop that breaks in every
        iteration each get theirs, as Dynamo counts entries per module object.
        ``config.accumulated_recompile_limit`` bounds all of them.
        """
        limit = config.recompile_limit if limit is None else limit
        if len(self.entries) >= config.accumulated_recompile_limit:
            return True
        if len(self.entries) < limit:
            return False  # too few to reach it, whichever modules they are for
        return len(self._entries_for(args, kwargs or {})) >= limit

    def _entries_for(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[CacheEntry]:
        """The entries for the call's own modules (the arguments are bound once for all)."""
        if not self.entries:
            return []
        try:
            f_locals: dict[str, Any] | None = self.entries[0].check.bind(args, kwargs)
        except TypeError:
            f_locals = None
        return [e for e in self.entries if e.check.same_modules(f_locals)]

    def _newest_reason(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        """Why the newest entry failed, and how many older ones did too (all, on a miss)."""
        first = self.entries[0].check.first_failure if self.entries else None
        newest = first(args, kwargs, users_words=True) if first is not None else None
        older = len(self.entries) - 1
        more = f" (and {older} older entries)" if older > 0 else ""
        return f"{newest or 'unknown'}{more}"

    def _limit_message(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        """Why the newest entry for the call's own modules fails."""
        newest = (self._entries_for(args, kwargs) or self.entries)[:1]
        reason = newest[0].check.first_failure(args, kwargs, users_words=True) if newest else None
        return reason or "unknown"

    def warn_limit_once(self, *args: Any, **kwargs: Any) -> bool:
        """Warn, the first time only, that this code now runs eagerly, naming the failing guard.

        True when it warned: the first call of this code that runs eagerly for the limit.
        """
        counters.bump("guards", "limit_eager_runs")
        if self._warned:
            return False
        self._warned = True
        reason = self._limit_message(args, kwargs)
        msg = (
            f"kiln: {self.name} hit the recompile limit ({len(self._entries_for(args, kwargs))} "
            f"entries for these modules, {len(self.entries)} in all); calls that "
            f"match no entry now run eagerly. The guard that keeps failing: {reason}. "
            f"Raise kiln.guards.config.recompile_limit or make that value stable."
        )
        recompiles_log.info("%s", msg)
        warnings.warn(msg, RuntimeWarning, stacklevel=_user_stacklevel())
        return True

    def raise_limit_error(self, *args: Any, **kwargs: Any) -> None:
        """Raise :class:`RecompileLimitExceeded` naming the failing guard."""
        raise RecompileLimitExceeded(
            self.name, len(self.entries), self._limit_message(args, kwargs)
        )

    def clear(self) -> None:
        self.entries.clear()
        self._checks = ()
        self._pending_reason = None
        self._warned = False
        self.version += 1


def _drop(cache: weakref.ref[CodeCache], entry: weakref.ref[CacheEntry]) -> None:
    live_cache, live_entry = cache(), entry()
    if live_cache is not None and live_entry is not None:
        live_cache.drop(live_entry)


def _user_stacklevel() -> int:
    """The ``stacklevel`` that points a warning at the first caller outside Kiln."""
    frame = sys._getframe(2)  # the caller of warn_limit_once
    level = 2  # as counted from warn_limit_once
    while frame is not None and frame.f_globals.get("__name__", "").startswith("kiln."):
        frame = frame.f_back  # type: ignore[assignment]
        level += 1
    return level


_caches: dict[types.CodeType, CodeCache] = {}


def cache_for(code: types.CodeType) -> CodeCache:
    """The cache of ``code`` (created empty on first use)."""
    cache = _caches.get(code)
    if cache is None:
        cache = _caches[code] = CodeCache(code)
    return cache


def reset() -> None:
    """Drop every cache entry of every code object."""
    for cache in _caches.values():
        cache.clear()
    _caches.clear()
