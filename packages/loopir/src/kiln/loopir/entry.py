"""``compile_fx``: loopir's one entry point, from a captured graph to the callable that runs it.

A frontend hands it the torch-level graph capture made and the user's options; it owns every
step from there:

1. loopir's torch-level rewrites (:func:`~kiln.loopir.fuse_attention`,
   :func:`~kiln.loopir.simplify_attention_masks`, ``contiguous_attention_masks``,
   :func:`~kiln.loopir.pad_matmuls`), run
   before autograd_aot so the backward is derived from the rewritten program;
2. autograd_aot with loopir's decompositions, the forward and the backward each compiled by
   :func:`~kiln.loopir.compile_graph` with the backend registered for each device (or the one
   given for every device);
3. graph wrappers: an option that names one (``cudagraphs``) wraps each compiled graph.

Options: ``freezing`` goes to autograd_aot (forward-only CPU programs take module state as
constants; by default where no parameter or buffer requires grad), ``fusion`` to the
scheduler, each graph wrapper's option to that wrapper, and the rest to every backend's
``with_options`` (``max_autotune``, ``cpp.threads``, ...).

A graph wrapper is a code generator's hook for running a whole compiled graph some other way:
``wrapper(compiled) -> callable``, which reads the :class:`~kiln.loopir.CompiledGraph`'s
``steps`` and ``input_names`` and decides, on the first call with real tensors, whether it applies (logging
why not, and calling ``compiled`` as it is). Wrappers are found by option name in
:data:`GRAPH_WRAPPERS` (``"module:attribute"``, imported on first use, so the code generator
and its toolchain are imported only by the graphs that ask) or registered with
:func:`register_graph_wrapper`. One whose module cannot be imported (Triton missing) is
skipped with one warning naming what is missing.
"""

from __future__ import annotations

import functools
import importlib
import logging
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeAlias

import torch
from torch import fx
from torch.utils import _pytree as pytree

from kiln import autograd_aot
from kiln.capture import counters
from kiln.capture.shapes.specialize import has_symbolic_inputs
from kiln.loopir import serialize
from kiln.loopir.attention import fuse_attention
from kiln.loopir.attention_masks import contiguous_attention_masks, simplify_attention_masks
from kiln.loopir.backend import Backend
from kiln.loopir.decompositions import decompositions
from kiln.loopir.errors import StaticShapesOnly
from kiln.loopir.matmul_padding import pad_matmuls
from kiln.loopir.pipeline import compile_graph
from kiln.loopir.wrapper import current_region, naming_region

__all__ = [
    "GRAPH_WRAPPERS",
    "GraphWrapper",
    "compile_fx",
    "load_fx",
    "register_graph_wrapper",
    "save_fx",
    "set_aten_stage_hook",
]

log = logging.getLogger(__name__)

GraphWrapper: TypeAlias = Callable[[Callable[..., Any]], Callable[..., Any]]
"""``(compiled graph) -> callable`` run in its place; wrappers nest in option-name order (a
later one wraps what the earlier one returned)."""

GRAPH_WRAPPERS: dict[str, str] = {
    "cudagraphs": "kiln.codegen_triton.cudagraphs:cudagraphify",
}
"""Graph wrappers by the option that turns them on, as ``"module:attribute"``."""

_registered: dict[str, GraphWrapper] = {}
AtenStageHook: TypeAlias = Callable[..., Callable[..., Any]]
"""``hook(stage, aten_gm, inputs, backend) -> callable``: runs ``stage(aten_gm, inputs)``
(loopir's compile of one ATen graph) its own way; the frontend's minifier checks it there."""
_aten_hook: list[AtenStageHook] = []
_unavailable: dict[str, str] = {}  # option -> why its wrapper cannot be imported (warned once)


def register_graph_wrapper(option: str, wrapper: GraphWrapper | None) -> None:
    """Wrap each graph compiled with ``options={option: True}`` by ``wrapper`` (None forgets
    a registration; :data:`GRAPH_WRAPPERS` names the built-in ones)."""
    _unavailable.pop(option, None)
    if wrapper is None:
        _registered.pop(option, None)
    else:
        _registered[option] = wrapper


def _graph_wrapper(option: str) -> GraphWrapper | None:
    """The wrapper for ``option``, imported on first use; None (warned once) when its module
    cannot be imported."""
    if option in _registered:
        return _registered[option]
    if option in _unavailable:
        return None
    module_name, _, attribute = GRAPH_WRAPPERS[option].partition(":")
    try:
        wrapper: GraphWrapper = getattr(importlib.import_module(module_name), attribute)
    except ImportError as exc:
        _unavailable[option] = str(exc)
        log.warning(
            "option %r needs %s, which cannot be imported (%s): graphs run without it",
            option,
            module_name,
            exc,
        )
        return None
    _registered[option] = wrapper
    return wrapper


def set_aten_stage_hook(hook: AtenStageHook | None) -> None:
    """Route every ATen graph's compile through ``hook`` (None: compile directly)."""
    _aten_hook[:] = [hook] if hook is not None else []


def _wrapper_options() -> set[str]:
    return set(GRAPH_WRAPPERS) | set(_registered)


def compile_fx(
    gm: fx.GraphModule,
    example_inputs: Sequence[Any],
    *,
    backend: Backend | None = None,
    options: Mapping[str, Any] | None = None,
) -> Callable[..., Any]:
    """A captured graph compiled by loopir, as a callable taking the graph's inputs.

    ``gm`` is rewritten in place. ``backend`` forces one backend for every device (the
    reference one, for tests); by default each device's registered backend is used.
    ``options`` as the module docstring says.
    """
    if _has_lazy_bits(example_inputs) or _on_meta_device(gm, example_inputs):
        return gm.forward
    with counters.phase("autograd_aot"):  # less loopir's passes, timed inside it
        return _aot_compile(gm, example_inputs, backend, options)


def save_fx(compiled: Callable[..., Any]) -> bytes:
    """What :func:`compile_fx` returned, as bytes for :func:`load_fx` in another process.

    Raises ``TypeError`` for a graph that runs as captured (nothing compiled to store),
    and what pickling raises for a program holding something that cannot be stored.
    """
    if not isinstance(compiled, autograd_aot.AotCompiled):
        msg = "the graph runs as captured: nothing was compiled"
        raise TypeError(msg)
    return serialize.dumps(compiled.snapshot())


def load_fx(
    data: bytes,
    gm: fx.GraphModule,
    example_inputs: Sequence[Any],
    *,
    backend: Backend | None = None,
    options: Mapping[str, Any] | None = None,
) -> Callable[..., Any]:
    """:func:`compile_fx`'s callable for ``gm``, loaded from what :func:`save_fx` wrote for
    the same graph, inputs and options: its compiled programs are used as they are, and
    programs for other grad modes or input aliasing compile on first use, as there."""
    return _aot_compile(gm, example_inputs, backend, options, serialize.loads(data))


def _aot_compile(
    gm: fx.GraphModule,
    example_inputs: Sequence[Any],
    backend: Backend | None,
    options: Mapping[str, Any] | None,
    restored: Any = None,
) -> autograd_aot.AotCompiled:
    compile_one = _prepare(backend, options)
    # a loaded program needs the rewritten gm only to trace another variant or run gm again
    # (rare): its rewrites (evaluating attention masks, ...) wait until then
    prepare = functools.partial(_rewrite, gm, backend)
    if restored is None:
        prepare()
    # a backward (or another grad mode's program) compiles on first use, outside the
    # frontend's naming: its profiler range is named now
    region = current_region()
    return autograd_aot.aot_compile(
        gm,
        example_inputs,
        fw_compiler=functools.partial(_named, compile_one, region),
        bw_compiler=functools.partial(_named, compile_one, f"{region} backward"),
        decompositions=decompositions() if restored is None else _LazyTable(),
        restored=restored,
        prepare=None if restored is None else prepare,
        freezing=_freezing(options),
    )


def _named(
    compile_one: Callable[[fx.GraphModule, Sequence[Any]], Callable[..., Any]],
    region: str,
    aten_gm: fx.GraphModule,
    inputs: Sequence[Any],
) -> Callable[..., Any]:
    with naming_region(region):
        return compile_one(aten_gm, inputs)


class _LazyTable(Mapping[Any, Callable[..., Any]]):
    """:func:`decompositions`, built on first read: a loaded program reads it only when another
    grad mode or aliasing compiles, and building it is a good part of a warm start."""

    @functools.cached_property
    def _table(self) -> dict[Any, Callable[..., Any]]:
        return decompositions()

    def __getitem__(self, op: Any) -> Callable[..., Any]:
        return self._table[op]

    def __iter__(self) -> Iterator[Any]:
        return iter(self._table)

    def __len__(self) -> int:
        return len(self._table)


def _prepare(
    backend: Backend | None,
    options: Mapping[str, Any] | None,
) -> Callable[[fx.GraphModule, Sequence[Any]], Callable[..., Any]]:
    """The compiler of each ATen graph under ``options``."""
    codegen = dict(options or {})
    codegen.pop("freezing", None)  # autograd_aot's (see _freezing)
    fusion = bool(codegen.pop("fusion", True))
    wrappers = [
        found
        for name in sorted(_wrapper_options())
        if codegen.pop(name, False) and (found := _graph_wrapper(name)) is not None
    ]

    def stage(aten_gm: fx.GraphModule, inputs: Sequence[Any]) -> Callable[..., Any]:
        return compile_graph(aten_gm, inputs, backend=backend, fusion=fusion, options=codegen)

    def compile_one(aten_gm: fx.GraphModule, inputs: Sequence[Any]) -> Callable[..., Any]:
        compiled: Callable[..., Any] = (
            _aten_hook[0](stage, aten_gm, inputs, backend) if _aten_hook else stage(aten_gm, inputs)
        )
        for wrap in wrappers:
            compiled = wrap(compiled)
        return compiled

    return compile_one


def _freezing(options: Mapping[str, Any] | None) -> bool | None:
    """Whether forward-only CPU programs take module state as constants (autograd_aot's
    ``freezing``): the ``freezing`` option, else ``KILN_FREEZING`` (``1`` on, ``0`` off), else
    None: on where no parameter or buffer requires grad."""
    value = (options or {}).get("freezing")
    if value is None:
        env = os.environ.get("KILN_FREEZING")
        return None if env is None else env != "0"
    return bool(value)


def _rewrite(gm: fx.GraphModule, backend: Backend | None) -> None:
    """loopir's torch-level rewrites of ``gm``, which run before autograd_aot traces it so the
    backward is derived from the rewritten program (and, for a loaded one, so later compiles
    and eager re-runs agree with it). They change call nodes only, never the graph's inputs,
    parameters or buffers."""
    try:
        with counters.phase("loopir.rewrites"):
            fuse_attention(gm)
            simplify_attention_masks(gm)
            contiguous_attention_masks(gm)
            pad_matmuls(gm, backend)
    except Exception as exc:
        if not has_symbolic_inputs(gm):
            raise
        msg = f"a torch-level rewrite failed on symbolic sizes ({type(exc).__name__}: {exc})"
        raise StaticShapesOnly(msg) from exc


def _on_meta_device(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> bool:
    """Whether the program holds a tensor on the meta device: an input, or one it makes
    there (``torch.zeros(3, device="meta")``, ``x.to("meta")``).

    Such a tensor has no data, so a kernel would read and write address 0, and loopir takes
    meta tensors as values of unknown device (its layouts put them on the graph's device, and
    the traced values it reads are meta tensors whatever the device), so the program's own
    device arguments say where it makes one. Such a graph runs as captured: ATen's meta
    kernels give eager's sizes.
    """
    inputs = any(isinstance(t, torch.Tensor) and t.device.type == "meta" for t in example_inputs)
    made = any(
        _names_meta(a)
        for n in gm.graph.nodes
        if n.op in ("call_function", "call_method")
        for a in pytree.tree_leaves((n.args, n.kwargs))
    )
    if inputs or made:
        log.info("the program holds a tensor on the meta device: the graph runs eagerly")
    return inputs or made


def _names_meta(arg: Any) -> bool:
    if isinstance(arg, torch.device):
        return arg.type == "meta"
    return isinstance(arg, str) and arg == "meta"


def _has_lazy_bits(example_inputs: Sequence[Any]) -> bool:
    """Whether an input carries a lazy conjugate or negative bit (``z.conj()``, its ``imag``).

    Only ATen kernels resolve those bits: a generated kernel reads the storage, and the traced
    program (over fake tensors without the bits) knows nothing of them. Such a graph runs as
    captured, with ATen's kernels.
    """
    for t in example_inputs:
        if isinstance(t, torch.Tensor) and (t.is_conj() or t.is_neg()):
            log.info("an input has a lazy conjugate or negative bit: the graph runs eagerly")
            return True
    return False
