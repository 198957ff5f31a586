"""kiln.export: one ATen graph per program, checked calls, and files that load in a fresh process.

Each model is exported with a dynamic batch (and sequence or image) dimension, saved, and
loaded in a subprocess that never imports the model's library; its outputs at three sizes
must equal eager's here. Wrong inputs must raise ``ExportInputError`` naming what is wrong.
"""

from __future__ import annotations

import operator
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils import _pytree as pytree

import kiln
import kiln.export as ke
from kiln.export import Dim

ROOT = Path(__file__).resolve().parents[1]

_CHILD = textwrap.dedent(
    """
    import sys
    import torch
    import kiln.export
    from torch.utils import _pytree as pytree

    program = kiln.export.load(sys.argv[1])
    calls = torch.load(sys.argv[2])
    results = [pytree.tree_leaves(program(*args, **kwargs)) for args, kwargs in calls]
    for name in ("transformers", "timm", "torchvision"):
        assert name not in sys.modules, name
    torch.save(results, sys.argv[3])
    """
)


def _mlp() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.LayerNorm(16))


class _ConvNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.head = torch.nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        y = torch.relu(self.bn(self.conv(x)))
        return {"logits": self.head(y.mean((2, 3))), "features": y}


def _run_fresh(program: ke.ExportedProgram, calls: list[Any], tmp_path: Path) -> list[Any]:
    """Save ``program`` and run ``calls`` on it in a new interpreter; their result leaves."""
    path, inputs, outputs = tmp_path / "p.kiln", tmp_path / "in.pt", tmp_path / "out.pt"
    ke.save(program, path)
    torch.save(calls, inputs)
    cmd = [sys.executable, "-c", _CHILD, str(path), str(inputs), str(outputs)]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    result: list[Any] = torch.load(outputs)
    return result


def _assert_fresh_equal(
    model: Any, program: ke.ExportedProgram, calls: list[Any], tmp: Path
) -> None:
    got = _run_fresh(program, calls, tmp)
    with torch.no_grad():
        for (args, kwargs), leaves in zip(calls, got, strict=True):
            want = pytree.tree_leaves(model(*args, **kwargs))
            assert len(leaves) == len(want)
            for a, b in zip(leaves, want, strict=True):
                torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_mlp_graph_signature_and_sizes() -> None:
    model = _mlp().eval()
    program = ke.export(model, (torch.randn(4, 8),), dynamic_shapes=({0: Dim("b", max=64)},))
    targets = {n.target for n in program.graph.nodes if n.op == "call_function"}
    aten_or_getitem = (torch._ops.OpOverload, type(operator.getitem))
    assert all(isinstance(t, aten_or_getitem) for t in targets), targets
    assert torch.ops.aten.mm.default in targets  # linear decomposed
    assert program.signature.names("parameter") == ["0.weight", "0.bias", "2.weight", "2.bias"]
    assert program.signature.names("user_input") == ["input"]
    assert program.range_constraints == {"s0": (2, 64)}
    for n in (2, 5, 64):
        x = torch.randn(n, 8)
        torch.testing.assert_close(program(x), model(x))


def test_wrong_inputs_raise_clear_errors() -> None:
    model = _mlp().eval()
    program = ke.export(model, (torch.randn(4, 8),), dynamic_shapes=({0: Dim("b", max=64)},))
    cases = [
        ((torch.randn(4, 8, dtype=torch.float64),), "dtype torch.float64"),
        ((torch.randn(4, 8, 1),), "3 dimensions"),
        ((torch.randn(65, 8),), "dimension 0 of input is 65, outside the range [2, 64]"),
        ((torch.randn(4, 9),), "dimension 1 is 9, but the program was exported for 8"),
        ((torch.randn(4, 8), torch.randn(4, 8)), "takes 1 positional arguments, got 2"),
        (([1, 2],), "positional argument 0 is a list of 2 items"),
        (("text",), "must be a tensor"),
    ]
    for args, text in cases:
        with pytest.raises(ke.ExportInputError) as info:
            program(*args)
        assert text in str(info.value), str(info.value)


def test_constant_arguments_and_relations_are_checked() -> None:
    def f(x: torch.Tensor, y: torch.Tensor, scale: float) -> torch.Tensor:
        return (x + y) * scale

    seq = Dim("seq", max=32)
    program = ke.export(
        f, (torch.randn(3, 5), torch.randn(3, 5), 2.0), dynamic_shapes=({1: seq}, {1: seq}, None)
    )
    x, y = torch.randn(3, 9), torch.randn(3, 9)
    torch.testing.assert_close(program(x, y, 2.0), f(x, y, 2.0))
    with pytest.raises(ke.ExportInputError, match="differs from 2.0"):
        program(x, y, 3.0)
    with pytest.raises(ke.ExportInputError, match="dimension 1 of y is 7"):
        program(x, torch.randn(3, 7), 2.0)
    strided = torch.randn(9, 3).t()  # traced for contiguous inputs: passed as a copy
    torch.testing.assert_close(program(strided, y, 2.0), f(strided, y, 2.0))


def test_a_returned_dynamic_size_is_refused_not_fixed() -> None:
    def f(x: torch.Tensor) -> tuple[torch.Tensor, int]:
        return x * 2, x.shape[0]

    with pytest.raises(ke.ExportError, match="output 1 .* computed from dynamic sizes"):
        ke.export(f, (torch.randn(5, 3),), dynamic_shapes=({0: Dim("b", min=2, max=64)},))


def test_buffer_mutations_update_the_module_state() -> None:
    model = _ConvNet().train()
    program = ke.export(model, (torch.randn(2, 3, 8, 8),), dynamic_shapes=({0: Dim("b")},))
    kinds = [o.kind for o in program.signature.outputs]
    assert kinds.count("buffer_mutation") == 3  # running mean, var, batches tracked
    exported = program.module()
    for n in (2, 3, 5):
        x = torch.randn(n, 3, 8, 8)
        want, got = model(x), exported(x)
        torch.testing.assert_close(got["logits"], want["logits"])
        torch.testing.assert_close(exported.bn.running_mean, model.bn.running_mean)


@pytest.mark.slow
def test_conv_net_fresh_process(tmp_path: Path) -> None:
    model = _ConvNet().eval()
    dims = {0: Dim("batch", max=16), 2: Dim("h", max=32), 3: Dim("w", max=32)}
    program = ke.export(model, (torch.randn(2, 3, 8, 8),), dynamic_shapes=(dims,))
    calls = [((torch.randn(b, 3, s, s),), {}) for b, s in [(2, 8), (5, 13), (3, 32)]]
    _assert_fresh_equal(model, program, calls, tmp_path)


@pytest.mark.slow
def test_loaded_program_runs_through_kiln_compile(tmp_path: Path) -> None:
    model = _mlp().eval()
    program = ke.export(model, (torch.randn(4, 8),), dynamic_shapes=({0: Dim("b", max=64)},))
    ke.save(program, tmp_path / "mlp.kiln")
    compiled = kiln.compile(ke.load(tmp_path / "mlp.kiln").module())
    for n in (3, 9, 17):
        x = torch.randn(n, 8)
        torch.testing.assert_close(compiled(x), model(x))
    with pytest.raises(ke.ExportInputError, match="outside the range"):
        compiled(torch.randn(100, 8))


def test_joint_export_returns_gradients() -> None:
    model = _mlp()
    program = ke.export(model, (torch.randn(4, 8),), joint=True)
    outputs = program.signature.outputs
    assert [o.target for o in outputs if o.kind == "gradient"] == [
        "0.weight", "0.bias", "2.weight", "2.bias",
    ]  # fmt: skip
    x, tangent = torch.randn(4, 8), torch.randn(4, 16)
    state = [program.state_dict[s.name] for s in program.signature.inputs if s.kind == "parameter"]
    got = program.graph_module(*state, x, tangent)
    y = model(x)
    grads = torch.autograd.grad(y, list(model.parameters()), tangent)
    torch.testing.assert_close(got[0], y)
    for a, b in zip(got[1:], grads, strict=True):
        torch.testing.assert_close(a, b)
    with pytest.raises(ke.ExportError, match="tangents"):
        program(x)


@pytest.mark.slow
def test_bert_fresh_process(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    cfg = transformers.BertConfig(
        vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=64,
    )  # fmt: skip
    model = transformers.BertModel(cfg).eval()
    b, s = Dim("batch", max=16), Dim("seq", max=64)
    ids, mask = torch.randint(0, 100, (3, 10)), torch.ones(3, 10, dtype=torch.long)
    spec = {"input_ids": {0: b, 1: s}, "attention_mask": {0: b, 1: s}}
    program = ke.export(model, (ids,), {"attention_mask": mask}, dynamic_shapes=spec)
    calls = []
    for bs, sl in [(2, 5), (5, 33), (3, 64)]:
        mask = torch.ones(bs, sl, dtype=torch.long)
        mask[0, -2:] = 0
        calls.append(((torch.randint(0, 100, (bs, sl)),), {"attention_mask": mask}))
    _assert_fresh_equal(model, program, calls, tmp_path)
    with pytest.raises(ke.ExportInputError, match="attention_mask"):
        program(torch.randint(0, 100, (2, 5)), attention_mask=torch.ones(2, 6, dtype=torch.long))


@pytest.mark.slow
def test_gpt2_fresh_process(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(
        n_embd=32, n_layer=2, n_head=4, vocab_size=100, n_positions=64, use_cache=False,
        bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    model = transformers.GPT2Model(cfg).eval()
    spec = ({0: Dim("batch", max=16), 1: Dim("seq", max=64)},)
    program = ke.export(model, (torch.randint(0, 100, (3, 10)),), dynamic_shapes=spec)
    calls = [((torch.randint(0, 100, (bs, sl)),), {}) for bs, sl in [(2, 5), (5, 33), (3, 64)]]
    _assert_fresh_equal(model, program, calls, tmp_path)
    with pytest.raises(ke.ExportInputError, match="outside the range"):
        program(torch.randint(0, 100, (2, 65)))


@pytest.mark.slow
def test_resnet18_fresh_process(tmp_path: Path) -> None:
    timm = pytest.importorskip("timm")
    model = timm.create_model("resnet18", pretrained=False, num_classes=10).eval()
    dims = {0: Dim("batch", max=16), 2: Dim("h", min=33, max=96), 3: Dim("w", min=33, max=96)}
    program = ke.export(model, (torch.randn(2, 3, 64, 64),), dynamic_shapes=(dims,))
    calls = [((torch.randn(b, 3, s, s),), {}) for b, s in [(2, 64), (3, 40), (4, 96)]]
    _assert_fresh_equal(model, program, calls, tmp_path)
    with pytest.raises(ke.ExportInputError, match="dtype"):
        program(torch.randn(2, 3, 64, 64, dtype=torch.float16))


def test_input_mutations_are_written_back() -> None:
    def accumulate(x: torch.Tensor, total: torch.Tensor) -> torch.Tensor:
        total.add_(x)
        return total * 2

    program = ke.export(accumulate, (torch.randn(4), torch.zeros(4)))
    assert [o.kind for o in program.signature.outputs] == ["user_output", "user_input_mutation"]
    ours, theirs = torch.zeros(4), torch.zeros(4)
    for _ in range(3):
        x = torch.randn(4)
        torch.testing.assert_close(program(x, ours), accumulate(x, theirs))
        torch.testing.assert_close(ours, theirs)
