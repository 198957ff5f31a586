"""Backwards for the outputs that got a gradient, and the saved values users can reach."""

import torch
from torch import fx

from kiln.autograd_aot import aot_eager
from kiln.autograd_aot.prune import _view_root, exposed_saved, prune_backward

aten = torch.ops.aten


def _targets(gm: fx.GraphModule) -> set:
    return {n.target for n in gm.graph.nodes if n.op == "call_function"}


def _two_outputs(x, w):
    h = x * w
    return h.exp(), (h * 3).sum()


def _compiled(fn):
    x, w = torch.randn(4, 3, requires_grad=True), torch.randn(4, 3, requires_grad=True)
    return aot_eager(fx.symbolic_trace(fn), [x, w]), x, w


def test_a_backward_for_some_outputs_drops_what_only_the_others_need():
    compiled, x, w = _compiled(_two_outputs)
    program = compiled.variant(joint=True)
    bw = program.backward
    assert isinstance(bw, fx.GraphModule)
    pruned, used, grads = prune_backward(bw, program.num_saved, [1])
    assert aten.exp.default not in _targets(bw)  # the forward saved exp's result
    assert len(used) < program.num_saved  # exp's saved result is not read
    assert grads == [0, 1]
    # the sum of both outputs' contributions is the present one's: no add, no zeros
    assert not _targets(pruned) & {aten.add.Tensor, aten.zeros.default}
    placeholders = [n for n in pruned.graph.nodes if n.op == "placeholder"]
    assert len(placeholders) == len(used) + 1


def test_a_gradient_no_present_output_reaches_is_not_returned():
    def fn(x, w):
        return x.exp(), w * 2

    compiled, x, w = _compiled(fn)
    program = compiled.variant(joint=True)
    _, used, grads = prune_backward(program.backward, program.num_saved, [1])
    assert grads == [1] and used == []  # w * 2's backward reads nothing saved


def test_saved_values_that_are_inputs_or_returned_outputs_are_exposed():
    def fn(x, w):
        h = x * w  # mul's backward reads the inputs; exp's, its returned result
        return h.exp(), h.sin()  # sin's reads h (or its cosine): not returned

    compiled, x, w = _compiled(fn)
    program = compiled.variant(joint=True)
    fw = program.forward
    assert isinstance(fw, fx.GraphModule)
    out = next(n for n in fw.graph.nodes if n.op == "output").args[0]
    saved = list(out[len(out) - program.num_saved :])
    exposed = exposed_saved(fw, program.program.num_user_outputs, program.num_saved)
    assert exposed == program.exposed
    returned = set(out[: program.program.num_user_outputs])
    roots = [_view_root(n) for n in saved]
    assert len(exposed) < len(saved)  # what sin's backward reads is not returned
    for i, root in enumerate(roots):
        assert (i in exposed) == (root in returned or root.op == "placeholder")


def test_a_backward_per_set_of_outputs_is_compiled_once():
    compiled, x, w = _compiled(_two_outputs)
    program = compiled.variant(joint=True)
    for _ in range(3):
        a, b = compiled(x, w)
        b.backward()
    assert list(program._backwards) == [(1,)]
    expected = torch.autograd.grad((x * w * 3).sum(), (x, w))
    x.grad = w.grad = None
    compiled(x, w)[1].backward()
    torch.testing.assert_close((x.grad, w.grad), expected)
