"""Every guard kind kiln.guards checks: one :class:`~kiln.guards.kinds.base.Kind` subclass per
:class:`~kiln.capture.guard_data.GuardKind`, registered in :data:`KINDS` when its module is
imported here. See the package README, "Adding a guard kind"."""

from kiln.guards.kinds import objects, shape, state, tensor, values
from kiln.guards.kinds.base import KINDS, Emitter, Kind, Rank, Reach, kind_of, register

__all__ = [
    "KINDS",
    "Emitter",
    "Kind",
    "Rank",
    "Reach",
    "kind_of",
    "objects",
    "register",
    "shape",
    "state",
    "tensor",
    "values",
]
