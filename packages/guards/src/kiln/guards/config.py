"""Run-time switches of kiln.guards, read on every call (so they act at once).

Setting any field also bumps the module stamp (:mod:`kiln.guards.stamps`), so
turning ``trust_module_stamps`` off takes effect on the very next check.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from kiln.guards import stamps

__all__ = ["GuardsConfig", "config"]


@dataclasses.dataclass
class GuardsConfig:
    """``recompile_limit``: cache entries per code object and module objects (the modules
    an entry matched by identity) before the frame runs eagerly;
    ``accumulated_recompile_limit``: entries per code object in all.

    ``fail_on_recompile_limit``: raise :class:`RecompileLimitExceeded` instead.
    ``skip_guards``: UNSAFE; run the newest entry without checking (serving loops whose
    inputs never change). ``trust_module_stamps``: check ``MODULE_TREE`` guards by the
    module stamp; turn off to run every tree's guards on every call (when modules are
    changed in ways the stamp cannot see, e.g. ``torch.ops.aten.set_(param, t)``).
    """

    recompile_limit: int = 8
    accumulated_recompile_limit: int = 256
    fail_on_recompile_limit: bool = False
    skip_guards: bool = False
    trust_module_stamps: bool = True

    def __setattr__(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)
        stamps.bump()


config = GuardsConfig()
