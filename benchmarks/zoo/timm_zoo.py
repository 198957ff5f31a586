"""One timm model per timm family (module): its smallest variant, random weights, few classes.

The smallest variant is found by name first (timm's ``test_*`` models, then atto, femto, ...,
small) and then, among the few best-ranked names, by parameter count on the meta device, which
costs no memory. The image size is the smallest of 64 px, with ``img_size`` passed to the
constructor (transformers fix their patch grid at construction), 64 px without it (convnets
pool globally), and the variant's own size, whichever runs in eager first. A family whose
smallest variant is still large (mobilenetv5's is 80M parameters) gets constructor arguments
that shrink it: a few blocks of every kind its architecture uses, at small widths.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import torch

from benchmarks.zoo.spec import Built, InputSpec, make_inputs

__all__ = ["build", "families", "family_of", "smallest", "tiny_args"]

_SIZE_WORDS = ["test", "atto", "femto", "pico", "nano", "tiny", "xxs", "xs", "mini", "small", "s"]
_BIG_WORDS = re.compile(r"(large|huge|giant|gigantic|xlarge|_l_|_xl|_h_|_g_|1b|3b|7b|_e_)")
_CANDIDATES = 4
_SMALL_IMAGE = 64
_BATCH = 2


def families() -> list[str]:
    """Every timm module that registers models, sorted."""
    import timm

    return sorted(m for m in timm.list_modules() if timm.list_models(module=m))


def _rank(name: str) -> tuple[int, int, str]:
    parts = re.split(r"[_.\d]+", name)
    size = next((i for i, w in enumerate(_SIZE_WORDS) if w in parts), len(_SIZE_WORDS))
    if name.startswith("test_"):
        size = 0
    return (size + (10 if _BIG_WORDS.search(name) else 0), len(name), name)


def _tiny_mobilenetv5() -> dict[str, Any]:
    """MobileNet-V5 (Gemma 3n's vision tower: 294M parameters, 80M in its smallest variant) at
    0.4M: one edge-residual block, then inverted-residual, multi-query attention (with and
    without a strided key/value) and plain inverted-residual blocks, the kinds its 84 blocks
    use, four stages of them as in the full model."""
    from timm.models._efficientnet_builder import decode_arch_def

    arch = [
        ["er_r1_k3_s2_e4_c16"],
        ["uir_r1_a3_k5_s2_e6_c24"],
        ["uir_r1_a5_k5_s2_e6_c32", "mqa_r1_k3_h2_v2_s1_d8_c32", "uir_r1_a0_k0_s1_e2_c32"],
        ["uir_r1_a5_k5_s2_e6_c48", "mqa_r1_k3_h2_s1_d8_c48", "uir_r1_a0_k0_s1_e2_c48"],
    ]
    return {"block_args": decode_arch_def(arch), "stem_size": 16}


# families whose every registered variant is large: constructor arguments that shrink them
_TINY_ARGS: dict[str, Callable[[], dict[str, Any]]] = {"mobilenetv5": _tiny_mobilenetv5}


def tiny_args(family: str) -> dict[str, Any]:
    """Constructor arguments that make ``family``'s models tiny, or none where its smallest
    variant already is."""
    make = _TINY_ARGS.get(family)
    return make() if make is not None else {}


def family_of(name: str) -> str:
    """The timm family (module) that registers the model ``name``."""
    from timm.models import model_entrypoint

    return str(model_entrypoint(name).__module__).rsplit(".", 1)[-1]


def smallest(family: str) -> str:
    """The family's smallest variant: by name first, then by parameters on the meta device."""
    import timm

    names = sorted(timm.list_models(module=family), key=_rank)[:_CANDIDATES]
    sizes: dict[str, int] = {}
    for name in names:
        try:
            with torch.device("meta"):
                m = timm.create_model(name, pretrained=False, num_classes=10)
            sizes[name] = sum(p.numel() for p in m.parameters())
        except Exception:  # a variant meta cannot build is judged by its name alone
            continue
    return min(sizes, key=lambda n: sizes[n]) if sizes else names[0]


def _forward_ok(model: torch.nn.Module, inputs: dict[str, InputSpec]) -> None:
    with torch.no_grad():
        model(**make_inputs(inputs, 0))


def build(family: str) -> Built:
    """The family's smallest variant at the smallest image size that runs in eager."""
    import timm

    name = smallest(family)
    default = timm.get_pretrained_cfg(name)
    full = tuple(default.input_size) if default is not None else (3, 224, 224)
    attempts: list[tuple[dict[str, Any], tuple[int, ...]]] = [
        ({"img_size": _SMALL_IMAGE}, (full[0], _SMALL_IMAGE, _SMALL_IMAGE)),
        ({}, (full[0], _SMALL_IMAGE, _SMALL_IMAGE)),
        ({}, full),
    ]
    errors = []
    for kwargs, shape in attempts:
        if max(shape[1:]) > max(full[1:]):
            continue
        try:
            torch.manual_seed(0)
            model = timm.create_model(
                name, pretrained=False, num_classes=10, **tiny_args(family), **kwargs
            ).eval()
            inputs = {"x": InputSpec("float", (_BATCH, *shape))}
            _forward_ok(model, inputs)
        except Exception as e:
            errors.append(f"{kwargs or 'default'} {shape}: {type(e).__name__}: {e}")
            continue
        return Built(family, model, inputs, name, {"image": list(shape)})
    raise RuntimeError(f"{name}: " + " | ".join(errors))
