"""``kiln.compile``: the call path from a user's call to compiled code.

On each call a compiled function looks up the cache of its code object; the first entry whose
guards pass runs. On a miss it captures the frame (kiln.capture), hands each graph to the backend,
builds the guard check (kiln.guards) and installs a new entry. Without a PEP 523 hook, the
wrapper is the only way in: nested compiled functions and resume functions get wrappers too.
"""

from __future__ import annotations

import functools
import inspect
import itertools
import logging
import sys
import threading
import types
import warnings
import weakref
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import fx

from kiln import capture, ddp_split, dynamic, graph_cache, guards, loopir, op_memo_store
from kiln.backends import Backend, list_backends, lookup_backend, takes_options
from kiln.backends import kiln as kiln_backend
from kiln.capture import artifacts, counters, parallel_modules, user_words
from kiln.capture.dynamic_dims import dynamic_dims
from kiln.capture.isolation import older_objects_spared
from kiln.config import CompileConfig, make_config
from kiln.debug_index import writing as writing_index
from kiln.disabling import _disabled, disable
from kiln.fallback import CompileError, run_eagerly_after_failure
from kiln.minifier import settings as repro_settings
from kiln.minifier import watch_backend
from kiln.modes import say_unhonoured

__all__ = ["compile", "CompiledFunction", "OptimizedModule", "disable"]

log = logging.getLogger(__name__)
graph_break_log = logging.getLogger("kiln.frontend.graph_breaks")

# One cache per code object, closure and compile settings (see CompiledFunction._key), and the
# keys of frames that run eagerly because capturing them failed. The function objects own their
# caches (``_OWNED`` in their ``__dict__``) and each cache holds the objects whose ids its key
# names: a cache, its artifacts and what their checks bind die with the last function that uses
# it, and this table only finds the cache of a key while one lives.
_caches: weakref.WeakValueDictionary[tuple[Any, ...], guards.CodeCache] = (
    weakref.WeakValueDictionary()
)
_skipped: set[tuple[Any, ...]] = set()
_new_cache_lock = threading.Lock()
_OWNED = "__kiln_caches__"
#: Bumped by ``kiln.reset()``: a compiled function's remembered cache is stale after it.
_generation = [0]
_trampoline_ids = itertools.count()


def compile(
    model: Any = None,
    *,
    fullgraph: bool = False,
    dynamic: bool | None = None,
    backend: str | Backend = "kiln",
    mode: str | None = None,
    options: dict[str, Any] | None = None,
    disable: bool = False,
) -> Any:
    """Compile a function, bound method or ``nn.Module``; same calling convention as torch's compile API.

    Usable as ``kiln.compile(fn)``, ``@kiln.compile`` and ``@kiln.compile(backend="eager")``.
    Arguments are checked now, so a typo fails here rather than at the first call.
    """
    config = make_config(fullgraph=fullgraph, dynamic=dynamic, mode=mode, options=options)
    chosen = lookup_backend(backend)
    wanted = config.backend_options()
    if wanted and not takes_options(chosen):
        name = backend if isinstance(backend, str) else getattr(backend, "__name__", backend)
        msg = (
            f"kiln.compile: backend {name!r} takes no options, so {sorted(wanted)} (from "
            f"mode={config.mode!r} and options) would be ignored; use backend='kiln', or give "
            "the backend an `options` keyword parameter"
        )
        raise ValueError(msg)
    if not isinstance(disable, bool):
        msg = f"kiln.compile: disable must be a bool, got {type(disable).__name__}"
        raise TypeError(msg)

    def wrap(target: Any) -> Any:
        if not callable(target):
            msg = (
                "kiln.compile needs a function, method or torch.nn.Module; "
                f"got a non-callable {type(target).__name__}"
            )
            raise TypeError(msg)
        if disable:
            return target
        if isinstance(target, torch.nn.Module):
            return _rebuild_module(target, chosen, config)
        return CompiledFunction(target, chosen, config)

    return wrap if model is None else wrap(model)


def _trampoline(target: Callable[..., Any]) -> types.FunctionType:
    """A fresh function ``(*args, **kwargs) -> target(*args, **kwargs)`` with its own code object.

    Modules and callables without Python code of their own (builtins, partials, objects with
    ``__call__``) are compiled through it; capture inlines the call. Its code object is unique
    (a numbered name), so each compiled object gets its own cache and recompile budget.
    """

    def call(*args: Any, **kwargs: Any) -> Any:
        return target(*args, **kwargs)

    name = f"{type(target).__name__}_call_{next(_trampoline_ids)}"
    code = call.__code__.replace(co_name=name, co_qualname=name)
    fn = types.FunctionType(code, call.__globals__, name, None, call.__closure__)
    fn._kiln_user_name = _user_name(target)  # type: ignore[attr-defined]
    user_words.name_frame(code, _trampoline_words(target))
    return fn


def _trampoline_words(target: Any) -> user_words.FrameWords:
    """Messages about a trampoline name the user's function and its parameters."""
    called = type(target).forward if isinstance(target, torch.nn.Module) else target
    code = getattr(inspect.unwrap(called), "__code__", None)
    where = f" ({user_words.place(code.co_filename, code.co_firstlineno)})" if code else ""
    try:
        bound = target.forward if isinstance(target, torch.nn.Module) else target
        params = list(inspect.signature(bound).parameters)
    except (TypeError, ValueError):
        params = []
    names = {f"L['args'][{i}]": p for i, p in enumerate(params)}
    names.update({f"L['kwargs'][{p!r}]": p for p in params})
    return user_words.FrameWords(_user_name(target) + where, names)


def _user_name(fn: Any) -> str:
    """How the user names ``fn``: ``Model.forward`` for a module, else its qualified name
    from its innermost enclosing function on."""
    if isinstance(fn, torch.nn.Module):
        return f"{type(fn).__qualname__.rpartition('<locals>.')[2]}.forward"
    named = getattr(fn, "_kiln_user_name", None) or getattr(fn, "__qualname__", None)
    return str(named or type(fn).__qualname__).rpartition("<locals>.")[2]


class CompiledFunction:
    """A compiled callable: the cache lookup, capture on a miss, and eager fallbacks."""

    _kiln_compiled = True  # capture inlines the original function when it meets one of these

    def __init__(self, fn: Callable[..., Any], backend: Backend, config: CompileConfig) -> None:
        self._orig = fn
        self._backend = backend
        self._config = config
        target: Any = fn
        self._self: tuple[Any, ...] = ()
        if isinstance(fn, types.MethodType):
            self._self, target = (fn.__self__,), fn.__func__
        if not isinstance(target, types.FunctionType):
            target = _trampoline(fn)
        self._target: types.FunctionType = target
        self._skip_guards = bool(config.option("skip_guards", False))
        self._settings = (
            backend,
            config.fullgraph,
            config.mode,
            tuple(sorted(config.options.items())),
        )
        self._cache_key = self._key()
        # the profiler's name of this frame's graph: the user's function and the graph's place
        # in it (a continuation after a break holds the next graph; a recompile keeps it)
        self._region: tuple[str, int] = (_user_name(fn), 0)
        # (generation, cache): every call after the first skips hashing the key
        self._cache_ref: tuple[int, guards.CodeCache] | None = None
        functools.update_wrapper(self, fn)

    @property
    def original(self) -> Callable[..., Any]:
        """The function as the user wrote it."""
        return self._orig

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        """Decorated methods bind like functions do."""
        if obj is None:
            return self
        return CompiledFunction(types.MethodType(self._orig, obj), self._backend, self._config)

    def __repr__(self) -> str:
        return f"<kiln compiled {getattr(self._orig, '__qualname__', self._orig)!r}>"

    def __reduce__(self) -> str | tuple[Any, ...]:
        """Pickled (and deep-copied) by value of the original, compiled again lazily on load:
        compiled code, caches and guards hold this process's objects. A compiled function
        that its module names (``@kiln.compile`` on a module-level ``def``) pickles as that
        name, as plain functions do."""
        module = sys.modules.get(getattr(self._orig, "__module__", None) or "")
        qualname = getattr(self._orig, "__qualname__", "")
        found: Any = module
        for part in qualname.split("."):
            found = getattr(found, part, None)
        if found is self and not isinstance(self._orig, types.MethodType):
            return qualname
        return (_rebuild_function, (self._orig, *_pickled_settings(self._backend, self._config)))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # The hot path of every compiled call, graph breaks' continuations included.
        target = self._target
        if (
            target.__defaults__ is not self._defaults
            or target.__kwdefaults__ is not self._kwdefaults
            or target.__code__ is not self._code
        ):
            self._cache_key, self._cache_ref = self._key(), None
        key = self._cache_key
        if _disabled.get() or (_skipped and key in _skipped):
            return self._orig(*args, **kwargs)
        full = (*self._self, *args)
        ref = self._cache_ref
        if ref is not None and ref[0] == _generation[0]:
            cache = ref[1]
        else:
            cache = self._own_cache(key)
            self._cache_ref = (_generation[0], cache)
        seen = cache.version
        entry: guards.CacheEntry | None
        if self._skip_guards and cache.entries:
            entry = cache.entries[0]  # unsafe by request: the inputs are promised not to change
        else:
            entry = cache.lookup(*full, **kwargs)
        if entry is not None:
            counters.bump("stats", "cache_hits")
            return entry.fn(*full, **kwargs)
        return self._miss(cache, key, seen, full, kwargs)

    def _key(self) -> tuple[Any, ...]:
        """Which cache this function's calls look up, as of now.

        Entries are per code object as in CPython's own design, but also per everything a
        function object adds to its code that the check and the compiled function take from
        it: globals, closure cells, defaults and keyword defaults (by identity: the check binds
        the very default objects, so a default mutated in place meets its guards), and per
        compile settings, so two ``kiln.compile`` calls with different backends never run each
        other's artifacts. Functions made by one ``def`` or ``lambda`` share a cache only when
        all of these are the same objects. ``__code__``, ``__defaults__`` and
        ``__kwdefaults__`` are writable: ``__call__`` compares them by identity on every call
        and looks the key up again when one was replaced. The cache holds the objects, so
        their ids stay unique while the key finds it.
        """
        target = self._target
        self._code = target.__code__
        self._defaults = target.__defaults__
        self._kwdefaults = target.__kwdefaults__
        held = (
            target.__globals__,
            *(target.__closure__ or ()),
            self._defaults,
            self._kwdefaults,
        )
        self._key_held = held
        return (self._code, tuple(map(id, held)), self._settings)

    def _own_cache(self, key: tuple[Any, ...]) -> guards.CodeCache:
        """The cache of ``key``, made the target's own (one per code object and compile
        settings: the cache of replaced defaults goes once no function uses it; a wrapper whose
        ``__dict__`` was copied from the target by ``functools.wraps`` has other code)."""
        cache = _caches.get(key)
        if cache is None:
            with _new_cache_lock:  # threads missing together must all get the one cache kept
                cache = _caches.get(key)
                if cache is None:
                    cache = _caches[key] = guards.CodeCache(self._code, keep=self._key_held)
                    weakref.finalize(cache, _forget_skip, key)
        self._target.__dict__.setdefault(_OWNED, {})[self._code, self._settings] = cache
        return cache

    def _miss(
        self,
        cache: guards.CodeCache,
        key: tuple[Any, ...],
        seen: int,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        """No entry passed (as of ``seen``, the cache's version then): compile one, or run eagerly.

        One thread compiles per cache at a time; the others wait, then look again, so threads
        missing together on one input install one entry and share it. Compiled and eager
        code runs after the lock is released (except the check that a failure was Kiln's).
        """
        with cache.lock:
            entry = cache.lookup(*args, **kwargs) if cache.version != seen else None
            if entry is not None:
                counters.bump("stats", "cache_hits")
                run = entry.fn
            else:
                run = self._compile_or_eager(cache, key, args, kwargs)
        return run(*args, **kwargs)

    def _compile_or_eager(
        self,
        cache: guards.CodeCache,
        key: tuple[Any, ...],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Callable[..., Any]:
        """What a miss runs (under the cache's lock): a new entry, or the frame uncompiled.

        Each way a frame ends up uncompiled counts one eager fallback, once: a frame capture
        rejects whole or that fails to compile is remembered in ``_skipped`` (later calls and
        threads that missed together run it without counting again), and a cache past the
        recompile limit counts when it first warns. Graphs the backend fails on count in
        :meth:`_compile_graph`.
        """
        if key in _skipped:  # another thread's compile of this frame failed meanwhile
            return self._target
        if cache.over_limit(args, kwargs, self._config.option("recompile_limit")):
            if self._config.option("fail_on_recompile_limit", False):
                cache.raise_limit_error(*args, **kwargs)
            if cache.warn_limit_once(*args, **kwargs):
                counters.bump("stats", "eager_fallbacks")
            return self._target
        counters.bump("stats", "cache_misses")
        root = self._config.option("debug_dir")
        name = self._target.__code__.co_qualname
        sizes = dynamic.policy(
            self._config.dynamic, cache, self._config.option("automatic_dynamic_shapes", True)
        )
        sizes = dynamic.with_data_dependent(sizes, self._config.option)
        # capture's op memo, kept where the whole-graph cache is (op_memo_store)
        persist = self._backend is kiln_backend and graph_cache.enabled(
            self._config.option("graph_cache")
        )
        if persist:
            op_memo_store.load_once()
        with (
            artifacts.frame(name, Path(root) if root else None) as folder,
            dynamic_dims(sizes),
            writing_index(folder, name, cache, args, kwargs) as index,
            older_objects_spared(),  # capture's, extended over the guard check's build
        ):
            try:
                result = dynamic.capture_data_dependent(
                    lambda: capture.capture(
                        self._target,
                        args,
                        kwargs,
                        compile_graph=self._compile_graph,
                        wrap_callable=self._wrap_callable,
                        fullgraph=self._config.fullgraph,
                    ),
                    sizes,
                )
                check = guards.build_check(result.guards, self._target)
            except capture.Unsupported as e:
                if self._config.fullgraph:
                    raise
                graph_break_log.info("running %s eagerly: %s", name, e)
                index.outcome = f"runs eagerly: {e}"
                counters.bump("graph_breaks", e.kind)
                counters.bump("stats", "eager_fallbacks")
                _skipped.add(key)
                return self._target
            except capture.EagerRaises as e:  # the user's error: eager raises it, as it would
                return self._eager_after(name, e, key, args, kwargs)
            except Exception as e:
                if self._config.fullgraph:
                    raise CompileError(f"kiln failed to compile {name}: {e}") from e
                index.outcome = f"compiling failed, runs eagerly: {type(e).__name__}: {e}"
                outcome = run_eagerly_after_failure(
                    name, e, self._target, args, kwargs, key, _skipped
                )
                return lambda *_args, **_kwargs: outcome
            index.result = result
            counters.bump("stats", "frames_captured")
            cache.insert(check, result.function, passes_through=result.passes_through)
        if persist:
            op_memo_store.store_if_grown()
        return result.function

    def _eager_after(
        self,
        name: str,
        error: Exception,
        key: tuple[Any, ...],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Callable[..., Any]:
        outcome = run_eagerly_after_failure(name, error, self._target, args, kwargs, key, _skipped)
        return lambda *_args, **_kwargs: outcome

    def _compile_graph(self, gm: fx.GraphModule, inputs: Sequence[Any]) -> Callable[..., Any]:
        """capture's callback: the graph (under DDP, each piece of it: ``ddp_split``) compiled."""
        counters.bump("stats", "graphs_compiled")
        if artifacts.current_frame_dir() is not None:  # printing costs (imports DTensor)
            artifacts.dump("graph.py", gm.print_readable(print_output=False))
        return ddp_split.compile_under_ddp(gm, inputs, self._compile_piece)

    def _compile_piece(self, gm: fx.GraphModule, inputs: Sequence[Any]) -> Callable[..., Any]:
        """The backend, with an eager fallback unless fullgraph is set."""
        try:
            wanted = self._config.backend_options()
            cached = self._backend is kiln_backend and graph_cache.enabled(
                self._config.option("graph_cache")
            )

            # The compiled graph keeps this function (it compiles per size on later calls),
            # and the emitted code object keeps the compiled graph: a reference to ``self``
            # here would close a cycle through a code object, which the garbage collector
            # cannot see, and the compiled function would outlive its module.
            backend = watch_backend(
                self._backend,
                *repro_settings(self._config.option("repro"), self._config.option("repro_level")),
            )
            region = "kiln: {} graph {}".format(*self._region)
            if backend is kiln_backend:
                say_unhonoured(self._config, self._region[0], gm, inputs)

            def compile_static(g: fx.GraphModule, inputs: Sequence[Any]) -> Callable[..., Any]:
                def compile_now() -> Callable[..., Any]:
                    if wanted:
                        return backend(g, inputs, options=wanted)
                    return backend(g, inputs)

                with loopir.naming_region(region):  # the graph's range in profiler traces
                    if cached:  # symbolic graphs too: see graph_cache's docstring
                        return graph_cache.compile_cached(g, inputs, wanted, compile_now)
                    return compile_now()

            if backend is kiln_backend and dynamic.has_unbacked(gm):
                return dynamic.unbacked_graph(compile_static, gm, inputs)
            limit = self._config.option("recompile_limit") or guards.config.recompile_limit
            symbolic_kernels = (
                self._backend is not kiln_backend
                or self._config.option("dynamic_kernels", True)
                or dynamic.numbers_only(gm)
            )
            if symbolic_kernels and dynamic.serves_symbols(self._backend, gm):
                return dynamic.symbolic_or_per_size(compile_static, gm, inputs, limit)
            return dynamic.per_size(compile_static, gm, inputs, limit)
        except Exception as e:
            if self._config.fullgraph:
                raise CompileError(f"kiln backend failed on a graph: {e}") from e
            counters.bump("stats", "eager_fallbacks")
            warnings.warn(
                f"kiln: the backend failed on a graph ({type(e).__name__}: {e}); that graph "
                "runs eagerly. Pass fullgraph=True to raise instead.",
                RuntimeWarning,
                stacklevel=2,
            )
            return gm.forward

    def _wrap_callable(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """capture's callback for resume functions and callees it could not inline."""
        compiled = CompiledFunction(fn, self._backend, self._config)
        if capture.is_continuation(fn):  # the rest of this function: its graphs count on
            compiled._region = (self._region[0], self._region[1] + 1)
        return compiled


class OptimizedModule(torch.nn.Module):
    """A compiled ``nn.Module`` that shares everything with the original.

    Parameters, buffers, submodules, ``state_dict`` keys, attributes and the train/eval flag are
    the original's own, so a model and its compiled wrapper never drift apart.
    """

    _orig_mod: torch.nn.Module
    _kiln_call: CompiledFunction
    _handover: parallel_modules.CompiledForward | None

    def __init__(self, mod: torch.nn.Module, compiled_call: CompiledFunction) -> None:
        super().__init__()
        self._orig_mod = mod
        object.__setattr__(self, "_kiln_call", compiled_call)
        # A DDP or FSDP module (FSDP2's ``fully_shard``) runs its own Python around its
        # wrapped forward, and capture hands a call of it over to that forward, compiled on
        # its own (``parallel_modules.CompiledForward``): the trampoline's frame would hold
        # nothing but the handover, and a lookup of its cache on every call. The handover is
        # made here instead, with the trampoline's own callback, so the wrapped forward is the
        # one the trampoline's frame would compile and share its cache.
        handover = None
        if parallel_modules.wrapped_module(mod) is not None:
            handover = parallel_modules.native_call(mod, compiled_call._wrap_callable)
        object.__setattr__(self, "_handover", handover)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        handover = self._handover
        if handover is not None and not _disabled.get():
            return handover(self.__dict__["_modules"]["_orig_mod"], *args, **kwargs)
        return self._kiln_call(*args, **kwargs)

    @property  # type: ignore[override]
    def training(self) -> bool:
        mod = self.__dict__.get("_modules", {}).get("_orig_mod")
        return bool(mod.training) if mod is not None else True

    @training.setter
    def training(self, value: bool) -> None:
        mod = self.__dict__.get("_modules", {}).get("_orig_mod")
        if mod is not None:
            mod.training = value

    def __getattr__(self, name: str) -> Any:
        if name == "_orig_mod":
            return super().__getattr__(name)
        return getattr(self._orig_mod, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in ("_orig_mod", "training") or "_orig_mod" not in self.__dict__.get(
            "_modules", {}
        ):
            super().__setattr__(name, value)
        else:
            setattr(self._orig_mod, name, value)

    def __delattr__(self, name: str) -> None:
        delattr(self._orig_mod, name)

    # Dunder lookups skip __getattr__: forward the container protocol of Sequential and friends.
    def __getitem__(self, key: Any) -> Any:
        return self._orig_mod[key]  # type: ignore[index]

    def __len__(self) -> int:
        return len(self._orig_mod)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[Any]:
        return iter(self._orig_mod)  # type: ignore[call-overload]

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | set(dir(self._orig_mod)))

    def __repr__(self) -> str:
        return f"OptimizedModule({self._orig_mod!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled, ``torch.save``d and deep-copied by value of the original module, compiled
        again lazily after loading (the compiled entries belong to this process)."""
        call = self._kiln_call
        return (_rebuild_module, (self._orig_mod, *_pickled_settings(call._backend, call._config)))

    def state_dict(self, *args: Any, **kwargs: Any) -> Any:
        return self._orig_mod.state_dict(*args, **kwargs)

    def load_state_dict(self, *args: Any, **kwargs: Any) -> Any:
        return self._orig_mod.load_state_dict(*args, **kwargs)

    def named_parameters(self, *args: Any, **kwargs: Any) -> Iterator[tuple[str, Any]]:
        return self._orig_mod.named_parameters(*args, **kwargs)

    def named_buffers(self, *args: Any, **kwargs: Any) -> Iterator[tuple[str, Any]]:
        return self._orig_mod.named_buffers(*args, **kwargs)

    def named_children(self) -> Iterator[tuple[str, torch.nn.Module]]:
        return self._orig_mod.named_children()

    def named_modules(self, *args: Any, **kwargs: Any) -> Any:
        return self._orig_mod.named_modules(*args, **kwargs)


def _pickled_settings(backend: Backend, config: CompileConfig) -> tuple[Any, ...]:
    """A registered backend by its name (the function itself may not be importable)."""
    name = next((n for n in list_backends() if lookup_backend(n) is backend), None)
    return (name if name is not None else backend), config


def _rebuild_function(fn: Callable[..., Any], backend: str | Backend, config: CompileConfig) -> Any:
    return CompiledFunction(fn, lookup_backend(backend), config)


def _rebuild_module(
    mod: torch.nn.Module, backend: str | Backend, config: CompileConfig
) -> OptimizedModule:
    return OptimizedModule(mod, CompiledFunction(_trampoline(mod), lookup_backend(backend), config))


def _forget_skip(key: tuple[Any, ...]) -> None:
    """A dead cache's key is no longer skipped (its ids may be reused once its objects are
    gone), unless a live cache took the key meanwhile: after ``kiln.reset()`` an old cache
    held in a reference cycle dies at the collector's next pass, after the new one's skip.
    The collector may call it while ``_caches`` is iterated: it only reads the dict under it
    (``get`` would commit the removals the iteration deferred)."""
    ref = _caches.data.get(key)  # type: ignore[attr-defined]  # (typeshed omits it)
    if ref is None or ref() is None:
        _skipped.discard(key)


def reset_frontend() -> None:
    """Forget every cache entry and which frames were skipped (part of ``kiln.reset()``)."""
    for cache in _caches.values():
        cache.clear()
    _caches.clear()
    _skipped.clear()
    _generation[0] += 1
