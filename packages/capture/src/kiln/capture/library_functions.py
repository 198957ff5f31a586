"""Python stand-ins for torch functions that libraries call only while compiled.

Library code asks ``torch.compiler.is_compiling()`` and, under a compiler, calls torch's
higher-order operators (mamba's selective scan calls ``associative_scan``), which eager
code never reaches and whose own implementation needs Dynamo. Capture traces the stand-in
here instead: plain Python over torch ops that computes what the operator is defined to.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["substitute"]


def associative_scan(
    combine_fn: Callable[[Any, Any], Any],
    xs: Any,
    dim: int,
    reverse: bool = False,
    combine_mode: str = "pointwise",
) -> Any:
    """torch's ``associative_scan``: the inclusive scan of ``xs`` along ``dim``.

    ``xs`` is a tensor, or a tuple or list of tensors scanned together. It runs as torch's
    generic scan does, in about ``2 log2(n)`` rounds that each combine every other element at
    once: pairs first, the scan of the pairs recursively, then the elements between. A
    ``pointwise`` combine takes the batched elements as they are; any other is vmapped, so it
    sees one element at a time (the scan dimension removed). ``reverse`` scans from the last
    element, with the running result as the left operand, as torch's flip-scan-flip does.

    A step-by-step scan would chain ``n`` combines, each read by the next step and by the
    result: a graph of thousands of ops for a sequence of hundreds, and kernels that inline
    the chain recompute it for every element they store.
    """
    single = isinstance(xs, torch.Tensor)
    leaves = [xs] if single else list(xs)
    if not leaves or leaves[0].shape[dim] == 0:
        return xs
    front = [x.movedim(dim, 0) for x in leaves]
    if reverse:
        front = [x.flip(0) for x in front]
    batched = combine_fn if combine_mode == "pointwise" else torch.vmap(combine_fn)

    def combine(left: list[torch.Tensor], right: list[torch.Tensor]) -> list[torch.Tensor]:
        if single:
            return [batched(left[0], right[0])]
        return list(batched(type(xs)(left), type(xs)(right)))

    def scan(elems: list[torch.Tensor]) -> list[torch.Tensor]:
        n = elems[0].shape[0]
        if n < 2:
            return elems
        odd = scan(combine([e[0:-1:2] for e in elems], [e[1::2] for e in elems]))
        if n < 3:  # no element between the pairs' scans
            return [torch.cat([e[:1], o], 0) for e, o in zip(elems, odd, strict=True)]
        between = [o[: (n - 1) // 2] for o in odd]
        even = combine(between, [e[2::2] for e in elems])
        even = [torch.cat([e[:1], v], 0) for e, v in zip(elems, even, strict=True)]
        return [_interleave(e, o) for e, o in zip(even, odd, strict=True)]

    scanned = scan(front)
    if reverse:
        scanned = [x.flip(0) for x in scanned]
    # a one-element scan is its input: copied, as the scan of any other length is new
    out = [x.movedim(0, dim).clone() if x.shape[0] < 2 else x.movedim(0, dim) for x in scanned]
    return out[0] if single else type(xs)(out)


def _interleave(even: torch.Tensor, odd: torch.Tensor) -> torch.Tensor:
    """``even[0], odd[0], even[1], odd[1], ...`` along dim 0 (``even`` may be one longer)."""
    k = odd.shape[0]
    pairs = torch.stack([even[:k], odd], 1).flatten(0, 1)
    return pairs if even.shape[0] == k else torch.cat([pairs, even[k:]], 0)


# Keyed by the (module, qualname) the library's function object reports, so that the call is
# recognised without importing torch's implementation; the stand-in replaces it.
_SUBSTITUTES: dict[tuple[str, str], Callable[..., Any]] = {
    ("torch._higher_order_ops.associative_scan", "associative_scan"): associative_scan,
}


def substitute(fn: types.FunctionType) -> types.FunctionType | None:
    """The stand-in capture traces for ``fn``, or None."""
    found = _SUBSTITUTES.get((fn.__module__, fn.__qualname__))
    return found if isinstance(found, types.FunctionType) else None
