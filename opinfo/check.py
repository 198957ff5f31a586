"""One OpInfo through Kiln's default backend, compared with eager: the sweep's unit of work.

For an op and a mode (``float32``, ``bfloat16``, ``grad``: float32 with gradients) it takes the
op's seeded CPU samples, compiles one function calling the op with ``kiln.compile`` (backend
``kiln``: C++ kernels, ATen for what loopir does not lower), calls it on the first samples in
turn (a later sample changes shapes or arguments, so guards fail and the frame recompiles) and
compares every output, and in ``grad`` every input's gradient of a randomly weighted sum of the
outputs, with eager's.

Comparison follows PyTorch's compiler tests: ``torch.testing.assert_close`` with the dtype's
tolerances first; where that fails and the op also runs in float64, the compiled result passes
if its error against the float64 result is within a small multiple of eager's own error (a
fused or reordered reduction may round differently from eager, but never much worse).
"""

from __future__ import annotations

import dataclasses
import math
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils import _pytree as pytree

import kiln
from kiln.capture import counters

__all__ = ["KNOWN", "MODES", "SKIPS", "OpResult", "check_op", "op_key"]

MODES = ("float32", "bfloat16", "grad")

#: Ops whose results eager itself cannot reproduce from the same inputs: nothing to compare.
SKIPS: dict[str, str] = {
    **dict.fromkeys(
        (
            "bernoulli",
            "cauchy",
            "exponential",
            "geometric",
            "log_normal",
            "multinomial",
            "normal",
            "normal.in_place",
            "normal.number_mean",
            "uniform",
            "rand_like",
            "randn",
            "randn_like",
            "randint",
            "randint_like",
            "nn.functional.dropout",
            "nn.functional.dropout2d",
            "nn.functional.dropout3d",
            "nn.functional.alpha_dropout",
            "nn.functional.feature_alpha_dropout.with_train",
            "nn.functional.rrelu",
        ),
        "random: draws from the generator, so eager and compiled draw different numbers",
    ),
    **dict.fromkeys(
        (
            "empty",
            "empty_like",
            "empty_permuted",
            "empty_strided",
            "new_empty",
            "new_empty_strided",
        ),
        "uninitialized: returns whatever memory held",
    ),
}

_ZERO_DIM = "a reduction compiled once, called again with a 0-d input, returns shape [1]"
#: Failures fixed elsewhere, by op and the modes they fail in: reported as ``known``, not as
#: failures, while they still fail (an op that passes is reported as passing).
KNOWN: dict[str, tuple[tuple[str, ...], str]] = {
    **dict.fromkeys(("amax", "amin", "any", "argmax", "argmin", "sum"), (MODES, _ZERO_DIM)),
}

#: (rtol, atol) for assert_close, and the float64 check's (multiplier, slack) per dtype.
TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float32: (1.3e-6, 1e-5),
    torch.bfloat16: (1.6e-2, 1e-2),
}
REFERENCE_SLACK: dict[torch.dtype, tuple[float, float]] = {
    torch.float32: (3.0, 1e-5),
    torch.bfloat16: (3.0, 1e-3),
}


@dataclasses.dataclass
class OpResult:
    """What happened to one op in one mode."""

    op: str
    mode: str
    status: str  # pass | fail | kiln-error | crash | timeout | known | eager-error | skipped
    reason: str = ""
    samples: int = 0
    kernels: int = 0  # generated kernels, all samples together
    fallback_ops: dict[str, int] = dataclasses.field(default_factory=dict)
    extern_kernels: dict[str, int] = dataclasses.field(default_factory=dict)
    graphs: int = 0  # graphs compiled; 0 when graph breaks left the op to run eagerly
    graph_breaks: int = 0
    recompiles: int = 0
    seconds: float = 0.0

    @property
    def reached(self) -> str:
        """Where the op's graphs went: generated kernels, vendor kernels (GEMMs, convolutions)
        alone, an ATen fallback, no kernel at all (views), or nowhere (no graph: it ran eagerly)."""
        if not self.graphs:
            return "not-compiled"
        if self.fallback_ops:
            return "aten-fallback"
        if self.kernels:
            return "kernels"
        return "vendor-kernels" if self.extern_kernels else "no-kernel"


def op_key(op: Any) -> str:
    """The name the sweep knows an OpInfo by (its name, dotted with its variant)."""
    return f"{op.name}.{op.variant_test_name}" if op.variant_test_name else str(op.name)


class Mismatch(AssertionError):
    """Compiled and eager disagree; the message says where and by how much."""


def _clone(value: Any) -> Any:
    def one(t: Any) -> Any:
        if not isinstance(t, torch.Tensor):
            return t
        c = t.detach().clone()
        return c.requires_grad_(t.requires_grad) if c.is_floating_point() else c

    return pytree.tree_map(one, value)


def _to_float64(value: Any) -> Any:
    def one(t: Any) -> Any:
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            return t
        return t.detach().to(torch.float64).requires_grad_(t.requires_grad)

    return pytree.tree_map(one, value)


def _grad_inputs(args: Any) -> list[torch.Tensor]:
    leaves = pytree.tree_leaves(args)
    return [t for t in leaves if isinstance(t, torch.Tensor) and t.requires_grad]


def _outputs_for_grad(out: Any) -> list[torch.Tensor]:
    leaves = pytree.tree_leaves(out)
    outs = [t for t in leaves if isinstance(t, torch.Tensor) and t.requires_grad]
    # A complex output weighs its real and imaginary parts (the loss must be real).
    return [torch.view_as_real(t.resolve_conj()) if t.is_complex() else t for t in outs]


def _weights(outs: list[torch.Tensor], seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.rand(o.shape, generator=gen, dtype=torch.float64) for o in outs]


def _grads(out: Any, inputs: list[torch.Tensor], weights: list[torch.Tensor]) -> list[Any]:
    outs = _outputs_for_grad(out)
    if not outs or not inputs:
        return []
    loss = sum((o * w.to(o.dtype)).sum() for o, w in zip(outs, weights, strict=True))
    assert isinstance(loss, torch.Tensor)
    return list(torch.autograd.grad(loss, inputs, allow_unused=True))


def _run(fn: Callable[..., Any], call: Any, grad: bool, seed: int) -> tuple[Any, list[Any]]:
    """``fn`` on a copy of ``call`` (input, args, kwargs), and in ``grad`` the gradients."""
    args = _clone(call)
    out = fn(args[0], *args[1], **args[2])
    if not grad:
        return out, []
    inputs = _grad_inputs(args)
    outs = _outputs_for_grad(out)
    return out, _grads(out, inputs, _weights(outs, seed))


def _rmse(a: torch.Tensor, b: torch.Tensor) -> float:
    finite = torch.isfinite(a) & torch.isfinite(b)
    if not bool(finite.any()):
        return 0.0
    d = (a.double() - b.double())[finite]
    return math.sqrt(float((d * d).mean()))


def _compare_tensor(
    where: str, actual: torch.Tensor, expected: torch.Tensor, ref: torch.Tensor | None
) -> None:
    if actual.shape != expected.shape or actual.dtype != expected.dtype:
        msg = (
            f"{where}: compiled gives {actual.dtype}{list(actual.shape)}, "
            f"eager {expected.dtype}{list(expected.shape)}"
        )
        raise Mismatch(msg)
    rtol, atol = TOLERANCES.get(expected.dtype, (None, None))
    try:
        torch.testing.assert_close(
            actual.detach(), expected.detach(), rtol=rtol, atol=atol, equal_nan=True
        )
        return
    except AssertionError as exc:
        first = str(exc).strip().splitlines()
        detail = " ".join(line.strip() for line in first[:4])
    if ref is not None and expected.is_floating_point():
        nan_same = torch.equal(actual.isnan(), expected.isnan())
        mult, slack = REFERENCE_SLACK.get(expected.dtype, (3.0, 1e-5))
        got = _rmse(actual.detach(), ref.detach())
        eager = _rmse(expected.detach(), ref.detach())
        if nan_same and got <= mult * eager + slack:
            return
        detail += f" (rmse against float64: compiled {got:.3g}, eager {eager:.3g})"
    raise Mismatch(f"{where}: {detail}")


def compare(where: str, actual: Any, expected: Any, ref: Any | None) -> None:
    """Raise ``Mismatch`` unless ``actual`` matches ``expected`` (see the module docstring)."""
    a_leaves, a_spec = pytree.tree_flatten(actual)
    e_leaves, e_spec = pytree.tree_flatten(expected)
    if a_spec != e_spec:
        msg = f"{where}: output structure {a_spec} differs from eager's {e_spec}"
        raise Mismatch(msg)
    r_leaves: list[Any] = [None] * len(e_leaves)
    if ref is not None:
        leaves, spec = pytree.tree_flatten(ref)
        if spec == e_spec:
            r_leaves = leaves
    for i, (a, e, r) in enumerate(zip(a_leaves, e_leaves, r_leaves, strict=True)):
        here = f"{where}[{i}]" if len(e_leaves) > 1 else where
        if isinstance(e, torch.Tensor):
            if not isinstance(a, torch.Tensor):
                raise Mismatch(f"{here}: compiled gives {type(a).__name__}, eager a tensor")
            same_shape = isinstance(r, torch.Tensor) and r.shape == e.shape
            _compare_tensor(here, a, e, r if same_shape else None)
        elif a != e and not (
            isinstance(e, float) and math.isnan(e) and isinstance(a, float) and math.isnan(a)
        ):
            raise Mismatch(f"{here}: compiled gives {a!r}, eager {e!r}")


def _samples(op: Any, dtype: torch.dtype, grad: bool, seed: int) -> Iterator[Any]:
    torch.manual_seed(seed)
    yield from op.sample_inputs("cpu", dtype, requires_grad=grad)


def _skip_reason(op: Any, mode: str, dtype: torch.dtype) -> str | None:
    name = op_key(op)
    if name in SKIPS:
        return SKIPS[name]
    if name.startswith("nn.functional.dropout") or "dropout" in name.split(".")[-1]:
        return "random: dropout"
    if getattr(op, "has_nondeterministic_output", False):
        return "nondeterministic output (OpInfo.has_nondeterministic_output)"
    if dtype not in op.supported_dtypes("cpu"):
        return f"eager does not support {dtype} on CPU"
    if mode == "grad":
        if not op.supports_autograd:
            return "no autograd support"
        if dtype not in op.supported_backward_dtypes("cpu"):
            return f"eager has no backward for {dtype} on CPU"
    return None


def check_op(op: Any, mode: str, *, samples: int = 2, seed: int = 0) -> OpResult:
    """Run ``op`` compiled and eagerly in ``mode`` on its first ``samples`` samples."""
    start = time.perf_counter()
    dtype = torch.bfloat16 if mode == "bfloat16" else torch.float32
    grad = mode == "grad"
    result = OpResult(op_key(op), mode, "pass")
    skip = _skip_reason(op, mode, dtype)
    if skip is not None:
        result.status, result.reason = "skipped", skip
        return result
    kiln.reset()
    counters.clear()
    fn = op.op

    def call_op(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    compiled = kiln.compile(call_op, backend="kiln")
    try:
        _check_samples(op, compiled, result, dtype, grad, samples, seed)
    except Mismatch as exc:
        result.status, result.reason = "fail", str(exc)
    except Exception as exc:
        frames = traceback.extract_tb(exc.__traceback__)
        where = f" at {frames[-1].filename.split('/')[-1]}:{frames[-1].lineno}" if frames else ""
        result.status = "fail"
        result.reason = f"compiled raised {type(exc).__name__}: {exc}{where}"[:500]
    known = KNOWN.get(result.op)
    if known is not None and mode in known[0] and result.status in ("fail", "kiln-error"):
        result.status, result.reason = "known", f"{known[1]}: {result.reason}"
    _record_counters(result)
    result.seconds = time.perf_counter() - start
    return result


def _check_samples(
    op: Any,
    compiled: Callable[..., Any],
    result: OpResult,
    dtype: torch.dtype,
    grad: bool,
    samples: int,
    seed: int,
) -> None:
    eager_errors: list[str] = []
    for index, sample in enumerate(_samples(op, dtype, grad, seed)):
        if result.samples >= samples:
            break
        call = (sample.input, sample.args, sample.kwargs)
        try:
            expected, expected_grads = _run(op.op, call, grad, seed + index)
        except Exception as exc:
            eager_errors.append(f"{type(exc).__name__}: {exc}"[:200])
            continue
        try:
            ref, ref_grads = _run(op.op, _to_float64(call), grad, seed + index)
        except Exception:
            ref, ref_grads = None, None
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            actual, actual_grads = _run(compiled, call, grad, seed + index)
        failures = [str(w.message) for w in caught if "kiln: compiling" in str(w.message)]
        if failures:
            result.status, result.reason = "kiln-error", failures[0][:500]
        compare(f"sample {index} output", actual, expected, ref)
        if grad:
            compare(f"sample {index} grads", actual_grads, expected_grads, ref_grads)
        result.samples += 1
    if result.samples == 0:
        result.status = "eager-error"
        result.reason = eager_errors[0] if eager_errors else "no samples"


def _record_counters(result: OpResult) -> None:
    snap = counters.snapshot()
    result.kernels = sum(snap.get("kernels", {}).values())
    result.fallback_ops = dict(snap.get("fallback_ops", {}))
    result.extern_kernels = dict(snap.get("extern_kernels", {}))
    result.graphs = snap.get("stats", {}).get("graphs_compiled", 0)
    result.graph_breaks = sum(snap.get("graph_breaks", {}).values())
    result.recompiles = snap.get("guards", {}).get("recompiles", 0)
