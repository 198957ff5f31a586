"""Real models capture as exactly one graph, in eval and train mode, equal to eager.

resnet18, BertModel and GPT2Model are covered in test_modules.py; these are the rest:
timm mobilenetv3_small_100 and vit_tiny_patch16_224, transformers T5EncoderModel and
DistilBertModel, from small configs with random weights (nothing is downloaded).
"""

from __future__ import annotations

import pytest
import torch

from kiln.capture import capture

timm = pytest.importorskip("timm")
transformers = pytest.importorskip("transformers")


def _mobilenet():
    return timm.create_model("mobilenetv3_small_100", pretrained=False, num_classes=10), (
        torch.randn(2, 3, 32, 32),
    )


def _vit():
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, num_classes=10)
    return model, (torch.randn(2, 3, 32, 32),)


def _t5_encoder():
    cfg = transformers.T5Config(d_model=32, d_ff=37, num_layers=2, num_heads=2, vocab_size=100)
    return transformers.T5EncoderModel(cfg), (torch.randint(0, 100, (2, 8)),)


def _distilbert():
    cfg = transformers.DistilBertConfig(
        dim=32, hidden_dim=37, n_layers=2, n_heads=2, vocab_size=100, max_position_embeddings=64
    )
    return transformers.DistilBertModel(cfg), (torch.randint(0, 100, (2, 8)),)


def _first_tensor(out):
    if isinstance(out, torch.Tensor):
        return out
    return out[0]


@pytest.mark.slow
@pytest.mark.parametrize("make", [_mobilenet, _vit, _t5_encoder, _distilbert])
@pytest.mark.parametrize("mode", ["eval", "train"])
def test_model_is_one_graph_equal_to_eager(make, mode):
    torch.manual_seed(0)
    model, inputs = make()
    getattr(model, mode)()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    result = capture(
        model.forward,
        inputs,
        {},
        compile_graph=lambda gm, example_inputs: gm.forward,
        wrap_callable=lambda f: f,
        fullgraph=True,
    )
    assert len(result.graphs) == 1
    torch.manual_seed(1)
    expected = _first_tensor(model(*inputs))
    model.load_state_dict(state)
    torch.manual_seed(1)
    actual = _first_tensor(result.function(*inputs))
    torch.testing.assert_close(actual, expected)
