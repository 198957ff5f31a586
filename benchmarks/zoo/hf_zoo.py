"""Every transformers architecture (its base model) built from a tiny config, with random weights.

transformers' own model tests build each model from a small config (hidden size 32, 2 layers,
2-4 heads, a vocabulary under 100) so that the whole zoo runs on a CPU in seconds. Those test
helpers do not ship with the package, so this module shrinks each architecture's default config
by the same conventions: every size field it knows by name is set to the tiny value, lists
sized per layer are cut to the new layer count, nested configs (text, vision, audio, ...) are
shrunk the same way, a config that wraps a timm model by name is shrunk as the timm zoo
shrinks that family, and token ids are moved inside the small vocabulary. Dropout and
train-time masking are off so that train mode compares deterministically. When the shrunk
config cannot build or run, a milder one (image sizes kept) is tried before the model is
reported skipped.

Inputs follow the forward's signature: the main input (``model.main_input_name``: token ids,
pixel values, audio samples or features), plus token or pixel inputs (and decoder ids for
encoder-decoders) that multimodal models need; the first set that runs in eager is kept. A
forward that refuses to train without labels gets them in train mode, where the zoo knows
their names.
"""

from __future__ import annotations

import copy
import inspect
from typing import Any

import torch

from benchmarks.zoo.spec import Built, InputSpec, make_inputs

__all__ = ["architectures", "build", "tiny_config"]

VOCAB = 99
HIDDEN = 32
LAYERS = 2
HEADS = 4
_BATCH, _SEQ = 2, 16
_FRAMES = 2  # spectrogram frames per token in the duration labels of train mode

_TINY: dict[str, int] = {
    **dict.fromkeys(
        ["hidden_size", "d_model", "n_embd", "n_embed", "embed_dim", "dim", "word_embed_proj_dim"],
        HIDDEN,
    ),
    **dict.fromkeys(["projection_dim", "text_embed_dim", "vision_embed_dim", "proj_dim"], HIDDEN),
    **dict.fromkeys(
        ["intermediate_size", "ffn_dim", "encoder_ffn_dim", "decoder_ffn_dim", "d_ff", "d_inner"],
        37,
    ),
    **dict.fromkeys(["n_inner", "mlp_dim", "ffn_hidden_size"], 37),
    # fastspeech2_conformer's feed-forward widths and variance predictors' channels
    **dict.fromkeys(["linear_units", "encoder_linear_units", "decoder_linear_units"], 37),
    **dict.fromkeys(
        ["duration_predictor_channels", "energy_predictor_channels", "pitch_predictor_channels"],
        HIDDEN,
    ),
    **dict.fromkeys(
        ["moe_intermediate_size", "shared_expert_intermediate_size", "expert_intermediate_size"], 16
    ),
    **dict.fromkeys(
        [
            "num_hidden_layers",
            "n_layer",
            "n_layers",
            "num_layers",
            "encoder_layers",
            "decoder_layers",
            "num_decoder_layers",
            "num_encoder_layers",
            "num_text_layers",
            "num_vision_layers",
        ],
        LAYERS,
    ),
    **dict.fromkeys(
        [
            "num_attention_heads",
            "n_head",
            "n_heads",
            "encoder_attention_heads",
            "decoder_attention_heads",
            "num_heads",
        ],
        HEADS,
    ),
    **dict.fromkeys(["num_key_value_heads", "num_kv_heads", "multi_query_group_num"], 2),
    **dict.fromkeys(["head_dim", "kv_channels", "qk_nope_head_dim", "v_head_dim"], 8),
    **dict.fromkeys(["qk_rope_head_dim", "kv_lora_rank", "q_lora_rank"], 8),
    **dict.fromkeys(["num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts"], 4),
    **dict.fromkeys(["num_experts_per_tok", "moe_topk", "top_k"], 2),
    **dict.fromkeys(["n_group", "topk_group", "n_shared_experts"], 1),
    # Mamba-2 mixers of hybrid models (falcon_h1): the chunked scan materializes
    # chunk x chunk x heads x state floats, billions at the defaults (256, 128, 256)
    "mamba_n_heads": HEADS,
    "mamba_d_ssm": HEADS * 8,
    "mamba_d_state": 16,
    "mamba_chunk_size": 16,
    # and under nemotron_h's names: 128 heads of 64 over a 128-wide state at the defaults
    "mamba_num_heads": HEADS,
    "mamba_head_dim": 8,
    "ssm_state_size": 16,
    "n_groups": 1,
    "moe_shared_expert_intermediate_size": 37,
    "vocab_size": VOCAB,
    "max_source_positions": 32,
}
_IMAGE: dict[str, int] = {"image_size": 32}
_LAYER_COUNTS = ["num_hidden_layers", "n_layer", "num_layers", "n_layers"]
_DROPOUT_WORDS = ("dropout", "drop_prob", "drop_path", "layerdrop")
_NESTED_LISTS = {"depths": 1, "hidden_sizes": 32, "embed_dims": 32, "conv_dim": 32}
# a backbone's chosen stages name layers the shrunk model may no longer have: its default
_STAGES = ("out_features", "out_indices")


def architectures() -> list[str]:
    """Every model type with a base model class in this transformers, sorted."""
    from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES

    return sorted(MODEL_MAPPING_NAMES)


def _is_mask_prob(key: str) -> bool:
    """SpecAugment-style masking in train mode (``mask_time_prob``), drawn with numpy."""
    return key.startswith("mask_") and key.endswith("_prob")


def _shrink(d: dict[str, Any], small_images: bool) -> dict[str, Any]:
    """``d`` (a config's ``to_dict()``) with every known size field made tiny, recursively."""
    layers = next((d[k] for k in _LAYER_COUNTS if isinstance(d.get(k), int)), None)
    table = {**_TINY, **(_IMAGE if small_images else {})}
    out = dict(d)
    for key, value in d.items():
        if isinstance(value, dict) and ("model_type" in value or key.endswith("_config")):
            out[key] = _shrink(value, small_images)
        elif key in table and isinstance(value, int) and not isinstance(value, bool):
            out[key] = min(value, table[key]) if key in _IMAGE else table[key]
        elif key in ("num_heads", "num_attention_heads") and isinstance(value, list) and value:
            out[key] = [2**i for i in range(len(value))]  # divides the per-stage width
        elif key in _STAGES:
            out[key] = None
        elif (any(w in key for w in _DROPOUT_WORDS) or _is_mask_prob(key)) and isinstance(
            value, float
        ):
            out[key] = 0.0
        elif key in _NESTED_LISTS and isinstance(value, list) and value:
            base = _NESTED_LISTS[key]
            if key in ("depths", "conv_dim"):
                out[key] = [base] * len(value)
            else:
                out[key] = [base * 2**i for i in range(len(value))]
        elif (key.endswith("_token_id") or key.endswith("_token_index")) and isinstance(value, int):
            out[key] = value if value < VOCAB - 10 else VOCAB - 1 - sum(map(ord, key)) % 9
    if isinstance(layers, int) and layers > LAYERS:
        for key, value in d.items():  # per-layer lists (layer types, sliding windows, ...)
            if isinstance(value, list) and len(value) == layers:
                out[key] = value[:LAYERS]
    if isinstance(d.get("architecture"), str) and "model_args" in d:
        out.update(_tiny_timm(d["architecture"], d["model_args"]))
    if "use_cache" in d:
        out["use_cache"] = False
    return out


def _tiny_timm(architecture: str, model_args: dict[str, Any] | None) -> dict[str, Any]:
    """A config that wraps a timm model by name (``TimmWrapperConfig`` and its subclasses, such
    as Gemma 3n's vision tower) shrunk as the timm zoo shrinks that model's family: with the
    family's shrinking constructor arguments, else by its smallest variant."""
    from benchmarks.zoo import timm_zoo

    try:
        family = timm_zoo.family_of(architecture)
    except KeyError:  # not a name timm registers
        return {}
    args = timm_zoo.tiny_args(family)
    if args:
        return {"model_args": {**(model_args or {}), **args}}
    return {"architecture": timm_zoo.smallest(family)}


def tiny_config(model_type: str, small_images: bool = True) -> Any:
    """``model_type``'s default config shrunk to tiny sizes."""
    from transformers import AutoConfig

    default = AutoConfig.for_model(model_type)
    cls = type(default)
    return cls(**_shrink(default.to_dict(), small_images))


def _sub(config: Any, attr: str) -> Any:
    """``attr`` from ``config`` or the first nested config that has it."""
    if getattr(config, attr, None) is not None:
        return getattr(config, attr)
    nested = ("text_config", "vision_config", "audio_config", "encoder", "decoder", "model_config")
    for name in nested:
        sub = getattr(config, name, None)
        if sub is not None and getattr(sub, attr, None) is not None:
            return getattr(sub, attr)
    return None


def _image_size(config: Any) -> int:
    size = _sub(config, "image_size") or 32
    return int(size[0] if isinstance(size, list | tuple) else size)


def _one(name: str, config: Any) -> InputSpec | None:
    vocab = int(_sub(config, "vocab_size") or VOCAB)
    if name in ("input_ids", "decoder_input_ids"):
        return InputSpec("ids", (_BATCH, _SEQ), 3, min(vocab, VOCAB) - 10)
    if name == "pixel_values":
        channels = int(_sub(config, "num_channels") or 3)
        size = _image_size(config)
        return InputSpec("float", (_BATCH, channels, size, size))
    if name == "input_values":
        return InputSpec("float", (_BATCH, 4000))
    if name == "input_features":
        mels = _sub(config, "num_mel_bins")
        positions = _sub(config, "max_source_positions")
        if mels and positions:
            return InputSpec("float", (_BATCH, int(mels), 2 * int(positions)))
        per_channel = _sub(config, "input_feat_per_channel")
        if per_channel:
            channels = int(_sub(config, "input_channels") or 1)
            return InputSpec("float", (_BATCH, 32, int(per_channel) * channels))
        return InputSpec("float", (_BATCH, 32, int(mels or _sub(config, "feature_size") or 80)))
    return None


def _input_sets(model: torch.nn.Module, config: Any) -> list[dict[str, InputSpec]]:
    params = inspect.signature(model.forward).parameters
    main = getattr(model, "main_input_name", "input_ids")
    extras = [n for n in ("input_ids", "pixel_values") if n in params and n != main]
    decoder = ["decoder_input_ids"] if getattr(config, "is_encoder_decoder", False) else []
    decoder = [n for n in decoder if n in params]
    choices = [[main], [main, *decoder], [main, *extras], [main, *extras, *decoder]]
    sets: list[dict[str, InputSpec]] = []
    for names in choices:
        specs = {n: _one(n, config) for n in dict.fromkeys(names)}
        if all(s is not None for s in specs.values()):
            full = {n: s for n, s in specs.items() if s is not None}
            if full not in sets:
                sets.append(full)
    return sets


def _label_specs(config: Any, batch: int, tokens: int) -> dict[str, InputSpec]:
    """Training labels by the forward's argument names, shaped after the token inputs.

    Every token lasts the same number of frames, so the spectrogram's length is known before
    the forward (a text-to-speech model repeats each token's state by its duration).
    """
    mels = int(_sub(config, "num_mel_bins") or 80)
    return {
        "duration_labels": InputSpec("ids", (batch, tokens), _FRAMES, _FRAMES + 1),
        "pitch_labels": InputSpec("float", (batch, tokens, 1)),
        "energy_labels": InputSpec("float", (batch, tokens, 1)),
        "spectrogram_labels": InputSpec("float", (batch, tokens * _FRAMES, mels)),
    }


def _runs_in_train(model: torch.nn.Module, inputs: dict[str, InputSpec]) -> bool:
    trained = copy.deepcopy(model).train()  # a copy: train mode updates running statistics
    try:
        with torch.no_grad():
            trained(**make_inputs(inputs, 0))
    except Exception:
        return False
    return True


def _train_labels(
    model: torch.nn.Module, config: Any, inputs: dict[str, InputSpec]
) -> dict[str, InputSpec]:
    """The labels train mode must pass where the forward fails in training without them and
    takes labels the zoo knows how to make; none where it trains without (eval's inputs then
    serve both modes) or the labels do not help (the train run then reports the forward's own
    error)."""
    params = inspect.signature(model.forward).parameters
    main = next(iter(inputs.values()))  # the main input comes first in every input set
    specs = _label_specs(config, *main.shape[:2]) if len(main.shape) >= 2 else {}
    labels = {n: s for n, s in specs.items() if n in params}
    if not labels or _runs_in_train(model, inputs):
        return {}
    return labels if _runs_in_train(model, {**inputs, **labels}) else {}


def build(model_type: str) -> Built:
    """``model_type``'s base model from a tiny config, and the first input set eager runs."""
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES

    cls_name = MODEL_MAPPING_NAMES[model_type]
    cls = getattr(transformers, cls_name)
    errors = []
    for small_images in (True, False):
        try:
            config = tiny_config(model_type, small_images)
            torch.manual_seed(0)
            model = cls(config).eval()
        except Exception as e:
            errors.append(f"build: {type(e).__name__}: {str(e)[:300]}")
            continue
        sets = _input_sets(model, config)
        if not sets:
            errors.append(f"no input recipe for main input {model.main_input_name!r}")
            break
        for inputs in sets:
            try:
                with torch.no_grad():
                    model(**make_inputs(inputs, 0))
            except Exception as e:
                errors.append(f"eager {sorted(inputs)}: {type(e).__name__}: {str(e)[:300]}")
                continue
            labels = _train_labels(model, config, inputs)
            notes = {"small_images": small_images}
            return Built(model_type, model, inputs, cls_name, notes, labels)
    raise RuntimeError(" | ".join(dict.fromkeys(errors)))
