"""``build_check``: guard records in, one compiled check function out (plus its explanation).

:class:`GuardCheck` holds the generated function (``fn``, what caches call), its
printable source, and the ordered guards it was made from, which
:meth:`GuardCheck.failure_reason` walks one at a time to say what failed.

Compiling a large model's check text is a visible part of a warm start (a process whose
graphs load from the whole-graph cache), and the text is the same in every process. So the
compiled code can be kept in a :class:`CodeStore` under a digest of the text, the name it is
compiled under and the interpreter: guards may not reach Kiln's disk caches (they live in
later layers), so the frontend sets :data:`code_store` to one backed by them. Stored bytes that
do not unmarshal to a code object compiled under that name are compiled again.
"""

from __future__ import annotations
import __future__

import dataclasses
import functools
import hashlib
import importlib.util
import inspect
import logging
import marshal
import sys
import types
import weakref
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch

from kiln.capture import artifacts, counters
from kiln.capture.binding import code_signature
from kiln.capture.guard_data import GuardKind, GuardSpec
from kiln.capture.source import LocalSource
from kiln.capture.user_words import user_expr
from kiln.guards import codegen, explain, frame, plan
from kiln.guards.errors import UnsupportedGuard
from kiln.guards.kinds import kind_of

__all__ = ["CodeStore", "GuardCheck", "build_check", "code_store"]

log = logging.getLogger(__name__)
guards_log = logging.getLogger("kiln.guards.guards")


class CodeStore(Protocol):
    """Compiled checks kept across processes: the bytes last stored under a key, or None."""

    def load(self, key: str) -> bytes | None: ...

    def store(self, key: str, data: bytes) -> None: ...


#: where compiled checks are kept (set by the frontend); None compiles every check
code_store: CodeStore | None = None
# what else decides compile()'s code object besides the text and the name: the future
# features a check is compiled with (given explicitly, not inherited from this module),
# the interpreter and its bytecode format, and -O
_FLAGS = __future__.annotations.compiler_flag
_COMPILER = repr(
    (sys.version, sys.implementation.cache_tag, importlib.util.MAGIC_NUMBER, marshal.version)
)
# a shorter text compiles faster than a disk store answers (0.3 us a character against
# about 0.15 ms a lookup, measured here)
_STORED_FROM = 1024


def _compile(text: str, filename: str) -> types.CodeType:
    """``text`` compiled under ``filename``: from :data:`code_store` when it holds it, else
    compiled (and stored). A store that fails or holds something else costs the compile."""
    store = code_store
    if store is None or len(text) < _STORED_FROM:
        return compile(text, filename, "exec", _FLAGS, dont_inherit=True)
    stamp = f"{_COMPILER}\0{sys.flags.optimize}\0{filename}\0{text}"
    key = hashlib.sha256(stamp.encode()).hexdigest()[:40]
    try:
        data = store.load(key)
        if data is not None:
            code = marshal.loads(data)
            if isinstance(code, types.CodeType) and code.co_filename == filename:
                return code
    except Exception as e:  # unreadable or not marshal data: compile it
        log.debug("stored check %s not used: %s: %s", key, type(e).__name__, e)
    code = compile(text, filename, "exec", _FLAGS, dont_inherit=True)
    try:
        store.store(key, marshal.dumps(code))
    except Exception as e:  # a full disk or a folder gone: the check still runs
        log.debug("check %s not stored: %s: %s", key, type(e).__name__, e)
    return code


def _target(fn: Callable[..., Any]) -> types.FunctionType:
    """The plain function whose signature the check takes (bound methods take ``self`` first)."""
    target = fn.__func__ if isinstance(fn, types.MethodType) else fn
    if not isinstance(target, types.FunctionType):
        msg = f"build_check needs a Python function, got {type(fn).__name__}: {fn!r}"
        raise UnsupportedGuard(msg)
    return target


class GuardCheck:
    """One cache entry's guards as a function: ``check(*args, **kwargs) -> bool``."""

    __slots__ = ("fn", "guards", "module_guards", "on_death", "signature", "source", "target")

    def __init__(
        self,
        fn: Callable[..., bool],
        source: str,
        guards: list[GuardSpec],
        target: types.FunctionType,
    ) -> None:
        self.fn = fn  # the generated function; caches call it directly
        self.source = source
        self.guards = guards  # in evaluation order, after dedup
        self.target = target
        self.signature = code_signature(target)
        # (source, id) of the modules matched by identity: MODULE_MATCH guards and the roots
        # of MODULE_TREE ones (which imply a MODULE_MATCH on their source)
        self.module_guards = [
            (g.source, _module_id(g))
            for g in guards
            if g.kind in (GuardKind.MODULE_MATCH, GuardKind.MODULE_TREE) and g.source
        ]
        # run when an object the check holds weakly dies: it can never pass again
        self.on_death: list[Callable[[], None]] = []

    def __call__(self, *args: Any, **kwargs: Any) -> bool:
        """Whether every guard holds; arguments that cannot bind raise TypeError as ``fn`` would."""
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<GuardCheck of {self.target.__qualname__}: {len(self.guards)} guards>"

    def bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        """The frame's arguments by name (defaults applied); TypeError if they do not fit."""
        bound = self.signature.bind(*args, **kwargs)
        bound.apply_defaults()
        return dict(bound.arguments)

    def same_modules(self, f_locals: dict[str, Any] | None) -> bool:
        """Whether every module this entry matched by identity is the one the call with
        arguments ``f_locals`` (from :meth:`bind`; None if they did not fit) reaches.

        An entry for another layer of a loop is no sign of a value that keeps changing, so
        the recompile limit counts only the entries for the call's own modules.
        """
        if not self.module_guards:
            return True
        if f_locals is None:
            return False
        try:
            return all(
                id(frame.resolve(source, f_locals, self.target)) == expected
                for source, expected in self.module_guards
            )
        except Exception:
            return False  # the path to a module is not there: another structure's entry

    def failure_reason(self, *args: Any, **kwargs: Any) -> str | None:
        """The first guard that fails for these arguments, in words; None if all hold."""
        return self.first_failure(args, kwargs)

    def first_failure(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], *, users_words: bool = False
    ) -> str | None:
        """:meth:`failure_reason`; with ``users_words`` values are named as the user's code
        names them (``self.fc.weight``, not ``L['self']._modules['fc']...``), for logs."""
        try:
            f_locals = self.bind(args, kwargs)
        except TypeError as e:
            return f"the arguments do not fit {self.target.__qualname__}{self.signature}: {e}"
        code = self.target.__code__
        for g in self.guards:
            value: Any = None
            where = None
            if g.source is not None:
                where = user_expr(g.source, code) if users_words else explain.describe(g.source)
                try:
                    value = frame.resolve(g.source, f_locals, self.target)
                except Exception as e:
                    return f"could not read {where}: {type(e).__name__}: {e}"
            elif kind_of(g.kind).reads_frame:
                value = functools.partial(frame.resolve, f_locals=f_locals, fn=self.target)
            try:
                reason = explain.explain(g, value, where)
            except Exception as e:
                reason = f"{g} raised {type(e).__name__}: {e}"
            if reason is not None:
                return _in_users_words(g, reason, code) if users_words else reason
        return None


def _module_id(g: GuardSpec) -> int:
    """The id a MODULE_MATCH guard, or the module a MODULE_TREE guard (held weakly or not),
    expects; a dead module's is -1, which no object's id is."""
    if g.kind is GuardKind.MODULE_MATCH:
        return int(g.expected)
    module = g.expected() if isinstance(g.expected, weakref.ref) else g.expected
    return -1 if module is None else id(module)


def _in_users_words(g: GuardSpec, reason: str, code: Any) -> str:
    """A shape relation's reason with each size named as the user's code names it
    (``x.size(1) == 7``, not ``L['x'].size()[1] == 7``)."""
    if g.kind is not GuardKind.SHAPE:
        return reason
    sources = sorted(
        (info.source for info in g.expected.symbols.values()), key=lambda s: -len(str(s))
    )
    for source in sources:  # the longest first: one source's text may hold another's
        reason = reason.replace(str(source), user_expr(source, code))
    return reason


def _unsupported(g: GuardSpec) -> None:
    msg = f"kiln.guards cannot check {g} (kind {g.kind}, source {g.source!r})"
    raise UnsupportedGuard(msg)


def _always_true(g: GuardSpec, fn: types.FunctionType) -> bool:
    """Guards Python's own argument binding makes true: ``*args`` is a tuple, ``**kw`` a dict."""
    if g.kind is not GuardKind.TYPE_MATCH or not isinstance(g.source, LocalSource):
        return False
    code = fn.__code__
    n = code.co_argcount + code.co_kwonlyargcount
    names = code.co_varnames
    if code.co_flags & inspect.CO_VARARGS and names[n] == g.source.name:
        return g.expected is tuple
    n += bool(code.co_flags & inspect.CO_VARARGS)
    if code.co_flags & inspect.CO_VARKEYWORDS and names[n] == g.source.name:
        return g.expected is dict
    return False


def _module_roots(guards: Sequence[GuardSpec], fn: types.FunctionType) -> list[GuardSpec]:
    """MODULE_TREE guards for modules capture matched by identity under a global or a
    closure cell: those resolve now, without a frame, so their trees come for free."""
    trees = {str(g.source) for g in guards if g.kind is GuardKind.MODULE_TREE}
    out = []
    for g in guards:
        if g.kind is not GuardKind.MODULE_MATCH or g.source is None or str(g.source) in trees:
            continue
        if not frame.frame_free(g.source):
            continue
        try:
            module = frame.resolve(g.source, {}, fn)
        except Exception:
            continue
        if isinstance(module, torch.nn.Module) and id(module) == g.expected:
            out.append(GuardSpec(g.source, GuardKind.MODULE_TREE, module))
            trees.add(str(g.source))
    return out


@counters.phase("guards")
def build_check(guards: Sequence[GuardSpec], fn: Callable[..., Any]) -> GuardCheck:
    """Compile ``guards`` into one check with ``fn``'s own signature.

    ``fn`` is the function whose code object is cached; for a bound method pass it
    or its ``__func__``: the check takes ``self`` as its first argument either way.
    Modules matched by identity under a global or closure cell get a MODULE_TREE guard.
    """
    target = _target(fn)
    guards = [g for g in guards if not _always_true(g, target)]
    guards = [*guards, *_module_roots(guards, target)]
    the_plan = plan.order(guards, _unsupported)
    ordered = the_plan.flat()
    name, text, namespace = codegen.generate(target, the_plan)
    filename = f"<kiln guards for {target.__qualname__}>"
    exec(_compile(text, filename), namespace)
    check_fn = namespace[name]
    check_fn.__defaults__ = target.__defaults__
    check_fn.__kwdefaults__ = target.__kwdefaults__
    check_fn.__qualname__ = target.__qualname__
    grouped = len(ordered) - len(the_plan.top)
    log.debug(
        "check of %s: %d guards, %d behind module stamps",
        target.__qualname__,
        len(ordered),
        grouped,
    )
    guards_log.info("%d guards:\n%s", len(ordered), text)
    artifacts.dump("guards.py", text)
    check = GuardCheck(check_fn, text, [_weak_module(g) for g in ordered], target)
    check.on_death = namespace[codegen.ON_DEATH]
    return check


def _weak_module(g: GuardSpec) -> GuardSpec:
    """``g``, holding its module weakly if it is a MODULE_TREE guard: a check that outlives
    the module must not keep it alive (explain reads either form)."""
    if g.kind is not GuardKind.MODULE_TREE:
        return g
    try:
        return dataclasses.replace(g, expected=weakref.ref(g.expected))
    except TypeError:
        return g  # takes no weak reference
