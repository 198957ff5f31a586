"""Numpy arrays computed from tensors: the tensor that holds the array's data.

``t.numpy()`` inside a captured frame does not leave the graph: the array is
tracked as the tensor it views, numpy calls on it become torch ops
(:mod:`kiln.capture.numpy_calls`), and the emitted code turns the graph's
output back into the numpy object wherever Python code sees it.
"""

from __future__ import annotations

import functools

import torch

from kiln.capture.values.base import Value
from kiln.capture.values.tensor import TensorValue

__all__ = ["NdarrayValue", "as_numpy", "numpy_dtype"]


@functools.cache
def numpy_dtype(dtype: torch.dtype) -> type:
    """The numpy scalar type of a torch dtype (``torch.float32`` -> ``numpy.float32``)."""
    return type(torch.empty((), dtype=dtype).numpy()[()])


class NdarrayValue(Value):
    """An ``ndarray`` (or, with ``scalar``, a numpy scalar such as ``numpy.float32``).

    Numpy reductions over every axis and ufuncs on 0-d arrays return scalars, not 0-d
    arrays; ``scalar`` keeps that difference, which Python code can see.
    """

    def __init__(self, tensor: TensorValue, scalar: bool = False) -> None:
        self.tensor = tensor
        self.scalar = scalar

    def python_type(self) -> type:
        if self.scalar:
            return numpy_dtype(self.tensor.fake.dtype)
        import numpy

        return numpy.ndarray

    def __repr__(self) -> str:
        fake = self.tensor.fake
        kind = "scalar" if self.scalar else f"{tuple(fake.shape)}"
        return f"NdarrayValue({self.tensor.node.name}, {kind}, {fake.dtype})"


def as_numpy(t: torch.Tensor, scalar: bool) -> object:
    """The numpy object a graph output stands for (the emitted code calls this)."""
    array = t.detach().numpy()
    return array[()] if scalar else array
