"""Instructions capture never models, each with the reason it cannot meet them in a traced frame.

Capture traces the code of functions: the captured frame (never a generator or
coroutine: those run eagerly) and the plain functions and generators it inlines.
What is left here cannot appear in such code, or not where capture runs it:

- async code (``await``, ``async for``/``with``, async generators): only coroutine
  frames hold it, and capture does not inline coroutines, because their
  suspensions belong to an event loop;
- class and module bodies (``LOAD_NAME``, ``STORE_NAME``, ``LOAD_CLASSDEREF``,
  ``SETUP_ANNOTATIONS``, ``LOAD_LOCALS``, ...): their locals live in a dict; a
  class statement runs ``__build_class__`` in Python (a ``class_statement``
  break), which runs the body, so capture never traces one;
- ``import *`` and ``PRINT_EXPR``: only a module body and the interactive prompt
  compile to them;
- 3.12's ``INSTRUMENTED_*`` opcodes (``co_code`` hands out the uninstrumented
  instructions even while ``sys.monitoring`` is on) and the compiler's pseudo-ops
  (``SETUP_FINALLY``, ``POP_BLOCK``, ``LOAD_SUPER_METHOD``, ...), which never reach
  a code object.

Each still maps to :func:`refuse`, so meeting one anyway is a graph break with
this explanation (``kiln.explain`` shows it), never a missing handler.
"""

from __future__ import annotations

import dis
from typing import TYPE_CHECKING

from kiln.capture.breaks.reasons import unsupported
from kiln.capture.opcodes.common import registry

if TYPE_CHECKING:
    from kiln.capture.tracer import Tracer

HANDLERS, handles = registry()

_ASYNC = frozenset(
    {
        "ASYNC_GEN_WRAP",
        "BEFORE_ASYNC_WITH",
        "END_ASYNC_FOR",
        "GET_AITER",
        "GET_ANEXT",
        "GET_AWAITABLE",
    }
)
_NAMESPACE_BODIES = frozenset(
    {
        "DELETE_NAME",
        "LOAD_CLASSDEREF",
        "LOAD_FROM_DICT_OR_DEREF",
        "LOAD_FROM_DICT_OR_GLOBALS",
        "LOAD_LOCALS",
        "LOAD_NAME",
        "SETUP_ANNOTATIONS",
        "STORE_NAME",
    }
)
_MODULE_LEVEL = frozenset({"IMPORT_STAR", "PRINT_EXPR"})


def why_not_modelled(opname: str) -> str:
    """Why capture has no model of ``opname``: where alone that instruction appears."""
    if opname in _ASYNC:
        return f"{opname}: async code (capture does not inline coroutines)"
    if opname in _NAMESPACE_BODIES:
        return f"{opname}: a class or module body (class statements run in Python)"
    if opname in _MODULE_LEVEL:
        return f"{opname}: module-level or interactive code only"
    if opname.startswith("INSTRUMENTED_"):
        return f"{opname}: instrumentation that code objects never hand out"
    return f"{opname}: an instruction that does not occur in function bytecode"


def refuse(tr: Tracer, ins: dis.Instruction) -> None:
    """Every opcode without a model (see the module docstring): a graph break saying why."""
    raise unsupported("unsupported_opcode", why_not_modelled(ins.opname))
