"""The "is it safe to record" rules of CUDA graphs, on fake steps (no GPU needed)."""

import types

import sympy
import torch

from kiln.codegen_triton.cudagraphs import cudagraphify, unsafe_reason
from kiln.loopir import ReferenceBackend
from kiln.loopir.kernel import SEEDS
from kiln.loopir.pipeline import compile_graph
from kiln.loopir.scheduler.order import ExternStep, KernelStep


class _CudaTensor(torch.Tensor):
    """A CPU tensor that says it lives on the GPU (the checks only read ``device``)."""

    @property
    def device(self):  # type: ignore[override]
        return torch.device("cuda", 0)


def _cuda_tensor():
    return torch.randn(3).as_subclass(_CudaTensor)


def _kernel(name="kernel0", device="cuda", inputs=("x",), outputs=("buf0",), numel=8):
    group = types.SimpleNamespace(
        name=name, device=torch.device(device), numel=sympy.sympify(numel), rnumel=sympy.S.One,
        inputs=inputs, outputs=outputs,
    )  # fmt: skip
    step = KernelStep.__new__(KernelStep)
    object.__setattr__(step, "group", group)
    return step


def _extern(op, args=()):
    step = ExternStep.__new__(ExternStep)
    object.__setattr__(step, "buffer", types.SimpleNamespace(op=op, args=args, kwargs={}))
    return step


def test_safe_graph_has_no_reason():
    assert unsafe_reason([_kernel()], ["x"], [_cuda_tensor()]) is None


def test_cpu_and_non_tensor_inputs_are_unsafe():
    assert "not a CUDA device" in unsafe_reason([_kernel()], ["x"], [torch.randn(3)])
    assert "not a tensor" in unsafe_reason([_kernel()], ["x"], [3])


def test_unsafe_steps():
    t = [_cuda_tensor()]
    assert "runs on cpu" in unsafe_reason([_kernel(device="cpu")], ["x"], t)
    # symbolic sizes are recorded once per size set (test_symbolic_sizes.py), not refused
    assert unsafe_reason([_kernel(numel=sympy.Symbol("s0"))], ["x"], t) is None
    assert "random seeds" in unsafe_reason([_kernel(inputs=("x", SEEDS))], ["x"], t)
    assert "writes into graph input" in unsafe_reason([_kernel(outputs=("x",))], ["x"], t)
    assert "synchronises" in unsafe_reason([_extern("aten.nonzero.default")], ["x"], t)
    assert "CPU tensor" in unsafe_reason([_extern("aten.mm.default", (torch.randn(2),))], ["x"], t)
    assert unsafe_reason([_extern("aten.mm.default")], ["x"], t) is None


def test_input_names_come_from_the_compiled_graph(caplog):
    def fn(x, scale, y):
        return (torch.ops.aten.add.Tensor(x, y, alpha=scale),)

    gm = torch.fx.symbolic_trace(fn)
    gm.graph.find_nodes(op="placeholder")[0].meta["val"] = torch.empty(3, device="meta")
    gm.graph.find_nodes(op="placeholder")[2].meta["val"] = torch.empty(3, device="meta")
    x, y = torch.randn(3), torch.randn(3)
    compiled = compile_graph(gm, [x, 2, y], backend=ReferenceBackend())
    assert compiled.input_names == ("x", None, "y")
    torch.testing.assert_close(compiled(x, 2, y)[0], x + 2 * y)

    # the wrapper reads the names from there: a kernel writing into y is seen as such
    def graph(*args):
        return args[0]

    graph.steps = [_kernel(outputs=("y",))]  # type: ignore[attr-defined]
    graph.input_names = compiled.input_names  # type: ignore[attr-defined]
    with caplog.at_level("INFO", logger="kiln.codegen_triton.cudagraphs"):
        cudagraphify(graph)(_cuda_tensor(), _cuda_tensor(), _cuda_tensor())
    assert "writes into graph input(s) ['y']" in caplog.text


def test_unsafe_graph_runs_normally_and_logs_why(caplog):
    calls = []

    def fn(*args):
        calls.append(args)
        return args[0] + 1

    fn.steps = [_kernel()]  # type: ignore[attr-defined]
    fn.input_names = ("x",)  # type: ignore[attr-defined]
    with caplog.at_level("INFO", logger="kiln.codegen_triton.cudagraphs"):
        run = cudagraphify(fn)
        x = torch.randn(3)
        torch.testing.assert_close(run(x), x + 1)
        run(x)
    assert len(calls) == 2 and "not a CUDA device" in caplog.text
