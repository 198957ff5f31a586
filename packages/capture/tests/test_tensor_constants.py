"""Branches on tensors the program computes from constants alone are answered while tracing.

torch.distributions checks its parameters (``if not torch._is_all_true(valid): raise``);
built from ``torch.tensor(...)`` constants in forward, as groupvit's gumbel softmax does,
those checks are the same on every call. Tensors that depend on inputs, random draws or a
storage written in place stay data-dependent branches.
"""

from __future__ import annotations

import pytest
import torch

from kiln.capture import capture


def r(*shape: int) -> torch.Tensor:
    return torch.randn(*shape)


def _capture(fn, *args):
    return capture(fn, args, {}, compile_graph=lambda gm, ex: gm.forward, wrap_callable=lambda f: f)


def test_distribution_built_from_constants(check):
    def fn(x):
        loc = torch.tensor(0.0, dtype=x.dtype, device=x.device)
        scale = torch.tensor(1.0, dtype=x.dtype, device="cpu")
        gumbels = torch.distributions.Gumbel(loc, scale).sample(x.shape)
        uniform = torch.distributions.Uniform(torch.zeros(3), torch.ones(3) * 2)
        return (x + gumbels).softmax(-1), uniform.rsample((2,)) * x, uniform.high.sum()

    result = check(fn, (r(2, 3),))
    assert not result.graph_breaks


def test_invalid_parameters_raise_as_in_eager():
    def fn(x):
        return torch.distributions.Normal(torch.tensor(0.0), torch.tensor(-1.0)).sample() + x

    result = _capture(fn, r(3))
    with pytest.raises(ValueError, match="scale"):
        result.function(r(3))


def _from_input(x):
    return x if (x.sum() > 0) else -x


def _random(x):
    return x if torch.rand([]) < 0.5 else -x


def _written_in_place(x):
    c = torch.zeros(3)
    c[:2] += x[:2]
    return x if c.sum() > 0 else -x


@pytest.mark.parametrize("fn", [_from_input, _random, _written_in_place])
def test_tensors_that_are_not_constants_stay_data_dependent(fn):
    result = _capture(fn, r(3))
    assert [b.kind for b in result.graph_breaks] == ["data_dependent_branch"]
    x = r(3)
    torch.manual_seed(0)
    expected = fn(x)
    torch.manual_seed(0)
    assert torch.equal(result.function(x), expected)
