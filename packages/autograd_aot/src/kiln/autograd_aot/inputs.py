"""Graph inputs: fakes of the runtime's tensors, and inputs that share memory.

A program may mutate an input that shares memory with another input (two views
of one buffer). The tracer tracks aliasing from a root, so such inputs are
replaced by one *base* input over their whole storage, and the program sees
``as_strided`` views of it: writes through one view reach the others in the
graph, and the runtime copies the base's new contents back into the storage.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import torch

from kiln.autograd_aot.errors import AotError
from kiln.capture.meta import FakeMode, storage_key, to_fake

__all__ = ["InputLayout", "fakes_of"]

_View = tuple[tuple[int, ...], tuple[int, ...], int]


def fakes_of(
    primals: Sequence[torch.Tensor], needs_grad: bool
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Fakes of the inputs, and the leaves to differentiate with respect to.

    Views of one storage alias; a tensor passed twice gets two fakes (each position
    gets its own gradient, which autograd sums). A non-leaf input that requires
    grad is traced as a clone of a fake leaf, so that it may be mutated.
    """
    mode = FakeMode()
    seen: set[int] = set()
    fakes: list[torch.Tensor] = []
    leaves: list[torch.Tensor] = []
    for p in primals:
        leaf = to_fake(p) if id(p) in seen else mode.to_fake(p)
        seen.add(id(p))
        leaves.append(leaf)
        if needs_grad and p.requires_grad and not p.is_leaf:
            with torch.enable_grad():
                fakes.append(leaf.clone())
        else:
            fakes.append(leaf)
    return fakes, leaves


def _storage_base(t: torch.Tensor) -> torch.Tensor:
    """A 1-D tensor over all of ``t``'s storage, in ``t``'s dtype."""
    n = t.untyped_storage().nbytes() // t.element_size()
    base = torch.empty(0, dtype=t.dtype, device=t.device)
    return base.set_(t.untyped_storage(), 0, (n,), (1,))


@dataclasses.dataclass(frozen=True)
class InputLayout:
    """How the program's inputs become graph inputs.

    ``kept`` inputs pass as they are; each group of ``groups`` (inputs sharing a
    storage) becomes one base input, after the kept ones.
    """

    num_inputs: int
    kept: tuple[int, ...]
    groups: tuple[tuple[int, ...], ...] = ()
    views: tuple[tuple[int, _View], ...] = ()

    @staticmethod
    def identity(num_inputs: int) -> InputLayout:
        return InputLayout(num_inputs, tuple(range(num_inputs)))

    @staticmethod
    def for_mutations(
        primals: Sequence[torch.Tensor], mutated: Sequence[int]
    ) -> InputLayout | None:
        """A layout with bases for mutated inputs that share memory, or None if none do."""
        groups: dict[int, list[int]] = {}
        for i, p in enumerate(primals):
            groups.setdefault(storage_key(p), []).append(i)
        aliased = [tuple(g) for g in groups.values() if len(g) > 1 and any(i in mutated for i in g)]
        if not aliased:
            return None
        for group in aliased:
            if (
                any(primals[i].requires_grad for i in group)
                or len({primals[i].dtype for i in group}) > 1
            ):
                msg = (
                    f"inputs {list(group)} share memory and one is mutated; Kiln handles that "
                    "only for inputs of one dtype that do not require grad. Pass separate "
                    "tensors (e.g. .clone() one of them)."
                )
                raise AotError(msg)
        members = {i for g in aliased for i in g}
        views = tuple(
            (
                i,
                (
                    tuple(primals[i].shape),
                    tuple(primals[i].stride()),
                    int(primals[i].storage_offset()),
                ),
            )
            for i in sorted(members)
        )
        kept = tuple(i for i in range(len(primals)) if i not in members)
        return InputLayout(len(primals), kept, tuple(aliased), views)

    def prepare(self, primals: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """The graph inputs for the program's inputs."""
        if not self.groups:
            return list(primals)
        kept = [primals[i] for i in self.kept]
        return kept + [_storage_base(primals[group[0]]) for group in self.groups]

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
