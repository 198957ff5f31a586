"""The benchmark suite: timm, HuggingFace and hand-written models, looked up by name or suite.

The breadth suites (``breadth``, ``breadth-cpu``: :mod:`benchmarks.models.breadth`) are a
sample of the model zoo; they are selected only by name, like the debug models.
"""

from __future__ import annotations

from benchmarks.models import breadth, handwritten, text, vision
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
    """Every entry by name, debug models included (they are selectable only by name); the
    breadth entries are not listed here (see :func:`get`)."""
    specs = [*vision.specs(), *text.specs(), *handwritten.specs(), *handwritten.debug_specs()]
    return {s.name: s for s in specs}


def get(name: str) -> ModelSpec:
    """The entry ``name``; ``timm.<variant>`` and ``hf.<model type>`` are breadth entries."""
    if breadth.is_breadth(name):
        return breadth.spec(name)
    specs = all_specs()
    if name not in specs:
        msg = f"unknown model {name!r}; known: {', '.join(sorted(specs))}"
        raise KeyError(msg)
    return specs[name]


def select(names: list[str] | None) -> list[ModelSpec]:
    """Models by name or suite name (``timm``, ``huggingface``, ``handwritten``, ``breadth``,
    ``breadth-cpu``); None: all but debug and breadth."""
    specs = all_specs()
    if not names:
        return [s for s in specs.values() if s.suite != "debug"]
    chosen: list[ModelSpec] = []
    for name in names:
        if name in breadth.SUITES:
            group = breadth.sample(name)
        else:
            group = [s for s in specs.values() if s.suite == name] or [get(name)]
        for spec in group:
            if spec.name not in {c.name for c in chosen}:
                chosen.append(spec)
    return chosen
