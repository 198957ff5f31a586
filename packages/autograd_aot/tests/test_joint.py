"""Joint tracing: signature of the traced program."""

import torch

from kiln.autograd_aot.joint import trace_program
from kiln.capture.meta import FakeMode


def _fakes(*tensors):
    mode = FakeMode()
    return [mode.to_fake(t) for t in tensors]


def test_joint_signature():
    def fn(x, y, buf):
        buf.add_(1)
        return x * y, x.argmax(), x.t(), 7

    x, y, buf = torch.randn(3, 4, requires_grad=True), torch.randn(3, 4), torch.randn(2)
    program = trace_program(fn, _fakes(x, y, buf), {}, joint=True)
    kinds = [s.kind for s in program.outputs]
    assert kinds == ["graph", "graph", "alias", "const"]
    assert program.num_user_outputs == 2 and program.mutated_inputs == [2]
    assert program.grad_inputs == [0] and program.diff_outputs == [0]
    assert program.non_differentiable == [1, 2]
    names = [n.name for n in program.gm.graph.nodes if n.op == "placeholder"]
    assert names == ["primals_1", "primals_2", "primals_3", "tangents_1"]
    outputs = next(n for n in program.gm.graph.nodes if n.op == "output").args[0]
    assert len(outputs) == program.num_forward_outputs + 1


def test_forward_only_when_not_joint():
    x = torch.randn(3, requires_grad=True)
    program = trace_program(lambda x: x.sin(), _fakes(x), {}, joint=False)
    assert not program.is_joint
    assert all(not n.name.startswith("tangents") for n in program.gm.graph.nodes)


def test_no_differentiable_output_means_no_backward():
    x = torch.randn(3, requires_grad=True)
    program = trace_program(lambda x: x.detach() + 1, _fakes(x), {}, joint=True)
    assert not program.is_joint
