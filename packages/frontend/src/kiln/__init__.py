"""Kiln: a just-in-time compiler for unmodified PyTorch programs.

``model = kiln.compile(model)`` captures Python bytecode into graphs (kiln.capture), guards and
caches them (kiln.guards), traces ATen graphs with autograd (kiln.autograd_aot), lowers them to a
loop IR and fuses (kiln.loopir), and generates C++ or Triton kernels (kiln.codegen_*).
"""

import pkgutil

# The other kiln distributions install kiln.capture, kiln.guards, ... into their own folders.
__path__ = pkgutil.extend_path(__path__, __name__)

from kiln import cache, export, guards, logs
from kiln.__about__ import __version__
from kiln.api import (
    CompiledFunction,
    OptimizedModule,
    compile,
    disable,
    reset_frontend,
)
from kiln.backends import list_backends, register_backend
from kiln.capture import KilnError, Unsupported, counters, explain
from kiln.config import MODES, OPTIONS
from kiln.dynamic import mark_dynamic, mark_static, maybe_mark_dynamic
from kiln.fallback import CompileError
from kiln.graph_cache import load_cache, save_cache
from kiln.stats import Stats, stats


def reset() -> None:
    """Drop every compiled artifact and cache entry, and zero ``kiln.stats()``."""
    guards.reset()
    reset_frontend()
    counters.clear()


logs.configure_from_env()

__all__ = [
    "MODES",
    "OPTIONS",
    "CompileError",
    "CompiledFunction",
    "KilnError",
    "OptimizedModule",
    "Stats",
    "Unsupported",
    "__version__",
    "cache",
    "compile",
    "disable",
    "explain",
    "export",
    "list_backends",
    "load_cache",
    "mark_dynamic",
    "mark_static",
    "maybe_mark_dynamic",
    "register_backend",
    "reset",
    "save_cache",
    "stats",
]
