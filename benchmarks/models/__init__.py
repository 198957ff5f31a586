"""The benchmark suite: timm, HuggingFace and hand-written models, looked up by name or suite."""

from __future__ import annotations

from benchmarks.models import handwritten, text, vision
from benchmarks.models.spec import PRESETS, Built, ModelSpec, default_loss, first_tensor

__all__ = [
    "PRESETS",
    "Built",
    "ModelSpec",
    "all_specs",
    "default_loss",
    "first_tensor",
    "get",
    "select",
]


def all_specs() -> dict[str, ModelSpec]:
    """Every entry by name, debug models included (they are selectable only by name)."""
    specs = [*vision.specs(), *text.specs(), *handwritten.specs(), *handwritten.debug_specs()]
    return {s.name: s for s in specs}


def get(name: str) -> ModelSpec:
    specs = all_specs()
    if name not in specs:
        msg = f"unknown model {name!r}; known: {', '.join(sorted(specs))}"
        raise KeyError(msg)
    return specs[name]


def select(names: list[str] | None) -> list[ModelSpec]:
    """Models by name or suite name (``timm``, ``huggingface``, ``handwritten``); None: all but debug."""
    specs = all_specs()
    if not names:
        return [s for s in specs.values() if s.suite != "debug"]
    chosen: list[ModelSpec] = []
    for name in names:
        group = [s for s in specs.values() if s.suite == name]
        for spec in group or [get(name)]:
            if spec not in chosen:
                chosen.append(spec)
    return chosen
