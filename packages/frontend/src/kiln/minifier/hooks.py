"""Where the minifier watches: around the user's backend, or around loopir's ATen compile.

``KILN_REPRO=after_capture`` wraps the backend of each captured graph; ``after_aot`` routes
each ATen graph's compile through :func:`kiln.loopir.entry.set_aten_stage_hook`. At
``KILN_REPRO_LEVEL=exception`` (the default) a crash while compiling or on the first call is
caught; at ``accuracy`` the first call also runs the graph eagerly and compares. A failure
writes ``repro.py`` for the whole graph, then minifies it and writes the smallest failing graph
over it, and the user's program goes on as it would have (the exception is raised again).
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import fx

from kiln.backends import Backend, list_backends, lookup_backend
from kiln.capture import artifacts
from kiln.loopir.entry import set_aten_stage_hook
from kiln.loopir.reference import ReferenceBackend
from kiln.minifier.graphs import minify, normalize
from kiln.minifier.runner import LEVELS, STAGES, Target, TensorSpec, fails, failure
from kiln.minifier.script import write_script

__all__ = ["settings", "watch_backend"]

log = logging.getLogger("kiln.frontend.minifier")
_busy: list[bool] = []  # set while minifying: the checks' own compiles are not watched


def settings(stage: str | None = None, level: str | None = None) -> tuple[str | None, str]:
    """The stage and level asked for (options win over ``KILN_REPRO``/``KILN_REPRO_LEVEL``)."""
    stage = stage or os.environ.get("KILN_REPRO") or None
    level = level or os.environ.get("KILN_REPRO_LEVEL") or "exception"
    if stage is not None and stage not in STAGES:
        msg = f"KILN_REPRO must be one of {', '.join(STAGES)}, got {stage!r}"
        raise ValueError(msg)
    if level not in LEVELS:
        msg = f"KILN_REPRO_LEVEL must be one of {', '.join(LEVELS)}, got {level!r}"
        raise ValueError(msg)
    return stage, level


def _ref(backend: Backend) -> tuple[str, tuple[str, ...]]:
    """How a script names ``backend``, and the module to import for it (a user's own)."""
    module = getattr(backend, "__module__", "") or ""
    modules = (module,) if module and not module.startswith("kiln") else ()
    for name in list_backends():
        if lookup_backend(name) is backend:
            return name, modules
    return f"{module}:{getattr(backend, '__qualname__', '')}", modules


def watch_backend(backend: Backend, stage: str | None, level: str) -> Backend:
    """``backend``, watched as ``KILN_REPRO`` asks (``backend`` itself when it asks nothing)."""
    if stage is None:
        return backend
    name, modules = _ref(backend)

    @functools.wraps(backend)
    def watched(gm: fx.GraphModule, inputs: Sequence[Any], **kwargs: Any) -> Any:
        if _busy:
            return backend(gm, inputs, **kwargs)
        if stage == "after_aot":  # the ATen graphs compile inside the backend's call
            set_aten_stage_hook(functools.partial(_aten_stage, level=level, modules=modules))
            try:
                return backend(gm, inputs, **kwargs)
            finally:
                set_aten_stage_hook(None)
        graph, values = normalize(gm, inputs)
        target = Target("after_capture", level, name, modules)
        run = lambda: backend(gm, inputs, **kwargs)  # noqa: E731
        return _watch(run, target, graph, values, len(inputs), values)

    return watched


def _aten_stage(
    stage: Callable[[fx.GraphModule, Sequence[Any]], Any],
    aten_gm: fx.GraphModule,
    inputs: Sequence[Any],
    backend: Any,
    *,
    level: str,
    modules: tuple[str, ...],
) -> Any:
    if _busy:
        return stage(aten_gm, inputs)
    graph, values = normalize(aten_gm, inputs)
    kind = "reference" if isinstance(backend, ReferenceBackend) else "default"
    target = Target("after_aot", level, kind, modules)
    example = [_real(v) for v in values]
    return _watch(lambda: stage(aten_gm, inputs), target, graph, values, len(inputs), example)


def _real(value: Any) -> Any:
    """A real tensor for a fake one (the ATen compile's inputs are fake), random values."""
    if isinstance(value, torch.Tensor) and type(value) is not torch.Tensor:
        return TensorSpec.of(value).make()
    return value


def _watch(
    compile_now: Callable[[], Any],
    target: Target,
    graph: fx.GraphModule,
    values: list[Any],
    n_args: int,
    example: list[Any],
) -> Any:
    """Compile, reporting a crash; the compiled callable, checked on its first call.

    ``values`` are the graph's inputs: the ``n_args`` the compiled callable takes, then the
    weights it holds; ``example`` the same as real tensors, for a crash while compiling.
    """
    where = artifacts.current_frame_dir() or Path.cwd()
    try:
        compiled = compile_now()
    except Exception as e:
        if target.level == "exception":
            _report(_with_error(target, e), graph, example, where)
        raise
    weights = values[n_args:]
    state = {"first": True}

    def checked(*args: Any) -> Any:
        if not state["first"] or _busy:
            return compiled(*args)
        state["first"] = False
        inputs = [t.detach() if isinstance(t, torch.Tensor) else t for t in [*args, *weights]]
        if target.level == "accuracy":
            if failure(target, graph, inputs) is not None:
                _report(target, graph, inputs, where)
            return compiled(*args)
        try:
            return compiled(*args)
        except Exception as e:
            _report(_with_error(target, e), graph, inputs, where)
            raise

    return checked


def _with_error(target: Target, error: Exception) -> Target:
    return Target(target.stage, target.level, target.backend, target.modules, type(error).__name__)


def _report(target: Target, graph: fx.GraphModule, inputs: list[Any], where: Path) -> None:
    """Write ``repro.py`` for the whole graph, then for the smallest one that still fails."""
    path = where / "repro.py"
    what = f"{target.level} failure {target.stage} (backend {target.backend})"
    _busy.append(True)
    try:
        write_script(path, target, graph, inputs, what)
        log.warning("kiln: %s; reproducer written to %s, minifying", what, path)
        small, small_inputs = minify(graph, inputs, lambda g, i: fails(target, g, i))
        write_script(path, target, small, small_inputs, what)
        log.warning(
            "kiln: minified reproducer (%d nodes) written to %s; run it with `python %s`",
            len(small.graph.nodes),
            path,
            path,
        )
    except Exception:
        log.exception("kiln: the minifier failed; %s holds what was written", path)
    finally:
        _busy.pop()
