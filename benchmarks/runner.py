"""Runs the suite: one child process per model and phase, with a timeout per backend.

A crash or hang is recorded as that backend's failure with its reason, and a fresh child runs
the backends still to go, so one broken model never stops the run. A backend that raises a
CUDA error, which poisons its child's context, ends that child after its row; the backends
after it run in a fresh child as they would have. A child times its backends
together, interleaved, after compiling them all (see ``worker``): the runner writes those times
into the rows, a crash or hang while timing leaves the rows without times (the reason says so),
and one before it has the next child time again the backends it had finished.

Compile caches live under ``CACHE/<model>`` (default ``OUT/cache``): emptied before the cold
run, reused by the warm run (a fresh process), which measures compile time with on-disk caches.
``budget_s`` is a hard cap on the whole run: a backend still running when it is spent is stopped
and recorded as timed out. Results are rewritten after every model.
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
from benchmarks.worker import DEVICE_FAULT, Job, run_job

__all__ = ["RunConfig", "finish_row", "run_suite"]

ROOT = Path(__file__).resolve().parent.parent
_CACHE_VARS = (
    "TORCHINDUCTOR_CACHE_DIR",
    "TRITON_CACHE_DIR",
    "KILN_CACHE_DIR",
    "KILN_GRAPH_CACHE_DIR",
)


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
    """Run ``job`` in child processes until every backend has a result row.

    The backends are timed together after the last one compiles, so a child that dies earlier
    takes the times of those it had finished: the next child compiles them again, to time them
    with the backends still to go, and only their ``ms`` is kept. A child that dies while
    timing is not run again; its rows stand without ``ms``, and their reason says so.
    """
    rows: dict[str, dict[str, Any]] = {}
    lost: dict[str, str] = {}  # finished backends without a time, and why
    spent: set[str] = set()  # compiled again to be timed and died there: not tried a third time
    todo = list(job.backends)
    attempt = 0
    while todo:
        if cfg.left_s() <= 0:
            rows |= {b: _skipped(cfg, b) for b in todo}
            break
        attempt += 1
        again = [b for b in lost if b not in spent]
        run = [b for b in job.backends if b in todo or b in again]
        evs, in_flight, (status, reason) = _attempt(cfg, job, run, attempt, workdir, env)
        for row in _results(evs):
            b = row["backend"]
            if b in todo:
                rows[b] = row
            elif row.get("ms") is not None:
                rows[b]["ms"] = row["ms"]
        timed = any(e["event"] == "timing" for e in evs)
        for b in run:
            if rows.get(b, {}).get("ms") is not None:
                lost.pop(b, None)
            elif not timed and _untimed(rows.get(b)):
                lost[b] = f"timing did not finish: {reason}"
        todo = [b for b in todo if b not in rows]
        if not todo:
            break
        fault = next((e["backend"] for e in evs if e["event"] == DEVICE_FAULT), None)
        if fault is not None:  # its row is in: the others go on in a fresh child
            if fault in again:
                spent.add(fault)
            continue
        if in_flight in again:
            spent.add(in_flight)
            continue
        current = in_flight if in_flight in todo else todo[0]
        rows[current] = {"backend": current, "status": status, "reason": reason[:400]}
        todo.remove(current)
    for b, why in lost.items():
        _note(rows[b], why)
    return list(rows.values())


def _attempt(
    cfg: RunConfig,
    job: Job,
    backends: list[str],
    attempt: int,
    workdir: Path,
    env: dict[str, str],
) -> tuple[list[dict[str, Any]], str | None, tuple[str, str]]:
    """One child over ``backends``: its events, the backend in flight when it ended, and the
    status and reason to give that backend should the child have ended early.
    """
    stem = f"{job.model}.{job.phase}.{attempt}"
    events, log, job_file = (workdir / f"{stem}.{ext}" for ext in ("jsonl", "log", "json"))
    events.unlink(missing_ok=True)
    spec = {**dataclasses.asdict(job), "backends": backends, "events": str(events)}
    spec["threads"] = cfg.threads
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
        evs, in_flight, timed_out = _watch(proc, events, cfg)
    if timed_out:
        status, reason = "timeout", f"no result within {cfg.timeout_s:g} s"
        if cfg.left_s() <= 0:
            reason = f"stopped: the run budget of {cfg.budget_s:g} s is spent"
    else:
        tail = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
        status = "crashed"
        reason = f"child exited with code {proc.returncode}" + (f": {tail[-1]}" if tail else "")
    return evs, in_flight, (status, reason)


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
    """Wait for the child; the clock restarts at each start event (a backend, or the timing).

    Returns the child's events, the backend in flight when it ended, and whether it timed out.
    """
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
            return _read_events(events), in_flight, True
        time.sleep(0.2)
    evs = _read_events(events)
    in_flight = next((e["backend"] for e in reversed(evs) if e["event"] == "start"), in_flight)
    return evs, in_flight, False


def _untimed(row: dict[str, Any] | None) -> bool:
    """Whether ``row`` is of a backend that ran in the cold phase and should have a time."""
    if row is None or row.get("phase") != "cold" or row.get("ms") is not None:
        return False
    return row.get("status") in ("ok", "incorrect")


def _note(row: dict[str, Any], why: str) -> None:
    row["reason"] = "; ".join(filter(None, [row.get("reason"), why]))


def _results(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The result rows, with ``ms`` from the timing event; if timing raised, its reason."""
    timing = next((e for e in events if e["event"] == "timing"), None)
    rows = [e for e in events if e["event"] == "result"]
    if timing is None:
        return rows
    for row in rows:
        if row["backend"] in timing["ms"]:
            row["ms"] = timing["ms"][row["backend"]]
        elif _untimed(row):
            _note(row, timing.get("reason", "not timed"))
    return rows


def _in_process(job: Job) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    run_job(job, events.append)
    return _results(events)


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
