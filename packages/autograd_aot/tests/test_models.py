"""Training steps of real model families (small configs, random weights) equal eager's."""

import copy

import pytest
import torch
from torch import fx

from kiln.autograd_aot import aot_eager, aot_eager_decomp_partition

timm = pytest.importorskip("timm")
transformers = pytest.importorskip("transformers")


def _assert_grads_equal(compiled_model, eager_model):
    for (name, a), (_, b) in zip(
        compiled_model.named_parameters(), eager_model.named_parameters(), strict=True
    ):
        scale = max(b.grad.abs().max().item(), 1e-2)  # key biases get ~0 gradients: noise
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-4 * scale, msg=name)


def _train_step(model, inputs, backend, trace=True):
    eager, compiled_model = copy.deepcopy(model), copy.deepcopy(model)
    if trace:
        compiled_model = fx.symbolic_trace(compiled_model)
    compiled = backend(compiled_model, inputs)
    got, expect = compiled(*inputs), eager(*inputs)
    torch.testing.assert_close(got, expect, rtol=1e-4, atol=1e-4)
    weights = [torch.randn_like(t) for t in torch.utils._pytree.tree_leaves(expect)]
    sum((g * w).sum() for g, w in zip(torch.utils._pytree.tree_leaves(got), weights)).backward()
    sum((e * w).sum() for e, w in zip(torch.utils._pytree.tree_leaves(expect), weights)).backward()
    _assert_grads_equal(compiled_model, eager)
    torch.testing.assert_close(dict(compiled_model.named_buffers()), dict(eager.named_buffers()))
    return compiled


@pytest.mark.slow
def test_resnet18_training_step():
    torch.manual_seed(0)
    model = timm.create_model("resnet18", pretrained=False, num_classes=10).train()
    compiled = _train_step(model, [torch.randn(2, 3, 32, 32)], aot_eager_decomp_partition)
    stats = compiled.partition_stats
    assert stats.saved_bytes < stats.save_all_bytes


class _Bert(torch.nn.Module):
    def __init__(self):
        super().__init__()
        config = transformers.BertConfig(
            vocab_size=100,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=37,
            max_position_embeddings=64,
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
            attn_implementation="eager",
        )
        self.bert = transformers.BertModel(config)

    def forward(self, ids):
        out = self.bert(input_ids=ids)
        return out.last_hidden_state, out.pooler_output


@pytest.mark.slow
@pytest.mark.parametrize("backend", [aot_eager, aot_eager_decomp_partition])
def test_bert_training_step(backend):
    torch.manual_seed(0)
    ids = torch.randint(0, 100, (2, 16))
    compiled = _train_step(_Bert().train(), [ids], backend, trace=False)
    stats = compiled.partition_stats
    assert stats.saved_bytes <= stats.save_all_bytes
