"""Random numbers from saved seeds, so a backward can recompute random ops.

Kiln's decompositions turn ``rand``/``randn``/``bernoulli`` into two ops of its
own: ``kiln_aot.seed`` draws a fresh seed from torch's generator (so
``torch.manual_seed`` makes runs reproducible), and ``kiln_aot.seeded_random``
turns a seed into uniform or normal numbers deterministically. The seed is
random and stays in the forward; ``seeded_random`` is a pure function of it, so
the partitioner may recompute it in the backward and get the same bits. The
distributions are eager's; the bits are not.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

__all__ = ["random_decompositions", "seed", "seeded_random"]

aten = torch.ops.aten

_lib = torch.library.Library("kiln_aot", "DEF")
_lib.define("seed(*, Device device) -> Tensor", tags=(torch.Tag.nondeterministic_seeded,))
_lib.define(
    "seeded_random(Tensor seed, SymInt[] size, str distribution, *, ScalarType dtype, "
    "Device device) -> Tensor"
)

_SEED_BOUND = 2**62


def _seed_impl(*, device: torch.device) -> torch.Tensor:
    return torch.randint(0, _SEED_BOUND, (), dtype=torch.int64, device=device)


def _seed_meta(*, device: torch.device) -> torch.Tensor:
    return torch.empty((), dtype=torch.int64, device="meta")


def _seeded_random_impl(
    seed: torch.Tensor,
    size: Sequence[int],
    distribution: str,
    *,
    dtype: torch.dtype,
    device: torch.device,
) -> torch.Tensor:
    generator = torch.Generator(device=device)
    generator.manual_seed(int(seed.item()))
    draw = torch.rand if distribution == "uniform" else torch.randn
    return draw(list(size), generator=generator, dtype=dtype, device=device)


def _seeded_random_meta(
    seed: torch.Tensor,
    size: Sequence[int],
    distribution: str,
    *,
    dtype: torch.dtype,
    device: torch.device,
) -> torch.Tensor:
    return torch.empty(list(size), dtype=dtype, device="meta")


_lib.impl("seed", _seed_impl, "CompositeExplicitAutograd")
_lib.impl("seed", _seed_meta, "Meta")
_lib.impl("seeded_random", _seeded_random_impl, "CompositeExplicitAutograd")
_lib.impl("seeded_random", _seeded_random_meta, "Meta")

seed = torch.ops.kiln_aot.seed.default
seeded_random = torch.ops.kiln_aot.seeded_random.default


def _draw(
    size: Sequence[int], distribution: str, dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    return seeded_random(seed(device=device), list(size), distribution, dtype=dtype, device=device)


def _like(distribution: str) -> Callable[..., Any]:
    def decomposition(
        x: torch.Tensor,
        *,
        dtype: torch.dtype | None = None,
        device: torch.device | None = None,
        **_: Any,
    ) -> torch.Tensor:
        return _draw(x.shape, distribution, dtype or x.dtype, device or x.device)

    return decomposition


def _sized(distribution: str) -> Callable[..., Any]:
    def decomposition(
        size: Sequence[int],
        *,
        dtype: torch.dtype | None = None,
        device: torch.device | None = None,
        generator: Any = None,
        **_: Any,
    ) -> Any:
        if generator is not None:
            return NotImplemented
        dtype = dtype or torch.get_default_dtype()
        return _draw(size, distribution, dtype, device or torch.get_default_device())

    return decomposition


def _bernoulli_p(x: torch.Tensor, p: float = 0.5, *, generator: Any = None) -> Any:
    if generator is not None:
        return NotImplemented
    return aten.lt.Scalar(_draw(x.shape, "uniform", x.dtype, x.device), p).to(x.dtype)


def _bernoulli(x: torch.Tensor, *, generator: Any = None) -> Any:
    if generator is not None:
        return NotImplemented
    return aten.lt.Tensor(_draw(x.shape, "uniform", x.dtype, x.device), x).to(x.dtype)


def random_decompositions() -> dict[Any, Callable[..., Any]]:
    """Decompositions of torch's random ops into ``seed`` + ``seeded_random``."""
    return {
        aten.rand_like.default: _like("uniform"),
        aten.randn_like.default: _like("normal"),
        aten.rand.default: _sized("uniform"),
        aten.randn.default: _sized("normal"),
        aten.bernoulli.p: _bernoulli_p,
        aten.bernoulli.default: _bernoulli,
    }
