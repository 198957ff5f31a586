"""Runs one model under several backends; the runner starts it in a child process per model.

``python -m benchmarks.worker JOB.json`` appends one JSON line per event to the job's events
file: ``start`` before each backend (the runner's timeout clock) and ``result`` after it, so a
crash or hang loses only the backend in flight. The eager reference is computed once, before
anything is compiled; each backend is compiled, checked against it and warmed up in turn. A
backend further from eager than the tolerance is checked once more against the same step run
in float64 (``Reference``): training gradients of deep convnets are ill-conditioned, and eager
float32 itself is ~1e-2 from float64 there, so closeness to eager alone cannot judge them.
Then (cold phase only) a ``start`` of ``(timing)`` and one ``timing`` event with every working
backend's median step in ms: they are timed together, interleaved (``interleaved_medians``),
because load on a shared machine drifts between timings taken one after another. The runner
writes those times into the result rows.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import sys
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from benchmarks import models
from benchmarks.backends import Column, make_column
from benchmarks.measure import (
    TOLERANCES,
    MemoryMeter,
    flat_tensors,
    interleaved_medians,
    relative_error,
    timed_call,
)
from benchmarks.models import Built, ModelSpec

__all__ = ["TIMING", "Job", "run_job", "strict_float32"]

Emit = Callable[[dict[str, Any]], None]
Step = Callable[[], Any]
# The ``start`` event's backend for the timing phase, after every backend's result.
TIMING = "(timing)"
# Against float64, a backend may be this many times as far as eager float32 is (and tol/10 more).
F64_MULTIPLIER = 2.0


@dataclasses.dataclass
class Job:
    """What one child process does: a model, the backends still to run, and the settings."""

    model: str
    backends: list[str]
    device: str = "cpu"
    dtype: str = "float32"
    mode: str = "inference"
    preset: str = "cpu"
    phase: str = "cold"  # "warm": time only the first call, reusing on-disk caches
    iters: int = 10
    warmup: int = 2
    budget_s: float = 5.0


def _prepare(spec: ModelSpec, job: Job) -> Built:
    built = spec.build(job.preset)
    dtype = torch.bfloat16 if job.dtype == "bfloat16" else torch.float32
    model = built.model.to(device=job.device, dtype=dtype)
    model.train(job.mode == "training")

    def move(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            x = x.to(job.device)
            return x.to(dtype) if x.is_floating_point() else x
        return x

    return Built(model, tuple(map(move, built.args)), {k: move(v) for k, v in built.kwargs.items()})


def _step(spec: ModelSpec, built: Built, fn: Callable[..., Any], job: Job) -> Callable[[], Any]:
    """One inference or training step of ``fn`` (the model, compiled or not) on the inputs."""
    params = [p for p in built.model.parameters() if p.requires_grad]

    @contextlib.contextmanager
    def precision() -> Iterator[None]:
        if job.dtype == "amp":
            with torch.autocast(job.device, dtype=torch.bfloat16):
                yield
        else:
            yield

    def infer() -> Any:
        with torch.no_grad(), precision():
            return fn(*built.args, **built.kwargs)

    def train() -> Any:
        for p in params:
            p.grad = None
        with precision():
            loss = spec.loss_of(fn(*built.args, **built.kwargs))
        loss.backward()
        # A parameter the loss does not reach has no gradient in eager but may get zeros from a
        # compiled backward that covers every output; both mean zero.
        return [loss, *(torch.zeros_like(p) if p.grad is None else p.grad for p in params)]

    return train if job.mode == "training" else infer


def _double(x: Any) -> Any:
    """``x`` in float64 when it is a floating tensor, else as it is."""
    return x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x


class Reference:
    """Eager's outputs for the job's step and, on first need, the same step in float64."""

    def __init__(self, spec: ModelSpec, built: Built, job: Job) -> None:
        self.spec, self.built, self.job = spec, built, job
        self.eager = flat_tensors(_step(spec, built, built.model, job)())
        self._f64: list[torch.Tensor] | None = None
        self._eager_f64_error = 0.0
        self._nhwc64: float | None = None

    def float64_errors(self, out: list[torch.Tensor]) -> tuple[float, float]:
        """``out``'s relative error against the float64 step, and eager's own."""
        device = self.eager[0].device if self.eager else "cpu"
        out = [t.to(device) for t in out]
        if self._f64 is None:
            model = copy.deepcopy(self.built.model).double()
            args = tuple(map(_double, self.built.args))
            built = Built(model, args, {k: _double(v) for k, v in self.built.kwargs.items()})
            job = dataclasses.replace(self.job, dtype="float32")  # no autocast to bfloat16
            self._f64 = [_double(t) for t in flat_tensors(_step(self.spec, built, model, job)())]
            self._eager_f64_error = relative_error([_double(t) for t in self.eager], self._f64)
        return relative_error([_double(t) for t in out], self._f64), self._eager_f64_error

    def channels_last_error(self) -> float | None:
        """Eager's error against float64 with the model and 4-D inputs in channels-last.

        None where no input is 4-D. Eager's own ops round differently in that layout: a ReLU
        input within rounding of zero can flip, and one flip moves a training step's gradients
        by ~1e-3. A compiler that chose channels-last is judged against that eager too.
        """
        if not any(isinstance(a, torch.Tensor) and a.dim() == 4 for a in self.built.args):
            return None
        if self._nhwc64 is not None:  # every failing column of the model asks
            return self._nhwc64

        def nhwc(x: Any) -> Any:
            if isinstance(x, torch.Tensor) and x.dim() == 4:
                return x.to(memory_format=torch.channels_last)
            return x

        model = copy.deepcopy(self.built.model).to(memory_format=torch.channels_last)
        args = tuple(map(nhwc, self.built.args))
        built = Built(model, args, {k: nhwc(v) for k, v in self.built.kwargs.items()})
        out = flat_tensors(_step(self.spec, built, model, self.job)())
        self._nhwc64 = self.float64_errors(out)[0]
        return self._nhwc64


def _judge(row: dict[str, Any], out: list[torch.Tensor], reference: Reference, job: Job) -> None:
    """Set the row's status: within tolerance of eager, or as close to float64 as eager is."""
    tol = TOLERANCES[job.dtype]
    err = row["rel_error"]
    row["status"] = "ok"
    if err <= tol:
        return
    reason = f"relative error {err:.3g} > {tol:g} against eager"
    try:
        err64, eager64 = reference.float64_errors(out)
    except Exception as e:
        row["status"], row["reason"] = "incorrect", f"{reason}; no float64 run: {_reason(e)}"
        return
    row["rel_error_f64"] = err64
    if err64 <= F64_MULTIPLIER * eager64 + tol / 10:
        return
    reason = f"{reason}, {err64:.3g} against float64 (eager: {eager64:.3g}"
    try:
        nhwc64 = reference.channels_last_error()
    except Exception as e:
        nhwc64, reason = None, f"{reason}; no channels-last run: {_reason(e)}"
    if nhwc64 is not None and err64 <= F64_MULTIPLIER * nhwc64 + tol / 10:
        row["reason"] = f"{reason}, eager in channels-last: {nhwc64:.3g})"
        return
    row["status"], row["reason"] = "incorrect", f"{reason})"


def _run_column(
    spec: ModelSpec, built: Built, column: Column, reference: Reference, job: Job
) -> tuple[dict[str, Any], Step | None]:
    """The column's result row, less its time, and its step to time (None in the warm phase)."""
    column.clear_stats()
    meter = MemoryMeter(job.device)
    with meter.measure():
        step = _step(spec, built, column.compile(built.model), job)
        out, first_call_s = timed_call(step, job.device)
        outputs = flat_tensors(out)
        err = relative_error(outputs, reference.eager)
        # kept off the device for a float64 check, out of the peak memory measured
        outputs = [t.cpu() for t in outputs] if err > TOLERANCES[job.dtype] else []
        del out
        if job.phase == "cold":
            for _ in range(job.warmup):
                step()
    row: dict[str, Any] = {"first_call_s": first_call_s, "rel_error": err}
    if job.phase == "warm":
        return {**row, **column.stats()}, None
    _judge(row, outputs, reference, job)
    row["peak_mem_mb"] = meter.peak_mb
    row.update(column.stats())
    ops = column.log.ops_per_graph
    if ops:
        row["ops_total"] = sum(ops)
        row["ops_per_graph"] = sum(ops) / len(ops)
    return row, step


def _columns(names: list[str], count_ops: bool = True) -> dict[str, Column | Exception]:
    """Each backend's column, or what making it raised; every compiler is reset once, here.

    Resetting before each column instead would make the columns compiled before it (Kiln's
    backends share one cache, as torch.compile's do) recompile in the timing phase.
    """
    columns: dict[str, Column | Exception] = {}
    for name in names:
        try:
            column = make_column(name, count_ops)
            column.reset()
        except Exception as e:
            columns[name] = e
        else:
            columns[name] = column
    return columns


def _timing(steps: dict[str, Step], job: Job) -> dict[str, Any]:
    """The timing event: median ms per backend, or none and why."""
    try:
        seconds = interleaved_medians(steps, job.device, job.iters, job.budget_s)
    except Exception as e:
        return {"event": "timing", "ms": {}, "reason": f"timing failed: {_reason(e)}"}
    return {"event": "timing", "ms": {name: 1e3 * s for name, s in seconds.items()}}


def _reason(exc: BaseException) -> str:
    """One line: the exception and the innermost frame that raised it."""
    tb = traceback.extract_tb(exc.__traceback__)
    where = f" at {Path(tb[-1].filename).name}:{tb[-1].lineno}" if tb else ""
    text = " ".join(str(exc).split())[:300]
    return f"{type(exc).__name__}: {text}{where}"


DEVICE_FAULT = "device_fault"
"""The event a child ends on when a backend's fault poisoned its CUDA context: the runner
goes on with the other backends in a fresh child, where they run as if the fault had not been."""


def poisons_device(exc: BaseException) -> bool:
    """Whether ``exc`` is a CUDA error, after which every call in the process raises again
    (a misaligned or illegal address in one backend's kernel would fail every later column)."""
    return type(exc).__name__ == "AcceleratorError" or "CUDA error" in str(exc)


def strict_float32(device: str, dtype: str, mode: str) -> bool:
    """Whether cuDNN runs float32 convolutions in full float32 (not TF32) for this setting.

    A training step's gradients pass through every convolution twice; with TF32, eager
    run against eager with other cuDNN algorithms already differs by ~1e-2 (resnet50),
    above the float32 tolerance, so float32 training on CUDA turns TF32 off."""
    return device == "cuda" and dtype == "float32" and mode == "training"


def run_job(job: Job, emit: Emit) -> None:
    """Run every backend of the job, then time them together; never raises for a backend."""
    spec = models.get(job.model)
    if strict_float32(job.device, job.dtype, job.mode):
        torch.backends.cudnn.allow_tf32 = False
    base = {"model": spec.name, "suite": spec.suite, "device": job.device}
    base |= {"dtype": job.dtype, "mode": job.mode}
    emit({"event": "start", "backend": job.backends[0]})
    try:
        torch.manual_seed(0)
        built = _prepare(spec, job)
        reference = Reference(spec, built, job)
    except Exception as e:
        for name in job.backends:
            emit({"event": "result", **base, "backend": name, "reason": f"eager: {_reason(e)}"})
        return
    columns = _columns(job.backends, count_ops=job.phase == "cold")
    steps: dict[str, Step] = {}
    for i, name in enumerate(job.backends):
        if i:
            emit({"event": "start", "backend": name})
        try:
            column = columns[name]
            if isinstance(column, Exception):
                raise column
            row, step = _run_column(spec, built, column, reference, job)
        except Exception as e:
            row, step = {"status": "failed", "reason": _reason(e)}, None
            if job.device == "cuda" and poisons_device(e):
                emit({"event": "result", **base, "backend": name, "phase": job.phase, **row})
                emit({"event": DEVICE_FAULT, "backend": name})
                return
        if step is not None:
            steps[name] = step
        emit({"event": "result", **base, "backend": name, "phase": job.phase, **row})
    if steps:
        emit({"event": "start", "backend": TIMING})
        emit(_timing(steps, job))


def main(argv: list[str]) -> int:
    job_file = Path(argv[0])
    spec = json.loads(job_file.read_text())
    events = Path(spec.pop("events"))
    torch.set_num_threads(int(spec.pop("threads", 0)) or torch.get_num_threads())

    def emit(event: dict[str, Any]) -> None:
        with events.open("a") as f:
            f.write(json.dumps(event, default=str) + "\n")

    run_job(Job(**spec), emit)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
