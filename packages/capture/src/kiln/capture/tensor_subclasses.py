"""Which tensor subclasses capture traces, and torch's own ``__torch_function__`` as Python.

Two kinds of subclass reach a captured frame as graph inputs:

* a ``__torch_function__`` subclass (``x.as_subclass(Logged)``, a class overriding
  ``__torch_function__`` or inheriting ``Tensor``'s, which makes ops return the subclass):
  the tensor is plain data, so the graph takes it as a plain tensor and the override is traced
  as Python (``subclass_calls.py``); results eager returns as the subclass are rewrapped by
  the emitted code after the graph runs.
* a ``__torch_dispatch__`` wrapper subclass with the flatten protocol
  (``__tensor_flatten__``/``__tensor_unflatten__``, as float8 and quantized tensors): the graph
  takes the real object and its ops stay torch-level; the backend desugars them (autograd_aot
  runs the subclass's ``__torch_dispatch__`` on the inner tensors while tracing ATen).

Any other subclass (a ``__torch_dispatch__`` without the protocol) is refused.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = [
    "as_plain",
    "is_dispatch_wrapper",
    "is_function_subclass",
    "tensor_torch_function",
    "traces_as_subclass",
]

_C: Any = torch._C


def _overrides_dispatch(cls: type) -> bool:
    return getattr(cls, "__torch_dispatch__", None) is not torch.Tensor.__torch_dispatch__


def is_dispatch_wrapper(cls: type) -> bool:
    """A ``__torch_dispatch__`` subclass whose instances flatten into inner tensors."""
    return (
        issubclass(cls, torch.Tensor)
        and _overrides_dispatch(cls)
        and hasattr(cls, "__tensor_flatten__")
        and hasattr(cls, "__tensor_unflatten__")
    )


def is_function_subclass(cls: type) -> bool:
    """A subclass that is plain data with, at most, a ``__torch_function__`` override."""
    if not issubclass(cls, torch.Tensor) or issubclass(cls, torch.nn.Parameter):
        return False  # parameters (of any class) are plain inputs, as they always were
    return cls is not torch.Tensor and not _overrides_dispatch(cls)


def traces_as_subclass(cls: type) -> bool:
    """Whether torch hands ops on ``cls`` tensors to ``cls.__torch_function__``."""
    if not is_function_subclass(cls):
        return False
    return getattr(cls, "__torch_function__", None) is not _C._disabled_torch_function_impl


_NOWRAP = frozenset(f for f in torch.overrides.get_default_nowrap_functions() if f is not None)


def _convert(ret: Any, cls: type) -> Any:
    if isinstance(ret, torch.Tensor):
        return ret if isinstance(ret, cls) else ret.as_subclass(cls)
    if type(ret) is tuple:
        return tuple([_convert(r, cls) for r in ret])
    if type(ret) is list:
        return [_convert(r, cls) for r in ret]
    if isinstance(ret, tuple):  # torch.return_types (a structseq): built from a sequence
        return type(ret)([_convert(r, cls) for r in ret])
    return ret


def tensor_torch_function(
    cls: type, func: Any, types: Any, args: Any = (), kwargs: Any = None
) -> Any:
    """``torch.Tensor.__torch_function__`` as capture traces it (``super().__torch_function__``
    in a subclass's override): the op with subclass dispatch off, its tensors converted to
    ``cls`` unless torch leaves ``func``'s results alone."""
    if kwargs is None:
        kwargs = {}
    for t in types:
        if not issubclass(cls, t):
            return NotImplemented
    with torch._C.DisableTorchFunctionSubclass():
        ret = func(*args, **kwargs)
        if cls is torch.Tensor or func in _NOWRAP:
            return ret
        return _convert(ret, cls)


def as_plain(t: torch.Tensor) -> torch.Tensor:
    """``t`` as a plain tensor on the same data, attached to its autograd graph: what a
    graph takes for a ``__torch_function__`` subclass input (its ops must not reach the
    override again), read without calling the override."""
    if type(t) is torch.Tensor:
        return t
    with _C.DisableTorchFunctionSubclass():
        return t.as_subclass(torch.Tensor)
