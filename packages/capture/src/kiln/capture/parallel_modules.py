"""DDP and FSDP modules met while capturing: their own Python runs, the model under it compiles.

A ``DistributedDataParallel`` module's forward is the runtime's own Python (its reducer's
bucket bookkeeping, logging, ``_DDPSink``, the autograd hooks it relies on), as is FSDP's
(``FullyShardedDataParallel``: unshard, reshard, its flat parameters' views), and so are
FSDP2's forward pre- and post-hooks on a ``fully_shard``-ed module (unshard before, reshard
and backward hooks after). TorchDynamo skips them and compiles the model underneath.
Capture does the same: calling such a module is a ``distributed_module`` break
(``calls.call_module``), and the split runs the call in Python through
:class:`CompiledForward`, which makes the wrapped module's ``forward`` (DDP's ``.module``,
FSDP's ``_fsdp_wrapped_module``, or the FSDP2 module's own) the compiled one for the length
of the call. DDP's gradient hooks fire on the compiled backward's gradients and all-reduce
them as in eager; FSDP's all-gathers and reshards run around the compiled forward. A frame
that is nothing but the call (``kiln.compile(DDP(model))``) records no break: it hands over
to the model's compiled forward, as TorchDynamo's skipped frame does.

A DDP or FSDP module is guarded by identity alone (:func:`runs_own_python`): its forward
writes its own attributes on every call, which, watched as a module tree, would make every
module tree's guards run again on every call; nothing traced reads them.

While a DDP module's forward runs (``_inside_ddp_forward``), graphs compiled under it are
split at its gradient-bucket boundaries, as TorchDynamo's DDPOptimizer splits them:
:func:`active_ddp_buckets` reads the bucket sizes that module uses (the frontend's
``ddp_split`` does the splitting).

This is a leaf module (``wrap.py`` asks it): the wrapper classes are looked up in
``sys.modules``, since a program holding such a module has imported them.
"""

from __future__ import annotations

import dataclasses
import inspect
import sys
import types
from collections.abc import Callable
from typing import Any

import torch

__all__ = [
    "BucketCaps",
    "CompiledForward",
    "active_ddp_buckets",
    "native_call",
    "runs_own_python",
    "wrapped_module",
]

# generators and coroutines: their call does not run their body
_GENERATOR_LIKE = (
    inspect.CO_GENERATOR
    | inspect.CO_COROUTINE
    | inspect.CO_ITERABLE_COROUTINE
    | inspect.CO_ASYNC_GENERATOR
)
_DDP = ("torch.nn.parallel.distributed", "DistributedDataParallel")
_FSDP1 = ("torch.distributed.fsdp", "FullyShardedDataParallel")
_FSDP2 = ("torch.distributed.fsdp", "FSDPModule")


def _class(where: tuple[str, str]) -> type | None:
    cls = getattr(sys.modules.get(where[0]), where[1], None)
    return cls if isinstance(cls, type) else None


def _is_instance(m: object, where: tuple[str, str]) -> bool:
    cls = _class(where)
    return cls is not None and isinstance(m, cls)


def runs_own_python(m: object) -> bool:
    """Whether ``m`` is a DDP or FSDP (1) module: its own forward runs, around its wrapped
    module's."""
    return _is_instance(m, _DDP) or _is_instance(m, _FSDP1)


@dataclasses.dataclass(frozen=True)
class BucketCaps:
    """The gradient-bucket sizes of the DDP module whose forward is running, in bytes.

    ``first`` is the last-computed gradients' bucket (DDP's first, all-reduced first: smaller
    by default, so communication starts early); ``ignored`` holds the ids of parameters DDP
    does not synchronize (``_ddp_params_and_buffers_to_ignore``), which count toward no bucket.
    """

    first: int
    rest: int
    ignored: frozenset[int] = frozenset()


def active_ddp_buckets() -> BucketCaps | None:
    """The buckets of the DDP module whose forward is running now (None: none is, or it
    reduces gradients in Python, ``_use_python_reducer``, where buckets do not apply)."""
    cls = _class(_DDP)
    ddp = getattr(cls, "_active_ddp_module", None) if cls is not None else None
    if ddp is None or getattr(ddp, "_use_python_reducer", False):
        return None
    rest = int(getattr(ddp, "bucket_bytes_cap", 0))
    if rest <= 0:
        return None
    config = getattr(ddp, "_bucket_config", None)
    first = getattr(config, "first_bucket_bytes_cap", None)
    if first is None:  # DDP before its bucket config: the default first bucket, if defaulted
        default = getattr(torch.distributed, "_DEFAULT_FIRST_BUCKET_BYTES", rest)
        first = default if getattr(ddp, "bucket_bytes_cap_default", False) else rest
    ignored = frozenset(
        id(p) for p in getattr(ddp, "module", ddp).parameters() if getattr(p, "_ddp_ignored", False)
    )
    return BucketCaps(min(int(first), rest), rest, ignored)


def wrapped_module(m: object) -> torch.nn.Module | None:
    """The module whose ``forward`` is compiled when ``m`` is called, if ``m`` is a DDP
    module (its ``.module``), an FSDP (1) one (its ``_fsdp_wrapped_module``) or an FSDP2
    module (itself, under its hooks); else None."""
    inner: object = None
    if _is_instance(m, _DDP):
        inner = getattr(m, "module", None)
    elif _is_instance(m, _FSDP1):
        inner = getattr(m, "_fsdp_wrapped_module", None)
    elif _is_instance(m, _FSDP2):
        inner = m
    return inner if isinstance(inner, torch.nn.Module) else None


def _class_attribute(cls: type, name: str) -> object:
    """What ``cls``'s dicts hold for ``name``, first along its MRO (``inspect.getattr_static``
    on the class without the metaclass's attributes, at a tenth of its cost: every call of a
    compiled FSDP2 block asks)."""
    for c in cls.__mro__:
        found = c.__dict__
        if name in found:
            return found[name]
    return None


class CompiledForward:
    """Calls a DDP or FSDP2 module as eager does, with its wrapped module's forward compiled.

    The call goes through the module's own ``__call__`` (DDP's forward and bookkeeping, the
    FSDP2 hooks, any other hooks); for its length the wrapped module's instance ``forward``
    is the compiled function, which ``nn.Module`` calls in place of the class's. A wrapped
    module of another class or with a ``forward`` of its own runs uncompiled.
    """

    def __init__(
        self, forward: types.FunctionType | None, compiled: Callable[..., Any] | None
    ) -> None:
        self.forward = forward
        self.compiled = compiled
        # the class of the FSDP2 module last called: such a module is its own wrapped module,
        # by its class alone, so its calls skip ``wrapped_module``'s class lookups (~2-3 us)
        self._own: type | None = None

    def __call__(self, module: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        inner = module if type(module) is self._own else wrapped_module(module)
        if inner is module:
            self._own = type(module)
        if (
            inner is None
            or self.forward is None
            or self.compiled is None
            or _class_attribute(type(inner), "forward") is not self.forward
            or "forward" in vars(inner)
        ):
            return module(*args, **kwargs)
        # Written with dict's own methods, past any subclass: kiln.guards watches module
        # dicts to see changes, and this one, undone before the call returns and read by
        # nothing but nn.Module's call, would make every module tree's guards run again on
        # every call. The dict is read again after the call: watching a module replaces it.
        bound = types.MethodType(self.compiled, inner)
        dict.__setitem__(vars(inner), "forward", bound)
        try:
            return module(*args, **kwargs)
        finally:
            state = vars(inner)
            if state.get("forward") is bound:
                dict.__delitem__(state, "forward")

    def __repr__(self) -> str:
        name = getattr(self.forward, "__qualname__", None)
        return f"<kiln: wrapper module call, compiled {name or 'nothing'}>"


def native_call(
    m: object, wrap_callable: Callable[[Callable[..., Any]], Callable[..., Any]]
) -> CompiledForward | None:
    """What a split calls in place of the wrapper module ``m`` (None: not a wrapper).

    The wrapped module's forward, a plain Python function, is compiled on its own through
    ``wrap_callable``, as a callee that breaks is.
    """
    inner = wrapped_module(m)
    if inner is None:
        return None
    forward = inspect.getattr_static(type(inner), "forward", None)
    if (
        not isinstance(forward, types.FunctionType)
        or forward.__code__.co_flags & _GENERATOR_LIKE
        or "forward" in vars(inner)
    ):
        return CompiledForward(None, None)
    return CompiledForward(forward, wrap_callable(forward))
