"""Runs the suite: one child process per model and phase, with a timeout per backend.

A crash or hang is recorded as that backend's failure with its reason, and a fresh child runs
the backends still to go, so one broken model never stops the run. Compile caches live under
``CACHE/<model>`` (default ``OUT/cache``): emptied before the cold run, reused by the warm run
(a fresh process), which measures compile time with on-disk caches. ``budget_s`` is a hard cap
on the whole run: a backend still running when it is spent is stopped and recorded as timed
out. Results are rewritten after every model.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.models import ModelSpec
from benchmarks.results import Result, write_csv
from benchmarks.worker import Job, run_job

__all__ = ["RunConfig", "finish_row", "run_suite"]

ROOT = Path(__file__).resolve().parent.parent
_CACHE_VARS = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "KILN_CACHE_DIR")


@dataclasses.dataclass
class RunConfig:
    backends: list[str]
    out: Path
    device: str = "cpu"
    dtype: str = "float32"
    mode: str = "inference"
    preset: str = "cpu"
    timeout_s: float = 600.0
    budget_s: float | None = None
    cache_dir: Path | None = None
    warm: bool = True
    iters: int = 10
    threads: int = 0
    isolate: bool = True  # False: run in this process (fast tests; no crash or hang protection)
    stop_at: float | None = None  # time.monotonic() when the budget is spent (set by run_suite)

    def left_s(self) -> float:
        """Seconds the next backend may run: its timeout, cut short by the run's budget."""
        if self.stop_at is None:
            return self.timeout_s
        return min(self.timeout_s, self.stop_at - time.monotonic())

    def job(self, model: str, backends: list[str], phase: str) -> Job:
        return Job(
            model, backends, self.device, self.dtype, self.mode, self.preset, phase, self.iters
        )


def _child(cfg: RunConfig, job: Job, workdir: Path, env: dict[str, str]) -> list[dict[str, Any]]:
    """Run ``job`` in child processes until every backend has a result row."""
    rows: list[dict[str, Any]] = []
    todo = list(job.backends)
    attempt = 0
    while todo:
        if cfg.left_s() <= 0:
            rows += [_skipped(cfg, b) for b in todo]
            break
        attempt += 1
        events = workdir / f"{job.model}.{job.phase}.{attempt}.jsonl"
        log = workdir / f"{job.model}.{job.phase}.{attempt}.log"
        events.unlink(missing_ok=True)
        spec = {**dataclasses.asdict(job), "backends": todo, "events": str(events)}
        spec["threads"] = cfg.threads
        job_file = workdir / f"{job.model}.{job.phase}.{attempt}.json"
        job_file.write_text(json.dumps(spec))
        with log.open("w") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "benchmarks.worker", str(job_file)],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=ROOT,
                start_new_session=True,
            )
            got, in_flight, timed_out = _watch(proc, events, cfg)
        rows += got
        done = {r["backend"] for r in got}
        todo = [b for b in todo if b not in done]
        if not todo:
            break
        current = in_flight if in_flight in todo else todo[0]
        if timed_out:
            status, reason = "timeout", f"no result within {cfg.timeout_s:g} s"
            if cfg.left_s() <= 0:
                reason = f"stopped: the run budget of {cfg.budget_s:g} s is spent"
        else:
            tail = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
            status = "crashed"
            reason = f"child exited with code {proc.returncode}" + (f": {tail[-1]}" if tail else "")
        rows.append({"backend": current, "status": status, "reason": reason[:400]})
        todo.remove(current)
    return rows


def _skipped(cfg: RunConfig, backend: str) -> dict[str, Any]:
    reason = f"not run: the run budget of {cfg.budget_s:g} s is spent"
    return {"backend": backend, "status": "skipped", "reason": reason}


def _read_events(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    return [json.loads(ln) for ln in lines if ln.strip()]


def _watch(
    proc: subprocess.Popen[bytes], events: Path, cfg: RunConfig
) -> tuple[list[dict[str, Any]], str | None, bool]:
    """Wait for the child; the clock restarts at each backend's start event."""
    deadline = time.monotonic() + cfg.left_s()
    seen = 0
    in_flight: str | None = None
    while proc.poll() is None:
        evs = _read_events(events)
        for ev in evs[seen:]:
            if ev["event"] == "start":
                in_flight = ev["backend"]
                deadline = time.monotonic() + cfg.left_s()
        seen = len(evs)
        if time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            results = [e for e in _read_events(events) if e["event"] == "result"]
            return results, in_flight, True
        time.sleep(0.2)
    evs = _read_events(events)
    in_flight = next((e["backend"] for e in reversed(evs) if e["event"] == "start"), in_flight)
    return [e for e in evs if e["event"] == "result"], in_flight, False


def _in_process(job: Job) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    run_job(job, events.append)
    return [e for e in events if e["event"] == "result"]


def _run(cfg: RunConfig, job: Job, env: dict[str, str]) -> list[dict[str, Any]]:
    if not cfg.isolate:
        return _in_process(job)
    workdir = cfg.out / "logs"
    workdir.mkdir(parents=True, exist_ok=True)
    return _child(cfg, job, workdir, env)


def finish_row(rows: list[Result]) -> None:
    """Derived columns of one model's rows: speedup and compile times relative to eager."""
    eager_ms = next((r.ms for r in rows if r.backend == "eager" and r.ms), None)
    for r in rows:
        if eager_ms is not None:
            r.eager_ms = eager_ms
            if r.ms and r.works:
                r.speedup = eager_ms / r.ms
        if r.backend == "eager" or r.ms is None:
            continue
        if r.first_call_s is not None:
            r.compile_s = max(0.0, r.first_call_s - r.ms / 1e3)
        if r.warm_compile_s is not None:
            r.warm_compile_s = max(0.0, r.warm_compile_s - r.ms / 1e3)


def _model_rows(cfg: RunConfig, spec: ModelSpec) -> list[Result]:
    backends = ["eager", *[b for b in cfg.backends if b != "eager"]]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    cache = (cfg.cache_dir or cfg.out / "cache") / spec.name
    shutil.rmtree(cache, ignore_errors=True)
    for var in _CACHE_VARS:
        env[var] = str(cache / var.lower())
    base = {"model": spec.name, "suite": spec.suite, "device": cfg.device}
    base |= {"dtype": cfg.dtype, "mode": cfg.mode}
    found = {r["backend"]: r for r in _run(cfg, cfg.job(spec.name, backends, "cold"), env)}
    rows = {b: Result.from_dict({**base, **found.get(b, {}), "backend": b}) for b in backends}
    compiled = [b for b, r in rows.items() if b != "eager" and r.status in ("ok", "incorrect")]
    if cfg.warm and compiled:
        for w in _run(cfg, cfg.job(spec.name, compiled, "warm"), env):
            if w.get("first_call_s") is not None:
                rows[w["backend"]].warm_compile_s = w["first_call_s"]
    ordered = [rows[b] for b in backends]
    finish_row(ordered)
    return ordered


def run_suite(
    specs: list[ModelSpec], cfg: RunConfig, on_model: Callable[[str], None] | None = None
) -> list[Result]:
    """Every model under every backend; results.csv under ``cfg.out`` is kept current."""
    cfg.out.mkdir(parents=True, exist_ok=True)
    results: list[Result] = []
    if cfg.budget_s is not None:
        cfg.stop_at = time.monotonic() + cfg.budget_s
    for spec in specs:
        if cfg.left_s() <= 0:
            results += [
                Result.from_dict(
                    {"model": spec.name, "suite": spec.suite, "device": cfg.device}
                    | {"dtype": cfg.dtype, "mode": cfg.mode}
                    | _skipped(cfg, b)
                )
                for b in ["eager", *[b for b in cfg.backends if b != "eager"]]
            ]
        else:
            results += _model_rows(cfg, spec)
        write_csv(cfg.out / "results.csv", results)
        if on_model is not None:
            on_model(spec.name)
    return results
