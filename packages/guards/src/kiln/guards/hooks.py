"""Where torch keeps module hooks: per module, and process-wide for every module.

A module with hooks runs them around ``forward``, so a graph captured without them
is wrong with them; guards compare these registries.
"""

from __future__ import annotations

from typing import Any

import torch.nn.modules.module as nn_module

__all__ = ["global_hook_dicts", "module_hook_names"]

module_hook_names = (
    "_forward_hooks",
    "_forward_pre_hooks",
    "_backward_hooks",
    "_backward_pre_hooks",
)
global_hook_dicts: tuple[dict[Any, Any], ...] = tuple(
    getattr(nn_module, name)
    for name in (
        "_global_forward_hooks",
        "_global_forward_pre_hooks",
        "_global_backward_hooks",
        "_global_backward_pre_hooks",
    )
    if hasattr(nn_module, name)
)
