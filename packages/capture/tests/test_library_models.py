"""Small library models whose training step uses torch.distributions and in-place updates.

transformers' GroupViT samples gumbel noise from a ``torch.distributions.Gumbel`` built in
forward from ``torch.tensor`` constants (its parameter checks are branches on tensors) and
adds to a non-leaf tensor in place; captured in train mode it is one graph with eager's
outputs and gradients.
"""

from __future__ import annotations

import copy

import pytest
import torch

from kiln.capture import capture

transformers = pytest.importorskip("transformers")


def test_groupvit_vision_train_step_in_one_graph():
    cfg = transformers.GroupViTVisionConfig(
        hidden_size=32,
        intermediate_size=37,
        depths=[1, 1],
        num_hidden_layers=2,
        num_group_tokens=[4, 0],
        num_output_groups=[4, 4],
        num_attention_heads=4,
        image_size=32,
        patch_size=8,
        dropout=0.0,
        attention_dropout=0.0,
    )
    eager = transformers.GroupViTVisionModel(cfg).train()
    mine = copy.deepcopy(eager)
    result = capture(
        mine.forward,
        (torch.randn(2, 3, 32, 32),),
        {},
        compile_graph=lambda gm, ex: gm.forward,
        wrap_callable=lambda f: f,
    )
    assert len(result.graphs) == 1 and not result.graph_breaks
    for seed in range(2):
        x = torch.randn(2, 3, 32, 32)
        torch.manual_seed(seed)
        expected = eager(x).pooler_output
        expected.sum().backward()
        torch.manual_seed(seed)
        actual = result.function(x).pooler_output
        actual.sum().backward()
        torch.testing.assert_close(actual, expected)
        for (name, p), q in zip(mine.named_parameters(), eager.parameters(), strict=True):
            torch.testing.assert_close(p.grad, q.grad, msg=name)
        mine.zero_grad(), eager.zero_grad()
