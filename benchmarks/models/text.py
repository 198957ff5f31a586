"""HuggingFace transformers built from configs (random weights): encoders, decoders, seq2seq.

``cpu`` configs are small (2 layers, width 256, 128 tokens); ``gpu`` ones are base-size. Dropout
is zero so training steps are deterministic and comparable with eager.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import torch

from benchmarks.models.spec import Built, ModelSpec

__all__ = ["Size", "specs"]


@dataclasses.dataclass(frozen=True)
class Size:
    """The shape knobs shared by every transformer config."""

    hidden: int
    layers: int
    heads: int
    ffn: int
    vocab: int
    seq: int
    batch: int


_SIZES = {
    "cpu": Size(hidden=256, layers=2, heads=4, ffn=512, vocab=1024, seq=128, batch=2),
    "gpu": Size(hidden=768, layers=12, heads=12, ffn=3072, vocab=30522, seq=512, batch=16),
}
# Decoder-only LMs at GPU size: Llama-style widths with grouped-query attention.
_LM_GPU = Size(hidden=1024, layers=12, heads=16, ffn=2816, vocab=32000, seq=1024, batch=8)


def _bert_like(config_name: str, model_name: str, s: Size, **extra: Any) -> torch.nn.Module:
    import transformers

    config = getattr(transformers, config_name)(
        hidden_size=s.hidden,
        num_hidden_layers=s.layers,
        num_attention_heads=s.heads,
        intermediate_size=s.ffn,
        vocab_size=s.vocab,
        max_position_embeddings=s.seq + 2,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        **extra,
    )
    return getattr(transformers, model_name)(config)


def bert(s: Size) -> torch.nn.Module:
    return _bert_like("BertConfig", "BertModel", s)


def bert_checkpointed(s: Size) -> torch.nn.Module:
    """BERT whose layers are recomputed in the backward (activation checkpointing)."""
    model = bert(s)
    model.gradient_checkpointing_enable()
    return model


def roberta(s: Size) -> torch.nn.Module:
    return _bert_like("RobertaConfig", "RobertaModel", s, pad_token_id=1)


def albert(s: Size) -> torch.nn.Module:
    return _bert_like("AlbertConfig", "AlbertModel", s, embedding_size=128)


def electra(s: Size) -> torch.nn.Module:
    return _bert_like("ElectraConfig", "ElectraModel", s, embedding_size=s.hidden // 2)


def distilbert(s: Size) -> torch.nn.Module:
    import transformers

    config = transformers.DistilBertConfig(
        dim=s.hidden,
        n_layers=s.layers,
        n_heads=s.heads,
        hidden_dim=s.ffn,
        vocab_size=s.vocab,
        max_position_embeddings=s.seq,
        dropout=0.0,
        attention_dropout=0.0,
    )
    return transformers.DistilBertModel(config)


def gpt2(s: Size) -> torch.nn.Module:
    import transformers

    config = transformers.GPT2Config(
        n_embd=s.hidden,
        n_layer=s.layers,
        n_head=s.heads,
        n_positions=s.seq,
        vocab_size=s.vocab,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=s.vocab - 1,
        eos_token_id=s.vocab - 1,
        use_cache=False,
    )
    return transformers.GPT2LMHeadModel(config)


def t5_encoder(s: Size) -> torch.nn.Module:
    import transformers

    config = transformers.T5Config(
        d_model=s.hidden,
        d_kv=s.hidden // s.heads,
        d_ff=s.ffn,
        num_layers=s.layers,
        num_heads=s.heads,
        vocab_size=s.vocab,
        dropout_rate=0.0,
        use_cache=False,
    )
    return transformers.T5EncoderModel(config)


def bart(s: Size) -> torch.nn.Module:
    import transformers

    config = transformers.BartConfig(
        d_model=s.hidden,
        encoder_layers=s.layers,
        decoder_layers=s.layers,
        encoder_attention_heads=s.heads,
        decoder_attention_heads=s.heads,
        encoder_ffn_dim=s.ffn,
        decoder_ffn_dim=s.ffn,
        vocab_size=s.vocab,
        max_position_embeddings=s.seq,
        dropout=0.0,
        attention_dropout=0.0,
        activation_dropout=0.0,
        use_cache=False,
    )
    return transformers.BartModel(config)


def _causal_lm(config_name: str, model_name: str, s: Size) -> torch.nn.Module:
    import transformers

    config = getattr(transformers, config_name)(
        hidden_size=s.hidden,
        intermediate_size=s.ffn,
        num_hidden_layers=s.layers,
        num_attention_heads=s.heads,
        num_key_value_heads=max(1, s.heads // 4),
        vocab_size=s.vocab,
        max_position_embeddings=s.seq,
        use_cache=False,
    )
    return getattr(transformers, model_name)(config)


def llama(s: Size) -> torch.nn.Module:
    return _causal_lm("LlamaConfig", "LlamaForCausalLM", s)


def mistral(s: Size) -> torch.nn.Module:
    return _causal_lm("MistralConfig", "MistralForCausalLM", s)


def qwen2(s: Size) -> torch.nn.Module:
    return _causal_lm("Qwen2Config", "Qwen2ForCausalLM", s)


_MODELS: dict[str, tuple[Callable[[Size], torch.nn.Module], bool]] = {
    # name -> (constructor, decoder-only LM using the larger GPU size)
    "hf_bert": (bert, False),
    "hf_bert_checkpointed": (bert_checkpointed, False),
    "hf_roberta": (roberta, False),
    "hf_distilbert": (distilbert, False),
    "hf_albert": (albert, False),
    "hf_electra": (electra, False),
    "hf_gpt2": (gpt2, False),
    "hf_t5_encoder": (t5_encoder, False),
    "hf_bart": (bart, False),
    "hf_llama": (llama, True),
    "hf_mistral": (mistral, True),
    "hf_qwen2": (qwen2, True),
}


def _build(name: str, preset: str) -> Built:
    make, is_lm = _MODELS[name]
    size = _LM_GPU if is_lm and preset == "gpu" else _SIZES[preset]
    torch.manual_seed(0)
    model = make(size)
    # Token 0 is a real token in every vocab here; avoid the pad id so no position is masked.
    ids = torch.randint(2, size.vocab, (size.batch, size.seq))
    return Built(model, (), {"input_ids": ids})


def specs() -> list[ModelSpec]:
    return [ModelSpec(name, "huggingface", functools.partial(_build, name)) for name in _MODELS]
