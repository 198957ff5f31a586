"""The default backend with symbolic sizes: one capture, one compile, C++ kernels that take
their sizes at run time, equal to eager at every size.

Each program is compiled with ``dynamic=True`` and called at several sizes; the first call's
sizes are unusual numbers, so a kernel or wrapper that baked one in shows it as a literal.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln import loopir
from kiln.capture import counters

# the default backend compiles a graph with symbolic sizes once (``dynamic_kernels``, on by
# default); ``options={"dynamic_kernels": False}`` compiles it per size
_PER_SIZE = {"dynamic_kernels": False}

torch.manual_seed(0)
_LINEAR = torch.nn.Linear(24, 24)
_NORM = torch.nn.LayerNorm(24)
_EMBED = torch.nn.Embedding(50, 24)


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    kiln.reset()
    counters.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no eager fallback, no kernel on the reference backend
        yield
    kiln.reset()


def _mlp(x: torch.Tensor) -> torch.Tensor:
    return _NORM(F.gelu(_LINEAR(x)) + x)


def _reductions(x: torch.Tensor) -> torch.Tensor:
    return x.sum(-1) + x.mean(-1) * x.amax(-1) - x.var(-1) + x.sum(0).mean()


def _softmaxes(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x, -1) + torch.log_softmax(x * 2, 0)


def _views(x: torch.Tensor) -> torch.Tensor:
    n = x.shape[0]
    heads = x.view(n, 4, 6).transpose(0, 1).contiguous() * 2
    flat = x.reshape(-1).sin().view(n, -1)
    return heads.transpose(0, 1).reshape(n, 24) + flat + x.t().contiguous().t()


def _slices(x: torch.Tensor) -> torch.Tensor:
    y = torch.cat([x[1:], x[:1]], 0) + x[:, :1].expand(-1, 24)
    return torch.cat([y, x[-1:] * 3], 0)


def _attention(x: torch.Tensor) -> torch.Tensor:
    q = x.view(1, x.shape[0], 4, 6).transpose(1, 2)
    return F.scaled_dot_product_attention(q, q * 0.5, q).transpose(1, 2).reshape(x.shape)


def _written_attention(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x @ x.t() / 4.0, -1) @ x


def _embedding(x: torch.Tensor) -> torch.Tensor:
    return _EMBED((x.abs() * 10).long() % 50).sum(1) + x.new_zeros(x.shape[0], 3).sum()


def _pads(x: torch.Tensor) -> torch.Tensor:
    n = x.shape[0]
    # padded to a multiple of 8 and cut back (as attention pads its mask), then a pad whose
    # sign changes with the size: it grows some sizes and crops others
    aligned = F.pad(x.t(), (0, 8 - n % 8), value=2.0)[..., :n].t()
    return aligned * 2 + F.pad(x, (1, 0, 1, 40 - n), value=-1.0).sum(0)[1:]


PROGRAMS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "mlp": _mlp,
    "reductions": _reductions,
    "softmaxes": _softmaxes,
    "views": _views,
    "slices": _slices,
    "attention": _attention,
    "written_attention": _written_attention,
    "embedding": _embedding,
    "pads": _pads,
}


def _sources(folder: Path) -> str:
    files = [*folder.rglob("*.cpp"), *folder.rglob("output_code.py")]
    assert files, "no generated source was dumped"
    return "\n".join(p.read_text() for p in files)


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_compiles_once_for_every_size(name: str, tmp_path: Path) -> None:
    fn = PROGRAMS[name]
    compiled = kiln.compile(fn, dynamic=True, options={"debug_dir": str(tmp_path)})
    with torch.no_grad():
        for rows in (37, 53, 5, 71):
            x = torch.randn(rows, 24)
            torch.testing.assert_close(compiled(x), fn(x), atol=2e-5, rtol=2e-5)
    stats = counters.snapshot()["stats"]
    assert stats["frames_captured"] == 1
    assert stats["graphs_compiled"] == 1
    assert not stats.get("size_specializations")
    assert not stats.get("static_shape_fallbacks")
    assert not stats.get("eager_fallbacks")
    text = _sources(tmp_path)
    assert not re.search(r"\b37\b", text), "a dynamic size was baked into the generated code"
    assert "s0 = " in text  # the wrapper binds the size once per call


def _libraries_built() -> int:
    """C++ libraries built or loaded from the on-disk cache (one per compile of kernels)."""
    cpp = counters.snapshot().get("codegen_cpp", {})
    return int(cpp.get("libraries_built", 0)) + int(cpp.get("libraries_cached", 0))


@pytest.mark.parametrize("dynamic", [True, None])
def test_by_default_a_new_size_reuses_the_built_kernels(
    dynamic: bool | None, tmp_path: Path
) -> None:
    """With the default options, a size seen after the graph went symbolic (the first call
    with ``dynamic=True``, the second with ``dynamic=None``) builds no C++ library: every
    later size runs the kernels built once, whose source holds no literal for the size."""
    compiled = kiln.compile(_mlp, dynamic=dynamic, options={"debug_dir": str(tmp_path)})
    sizes = (37, 53, 5, 71, 19)
    symbolic_from = 1 if dynamic else 2
    with torch.no_grad():
        for i, rows in enumerate(sizes):
            x = torch.randn(rows, 24)
            if i == symbolic_from:
                built = _libraries_built()
                assert built > 0
            torch.testing.assert_close(compiled(x), _mlp(x), atol=2e-5, rtol=2e-5)
    assert _libraries_built() == built
    stats = counters.snapshot()["stats"]
    assert stats["graphs_compiled"] == (1 if dynamic else 2)
    assert not stats.get("size_specializations")
    symbolic = [p for p in tmp_path.rglob("*.cpp") if "int64_t s" in p.read_text()]
    assert symbolic, "no kernel takes a size argument"
    for size in sizes[symbolic_from - 1 :]:
        text = "\n".join(p.read_text() for p in symbolic)
        assert not re.search(rf"\b{size}\b", text), f"size {size} baked into a kernel"


_QKV = torch.nn.Linear(24, 72)


def _projected_attention(x: torch.Tensor) -> torch.Tensor:
    """GPT-2's attention: q, k, v split from one projection, heads transposed out of it."""
    b, n, _ = x.shape
    q, k, v = (t.view(b, n, 4, 6).transpose(1, 2) for t in _QKV(x).split(24, dim=-1))
    return F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(x.shape)


def test_an_extern_result_over_symbolic_sizes_is_planned_as_its_kernel_lays_it_out() -> None:
    """The attention kernel's output layout follows its inputs'; with symbolic sizes loopir
    takes that order from the op run at the compiled call's sizes, so no call copies it."""
    compiled = kiln.compile(_projected_attention, dynamic=True)
    with torch.no_grad():
        for n in (17, 24, 9, 33):
            x = torch.randn(2, n, 24)
            torch.testing.assert_close(compiled(x), _projected_attention(x), atol=2e-5, rtol=2e-5)
    assert not counters.snapshot().get("extern_copies")
    assert counters.snapshot()["stats"]["graphs_compiled"] == 1


def test_dynamic_kernels_off_compiles_per_size() -> None:
    compiled = kiln.compile(_mlp, dynamic=True, options=_PER_SIZE)
    with torch.no_grad():
        for rows in (37, 53, 37):
            x = torch.randn(rows, 24)
            torch.testing.assert_close(compiled(x), _mlp(x), atol=2e-5, rtol=2e-5)
    stats = counters.snapshot()["stats"]
    assert stats["frames_captured"] == 1
    assert stats["size_specializations"] == 2


def _unproven_slice(x: torch.Tensor) -> torch.Tensor:
    return x[:, : x.shape[1] // 2].sin()  # its end is not provably inside the dim


def test_what_loopir_compiles_static_only_is_compiled_per_size() -> None:
    compiled = kiln.compile(_unproven_slice, dynamic=True)
    for n in (9, 12, 9):
        x = torch.randn(3, n)
        torch.testing.assert_close(compiled(x), _unproven_slice(x))
    stats = counters.snapshot()["stats"]
    assert stats["frames_captured"] == 1
    assert stats["static_shape_fallbacks"] == 1
    assert stats["size_specializations"] == 2


def _static(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x, -1) @ y + x.mean(-1, keepdim=True)


_STATIC_WRAPPER = """\
def call(args):
    if _profiler._is_profiler_enabled:
        return _profiled(args)
    primals_1, primals_2, = args
    args.clear()
    buf0 = empty_strided((4,), (1,), device=_device_cpu, dtype=torch.float32)
    buf1 = empty_strided((4,), (1,), device=_device_cpu, dtype=torch.float32)
    buf2 = empty_strided((4, 6), (6, 1), device=_device_cpu, dtype=torch.float32)
    # kernel0(numel=4, rnumel=6): buf0[reduction,xr], buf1[reduction,xr], buf2[pointwise,xr]  [aten.amax.default, aten.sum.dim_IntList, aten.div.Tensor]
    kernel0(primals_1, buf0, buf1, buf2)  # range kiln_cpp_amax_sum_div_0
    del buf1
    buf3 = as_layout(_op0(buf2, primals_2), (6, 1), 'aten.mm.default', torch.float32)  # extern aten.mm.default
    del buf2, primals_2
    buf4 = buf0; del buf0  # reuse
    buf5 = buf3  # inplace
    # kernel1(numel=4, rnumel=6): buf4[reduction,xr], buf5[pointwise,xr]  [aten.mean.dim, aten.add.Tensor]
    kernel1(primals_1, buf3, buf4, buf5)  # range kiln_cpp_mean_add_1
    del buf3, buf4, primals_1
    return (buf5, )
"""


def test_a_static_graph_generates_what_it_did(tmp_path: Path) -> None:
    """No symbol, no change: the wrapper loopir generated before it took symbolic sizes (and
    kernels without size parameters)."""
    compiled = kiln.compile(_static, dynamic=False, options={"debug_dir": str(tmp_path)})
    x, y = torch.randn(4, 6), torch.randn(6, 6)
    torch.testing.assert_close(compiled(x, y), _static(x, y))
    (wrapper,) = tmp_path.rglob("output_code.py")
    assert _STATIC_WRAPPER in wrapper.read_text()  # the runnable file holds the wrapper
    kernels = [p.read_text() for p in tmp_path.rglob("*.cpp")]
    assert kernels and all("int64_t s" not in k for k in kernels)


def test_loopir_raises_static_shapes_only_before_compiling() -> None:
    seen: list[BaseException] = []

    def backend(gm: Any, example_inputs: Any) -> Any:
        try:
            return loopir.compile_fx(gm, example_inputs)
        except loopir.StaticShapesOnly as e:
            seen.append(e)
            return gm.forward

    backend.dynamic_shapes = True  # type: ignore[attr-defined]
    x = torch.randn(3, 9)
    torch.testing.assert_close(
        kiln.compile(_unproven_slice, backend=backend, dynamic=True)(x), _unproven_slice(x)
    )
    assert len(seen) == 1 and "slice" in str(seen[0])


def _train_mlp(x: torch.Tensor) -> torch.Tensor:
    return _NORM(F.gelu(_LINEAR(x)) + x).sum()


def _train_statistics(x: torch.Tensor) -> torch.Tensor:
    return (x.mean(-1) * x.var(-1)).sum() + _LINEAR(x)[1:].sum()


def _train_attention(x: torch.Tensor) -> torch.Tensor:
    q = _LINEAR(x).view(1, x.shape[0], 4, 6).transpose(1, 2)
    return F.scaled_dot_product_attention(q, q, q).sum()


@pytest.mark.parametrize("fn", [_train_mlp, _train_statistics, _train_attention])
def test_training_compiles_once_for_every_size(fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
    compiled = kiln.compile(fn, dynamic=True)
    for rows in (37, 53, 5):
        x = torch.randn(rows, 24, requires_grad=True)
        _LINEAR.zero_grad()
        compiled(x).backward()
        got = (x.grad, _LINEAR.weight.grad.clone())
        x2 = x.detach().clone().requires_grad_()
        _LINEAR.zero_grad()
        fn(x2).backward()
        torch.testing.assert_close(got[0], x2.grad, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(got[1], _LINEAR.weight.grad, atol=1e-3, rtol=1e-4)
    stats = counters.snapshot()["stats"]
    assert stats["graphs_compiled"] == 1
    assert not stats.get("size_specializations")
    assert not stats.get("static_shape_fallbacks")


def _add_norm(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return _NORM(x + y)


def test_symbolic_sizes_fuse_as_static_ones() -> None:
    """A flat index split by a symbolic size and rejoined (the add read in the layer norm's
    row loop) simplifies to the plain index, so the kernels fuse as with static sizes."""
    counts = []
    for dynamic in (False, True):
        kiln.reset()
        counters.clear()
        compiled = kiln.compile(_add_norm, dynamic=dynamic)
        with torch.no_grad():
            for rows in (37, 53):
                x, y = torch.randn(2, rows, 24), torch.randn(2, rows, 24)
                torch.testing.assert_close(compiled(x, y), _add_norm(x, y))
        counts.append(kiln.stats().kernels["cpp"] // (2 if not dynamic else 1))
    assert counts[0] == counts[1] == 1


def _flat_linear(x: torch.Tensor) -> torch.Tensor:
    # GPT-2's Conv1D: the (batch, rows, 24) activation flattened to (batch * rows, 24)
    out = torch.addmm(_LINEAR.bias, F.gelu(x).view(-1, x.size(-1)), _LINEAR.weight)
    return out.view(x.shape) * 2


def test_a_flattened_symbolic_dim_reaches_an_extern_call_without_a_copy(tmp_path: Path) -> None:
    """A contiguous (batch, rows, 24) value viewed as (batch * rows, 24) is passed to a
    library matmul as a strided window on its buffer, with symbolic sizes as with static ones:
    the view's flat index splits by the symbolic ``rows`` and rejoins to the plain index."""
    allocations = []
    for dynamic in (False, True):
        kiln.reset()
        folder = tmp_path / str(dynamic)
        compiled = kiln.compile(_flat_linear, dynamic=dynamic, options={"debug_dir": str(folder)})
        with torch.no_grad():
            for rows in (37, 53) if dynamic else (37,):
                x = torch.randn(2, rows, 24)
                torch.testing.assert_close(compiled(x), _flat_linear(x))
        code = _sources(folder)
        assert "as_strided(buf0" in code  # the product reads gelu's buffer, not a copy
        allocations.append(code.count("empty_strided("))
    assert allocations[0] == allocations[1]


_CNN = torch.nn.Sequential(
    torch.nn.Conv2d(3, 8, 3, 2, 1),
    torch.nn.BatchNorm2d(8),
    torch.nn.ReLU(),
    torch.nn.MaxPool2d(3, 2, 1),
    torch.nn.Conv2d(8, 8, 3, 1, 1),
    torch.nn.AdaptiveAvgPool2d(1),
    torch.nn.Flatten(),
    torch.nn.Linear(8, 4),
).eval()


def test_a_cnn_compiles_once_for_every_image_size() -> None:
    """Convolution output sizes (Max of sizes the ranges decide), a padded max pool masked
    against this call's size, a global average pool."""
    compiled = kiln.compile(_CNN, dynamic=True)
    with torch.no_grad():
        for hw in ((40, 48), (33, 57), (64, 64)):
            x = torch.randn(2, 3, *hw)
            torch.testing.assert_close(compiled(x), _CNN(x), atol=1e-4, rtol=1e-4)
    stats = counters.snapshot()["stats"]
    assert stats["graphs_compiled"] == 1
    assert not stats.get("size_specializations")
    assert not stats.get("static_shape_fallbacks")


def _mask_rows(y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    v0 = y * 3 + 1
    v8 = v0.clone()
    v10 = v8[(v8 > 0).nonzero()[:, 0]]
    v8.sigmoid_()
    return v10, v0


def test_rows_picked_by_a_mask_across_layouts() -> None:
    """The continuation past ``nonzero`` mutates an input that shares memory with another:
    traced over their base, on the sizes of its first call, so a later call whose row count
    differs takes a program of its own."""
    compiled = kiln.compile(_mask_rows)
    for layout in ("transposed", "contiguous", "sliced", "sliced", "contiguous"):
        if layout == "transposed":
            y = torch.randn(5, 2).t()
        elif layout == "contiguous":
            y = torch.randn(5, 3)
        else:
            y = torch.randn(6, 5)[:-1, 2:]
        for got, want in zip(compiled(y), _mask_rows(y), strict=True):
            torch.testing.assert_close(got, want)


def _write_one_view(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    a.mul_(2)
    return b.sum(0) + c.sum(0)


def test_a_write_through_a_shared_view_serves_other_inputs_sizes() -> None:
    """``a`` and ``b`` overlap and ``a`` is written: the program over their base is traced
    on static fakes, so the size of ``c`` (symbolic in the graph) selects the program too."""
    compiled = kiln.compile(_write_one_view, dynamic=True)
    for rows in (37, 53, 5, 53):
        base, expected = torch.randn(8, 6), torch.randn(8, 6)
        expected.copy_(base)
        c = torch.randn(rows, 6)
        got = compiled(base[:4], base[2:6], c)
        want = _write_one_view(expected[:4], expected[2:6], c)
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(base, expected)


class _ConvBlock(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(4, 4, 3, padding=1)
        self.norm = torch.nn.BatchNorm2d(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.norm(self.conv(x))) + x


def test_eval_batch_norm_writes_no_statistic() -> None:
    """With symbolic sizes torch routes an eval-mode batch norm through an op whose schema
    writes the running statistics: the graph must not return them (two extra kernels and
    two copies per batch norm), so it has as many kernels as the static graph."""
    block = _ConvBlock().eval()
    with torch.no_grad():
        block.norm.running_mean.uniform_(-1, 1)
        block.norm.running_var.uniform_(0.5, 2)
    state = {k: v.clone() for k, v in block.state_dict().items()}
    kernels = []
    for dynamic in (False, True):
        kiln.reset()
        compiled = kiln.compile(block, dynamic=dynamic)
        with torch.no_grad():
            for size in (11, 7):
                x = torch.randn(2, 4, size, size + 2)
                torch.testing.assert_close(compiled(x), block(x), atol=2e-5, rtol=2e-5)
        kernels.append(kiln.stats().kernels.get("cpp", 0))
    assert kernels[1] * 2 == kernels[0]  # the static graph is compiled for each size
    for key, value in block.state_dict().items():
        torch.testing.assert_close(value, state[key])
