"""A compiled nn.Module shares parameters, state_dict, attributes and train/eval with the original."""

import torch

import kiln


def make():
    m = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    return m, kiln.compile(m, backend="eager")


def test_parameters_and_state_dict_are_the_originals():
    m, om = make()
    assert isinstance(om, torch.nn.Module)
    assert list(om.state_dict()) == list(m.state_dict())
    assert [p for p in om.parameters()] == [p for p in m.parameters()]
    assert dict(om.named_buffers()).keys() == dict(m.named_buffers()).keys()
    sd = {k: torch.randn_like(v) if v.is_floating_point() else v for k, v in m.state_dict().items()}
    om.load_state_dict(sd)
    torch.testing.assert_close(m[0].weight, sd["0.weight"])


def test_train_eval_in_sync_both_ways():
    m, om = make()
    om.eval()
    assert not m.training and not m[1].training and not om.training
    m.train()
    assert om.training


def test_attributes_read_and_write_through():
    m, om = make()
    om.scale = 3
    assert m.scale == 3
    m.other = 5
    assert om.other == 5
    assert om[0] is m[0]


def test_to_moves_the_original():
    m, om = make()
    om.to(torch.float64)
    assert m[0].weight.dtype == torch.float64
