"""The protocol device code generators implement, and the registry that finds them.

loopir owns this interface; ``kiln.codegen_cpp`` and ``kiln.codegen_triton``
implement it and never the other way round. A backend turns one fused
:class:`~kiln.loopir.kernel.KernelGroup` into a :class:`KernelCode`: source text
(dumped and printed on ``kiln.loopir.output_code``) and a Python callable the
generated wrapper calls as ``kernel(*tensors)`` with one tensor per name of
``group.args``. It may veto fusions the scheduler proposes. Its ``finalize()`` is
called once after all of a graph's kernels were generated (to build queued kernels in
one batch, so errors surface at compile time). Its ``with_options(options)`` is called
once per graph compiled with options (``kiln.compile(options=...)``, e.g.
``max_autotune`` or ``cpp.threads``) and returns the backend to use for that graph.
Its ``traits`` (:class:`~kiln.loopir.traits.BackendTraits`) say which of several
equivalent programs lowering should choose on its device (how to lower ``cat``, which
ATen ops to call rather than lower, when to split reductions, convolution layouts,
matmul padding). :class:`~kiln.loopir.reference.ReferenceBackend` shows the defaults.

Finding a backend for a device type, first match wins:

1. :func:`register_backend` (explicit, e.g. in tests or by the frontend);
2. entry points in group ``kiln.backends`` whose name is the device type;
3. the built-in module list ``FALLBACK_MODULES`` imported with importlib (on
   machines where packages sit on ``PYTHONPATH`` without install metadata);
4. the :class:`~kiln.loopir.reference.ReferenceBackend`, with a warning.

An entry point or module may provide a ``Backend`` instance, a class, or a
factory; modules are asked for ``make_backend(device_type)``. Raising
:class:`~kiln.loopir.errors.BackendError` (or ImportError) from a factory means
"not available here" and the search goes on.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Mapping
from importlib import metadata
from typing import Any, Protocol, runtime_checkable

from kiln.loopir.errors import BackendError
from kiln.loopir.kernel import KernelCode, KernelGroup
from kiln.loopir.reference import ReferenceBackend
from kiln.loopir.traits import BackendTraits

__all__ = [
    "Backend",
    "BackendTraits",
    "KernelCode",
    "ENTRY_POINT_GROUP",
    "FALLBACK_MODULES",
    "register_backend",
    "unregister_backend",
    "get_backend",
    "clear_backend_cache",
    "configure",
]

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "kiln.backends"
FALLBACK_MODULES: dict[str, tuple[str, ...]] = {
    "cpu": ("kiln.codegen_cpp",),
    "cuda": ("kiln.codegen_triton",),
}


@runtime_checkable
class Backend(Protocol):
    """What a code generator provides for one device type: the whole contract."""

    name: str
    traits: BackendTraits
    """The device-dependent choices lowering makes for this backend's kernels."""

    def codegen_kernel(self, group: KernelGroup) -> KernelCode:
        """Generate, compile and load the kernel for ``group``."""
        ...

    def fusion_veto(self, group: KernelGroup) -> str | None:
        """None to accept a proposed fused kernel, else the reason to refuse it."""
        ...

    def finalize(self) -> None:
        """Called once after all of a graph's kernels were generated (a no-op is fine)."""
        ...

    def with_options(self, options: Mapping[str, Any]) -> Backend:
        """The backend for one graph compiled with the user's ``options`` (``self`` if none
        concern it); each backend reads its own keys."""
        ...


_registered: dict[str, Backend | Callable[[], Backend]] = {}
_resolved: dict[str, Backend] = {}
_unavailable: dict[str, list[str]] = {}  # device type -> why each candidate failed to load


def register_backend(device_type: str, backend: Backend | Callable[[], Backend]) -> None:
    """Use ``backend`` (or what the factory returns) for tensors on ``device_type``."""
    _registered[device_type] = backend
    _resolved.pop(device_type, None)


def unregister_backend(device_type: str) -> None:
    """Forget an explicit registration (the search falls back to entry points)."""
    _registered.pop(device_type, None)
    _resolved.pop(device_type, None)


def clear_backend_cache() -> None:
    """Search again on the next :func:`get_backend` (after installing a codegen)."""
    _resolved.clear()


def _instantiate(obj: Any, device_type: str) -> Backend:
    if isinstance(obj, Backend) and not isinstance(obj, type):
        return obj
    if isinstance(obj, type):
        return obj()  # type: ignore[no-any-return]
    try:
        made = obj(device_type)
    except TypeError:
        made = obj()
    if not isinstance(made, Backend):
        msg = f"{obj!r} returned {made!r}, which lacks a member of kiln.loopir.backend.Backend"
        raise BackendError(msg)
    return made


def _from_entry_points(device_type: str) -> Backend | None:
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        if ep.name != device_type:
            continue
        try:
            return _instantiate(ep.load(), device_type)
        except (ImportError, BackendError) as exc:
            _unavailable.setdefault(device_type, []).append(f"{ep.value}: {exc}")
            log.info("backend entry point %s for %s unavailable: %s", ep.value, device_type, exc)
    return None


def _from_modules(device_type: str) -> Backend | None:
    for module_name in FALLBACK_MODULES.get(device_type, ()):
        try:
            module = importlib.import_module(module_name)
            factory = getattr(module, "make_backend", None)
            if factory is None:
                continue
            return _instantiate(factory, device_type)
        except (ImportError, BackendError) as exc:
            _unavailable.setdefault(device_type, []).append(f"{module_name}: {exc}")
            log.info("backend module %s for %s unavailable: %s", module_name, device_type, exc)
    return None


def get_backend(device_type: str) -> Backend:
    """The backend for ``device_type`` (see the module docstring for the search order)."""
    if device_type in _resolved:
        return _resolved[device_type]
    if device_type in _registered:
        backend = _instantiate(_registered[device_type], device_type)
    else:
        _unavailable[device_type] = []
        found = _from_entry_points(device_type) or _from_modules(device_type)
        if found is None:
            why = "; ".join(dict.fromkeys(_unavailable[device_type])) or "none is installed"
            log.warning(
                "no code generator for device %r (%s); using loopir's reference backend "
                "(slow: evaluates kernels with torch ops). Install kiln-codegen-cpp or "
                "kiln-codegen-triton and the toolchain it names, or call "
                "kiln.loopir.register_backend.",
                device_type,
                why,
            )
            found = ReferenceBackend()
        backend = found
    _resolved[device_type] = backend
    return backend


def configure(backend: Backend, options: Mapping[str, Any]) -> Backend:
    """``backend`` set up for one graph compiled with ``options`` (see the module docstring)."""
    if not options:
        return backend
    configured = backend.with_options(options)
    if not isinstance(configured, Backend):
        msg = f"{backend!r}.with_options returned {configured!r}, which is not a backend"
        raise BackendError(msg)
    return configured
