"""Guard records become the text of one Python function with the guarded function's signature.

Python binds the arguments itself when the check is called like the function, so
``L['x']`` is just the parameter ``x``; ``G[...]`` reads the function's globals dict,
``C[...]`` a closure cell. Every other object the check needs (types, dtypes, torch
state readers, the module stamp) is bound by name in the check's own namespace, under
a prefix no parameter uses. Sub-expressions several guards share are computed once
into locals; every tensor is checked in one boolean expression; any exception while
reading the frame means "does not match". Each guard's own expression comes from its
kind (:meth:`kiln.guards.kinds.Kind.condition`); this module binds names, reads sources and
lays the conditions out.
"""

from __future__ import annotations

import collections
import functools
import inspect
import keyword
import types
import weakref
from collections.abc import Callable
from typing import Any

import torch

from kiln.capture.binding import code_signature
from kiln.capture.guard_data import GuardKind, GuardSpec
from kiln.capture.source import (
    AttrSource,
    ClosureSource,
    DefaultSource,
    GlobalSource,
    ItemSource,
    LocalSource,
    SizeSource,
    Source,
    StrideSource,
    WeakRefCallSource,
)
from kiln.guards import frame, hooks, stamps
from kiln.guards.config import config
from kiln.guards.errors import UnsupportedGuard
from kiln.guards.kinds import kind_of
from kiln.guards.kinds.tensor import same_tensor_test
from kiln.guards.plan import Plan, source_depth

__all__ = ["ON_DEATH", "CheckSource", "generate"]

#: The namespace key of the hooks run when an object the check holds weakly dies.
ON_DEATH = "__kiln_on_death__"

_LITERAL_TYPES = (bool, int, str, bytes, type(None))


def _is_literal(value: Any) -> bool:
    """Values whose ``repr`` is valid Python that rebuilds an equal value of the same type."""
    if isinstance(value, tuple):
        return all(_is_literal(v) for v in value)
    return type(value) in _LITERAL_TYPES


def _signature_text(fn: types.FunctionType, prefix: str) -> str:
    """``fn``'s parameter list with placeholder defaults (the real ones are set afterwards)."""
    parts: list[str] = []
    kinds = inspect.Parameter
    seen_star = False
    params = list(code_signature(fn).parameters.values())
    for i, p in enumerate(params):
        if p.kind is kinds.VAR_POSITIONAL:
            parts.append(f"*{p.name}")
            seen_star = True
        elif p.kind is kinds.VAR_KEYWORD:
            parts.append(f"**{p.name}")
        else:
            if p.kind is kinds.KEYWORD_ONLY and not seen_star:
                parts.append("*")
                seen_star = True
            parts.append(p.name if p.default is p.empty else f"{p.name}={prefix}default")
        if p.kind is kinds.POSITIONAL_ONLY and (
            i + 1 == len(params) or params[i + 1].kind is not kinds.POSITIONAL_ONLY
        ):
            parts.append("/")
    return ", ".join(parts)


def _run_hooks(hooks: list[Callable[[], None]], _ref: object) -> None:
    for hook in list(hooks):
        hook()


class CheckSource:
    """Builds the text and namespace of one check function."""

    def __init__(self, fn: types.FunctionType) -> None:
        self.fn = fn
        params = code_signature(fn).parameters
        self.params = set(params)
        self.varkw = {n for n, p in params.items() if p.kind is p.VAR_KEYWORD}
        prefix = "___"
        while any(p.startswith(prefix) for p in self.params):
            prefix += "_"
        self.prefix = prefix
        self.namespace: dict[str, Any] = {f"{prefix}default": None}
        self._bound: dict[int, str] = {}
        self._next_suffix: dict[str, int] = {}  # a bound name's stem -> the next number to try
        self._locals: dict[str, str] = {}
        self._kept: dict[str, str] = {}  # text -> the local a condition keeps its value in
        self._uses: collections.Counter[str] = collections.Counter()
        self.lines: list[str] = []
        self.indent = 0
        self._n_locals = 0
        self.functions: list[str] = []  # texts of the trees' group functions
        self.bound: dict[str, Any] = {}  # sources read from the namespace (Plan.bound)
        self.needs_locals = False  # whether the check starts with ``<prefix>L = locals()``
        self.in_group = False  # emitting a tree's group (run only after the stamp moved)
        # called when an object the check holds weakly dies (the entry can never pass again)
        self.on_death: list[Callable[[], None]] = []
        self.namespace[ON_DEATH] = self.on_death
        self._refs: dict[int, str] = {}

    # ---- names and expressions -------------------------------------------------------

    def bind(self, obj: Any, stem: str) -> str:
        """A namespace name holding ``obj`` (one per object)."""
        name = self._bound.get(id(obj))
        if name is None:
            readable = getattr(obj, "__name__", None) if stem in ("T", "fn", "obj") else None
            if isinstance(obj, torch.dtype):
                readable = str(obj).rpartition(".")[2]
            base = f"{self.prefix}{readable if isinstance(readable, str) and readable.isidentifier() else stem}"
            n = self._next_suffix.get(base, 0)
            name = f"{base}{n}" if n else base
            while name in self.namespace:
                n += 1
                name = f"{base}{n}"
            self._next_suffix[base] = n + 1  # probing from 1 each time was quadratic
            self._bound[id(obj)] = name
            self.namespace[name] = obj
        return name

    def held(self, obj: Any, stem: str) -> str:
        """An expression for the user object ``obj``, through a weak reference where ``obj``
        takes one: a check must not keep a module or tensor alive (its cache lives as long as
        the function), and a dead one reads as None, which no ``is`` test below accepts."""
        name = self._refs.get(id(obj))
        if name is None:
            try:
                ref = weakref.ref(obj, functools.partial(_run_hooks, self.on_death))
            except TypeError:
                return self.bind(obj, stem)
            name = self._refs[id(obj)] = self.bind(ref, stem)
        return f"{name}()"

    def literal(self, value: Any, stem: str = "k") -> str:
        return repr(value) if _is_literal(value) else self.bind(value, stem)

    def keep(self, text: str, stem: str) -> tuple[str, str]:
        name = self._kept.get(text)
        if name is not None:
            return name, name
        name = f"{self.prefix}{stem}{self._n_locals}"
        self._n_locals += 1
        self._kept[text] = name
        return f"({name} := {text})", name

    def in_scope(self, name: str, obj: Any) -> None:
        if name in self.params or name == self.fn.__name__:
            msg = f"a guard of {self.fn.__qualname__} needs the name {name!r}, which its parameters or its own name take"
            raise UnsupportedGuard(msg)
        self.namespace[name] = obj

    def _size(self, source: SizeSource | StrideSource) -> str:
        """One size or stride, through the tuple a tensor condition kept when there is one."""
        base = self.expr(source.base)
        if isinstance(source, SizeSource):
            kept = self._kept.get(f"{base}.shape")
            return f"{kept if kept else f'{base}.shape'}[{source.dim}]"
        kept = self._kept.get(f"{base}.stride()")
        return f"{kept}[{source.dim}]" if kept else f"{base}.stride({source.dim})"

    def count_uses(self, guards: list[GuardSpec]) -> None:
        """How many guards read each source, as theirs or as a prefix of theirs. Each distinct
        source passes its count to its base once, deepest first: walking every guard's
        chain to its root repeated the shared prefixes of thousands of parameters."""
        by_depth: dict[int, dict[str, AttrSource | ItemSource]] = {}
        for g in guards:
            if g.source is None:
                continue
            key = str(g.source)
            self._uses[key] += 1
            if isinstance(g.source, (AttrSource, ItemSource)):
                by_depth.setdefault(source_depth(g.source), {})[key] = g.source
        for depth in range(max(by_depth, default=0), 0, -1):
            for key, source in by_depth.get(depth, {}).items():
                base = source.base
                base_key = str(base)
                self._uses[base_key] += self._uses[key]
                if isinstance(base, (AttrSource, ItemSource)):
                    by_depth.setdefault(depth - 1, {})[base_key] = base

    def _global(self, name: str) -> str:
        globs = self.fn.__globals__
        g = self.bind(globs, "G")
        if name in globs:
            return f"{g}[{name!r}]"
        return f"{g}.get({name!r}, {self.bind(frame.builtins_of(self.fn), 'B')}[{name!r}])"

    def _closure(self, name: str) -> str:
        freevars = self.fn.__code__.co_freevars
        if name not in freevars or self.fn.__closure__ is None:
            msg = f"guard on closure variable {name!r}, but {self.fn.__qualname__} has no such free variable"
            raise UnsupportedGuard(msg)
        cell = self.fn.__closure__[freevars.index(name)]
        return f"{self.bind(cell, 'cell')}.cell_contents"

    def _default(self, source: DefaultSource) -> str:
        if source.fn is None:
            fn = self.bind(self.fn, "fn")
            if source.kwonly:
                return f"{fn}.__kwdefaults__[{source.name!r}]"
            names = list(code_signature(self.fn).parameters)
            positional = self.fn.__code__.co_argcount
            index = names.index(source.name) - (positional - len(self.fn.__defaults__ or ()))
            return f"{fn}.__defaults__[{index}]"
        helper = self.bind(frame.default_of, "default_of")
        return f"{helper}({self.expr(source.fn)}, {source.name!r}, {source.kwonly!r})"

    def expr(self, source: Source) -> str:
        """Python text evaluating ``source`` inside the check (shared parts already hoisted)."""
        key = str(source)
        if key in self._locals:
            return self._locals[key]
        if key in self.bound:
            return self.held(self.bound[key], "module")
        if isinstance(source, LocalSource):
            if source.name not in self.params:
                msg = f"guard on {source}, which is not a parameter of {self.fn.__qualname__}"
                raise UnsupportedGuard(msg)
            return source.name
        if isinstance(source, GlobalSource):
            return self._global(source.name)
        if isinstance(source, ClosureSource):
            return self._closure(source.name)
        if isinstance(source, AttrSource):
            base = self.expr(source.base)
            if source.name.isidentifier() and not keyword.iskeyword(source.name):
                return f"{base}.{source.name}"
            return f"getattr({base}, {source.name!r})"
        if isinstance(source, ItemSource):
            return f"{self.expr(source.base)}[{self.literal(source.index, 'idx')}]"
        if isinstance(source, DefaultSource):
            return self._default(source)
        if isinstance(source, (SizeSource, StrideSource)):
            return self._size(source)
        if isinstance(source, WeakRefCallSource):
            return f"{self.expr(source.base)}()"
        return self._resolved(source)

    def _resolved(self, source: Source) -> str:
        """A source kind codegen does not know: ask the source itself (slower, still correct)."""
        if type(source).resolve is Source.resolve:
            msg = (
                f"kiln.guards cannot read a {type(source).__name__} ({source}): it has no resolve()"
            )
            raise UnsupportedGuard(msg)
        self.needs_locals = True
        cells = dict(zip(self.fn.__code__.co_freevars, self.fn.__closure__ or (), strict=True))
        args = f"{self.prefix}L, {self.bind(self.fn.__globals__, 'G')}, {self.bind(cells, 'cells')}"
        return f"{self.bind(source, 'source')}.resolve({args})"

    def hoist(self, source: Source | None, *, itself: bool = False) -> None:
        """Compute into locals every prefix of ``source`` that several guards read
        (and ``source`` itself when ``itself``: its guard reads it more than once)."""
        # the source and its prefixes, innermost first, up to the nearest one already held
        # (a held submodule or a local, such as a tree group's root): nothing above it is read
        chain: list[tuple[Source, str]] = []
        while source is not None:
            key = str(source)
            if key in self.bound or key in self._locals:
                break
            chain.append((source, key))
            source = source.base if isinstance(source, (AttrSource, ItemSource)) else None
        for i, (s, key) in enumerate(reversed(chain)):
            shared = self._uses[key] > 1 or (itself and i == len(chain) - 1)
            if shared and not isinstance(s, LocalSource):
                name = f"{self.prefix}v{self._n_locals}"
                self._n_locals += 1
                self.line(f"{name} = {self.expr(s)}")
                self._locals[key] = name

    # ---- one condition per guard -----------------------------------------------------

    def condition(self, g: GuardSpec) -> str:
        """The expression that is true when ``g`` holds (its kind's, over its source)."""
        v = self.expr(g.source) if g.source is not None else ""
        return kind_of(g.kind).condition(self, g, v)

    def held_source(self, source: Source, expected_id: int) -> str | None:
        """A name bound to the very object ``source`` held when the check was built, when it
        can be read without a frame and is the object capture saw: ``is`` beats ``id() ==``,
        and a weak reference, unlike an id, never matches another object that took its id."""
        if not frame.frame_free(source):
            return None
        try:
            obj = frame.resolve(source, {}, self.fn)
        except Exception:
            return None
        return self.held(obj, "obj") if id(obj) == expected_id else None

    def line(self, text: str) -> None:
        self.lines.append("    " * self.indent + text)

    def require(self, condition: str) -> None:
        self.line(f"if not ({condition}):")
        self.line("    return False")

    def tree_group(
        self,
        tree: GuardSpec,
        emit_members: Callable[[], None],
        tensor_part: Callable[[], tuple[list[str], list[str], str]] | None = None,
    ) -> None:
        """A tree's group as a function of its own, called only when the stamp moved since
        the group last passed (its own function: a call of the check then sets up only the
        few locals of the common path, not the group's hundreds). With ``tensor_part`` (which
        emits the group's guards on tensors: :meth:`tensor_checks`), a move for tensors only
        (``stamps.bump_tensors``) runs that part alone."""
        assert tree.source is not None
        stamps.watch(tree.expected)
        stamp = self.bind(stamps.state, "stamp")
        structure = self.bind(stamps.structure, "structure")
        seen = self.bind([-1], "seen")  # the stamp the group last passed at; -1: never
        seen_structure = self.bind([-1], "seen_structure")
        trust = self.bind(config, "config")
        root = f"{self.prefix}root"
        now = f"{self.prefix}now"
        moved = f"{stamp}[0] == {seen}[0]"
        if tensor_part is not None:
            tensors = f"{self.prefix}tensors{len(self.functions)}"
            rewatch = self.bind(stamps.rewatch, "rewatch")

            def tail(held: list[str], tracked: list[str], last: str) -> None:
                # the tensors now in the slots stay watched: their own changes move the stamp
                # (the very tracked parameters that last passed are: only new ones need it)
                watch = f"{rewatch}(({''.join(f'{h}, ' for h in held)}))"
                if tracked:
                    same = " and ".join(f"{h} is {last}[{k}]()" for k, h in enumerate(tracked))
                    refs = "".join(f"{self.bind(weakref.ref, 'ref')}({h}), " for h in tracked)
                    self.line(f"if not ({same}):")
                    self.line(f"    if {trust}.trust_module_stamps:")
                    self.line(f"        {last}[:] = ({refs})")
                    if len(tracked) == len(held):
                        self.line(f"    {watch}")
                if len(tracked) < len(held):
                    self.line(watch)
                self.line(f"if {trust}.trust_module_stamps:")
                self.line(f"    {seen}[0] = {now}")

            self._function(tensors, root, tree, lambda: tail(*tensor_part()))
            within = f"{self.expr(tree.source)}"
            moved = f"({moved} or {structure}[0] == {seen_structure}[0] and {tensors}({within}))"
        # what the stamp cannot follow, compared on every call: global hooks, buffers' metadata
        quiet = [moved]
        if hooks.global_hook_dicts:
            dicts = " or ".join(self.bind(d, "global_hooks") for d in hooks.global_hook_dicts)
            quiet.append(f"not ({dicts})")
        untracked = self.bind(stamps.Untracked(), "untracked")
        quiet.append(f"(not {untracked}.entries or {untracked}.unchanged())")
        name = f"{self.prefix}group{len(self.functions)}"

        def whole() -> None:
            self.line(f"{self.prefix}now_structure = {structure}[0]")
            emit_members()
            # modules and tensors that joined the tree since it was last watched
            self.line(f"{self.bind(stamps.watch, 'watch')}({root}, {untracked})")
            self.line(f"if {trust}.trust_module_stamps:")
            self.line(f"    {seen}[0] = {now}")
            self.line(f"    {seen_structure}[0] = {self.prefix}now_structure")

        self._function(name, root, tree, whole)
        self.require(f"{' and '.join(quiet)} or {name}({self.expr(tree.source)})")

    def _function(self, name: str, root: str, tree: GuardSpec, emit: Callable[[], None]) -> None:
        """One function of a tree's group, ``name(root)``, with what ``emit`` writes between
        reading the stamp and returning True; read from the tree's real paths."""
        outer = (self.lines, self._locals, self._kept, self.indent, self.in_group)
        outer_bound, self.bound = self.bound, {}  # the group reads the real paths
        self.in_group = True
        self.lines, self._locals, self._kept, self.indent = [], {str(tree.source): root}, {}, 0
        self.line(f"{self.prefix}now = {self.bind(stamps.state, 'stamp')}[0]")
        emit()
        self.line("return True")
        body = "\n".join(f"    {line}" for line in self.lines)
        self.functions.append(f"def {name}({root}):\n{body}\n")
        self.lines, self._locals, self._kept, self.indent, self.in_group = outer
        self.bound = outer_bound

    def held_tensors(self, guards: list[GuardSpec]) -> list[str]:
        """The locals ``guards`` (tensor guards, just emitted) read their tensors into."""
        return [self._locals[str(g.source)] for g in guards if str(g.source) in self._locals]

    def tensor_checks(self, guards: list[GuardSpec]) -> tuple[list[str], list[str], str]:
        """A tree group's guards on tensors (``TENSOR_MATCH``es: ``Plan.tensor_part``) in one
        test, for a move of the stamp for tensors only: a parameter swapped for another in
        its slot, a storage resized. A tracked parameter that is the very tensor that last
        passed here needs its storage test alone (FSDP2 puts the same unsharded parameters
        back, their storage refilled, before every call): its other metadata cannot change
        without moving the whole stamp, which runs the whole group instead. Returns the
        locals holding the tensors, those of them that may take that way, and the name of
        the list of weak references to the tensors that last passed (filled by the tail)."""
        for g in guards:
            self.hoist(g.source, itself=kind_of(g.kind).reads_twice)
        last: list[Callable[[], Any]] = []
        name = self.bind(last, "last")
        tests: list[str] = []
        tracked: list[str] = []
        for g in guards:
            assert g.source is not None  # a tensor guard reads a tensor
            v, full = self.expr(g.source), self.condition(g)
            same = same_tensor_test(self, g.expected, v)
            if same is not None and g.kind is GuardKind.TENSOR_MATCH and v in self._locals.values():
                test = f"{v} is {name}[{len(tracked)}]()" + (f" and {same}" if same else "")
                full = f"{test} or {full}"
                tracked.append(v)
                last.append(_no_tensor)
            tests.append(f"({full})")
        if tests:
            self.require(" and ".join(tests))
        return self.held_tensors(guards), tracked, name


def _no_tensor() -> None:
    """What no tensor ``is``: a tensor-part slot before its first pass."""


def _emit(cs: CheckSource, guards: list[GuardSpec], plan: Plan) -> None:
    """Emit ``guards`` in order, each batched kind's guards in one test where the first of
    them stands (every tensor in one expression); then the trees' groups, which run rarely
    and are long: last, so the common path is short and jumps over nothing."""
    batches: dict[GuardKind, list[GuardSpec]] = {}
    for g in guards:
        if kind_of(g.kind).batched:
            batches.setdefault(g.kind, []).append(g)
    for g in guards:
        batch = batches.get(g.kind)
        if batch is not None:
            if g is batch[0]:
                # hoist the shared prefixes, then one test
                for b in batch:
                    cs.hoist(b.source, itself=kind_of(b.kind).reads_twice)
                cs.require(" and ".join(f"({cs.condition(b)})" for b in batch))
            continue
        cs.hoist(g.source, itself=kind_of(g.kind).reads_twice)
        cs.require(cs.condition(g))
    for g in guards:
        if plan.group(g):  # a MODULE_TREE guard with guards under its stamp
            part = plan.tensor_part(g)
            emit_part = None
            if part is not None:

                def emit_part(
                    part: list[GuardSpec] = part,
                ) -> tuple[list[str], list[str], str]:
                    return cs.tensor_checks(part)  # each tensor read into a local

            cs.tree_group(g, functools.partial(_emit, cs, plan.group(g), plan), emit_part)


def generate(fn: types.FunctionType, plan: Plan) -> tuple[str, str, dict[str, Any]]:
    """Name, source text and namespace of the check for ``plan``."""
    cs = CheckSource(fn)
    cs.bound = dict(plan.bound)
    cs.count_uses(plan.flat())
    _emit(cs, plan.top, plan)
    first = [f"{cs.prefix}L = locals()"] if cs.needs_locals else []
    body = "\n".join(f"        {line}" for line in [*first, *cs.lines, "return True"])
    # Named like the function, so a call that cannot bind fails with Python's own message.
    name = fn.__name__ if fn.__name__.isidentifier() else "guard"
    text = (
        f"# guards of {fn.__qualname__}\n"
        f"def {name}({_signature_text(fn, cs.prefix)}):\n"
        f"    try:\n{body}\n"
        f"    except Exception:\n"
        f"        return False\n"
    )
    if cs.functions:
        text += "\n\n# guards protected by the module stamp (see MODULE_TREE)\n"
        text += "\n\n".join(cs.functions)
    return name, text, cs.namespace
