"""Test helpers: :mod:`kiln.loopir.testing`, compiling with the suite's backend (the reference
backend unless ``KILN_LOOPIR_TEST_BACKEND`` names another)."""

from __future__ import annotations

import importlib
import os

from kiln.loopir import ReferenceBackend, get_backend, register_backend, testing
from kiln.loopir.pipeline import CompiledGraph

# re-exported: the suite imports every helper from here
from kiln.loopir.testing import Input, aten_graph, fill_meta, graph_of_calls, to_meta  # noqa: F401

# KILN_LOOPIR_TEST_BACKEND picks the backend this suite compiles with, so that its
# eager-parity tests (the lowering corpus, ``nox -s lowering-corpus``) check a code
# generator: unset, loopir's reference backend; ``registered``, the code generator
# registered for the CPU; ``module:Class``, that backend class, registered for the CPU
# too (``kiln.codegen_triton:TritonBackend`` under TRITON_INTERPRET=1).
_CHOICE = os.environ.get("KILN_LOOPIR_TEST_BACKEND", "")
_CODEGEN = None
if ":" in _CHOICE:
    _module, _, _name = _CHOICE.partition(":")
    _CODEGEN = getattr(importlib.import_module(_module), _name)
    register_backend("cpu", _CODEGEN)


def suite_backend():
    if _CODEGEN is not None:
        return _CODEGEN()
    return get_backend("cpu") if _CHOICE == "registered" else ReferenceBackend()


def compile_fn(fn, *inputs) -> CompiledGraph:
    return testing.compile_fn(fn, *inputs, backend=suite_backend())


def check(fn, *inputs, atol=None, rtol=None, equal_nan=True) -> CompiledGraph:
    """Compile ``fn`` with the suite's backend, run it, and compare with eager."""
    return testing.check(
        fn, *inputs, atol=atol, rtol=rtol, equal_nan=equal_nan, backend=suite_backend()
    )


def check_calls(calls, *inputs, **tol) -> CompiledGraph:
    return testing.check_calls(calls, *inputs, backend=suite_backend(), **tol)
