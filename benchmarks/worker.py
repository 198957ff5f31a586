"""Runs one model under several backends; the runner starts it in a child process per model.

``python -m benchmarks.worker JOB.json`` appends one JSON line per event to the job's events
file: ``start`` before each backend (the runner's timeout clock) and ``result`` after it, so a
crash or hang loses only the backend in flight. The eager reference is computed once, before
anything is compiled; each backend is compiled, checked against it and warmed up in turn.
Then (cold phase only) a ``start`` of ``(timing)`` and one ``timing`` event with every working
backend's median step in ms: they are timed together, interleaved (``interleaved_medians``),
because load on a shared machine drifts between timings taken one after another. The runner
writes those times into the result rows.
"""

from __future__ import annotations

import contextlib
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


def _run_column(
    spec: ModelSpec, built: Built, column: Column, reference: list[torch.Tensor], job: Job
) -> tuple[dict[str, Any], Step | None]:
    """The column's result row, less its time, and its step to time (None in the warm phase)."""
    column.clear_stats()
    meter = MemoryMeter(job.device)
    with meter.measure():
        step = _step(spec, built, column.compile(built.model), job)
        out, first_call_s = timed_call(step, job.device)
        err = relative_error(flat_tensors(out), reference)
        del out
        if job.phase == "cold":
            for _ in range(job.warmup):
                step()
    row: dict[str, Any] = {"first_call_s": first_call_s, "rel_error": err}
    if job.phase == "warm":
        return row, None
    row["peak_mem_mb"] = meter.peak_mb
    row.update(column.stats())
    ops = column.log.ops_per_graph
    if ops:
        row["ops_total"] = sum(ops)
        row["ops_per_graph"] = sum(ops) / len(ops)
    if err > TOLERANCES[job.dtype]:
        row["status"] = "incorrect"
        row["reason"] = f"relative error {err:.3g} > {TOLERANCES[job.dtype]:g} against eager"
    else:
        row["status"] = "ok"
    return row, step


def _columns(names: list[str]) -> dict[str, Column | Exception]:
    """Each backend's column, or what making it raised; every compiler is reset once, here.

    Resetting before each column instead would make the columns compiled before it (Kiln's
    backends share one cache, as torch.compile's do) recompile in the timing phase.
    """
    columns: dict[str, Column | Exception] = {}
    for name in names:
        try:
            column = make_column(name)
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
        reference = flat_tensors(_step(spec, built, built.model, job)())
    except Exception as e:
        for name in job.backends:
            emit({"event": "result", **base, "backend": name, "reason": f"eager: {_reason(e)}"})
        return
    columns = _columns(job.backends)
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
