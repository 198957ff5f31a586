"""The safetensors file format, read and written without the ``safetensors`` package.

An exported program is one file in this format: the weights as its tensors and the program
(graph, specs, signature) as JSON in the header's ``__metadata__``. The format is small and
documented: an 8-byte little-endian header length, a JSON header giving each tensor's dtype,
shape and byte range, then the raw bytes. Writing it here keeps the frontend's dependencies
as they are, and any safetensors reader opens the weights.
"""

from __future__ import annotations

import json
import os
import struct
import tempfile
from collections.abc import Mapping
from pathlib import Path

import torch

__all__ = ["read_safetensors", "write_safetensors"]

_DTYPES = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
    torch.complex64: "C64",
}
_BY_NAME = {v: k for k, v in _DTYPES.items()}


def _bytes_of(t: torch.Tensor) -> bytes:
    flat = t.detach().to("cpu").contiguous().reshape(-1)
    if flat.numel() == 0:
        return b""
    return bytes(flat.view(torch.uint8).numpy().tobytes())


def write_safetensors(
    path: str | os.PathLike[str], tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str]
) -> None:
    """Write ``tensors`` and ``metadata`` to ``path`` (atomically: a reader never sees half)."""
    header: dict[str, object] = {"__metadata__": dict(metadata)}
    chunks: list[bytes] = []
    offset = 0
    for name, t in tensors.items():
        if t.dtype not in _DTYPES:
            msg = f"kiln.export.save: tensor {name!r} has dtype {t.dtype}, which safetensors lacks"
            raise TypeError(msg)
        data = _bytes_of(t)
        header[name] = {
            "dtype": _DTYPES[t.dtype],
            "shape": list(t.shape),
            "data_offsets": [offset, offset + len(data)],
        }
        chunks.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the format aligns the data to 8 bytes
    target = Path(path)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(struct.pack("<Q", len(text)))
            f.write(text)
            for data in chunks:
                f.write(data)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_safetensors(
    path: str | os.PathLike[str],
) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """The tensors and the metadata of a safetensors file."""
    raw = Path(path).read_bytes()
    if len(raw) < 8:
        msg = f"{path} is not a safetensors file (too short)"
        raise ValueError(msg)
    (length,) = struct.unpack("<Q", raw[:8])
    if 8 + length > len(raw):
        msg = f"{path} is not a safetensors file (its header runs past the end)"
        raise ValueError(msg)
    header = json.loads(raw[8 : 8 + length])
    metadata = header.pop("__metadata__", {}) or {}
    body = memoryview(raw)[8 + length :]
    tensors: dict[str, torch.Tensor] = {}
    for name, entry in header.items():
        dtype = _BY_NAME[entry["dtype"]]
        begin, end = entry["data_offsets"]
        shape = entry["shape"]
        if begin == end:
            tensors[name] = torch.empty(shape, dtype=dtype)
            continue
        flat = torch.frombuffer(bytearray(body[begin:end]), dtype=dtype)
        tensors[name] = flat.reshape(shape)
    return tensors, metadata
