"""The breadth suite: a fixed sample of the capture-breadth zoo, timed at realistic sizes.

The zoo (``benchmarks.zoo``) builds every timm family and transformers architecture tiny, to
check capture; this suite times a sample of the same models at the sizes people run them.
Entries are named by source: ``timm.<model name>`` (a timm variant) and ``hf.<model type>``
(a transformers architecture's base model). Any such name builds, so ``--models timm.dla34``
times a model outside the sample too. The sample is the list in ``breadth_sample.json``, which
:mod:`benchmarks.models.breadth_rule` derives from the zoo by the rule its docstring states:
``breadth`` is the GPU sample (at least 60 models), ``breadth-cpu`` the CPU one (at least 30).

Sizes, with random weights (nothing is downloaded) and dropout, drop-path and train-time
masking off so that training steps compare with eager:

- timm: the variant at its default input resolution (``pretrained_cfg["input_size"]``) and
  1000 classes. ``gpu`` batch: 64 images at 224 px, fewer at larger sizes (the power of two
  nearest below ``64 * (224 / side)**2``, at least 8), so pixels per step stay about even.
  ``cpu`` batch: 2 images.
- transformers: the default config of the model type, with every stack cut to at most 12
  layers (a deeper default repeats the same layer) and no key/value cache. Token models take
  ``gpu`` 16 sequences of 256 tokens, ``cpu`` 2 of 128 (fewer where the model has fewer
  positions), random ids that avoid the config's special token ids; encoder-decoders get the
  same ids as decoder input. Image models take pixel values at the config's image size, the
  batch as for timm.

The ``tiny`` preset (tests only) is one image, or one sequence of 16 tokens through 2 layers.
"""

from __future__ import annotations

import functools
import inspect
import json
from pathlib import Path
from typing import Any

import torch

from benchmarks.models.spec import Built, ModelSpec

__all__ = [
    "LAYER_CAP",
    "SAMPLE_FILE",
    "SUITES",
    "build",
    "hf_config",
    "image_batch",
    "inputs",
    "is_breadth",
    "sample",
    "spec",
]

SUITES = {"breadth": "gpu", "breadth-cpu": "cpu"}
SAMPLE_FILE = Path(__file__).with_name("breadth_sample.json")
LAYER_CAP = {"gpu": 12, "cpu": 12, "tiny": 2}
_SEQ = {"gpu": (16, 256), "cpu": (2, 128), "tiny": (1, 16)}  # (batch, tokens)
_LAYER_KEYS = (
    "num_hidden_layers",
    "n_layer",
    "n_layers",
    "num_layers",
    "encoder_layers",
    "decoder_layers",
    "num_encoder_layers",
    "num_decoder_layers",
)
_DROPOUT_WORDS = ("dropout", "drop_prob", "drop_path", "layerdrop")
_NESTED = ("text_config", "vision_config", "encoder", "decoder", "model_config")
_FIRST_ID = 10  # ids below this are special in most vocabularies


def is_breadth(name: str) -> bool:
    """Whether ``name`` is a breadth entry's name (``timm.<variant>`` or ``hf.<model type>``)."""
    return name.startswith(("timm.", "hf.")) and len(name.split(".", 1)[1]) > 0


def spec(name: str) -> ModelSpec:
    """The entry ``name``, built from its name alone."""
    if not is_breadth(name):
        msg = f"{name!r} is not a breadth entry (timm.<variant> or hf.<model type>)"
        raise KeyError(msg)
    return ModelSpec(name, "breadth", functools.partial(build, name))


@functools.cache
def _sample_file() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(SAMPLE_FILE.read_text())
    return data


def sample(suite: str) -> list[ModelSpec]:
    """The entries of ``suite`` (``breadth`` or ``breadth-cpu``), in the sample's order."""
    preset = SUITES[suite]
    return [spec(e["name"]) for e in _sample_file()["entries"] if e[preset]]


def build(name: str, preset: str) -> Built:
    """The entry's model (seeded random weights) and its inputs at ``preset``."""
    source, _, what = name.partition(".")
    torch.manual_seed(0)
    model = _timm(what) if source == "timm" else _hf(what, preset)
    return inputs(model, preset)


def inputs(model: torch.nn.Module, preset: str) -> Built:
    """``model`` (an entry's, built at any preset but ``tiny``) with ``preset``'s inputs."""
    cfg = getattr(model, "pretrained_cfg", None)
    if isinstance(cfg, dict):  # timm's create_model sets it
        size = tuple(cfg.get("input_size", (3, 224, 224)))
        return Built(model, (torch.randn(image_batch(size[-1], preset), *size),))
    return Built(model, (), _hf_inputs(model, model.config, preset))


def image_batch(side: int, preset: str) -> int:
    """Images per step: 2 on the CPU; on the GPU about 64 images' worth of 224-px pixels."""
    if preset != "gpu":
        return 1 if preset == "tiny" else 2
    want = 64 * (224 / side) ** 2
    batch = 8
    while batch * 2 <= min(want, 64):
        batch *= 2
    return batch


def _timm(variant: str) -> torch.nn.Module:
    import timm

    from benchmarks.models.vision import _without_dropout

    return _without_dropout(timm.create_model(variant, pretrained=False))


def _capped(d: dict[str, Any], layers: int) -> dict[str, Any]:
    """A config's ``to_dict()`` with its stacks cut to ``layers``, dropout and cache off."""
    out = dict(d)
    counts = {v for k, v in d.items() if k in _LAYER_KEYS and isinstance(v, int) and v > layers}
    for key, value in d.items():
        if isinstance(value, dict) and ("model_type" in value or key.endswith("_config")):
            out[key] = _capped(value, layers)
        elif key in _LAYER_KEYS and isinstance(value, int) and not isinstance(value, bool):
            out[key] = min(value, layers)
        elif isinstance(value, list) and len(value) in counts:  # per-layer lists
            out[key] = value[:layers]
        elif isinstance(value, float) and (
            any(w in key for w in _DROPOUT_WORDS) or (key.startswith("mask_") and "prob" in key)
        ):
            out[key] = 0.0
    if "use_cache" in d:
        out["use_cache"] = False
    return out


def _sub(config: Any, attr: str) -> Any:
    """``attr`` of ``config`` or of the first nested config that has it."""
    if getattr(config, attr, None) is not None:
        return getattr(config, attr)
    for name in _NESTED:
        value = getattr(getattr(config, name, None), attr, None)
        if value is not None:
            return value
    return None


def _special_ids(value: Any, key: str = "") -> set[int]:
    """Every special token id a config names (``*_token_id``, ``*_token_index``, lists too)."""
    if isinstance(value, dict):
        return set().union(*(_special_ids(v, str(k)) for k, v in value.items()))
    special = key.endswith(("_token_id", "_token_ids", "_token_index", "_token_indices"))
    if special and isinstance(value, int) and not isinstance(value, bool):
        return {value}
    if special and isinstance(value, list | tuple):
        return {v for v in value if isinstance(v, int)}
    return set()


def hf_config(model_type: str, preset: str) -> Any:
    """``model_type``'s default config with the preset's layer cap, dropout and cache off."""
    from transformers import AutoConfig

    default = AutoConfig.for_model(model_type)
    return type(default)(**_capped(default.to_dict(), LAYER_CAP[preset]))


def _hf(model_type: str, preset: str) -> torch.nn.Module:
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES

    model: torch.nn.Module = getattr(transformers, MODEL_MAPPING_NAMES[model_type])(
        hf_config(model_type, preset)
    )
    return model


def _hf_inputs(model: torch.nn.Module, config: Any, preset: str) -> dict[str, torch.Tensor]:
    main = getattr(model, "main_input_name", "input_ids")
    params = inspect.signature(model.forward).parameters
    if main == "pixel_values":
        size = _sub(config, "image_size") or 224
        side = int(size[0] if isinstance(size, list | tuple) else size)
        channels = int(_sub(config, "num_channels") or 3)
        return {"pixel_values": torch.randn(image_batch(side, preset), channels, side, side)}
    if main != "input_ids":
        msg = f"main input {main!r}: the breadth suite times token and image models"
        raise ValueError(msg)
    batch, seq = _SEQ[preset]
    positions = _sub(config, "max_position_embeddings") or _sub(config, "n_positions")
    if isinstance(positions, int) and positions < seq + 2:
        seq = positions - 2  # learned positions may start after the padding id
    vocab = int(_sub(config, "vocab_size"))
    ids = torch.randint(_FIRST_ID, vocab, (batch, seq))
    special = torch.tensor(sorted(_special_ids(config.to_dict())), dtype=ids.dtype)
    ids = torch.where(torch.isin(ids, special), _FIRST_ID, ids)
    kwargs = {"input_ids": ids}
    if getattr(config, "is_encoder_decoder", False) and "decoder_input_ids" in params:
        kwargs["decoder_input_ids"] = ids.clone()
    return kwargs
