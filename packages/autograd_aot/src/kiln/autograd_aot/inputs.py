"""Graph inputs: fakes of the runtime's tensors, and inputs that share memory.

A program may mutate an input that shares memory with another input (the same
tensor twice, a view and its base, two overlapping views of one buffer). The
tracer tracks aliasing from a root, so such inputs are replaced by one *base*
input, and the program sees ``as_strided`` views of it: writes through one view
reach the others in the graph, and the runtime copies the base's new contents
back. Without gradients the base is a tensor over the whole storage; with them it
is the inputs' common autograd base, so the writes enter its history as in eager.

Which inputs overlap a mutated one is part of what a compiled program assumes:
:func:`shared_memory` computes it on every call of a program that mutates an
input, and a different answer selects (or compiles) another program.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import torch

from kiln.autograd_aot.errors import AotError
from kiln.autograd_aot.symbolic import fresh_fake
from kiln.capture.meta import FakeMode, FakeTensor, storage_key, to_fake

__all__ = ["Aliasing", "InputLayout", "fakes_of", "shared_memory"]

_View = tuple[tuple[int, ...], tuple[int, ...], int]
# One storage's inputs: their positions, how their base is made ("storage", "autograd",
# or why neither can be), the base's sizes, and each input's view of the base. The
# program is traced for exactly these views, so all of it is compared between calls.
Group = tuple[tuple[int, ...], str, tuple[int, ...], tuple[_View, ...]]
# The groups that hold a mutated input overlapping another; () when there are none.
Aliasing = tuple[Group, ...]


def fakes_of(
    primals: Sequence[torch.Tensor],
    needs_grad: bool,
    templates: Sequence[torch.Tensor | None] = (),
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Fakes of the inputs, and the leaves to differentiate with respect to.

    Views of one storage alias; a tensor passed twice gets two fakes (each position
    gets its own gradient, which autograd sums). A non-leaf input that requires
    grad is traced as a clone of a fake leaf, so that it may be mutated.
    An input with a symbolic template (the captured graph's fake for it, with symbolic
    sizes) gets a fresh fake with the template's sizes and strides instead, so the trace
    holds for every size the template admits; it shares memory with no other input.
    """
    mode = FakeMode()
    seen: set[int] = set()
    fakes: list[torch.Tensor] = []
    leaves: list[torch.Tensor] = []
    for i, p in enumerate(primals):
        template = templates[i] if i < len(templates) else None
        if template is not None:
            leaf: torch.Tensor = fresh_fake(template, p.device, p.requires_grad)
        else:
            leaf = to_fake(p) if id(p) in seen else mode.to_fake(p)
        seen.add(id(p))
        leaves.append(leaf)
        if needs_grad and p.requires_grad and not p.is_leaf:
            with torch.enable_grad():
                fakes.append(_strided_clone(leaf))
        else:
            fakes.append(leaf)
    return fakes, leaves


def _strided_clone(t: torch.Tensor) -> torch.Tensor:
    """A copy of ``t`` laid out as ``t`` is (``clone`` makes non-dense views contiguous):
    compilers specialize on the graph inputs' strides, and the real input keeps its own.
    A lazy conjugate or negative bit stays a bit (a view of the copied storage), as the real
    input has it: ``imag`` and ``view_as_real`` of the copy then trace what they do on it."""
    if t.is_conj():
        return _strided_clone(t.conj()).conj()
    if t.is_neg():
        return torch._neg_view(_strided_clone(torch._neg_view(t)))
    return t.new_empty_strided(t.shape, t.stride()).copy_(t)


def _storage_base(t: torch.Tensor) -> torch.Tensor:
    """A 1-D tensor over all of ``t``'s storage, in ``t``'s dtype."""
    n = t.untyped_storage().nbytes() // t.element_size()
    base = torch.empty(0, dtype=t.dtype, device=t.device)
    return base.set_(t.untyped_storage(), 0, (n,), (1,))


def _autograd_base(t: torch.Tensor) -> torch.Tensor:
    return t if t._base is None else t._base


def _extent(t: torch.Tensor) -> tuple[int, int] | None:
    """The bytes of its storage ``t`` may touch, as a half-open range (None if empty)."""
    if t.numel() == 0:
        return None
    first = last = t.storage_offset()
    for size, stride in zip(t.shape, t.stride(), strict=True):
        if stride >= 0:
            last += (size - 1) * stride
        else:
            first += (size - 1) * stride
    return int(first) * t.element_size(), (int(last) + 1) * t.element_size()


def _overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``a`` and ``b`` (over one storage) may share an element: by their extents, so
    interleaved views (``x[::2]``, ``x[1::2]``) count as overlapping, which is safe."""
    if a is b:
        return a.numel() > 0
    ea, eb = _extent(a), _extent(b)
    return ea is not None and eb is not None and ea[0] < eb[1] and eb[0] < ea[1]


def _view(t: torch.Tensor) -> _View:
    return tuple(t.shape), tuple(t.stride()), int(t.storage_offset())


def _group(primals: Sequence[torch.Tensor], members: tuple[int, ...]) -> Group:
    tensors = [primals[i] for i in members]
    kind = _base_kind(tensors)
    if kind == "autograd":
        base_size = tuple(_autograd_base(tensors[0]).shape)
    else:
        base_size = (tensors[0].untyped_storage().nbytes() // tensors[0].element_size(),)
    return members, kind, base_size, tuple(map(_view, tensors))


def _base_kind(members: Sequence[torch.Tensor]) -> str:
    """How a group's base is made: over the storage, or the members' common autograd base
    when one requires grad (then its history must record the writes)."""
    if len({t.dtype for t in members}) > 1:
        return "inputs of several dtypes"
    if not any(t.requires_grad for t in members):
        return "storage"
    bases = {id(_autograd_base(t)): _autograd_base(t) for t in members}
    if len(bases) > 1:
        return "inputs that require grad and are not views of one tensor"
    (base,) = bases.values()
    if base.storage_offset() != 0 or not base.is_contiguous():
        return "a base that requires grad and is not contiguous from its storage's start"
    return "autograd"


# The address of a tensor's storage, without making a storage object (a third of the
# cost): this runs on every call of a program that mutates an input.
_storage_id: Callable[[torch.Tensor], int] = getattr(torch._C, "_storage_id", storage_key)


def _storage_ids(primals: Sequence[torch.Tensor]) -> list[int]:
    if FakeTensor in set(map(type, primals)):  # example inputs: a fake's memory is its meta's
        return list(map(storage_key, primals))
    return list(map(_storage_id, primals))


def shared_memory(primals: Sequence[torch.Tensor], mutated: Sequence[int]) -> Aliasing:
    """The storages on which a ``mutated`` input overlaps another input: their inputs, and
    how their base is made. One storage look-up per input when none shares one."""
    keys = _storage_ids(primals)
    if len(set(keys)) == len(keys):
        return ()
    by_storage: dict[int, list[int]] = {}
    for i, key in enumerate(keys):
        by_storage.setdefault(key, []).append(i)
    out = []
    for group in by_storage.values():
        if len(group) > 1 and any(
            _overlap(primals[m], primals[o]) for m in group if m in mutated for o in group if o != m
        ):
            out.append(_group(primals, tuple(group)))
    return tuple(out)


@dataclasses.dataclass(frozen=True)
class InputLayout:
    """How the program's inputs become graph inputs.

    ``kept`` inputs pass as they are; each group of ``groups`` (inputs sharing a
    storage) becomes one base input, after the kept ones: over its whole storage,
    or, where ``grad_bases`` says so, the members' common autograd base.
    """

    num_inputs: int
    kept: tuple[int, ...]
    groups: tuple[tuple[int, ...], ...] = ()
    views: tuple[tuple[int, _View], ...] = ()
    grad_bases: tuple[bool, ...] = ()

    @staticmethod
    def identity(num_inputs: int) -> InputLayout:
        return InputLayout(num_inputs, tuple(range(num_inputs)))

    @staticmethod
    def for_mutations(
        primals: Sequence[torch.Tensor], mutated: Sequence[int]
    ) -> InputLayout | None:
        """A layout with bases for mutated inputs that share memory, or None if none do."""
        return InputLayout.for_aliasing(primals, shared_memory(primals, mutated))

    @staticmethod
    def for_aliasing(primals: Sequence[torch.Tensor], aliasing: Aliasing) -> InputLayout | None:
        """The layout for ``aliasing`` (as :func:`shared_memory` found it), None if empty."""
        if not aliasing:
            return None
        for group, kind, _, _ in aliasing:
            if kind not in ("storage", "autograd"):
                msg = (
                    f"inputs {list(group)} share memory and one is mutated; Kiln handles that "
                    f"for inputs of one dtype, without grad or views of one tensor, not for {kind}. "
                    "Pass separate tensors (e.g. .clone() one of them)."
                )
                raise AotError(msg)
        views = tuple(sorted(v for g in aliasing for v in zip(g[0], g[3], strict=True)))
        members = {i for i, _ in views}
        kept = tuple(i for i in range(len(primals)) if i not in members)
        groups = tuple(g[0] for g in aliasing)
        grad_bases = tuple(g[1] == "autograd" for g in aliasing)
        return InputLayout(len(primals), kept, groups, views, grad_bases)

    def prepare(self, primals: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """The graph inputs for the program's inputs."""
        if not self.groups:
            return list(primals)
        kept = [primals[i] for i in self.kept]
        return kept + [
            _autograd_base(primals[group[0]]) if grad else _storage_base(primals[group[0]])
            for group, grad in zip(self.groups, self.grad_bases, strict=True)
        ]

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` taking graph inputs: group members become views of their base."""
        if not self.groups:
            return fn
        views = dict(self.views)

        def with_bases(*graph_inputs: torch.Tensor) -> Any:
            inputs: list[Any] = [None] * self.num_inputs
            for i, t in zip(self.kept, graph_inputs, strict=False):
                inputs[i] = t
            for group, base in zip(self.groups, graph_inputs[len(self.kept) :], strict=True):
                for i in group:
                    inputs[i] = base.as_strided(*views[i])
            return fn(*inputs)

        return with_bases
