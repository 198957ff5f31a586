"""timm image models with random weights (``pretrained=False``): convolutions, attention, windows."""

from __future__ import annotations

import functools

import torch

from benchmarks.models.spec import Built, ModelSpec

__all__ = ["TIMM_MODELS", "specs"]

TIMM_MODELS = (
    "resnet18",
    "resnet50",
    "mobilenetv3_small_100",
    "mobilenetv3_large_100",
    "efficientnet_b0",
    "convnext_tiny",
    "regnety_002",
    "densenet121",
    "vit_tiny_patch16_224",
    "vit_base_patch16_224",
    "deit_small_patch16_224",
    "swin_tiny_patch4_window7_224",
)

# Batch size per preset: two images keep a CPU step within seconds on two cores; 64 fills a GPU.
_BATCH = {"cpu": 2, "gpu": 64}


def _build(name: str, preset: str) -> Built:
    import timm

    torch.manual_seed(0)
    model = _without_dropout(timm.create_model(name, pretrained=False))
    size = model.default_cfg.get("input_size", (3, 224, 224))
    return Built(model, (torch.randn(_BATCH[preset], *size),))


def _without_dropout(model: torch.nn.Module) -> torch.nn.Module:
    """No dropout or stochastic depth (Swin's default drop-path rate is 0.1): a training step
    must be comparable with eager's, and random masks differ between generators."""
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        if hasattr(module, "drop_prob"):  # timm's DropPath
            module.drop_prob = 0.0
    return model


def specs() -> list[ModelSpec]:
    return [ModelSpec(name, "timm", functools.partial(_build, name)) for name in TIMM_MODELS]
