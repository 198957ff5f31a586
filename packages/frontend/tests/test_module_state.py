"""Compiled modules never run on stale state, whichever way the module comes in.

The output code reads parameters, buffers and submodules through the module's own dicts on
every call, and the guards check what could invalidate the graph by the module stamp. Three
ways in: the module itself, its bound ``forward``, and a function taking it as an argument.
"""

import pytest
import torch

import kiln


def net(depth=8):
    """Linear layers, then one BatchNorm (train and eval differ)."""
    return torch.nn.Sequential(
        *[torch.nn.Linear(4, 4) for _ in range(depth)], torch.nn.BatchNorm1d(4)
    )


def call_model(model, x):
    return model(x)


def compiled(how, model):
    if how == "module":
        return kiln.compile(model, backend="eager")
    if how == "method":
        return kiln.compile(model.forward, backend="eager")
    fn = kiln.compile(call_model, backend="eager")
    return lambda x: fn(model, x)


def same(fn, model, x):
    with torch.no_grad():
        torch.testing.assert_close(fn(x), model(x))


@pytest.mark.parametrize("how", ["module", "method", "argument"])
def test_state_changes_are_seen(how):
    kiln.reset()
    model = net()
    fn = compiled(how, model)
    x = torch.randn(3, 4)
    same(fn, model, x)
    with torch.no_grad():
        model[4].weight.mul_(2.0)  # in place: the same graph, new values
        model[-1].running_mean.add_(1.0)
    same(fn, model, x)
    model[6].weight = torch.nn.Parameter(torch.randn(4, 4))  # replaced
    same(fn, model, x)
    model.eval()  # BatchNorm now uses its running statistics
    same(fn, model, x)
    with torch.no_grad():
        model[7]._parameters["bias"] = torch.nn.Parameter(torch.randn(4))  # behind torch's back
    same(fn, model, x)
    model[2] = torch.nn.Linear(4, 4)  # a new submodule
    same(fn, model, x)
    model.half().float()  # _apply: new parameter objects everywhere
    same(fn, model, x)


def test_another_instance_as_argument_gets_its_own_entry():
    kiln.reset()
    fn = kiln.compile(call_model, backend="eager")
    x = torch.randn(3, 4)
    a, b = net(), net()
    with torch.no_grad():
        torch.testing.assert_close(fn(a, x), a(x))
        torch.testing.assert_close(fn(b, x), b(x))
        torch.testing.assert_close(fn(a, x), a(x))
