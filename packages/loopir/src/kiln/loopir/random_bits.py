"""The device-independent counter-based random numbers behind ``ops.rand``/``randn``.

Every backend implements the same 32-bit hash, so a kernel gives the same random
numbers on CPU, GPU and the reference backend (unlike eager PyTorch, whose streams
differ by device). The spec, in unsigned 32-bit arithmetic (wrapping):

    fmix32(h):  h ^= h >> 16; h *= 0x85EBCA6B; h ^= h >> 13; h *= 0xC2B2AE35; h ^= h >> 16
    kiln_hash32(seed, offset, stream) = fmix32(fmix32(lo32(seed) ^ hi32(seed)) + 2*lo32(offset) + stream)
    rand(seed, offset)  = (kiln_hash32(seed, offset, 0) >> 8) * 2**-24                   # [0, 1)
    randn(seed, offset) = sqrt(-2*log(u1)) * cos(2*pi*u2)   with
        u1 = ((kiln_hash32(seed, offset, 0) >> 8) + 1) * 2**-24, u2 = (kiln_hash32(seed, offset, 1) >> 8) * 2**-24

Seeds are int64 values in [0, 2**31) that the wrapper draws from torch's generator,
so ``torch.manual_seed`` makes compiled programs reproducible.
"""

from __future__ import annotations

import math

import torch

__all__ = ["MASK32", "fmix32", "kiln_hash32", "rand", "randn", "draw_seeds", "fmix32_int"]

MASK32 = 0xFFFFFFFF
_C1 = 0x85EBCA6B
_C2 = 0xC2B2AE35


def fmix32_int(h: int) -> int:
    """MurmurHash3's 32-bit finaliser on a Python int (the spec, for tests and docs)."""
    h &= MASK32
    h ^= h >> 16
    h = (h * _C1) & MASK32
    h ^= h >> 13
    h = (h * _C2) & MASK32
    h ^= h >> 16
    return h


def fmix32(h: torch.Tensor) -> torch.Tensor:
    """:func:`fmix32_int` on an int64 tensor holding values in [0, 2**32)."""
    # int64 products wrap modulo 2**64; the low 32 bits are still the uint32 product
    h = h ^ (h >> 16)
    h = (h * _C1) & MASK32
    h = h ^ (h >> 13)
    h = (h * _C2) & MASK32
    return h ^ (h >> 16)


def kiln_hash32(seed: torch.Tensor, offset: torch.Tensor, stream: int) -> torch.Tensor:
    """The hash of the module docstring on int64 tensors (broadcasting)."""
    seed = seed.to(torch.int64)
    key = fmix32((seed & MASK32) ^ ((seed >> 32) & MASK32))
    return fmix32((key + 2 * (offset.to(torch.int64) & MASK32) + stream) & MASK32)


def rand(seed: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
    """Uniform float32 in [0, 1)."""
    bits = kiln_hash32(seed, offset, 0) >> 8
    return bits.to(torch.float32) * (2.0**-24)


def randn(seed: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
    """Standard normal float32 (Box-Muller)."""
    u1 = ((kiln_hash32(seed, offset, 0) >> 8) + 1).to(torch.float32) * (2.0**-24)
    u2 = (kiln_hash32(seed, offset, 1) >> 8).to(torch.float32) * (2.0**-24)
    return torch.sqrt(-2.0 * torch.log(u1)) * torch.cos((2.0 * math.pi) * u2)


def draw_seeds(count: int, device: torch.device | str) -> torch.Tensor:
    """``count`` int64 seeds from torch's default generator (so manual_seed applies)."""
    return torch.randint(0, 2**31, (count,), dtype=torch.int64, device="cpu").to(device)
