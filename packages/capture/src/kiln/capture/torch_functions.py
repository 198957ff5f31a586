"""Which Python callables are torch's: classified before capture evaluates a call.

:func:`~kiln.capture.wrap.wrap` needs the answer to decide how a callable read from the frame is
tracked, and :mod:`~kiln.capture.torch_calls` to decide how its call is evaluated; the tables
live here, below both, so that wrapping values never depends on the evaluator.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import inspect
import types
from collections.abc import Iterator
from typing import Any

import torch
import torch.func

__all__ = [
    "COMPILING",
    "CONTROL_FLOW",
    "CONSTANT_FOLDED",
    "CompilingAnswer",
    "Site",
    "TRANSFORMS",
    "REFUSED",
    "RESEEDS",
    "answering_compiling",
    "compiling_answer",
    "is_apply",
    "is_control_flow",
    "is_special",
    "is_torch_callable",
    "made_by_transform",
    "unwrapped",
]


def unwrapped(obj: Any) -> Any:
    """The function under torch's own decorators (which torch may apply lazily, at run time)."""
    for _ in range(8):
        inner = getattr(obj, "__wrapped__", None)
        if inner is None:
            return obj
        obj = inner
    return obj


CONSTANT_FOLDED = {
    unwrapped(f)
    for f in (
        torch.is_grad_enabled,
        torch.get_default_dtype,
        torch.is_inference_mode_enabled,
        torch.are_deterministic_algorithms_enabled,
    )
}
# seeding: eager's random numbers are expected after it (see OutputGraph.eager_random)
RESEEDS = {unwrapped(f) for f in (torch.manual_seed, torch.random.manual_seed, torch.set_rng_state)}
REFUSED = {
    unwrapped(f)
    for f in (
        torch.seed,
        torch.get_rng_state,
        torch.set_default_dtype,
        torch.set_default_device,
        torch.set_printoptions,
        torch.use_deterministic_algorithms,
        torch.set_num_threads,
        torch.save,
        torch.load,
    )
}
COMPILING = {
    unwrapped(f) for f in (torch.compiler.is_compiling, torch.compiler.is_dynamo_compiling)
}


#: Where a trace asks ``torch.compiler.is_compiling()``: the code and instruction index of
#: every frame on the inline stack, outermost first (a loop's iterations share one site).
Site = tuple[tuple[types.CodeType, int], ...]


@dataclasses.dataclass
class CompilingAnswer:
    """How one trace answers ``torch.compiler.is_compiling()``, and where it was asked.

    True, the library's compiled path, except at ``eager_sites``, which answer False as
    eager does.
    """

    eager_sites: frozenset[Site] = frozenset()
    asked: list[Site] = dataclasses.field(default_factory=list)


_ANSWER: contextvars.ContextVar[CompilingAnswer | None] = contextvars.ContextVar(
    "kiln_is_compiling", default=None
)


@contextlib.contextmanager
def answering_compiling(eager_sites: frozenset[Site]) -> Iterator[CompilingAnswer]:
    """Trace with ``torch.compiler.is_compiling()`` answering False at ``eager_sites``."""
    answer = CompilingAnswer(eager_sites)
    token = _ANSWER.set(answer)
    try:
        yield answer
    finally:
        _ANSWER.reset(token)


def compiling_answer(site: Site) -> bool:
    """``torch.compiler.is_compiling()`` asked at ``site`` in the trace."""
    answer = _ANSWER.get()
    if answer is None:
        return True
    answer.asked.append(site)
    return site not in answer.eager_sites


CONTROL_FLOW = frozenset(
    f for f in (getattr(torch, "cond", None), getattr(torch, "while_loop", None)) if f is not None
)
"""``torch.cond`` and ``torch.while_loop``: traced into subgraphs (``control_flow``), never
inlined (their Python bodies call torch's own compiler)."""


def is_control_flow(obj: Any) -> bool:
    """Whether ``obj`` is ``torch.cond`` or ``torch.while_loop``."""
    try:
        return obj in CONTROL_FLOW
    except TypeError:  # unhashable
        return False


def is_apply(obj: Any) -> bool:
    """Whether ``obj`` is ``Fn.apply`` of a custom ``torch.autograd.Function``."""
    if not isinstance(obj, (types.MethodType, types.BuiltinMethodType)):
        return False
    cls = obj.__self__
    if getattr(obj, "__name__", None) != "apply" or not isinstance(cls, type):
        return False
    if not issubclass(cls, torch.autograd.Function):
        return False
    # torch's own ``apply`` (a C classmethod, or a Python one calling it), not a user override
    owner = next(k for k in cls.__mro__ if "apply" in vars(k))
    return owner.__module__.startswith("torch")


#: ``torch._check(cond)``, ``torch._check_is_size(n)``: facts the program states, assumed
#: where ``cond`` is symbolic (torch_calls.symbolic_check), inlined as Python otherwise
CHECKS = (torch._check, torch._check_is_size)


def is_special(obj: Any) -> bool:
    """Torch functions with a fixed answer while capturing (``torch.compiler.is_compiling``)."""
    try:
        base = unwrapped(obj)
        return base in COMPILING or base in REFUSED or base in RESEEDS or base in CONSTANT_FOLDED
    except TypeError:
        return False


#: torch.func's transforms that return a function of the same arguments, by their name
TRANSFORMS: dict[Any, str] = {
    torch.func.vmap: "vmap",
    torch.func.grad: "grad",
    torch.func.grad_and_value: "grad_and_value",
    torch.func.jacrev: "jacrev",
    torch.func.jacfwd: "jacfwd",
    torch.func.hessian: "hessian",
}


def _made_codes() -> dict[types.CodeType, tuple[str, dict[str, int], int]]:
    """The code of the function each transform returns: its name, where its options and its
    function sit in the closure (read from a sample, as torch versions differ)."""
    found: dict[types.CodeType, tuple[str, dict[str, int], int]] = {}
    for transform, name in TRANSFORMS.items():
        made = transform(is_special)
        code, params = made.__code__, inspect.signature(transform).parameters
        cells = {v: i for i, v in enumerate(code.co_freevars)}
        if "func" in cells and code not in found:  # hessian returns jacfwd's function
            options = {k: i for k, i in cells.items() if k in params and k != "func"}
            found[code] = (name, options, cells["func"])
    return found


def made_by_transform(fn: Any) -> tuple[str, dict[str, int], int] | None:
    """For a function a torch.func transform returned (``batched = vmap(f)``): the
    transform's name, where its options and its function sit in the closure."""
    if not isinstance(fn, types.FunctionType) or fn.__closure__ is None:
        return None
    return _MADE.get(fn.__code__)


def is_torch_callable(obj: Any) -> bool:
    """Whether calling ``obj`` is a torch op to put in the graph (or fold on fakes)."""
    if isinstance(obj, type):
        return False
    if isinstance(obj, (types.MethodDescriptorType, types.WrapperDescriptorType)):
        return issubclass(obj.__objclass__, torch._C.TensorBase)
    module = getattr(obj, "__module__", None) or ""
    if isinstance(obj, types.BuiltinFunctionType) and module.startswith("torch"):
        return True
    if isinstance(obj, torch._ops.OpOverloadPacket | torch._ops.OpOverload):
        return True
    return (
        isinstance(obj, types.FunctionType)
        and module.startswith(
            ("torch.nn.functional", "torch.functional", "torch._refs", "torch.nn.init")
        )
        and obj.__name__ not in {"_in_projection_packed"}
    )


_MADE = _made_codes()
