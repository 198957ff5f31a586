"""The whole-graph cache: a captured graph's compiled program reused by later processes.

Capture still runs (its graph is the key); what the ``kiln`` backend would do with the graph
(autograd_aot, loopir, the code generators) is loaded instead: ``kiln.loopir.save_fx`` bytes in
``<cache root>/graphs/<key>.graph``. The key hashes the graph (node targets, arguments and
tensor metadata, tensor constants by value), the example inputs' metadata, the backend options,
Kiln's version and sources, torch's and Python's versions, the global settings tracing reads,
and the devices (for CPUs the C++ toolchain and its target). A graph holding something the key
cannot name stably (a user function, an object of an unknown type) is not cached.

Loading an entry unpickles it, so the folder gets the library cache's rules
(:mod:`kiln.loopir.disk_cache`): private to the user, written atomically, each entry vouched for
by a size-and-hash sidecar and read once against it, bounded by ``KILN_CACHE_SIZE_MB``. Beside
each entry, ``<key>.json`` records its key's parts, so ``KILN_LOGS=cache`` can say which part
differs when a lookup misses. ``save_cache``/``load_cache`` move every graph this process
compiled or loaded, with its C++ libraries or, on a GPU, Triton's binaries and the autotuning
records (:mod:`kiln.codegen_triton.bundle`), as one file.

On by default; off with ``KILN_GRAPH_CACHE=0`` or ``options={"graph_cache": False}`` (the
option wins). ``KILN_GRAPH_CACHE_DIR`` moves the folder (the test suite gives each test its
own, so no test sees another's programs).

A graph with symbolic sizes is stored like any other: its key holds the symbolic graph (the
sizes' symbols in every node's metadata) and the concrete inputs of the call that compiled
it, so an entry serves a later process whose first call has the same sizes; the program it
holds (compiled once with the sizes as arguments under ``dynamic_kernels``, or per size)
serves every size the capture's guards admit, as it did where it was compiled.

The guard checks' compiled code (:class:`kiln.guards.check.CodeStore`) is kept beside, in
``<cache root>/guards`` with the same rules, whatever the switch says: an entry is the code of
one exact check text, so it only spares a later process the ``compile()``.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import json
import logging
import os
import sys
import types
import zipfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import fx

from kiln import loopir
from kiln.__about__ import __version__
from kiln.capture import GlobalState, artifacts, counters
from kiln.codegen_cpp.build import toolchain_stamp
from kiln.codegen_cpp.cache import cache_dir as cpp_cache_dir
from kiln.codegen_cpp.cache import cache_root, probe_dir
from kiln.codegen_cpp.loader import opened_libraries
from kiln.guards import check
from kiln.logs import PACKAGES
from kiln.loopir import disk_cache

__all__ = [
    "checks_folder",
    "compile_cached",
    "enabled",
    "folder",
    "graph_key",
    "load_cache",
    "save_cache",
]

log = logging.getLogger("kiln.frontend.cache")
ENV = "KILN_GRAPH_CACHE"
DIR_ENV = "KILN_GRAPH_CACHE_DIR"
_SUFFIX = ".graph"
# meta entries that only say where a node came from, for messages
_UNKEYED_META = frozenset({"source", "stack_trace", "user_frame"})
_TRUSTED_MODULES = ("torch", "_operator", "operator", "math", "builtins", "kiln")
_NAMED_KINDS = (types.FunctionType, types.BuiltinFunctionType, type)
#: keys of the entries this process stored or loaded: what ``save_cache`` writes
_used: dict[str, None] = {}


class _Unkeyable(Exception):
    """Something in the graph or its inputs has no stable description."""


def enabled(option: bool | None) -> bool:
    """Whether compiles look up the cache: the option if given, else ``KILN_GRAPH_CACHE``
    (on unless ``0``, ``false``, ``no`` or ``off``)."""
    if option is not None:
        return option
    return os.environ.get(ENV, "").strip().lower() not in ("0", "false", "no", "off")


def folder() -> Path:
    """``KILN_GRAPH_CACHE_DIR``, else ``<cache root>/graphs``, after the same privacy checks as
    the library cache (the folder and its parent private to the user)."""
    override = os.environ.get(DIR_ENV)
    if override:
        chosen = Path(override).absolute()
        return disk_cache.private_dir(chosen.parent, chosen.name)
    return disk_cache.private_dir(cache_root(), "graphs")


def _digest(value: Any) -> str:
    return hashlib.sha256(repr(value).encode()).hexdigest()[:40]


def _tensor(t: torch.Tensor, by_value: bool) -> tuple[Any, ...]:
    meta = (
        "tensor",
        tuple(map(str, t.shape)),
        tuple(map(str, t.stride())),
        str(t.storage_offset()),
        str(t.dtype),
        str(t.device),
        t.requires_grad,
        isinstance(t, torch.nn.Parameter),
        t.is_conj(),
        t.is_neg(),
        str(t.layout),
    )
    if not by_value:
        return meta
    if t.device.type == "meta" or type(t) not in (torch.Tensor, torch.nn.Parameter):
        raise _Unkeyable(f"a constant tensor of type {type(t).__name__} on {t.device}")
    data = t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes()
    return (*meta, hashlib.sha256(data).hexdigest())


def _target(target: Any) -> str:
    if isinstance(target, str):
        return target
    if isinstance(target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return f"op:{target}"
    # A function or class names itself: its module's attribute of that name is that very
    # object. A callable object (a node holding subgraphs) or a local function does not.
    module = getattr(target, "__module__", None) or ""
    if module.split(".")[0] not in _TRUSTED_MODULES or not isinstance(target, _NAMED_KINDS):
        raise _Unkeyable(f"the graph calls {target!r} (from {module or 'no module'})")
    owner = sys.modules.get(module)
    qualname = getattr(target, "__qualname__", "")
    found: Any = owner
    for part in qualname.split("."):
        found = getattr(found, part, None)
    if found is not target and getattr(owner, target.__name__, None) is not target:
        raise _Unkeyable(f"the graph calls {target!r}, which its module does not name")
    return f"{module}:{qualname}:{target.__name__}"


def _value(value: Any, by_value: bool = True) -> Any:
    """A description of ``value`` that is equal in every process exactly when it is equal."""
    if isinstance(value, fx.Node):
        return ("node", value.name)
    if value is None or value is Ellipsis or isinstance(value, (bool, int, float, complex, str)):
        return (type(value).__name__, repr(value))
    if isinstance(value, (torch.dtype, torch.device, torch.layout, torch.memory_format)):
        return (type(value).__name__, str(value))
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return (type(value).__name__, str(value))
    if isinstance(value, torch.Tensor):
        return _tensor(value, by_value)
    if isinstance(value, slice):
        return ("slice", _value(value.start), _value(value.stop), _value(value.step))
    if isinstance(value, (tuple, list, torch.Size)):
        return (type(value).__name__, tuple(_value(v, by_value) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple((_value(k), _value(v, by_value)) for k, v in value.items()))
    raise _Unkeyable(f"a value of type {type(value).__name__}")


def _graph(gm: fx.GraphModule) -> list[Any]:
    # parameters and buffers are read at each call (autograd_aot lifts them into inputs):
    # keyed by metadata; other tensors the graph reads are baked into its code: by value
    state = {name for name, _ in gm.named_parameters()} | {name for name, _ in gm.named_buffers()}
    described: list[Any] = []
    for node in gm.graph.nodes:
        if node.op == "call_module":
            raise _Unkeyable(f"the graph calls a module ({node.target})")
        target = _target(node.target)
        if node.op == "get_attr":
            value = getattr(gm, node.target)
            target += repr(_value(value, by_value=node.target not in state))
        meta = sorted(
            (key, _value(value, by_value=False))
            for key, value in node.meta.items()
            if key not in _UNKEYED_META
        )
        args = _value((node.args, node.kwargs))
        described.append((node.op, node.name, target, args, meta))
    return described


_PACKAGES = ("capture", "guards", "autograd_aot", "loopir", "codegen_cpp", "codegen_triton")


def _source_files() -> list[str]:
    """Every installed Kiln source file (the frontend's modules, the packages' ``.py`` and
    ``.h`` files), sorted."""
    files = [str(p) for p in Path(__file__).parent.glob("*.py")]
    for name in _PACKAGES:
        spec = importlib.util.find_spec(f"kiln.{name}")
        for root in (spec.submodule_search_locations or []) if spec else []:
            for parent, _, names in os.walk(root):
                files.extend(os.path.join(parent, n) for n in names if n.endswith((".py", ".h")))
    return sorted(set(files))


@functools.cache
def _kiln_sources() -> str:
    """A digest of every installed Kiln source file: a changed Kiln compiles anew.

    Reading and hashing them all is a good part of a warm start, so the digest is kept in the
    probes folder (:func:`kiln.loopir.disk_cache.memoized`) under the files' paths, sizes and
    modification times, as the compiler's probes are under the compiler's."""
    files = _source_files()

    def digest() -> str:
        found = hashlib.sha256(__version__.encode())
        for path in files:
            found.update(path.encode())
            found.update(Path(path).read_bytes())
        return found.hexdigest()[:40]

    stats = [(path, (info := os.stat(path)).st_size, info.st_mtime_ns) for path in files]
    stamp = hashlib.sha256(repr((__version__, stats)).encode()).hexdigest()
    try:
        probes = probe_dir()
    except OSError:  # no usable private folder: hash them, as without the cache
        return digest()
    kept: str = disk_cache.memoized(probes, "sources", stamp, digest, _is_text)
    return kept


def _is_text(answer: Any) -> bool:
    return isinstance(answer, str)


def _device(inputs: Sequence[Any]) -> list[str]:
    devices = sorted({str(t.device) for t in inputs if isinstance(t, torch.Tensor)})
    described = list(devices)
    for device in devices:
        kind = torch.device(device).type
        if kind == "cpu":
            described.append(toolchain_stamp())
        elif kind == "cuda":
            index = torch.device(device).index or 0
            capability = torch.cuda.get_device_capability(index)
            described.append(
                f"{torch.cuda.get_device_name(index)} {capability} {torch.version.cuda}"
            )
    return described


def _inputs(example_inputs: Sequence[Any]) -> list[Any]:
    """Each input's metadata, and which tensor inputs share a storage (a program may be
    specialized to that aliasing); tensor subclasses are refused (their inner tensors and
    flattening are not described)."""
    described: list[Any] = []
    storages: dict[int, int] = {}
    for i, value in enumerate(example_inputs):
        if isinstance(value, torch.Tensor):
            if type(value) not in (torch.Tensor, torch.nn.Parameter):
                raise _Unkeyable(f"an input of tensor subclass {type(value).__name__}")
            storage = value.untyped_storage().data_ptr() if value.device.type != "meta" else -i
            described.append(("aliases", storages.setdefault(storage, i)))
        described.append(_value(value, by_value=False))
    return described


def _settings() -> tuple[Any, ...]:
    """The process state that tracing and code generation read: grad and inference mode,
    autocast, default dtype and device, function modes (``GlobalState``, what capture guards
    on), the numerics switches (matmul precision, TF32, determinism), and the environment's
    default for freezing."""
    cuda = torch.backends.cuda.matmul
    cudnn = torch.backends.cudnn
    return (
        repr(GlobalState.current()),
        torch.get_autocast_dtype("cpu"),
        torch.get_autocast_dtype("cuda"),
        torch.get_float32_matmul_precision(),
        cuda.allow_tf32,
        cuda.allow_fp16_reduced_precision_reduction,
        cuda.allow_bf16_reduced_precision_reduction,
        cudnn.allow_tf32,
        cudnn.deterministic,
        cudnn.benchmark,
        os.environ.get("KILN_FREEZING"),  # the freezing option's default (loopir's entry)
        os.environ.get("KILN_FREEZING_PREPACK"),  # oneDNN-packed frozen convolutions and linears
    )


def graph_key(
    gm: fx.GraphModule, example_inputs: Sequence[Any], options: Mapping[str, Any]
) -> tuple[str, dict[str, str]]:
    """The key of compiling ``gm`` for these inputs and options, with its parts' digests;
    raises ``_Unkeyable`` naming what has no stable description."""
    parts = {
        "graph": _digest(_graph(gm)),
        "inputs": _digest(_inputs(example_inputs)),
        "options": _digest(sorted((k, repr(v)) for k, v in options.items())),
        "versions": _digest(
            (_kiln_sources(), torch.__version__, sys.version, sys.platform, sys.byteorder)
        ),
        "settings": _digest(_settings()),
        "device": _digest(_device(example_inputs)),
    }
    return _digest(sorted(parts.items())), parts


def _why_missed(graphs: Path, parts: Mapping[str, str]) -> str:
    """Which parts of the key differ from the entry stored for the same graph, if any."""
    closest: list[str] | None = None
    for record in graphs.glob("*.json"):
        with contextlib.suppress(OSError, ValueError):
            stored = json.loads(record.read_text())
            if stored.get("graph") != parts["graph"]:
                continue
            differ = [name for name, value in parts.items() if stored.get(name) != value]
            if closest is None or len(differ) < len(closest):
                closest = differ
    if closest is None:
        return "no entry for this graph (a new or changed graph)"
    if not closest:
        return "its entry is missing, incomplete or fails verification"
    return f"an entry for this graph differs in: {', '.join(closest)}"


#: channels that log what lowering does: a graph whose compile they watch is compiled
_LOWERING_CHANNELS = ("aot", "ir", "fusion", "output_code", "build", "autotune", "perf_hints")


def _compile_watched() -> str | None:
    """Why this compile must run rather than load (its artifacts dumped, its lowering
    logged), or None: a debugging user sees what a compile shows, as without the cache."""
    if artifacts.debug_dir() is not None:
        return "KILN_DEBUG_DIR is set"
    for channel in _LOWERING_CHANNELS:
        for package in PACKAGES:
            level = logging.getLogger(f"kiln.{package}.{channel}").level
            if logging.NOTSET < level <= logging.INFO:
                return f"KILN_LOGS shows {channel}"
    return None


@counters.phase("graph_cache")
def compile_cached(
    gm: fx.GraphModule,
    example_inputs: Sequence[Any],
    options: Mapping[str, Any],
    compile_graph: Callable[[], Callable[..., Any]],
) -> Callable[..., Any]:
    """The compiled graph loaded from the cache, or ``compile_graph()``'s, stored for next time.

    The cache never fails a compile: a graph it cannot key, an entry it cannot read or load,
    a folder it cannot use or a store that fails is logged (``KILN_LOGS=cache``) and the
    graph compiles as it would without the cache."""
    try:
        key, parts = graph_key(gm, example_inputs, options)
        path = folder() / f"{key}{_SUFFIX}"
    except _Unkeyable as e:
        log.info("graph not cached: %s", e)
        return compile_graph()
    except Exception as e:  # a description or folder that failed: compile as without a cache
        log.info("graph not cached: %s: %s", type(e).__name__, e)
        return compile_graph()
    watched = _compile_watched()
    if watched is not None:
        log.info("miss %s: compiled to be watched (%s)", key, watched)
    elif (loaded := _load(path, key, parts, gm, example_inputs, options)) is not None:
        return loaded
    counters.bump("stats", "graph_cache_misses")
    compiled = compile_graph()
    try:
        _store(path, key, parts, compiled)
    except Exception as e:  # a full disk, a folder gone read-only: the program still runs
        log.info("graph %s not stored: %s: %s", key, type(e).__name__, e)
    return compiled


def _load(
    path: Path,
    key: str,
    parts: Mapping[str, str],
    gm: fx.GraphModule,
    example_inputs: Sequence[Any],
    options: Mapping[str, Any],
) -> Callable[..., Any] | None:
    """The program stored at ``path``, or None (a miss, logged with its reason)."""
    data = disk_cache.read_verified(path)
    if data is None:
        if log.isEnabledFor(logging.INFO):  # reads every record: only when it is shown
            log.info("miss %s: %s", key, _why_missed(path.parent, parts))
        return None
    try:
        loaded = loopir.load_fx(data, gm, example_inputs, options=options)
    except Exception as e:  # a stale or foreign entry: compile as if it were not there
        log.info("miss %s: its entry failed to load (%s: %s)", key, type(e).__name__, e)
        return None
    counters.bump("stats", "graph_cache_hits")
    disk_cache.touch(path)
    _used[key] = None
    log.info("hit %s", key)
    return loaded


def _store(path: Path, key: str, parts: Mapping[str, str], compiled: Callable[..., Any]) -> None:
    try:
        data = loopir.save_fx(compiled)
    except Exception as e:
        log.info("graph %s not stored: %s: %s", key, type(e).__name__, e)
        return
    _write(path, data)
    disk_cache.atomic_write(path.with_suffix(".json"), json.dumps(dict(parts)))
    _used[key] = None
    disk_cache.evict(path.parent, keep={key})


def checks_folder() -> Path:
    """``<cache root>/guards``, where compiled guard checks are kept (private, like the rest)."""
    return disk_cache.private_dir(cache_root(), "guards")


class _CheckStore:
    """kiln.guards' compiled checks as ``<key>.code`` entries of :func:`checks_folder`."""

    def load(self, key: str) -> bytes | None:
        path = checks_folder() / f"{key}.code"
        data = disk_cache.read_verified(path)
        if data is not None:
            disk_cache.touch(path)
        return data

    def store(self, key: str, data: bytes) -> None:
        path = checks_folder() / f"{key}.code"
        _write(path, data)
        disk_cache.evict(path.parent, keep={key})


check.code_store = _CheckStore()


def _write(path: Path, data: bytes) -> None:
    staged = disk_cache.temporary_sibling(path)
    try:
        staged.write_bytes(data)
        disk_cache.seal(staged, path)
    except BaseException:
        staged.unlink(missing_ok=True)
        raise


def _triton_bundle() -> types.ModuleType | None:
    """``kiln.codegen_triton.bundle`` where Triton is installed (imported only when asked)."""
    try:
        return importlib.import_module("kiln.codegen_triton.bundle")
    except ImportError:
        return None


def _bundle() -> Iterator[tuple[str, str, Path]]:
    """The files ``save_cache`` writes, as (kind, name, path)."""
    graphs = folder()
    for key in _used:
        for path in (graphs / f"{key}{_SUFFIX}", graphs / f"{key}.json"):
            if path.exists():
                yield "graphs", path.name, path
    for library in dict.fromkeys(opened_libraries()):
        for path in (library, library.with_suffix(".cpp")):
            if path.exists():
                yield "cpp", path.name, path
    triton_bundle = _triton_bundle()
    if triton_bundle is not None:
        yield from triton_bundle.members()


def save_cache(path: str | os.PathLike[str]) -> int:
    """Write every graph this process compiled or loaded through the cache, and what its
    kernels need to run without compiling (the C++ libraries it loaded; on a GPU, Triton's
    binaries and launchers of its kernels and the autotuning records it used) into one file;
    the number of files it holds."""
    manifest = []
    target = Path(path)
    staged = disk_cache.temporary_sibling(target)
    try:
        with zipfile.ZipFile(staged, "w", zipfile.ZIP_DEFLATED) as archive:
            for kind, name, file in _bundle():
                data = file.read_bytes()
                member = f"{kind}/{name}"
                manifest.append({"name": member, "sha256": hashlib.sha256(data).hexdigest()})
                archive.writestr(member, data)
            archive.writestr("manifest.json", json.dumps({"format": 1, "files": manifest}))
        os.replace(staged, target)
    except BaseException:
        staged.unlink(missing_ok=True)
        raise
    return len(manifest)


def _member_ok(kind: str, name: str) -> bool:
    """Whether a member's name stays inside its folder: one file (a ``triton`` member: one
    folder of Triton's cache and a file in it)."""
    parts = name.split("/")
    depth = 2 if kind == "triton" else 1
    return len(parts) == depth and all(p and not p.startswith(".") for p in parts)


def load_cache(path: str | os.PathLike[str]) -> int:
    """Add what :func:`save_cache` wrote to this machine's caches (the file is trusted as a
    pickle is: only load one you made); the number of entries added. Each file must match
    the hash the file's manifest records, else nothing is added (``ValueError``)."""
    folders = {"graphs": folder(), "cpp": cpp_cache_dir()}
    kinds = {*folders, "triton", "autotune"}
    with zipfile.ZipFile(path) as archive:
        manifest = json.loads(archive.read("manifest.json"))
        if manifest.get("format") != 1:
            msg = f"{path} is not a Kiln cache file of a known format"
            raise ValueError(msg)
        files = []
        for item in manifest["files"]:
            kind, _, name = item["name"].partition("/")
            if kind not in kinds or not _member_ok(kind, name):
                msg = f"{path}: unexpected member {item['name']!r}"
                raise ValueError(msg)
            data = archive.read(item["name"])
            if hashlib.sha256(data).hexdigest() != item["sha256"]:
                msg = f"{path}: {item['name']} does not match its recorded hash"
                raise ValueError(msg)
            files.append((kind, name, data))
    added = 0
    triton_bundle = _triton_bundle()
    for kind, name, data in files:
        if kind not in folders:  # a GPU's: of no use to a machine without Triton
            if triton_bundle is not None:
                triton_bundle.restore(kind, name, data)
                added += 1
            continue
        target = folders[kind] / name
        if target.suffix in (_SUFFIX, ".so"):
            if disk_cache.read_verified(target) == data:
                continue
            _write(target, data)
            added += 1
        else:
            disk_cache.atomic_write(target, data)
    return added
