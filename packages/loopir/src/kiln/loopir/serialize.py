"""Compiled programs as bytes: what a whole-graph cache stores on disk.

A compiled program is pickled: its graphs pickle as their wrappers' source with the kernels,
constants and ops that source names (:class:`~kiln.loopir.CompiledGraph`), and each kernel as
its code generator says (a C++ kernel as its library's source and symbol, built again, a hit in
the library cache, when loaded). ATen operators pickle by their qualified name. Anything else
that cannot be pickled (a kernel of the reference backend, a graph wrapper's closure) makes
:func:`dumps` raise, and such a program is not stored.

Loading unpickles, which runs code named in the bytes: read them only from a folder as private
as the library cache's (:mod:`kiln.loopir.disk_cache`) or from a file the user chose to trust.
"""

from __future__ import annotations

import dataclasses
import io
import pickle
from typing import Any

import torch

__all__ = ["by_fields", "dumps", "loads"]


def _op(namespace: str, name: str, overload: str) -> Any:
    packet = getattr(getattr(torch.ops, namespace), name)
    return packet if overload == "" else getattr(packet, overload)


_PLAIN_DATA = ("kiln.autograd_aot.",)
"""Packages whose objects are plain data (a program's signature, how its inputs are laid out),
stored field by field. Any other Kiln or Triton object must say how it is stored
(``__reduce__``): pickled field by field, a launcher's device handles and a loaded library's
addresses would load as numbers that mean nothing in another process."""


def by_fields(obj: Any) -> tuple[Any, ...]:
    """``__reduce__`` for a dataclass whose fields are all its constructor's arguments, stored
    field by field: assign it in the class body (``__reduce__ = serialize.by_fields``), where
    :func:`dumps` looks for a stored form."""
    return (type(obj), tuple(getattr(obj, f.name) for f in dataclasses.fields(obj)))


class _Pickler(pickle.Pickler):
    def reducer_override(self, obj: Any) -> Any:
        kind = type(obj)
        module = getattr(kind, "__module__", "") or ""
        if (
            module.startswith(("kiln.", "triton"))
            and not module.startswith(_PLAIN_DATA)
            and not isinstance(obj, type)
            and "__reduce__" not in vars(kind)
        ):
            msg = f"{kind.__qualname__} (from {module}) has no stored form"
            raise pickle.PicklingError(msg)
        if isinstance(obj, torch._ops.OpOverload):
            namespace, name = obj._schema.name.split("::", 1)
            return _op, (namespace, name, obj._overloadname)
        if isinstance(obj, torch._ops.OpOverloadPacket):
            namespace, name = obj._qualified_op_name.split("::", 1)
            return _op, (namespace, name, "")
        return NotImplemented


def dumps(obj: Any) -> bytes:
    """``obj`` pickled, ATen operators by name; raises what pickling raises."""
    buffer = io.BytesIO()
    _Pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return buffer.getvalue()


def loads(data: bytes) -> Any:
    """What :func:`dumps` wrote."""
    return pickle.loads(data)
