"""Runs the sweep in worker processes: a crash or hang costs one op, never the sweep.

Ops go to workers in chunks (importing torch and the OpInfo database costs seconds, so not one
process per op). A worker reports each op as it starts and ends; when it dies, the op it was in is
recorded as a crash (with the end of its output), and when one op runs past the timeout the worker
is killed and the op recorded as a timeout. Either way the chunk's remaining ops go to a fresh
worker.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from opinfo.check import OpResult

__all__ = ["SweepConfig", "run_sweep"]

ROOT = Path(__file__).resolve().parent.parent


@dataclasses.dataclass
class SweepConfig:
    mode: str = "float32"
    workers: int = 1
    samples: int = 2
    seed: int = 0
    timeout_s: float = 180.0  # one op, all its samples
    chunk: int = 20


@dataclasses.dataclass
class _Worker:
    proc: subprocess.Popen[bytes]
    results: Path
    log: Path
    ops: list[str]
    done: int = 0  # lines of the results file read so far
    current: str | None = None
    since: float = 0.0
    finished: set[str] = dataclasses.field(default_factory=set)


def _start(cfg: SweepConfig, ops: list[str], tmp: Path, n: int) -> _Worker:
    results, log = tmp / f"w{n}.jsonl", tmp / f"w{n}.log"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    env["OMP_NUM_THREADS"] = "1"
    cmd = [sys.executable, "-m", "opinfo.worker", cfg.mode, str(cfg.samples), str(cfg.seed)]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [*cmd, str(results), *ops], stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT
        )
    return _Worker(proc, results, log, ops, since=time.monotonic())


def _read(worker: _Worker, found: dict[str, OpResult]) -> None:
    if not worker.results.exists():
        return
    lines = worker.results.read_text(encoding="utf-8").splitlines()
    for line in lines[worker.done :]:
        try:
            event: dict[str, Any] = json.loads(line)
        except json.JSONDecodeError:
            break  # a line still being written
        worker.done += 1
        if "start" in event:
            worker.current, worker.since = event["start"], time.monotonic()
        else:
            result = OpResult(**event)
            found[result.op] = result
            worker.finished.add(result.op)
            worker.current = None


def _tail(path: Path, n: int = 400) -> str:
    text = path.read_text(encoding="utf-8", errors="replace") if path.exists() else ""
    return " ".join(text[-n:].split())


def _left(worker: _Worker) -> list[str]:
    return [op for op in worker.ops if op not in worker.finished and op != worker.current]


def run_sweep(
    ops: list[str], cfg: SweepConfig, progress: Callable[[OpResult], None] | None = None
) -> list[OpResult]:
    """Check every op of ``ops`` in ``cfg.mode``; results in the order of ``ops``."""
    queue = collections.deque(ops[i : i + cfg.chunk] for i in range(0, len(ops), cfg.chunk))
    found: dict[str, OpResult] = {}
    active: list[_Worker] = []
    started = 0
    reported: set[str] = set()
    with tempfile.TemporaryDirectory(prefix="kiln-opinfo-") as tmp_name:
        tmp = Path(tmp_name)
        while queue or active:
            while queue and len(active) < cfg.workers:
                active.append(_start(cfg, queue.popleft(), tmp, started))
                started += 1
            time.sleep(0.1)
            for worker in list(active):
                _read(worker, found)
                code = worker.proc.poll()
                hung = (
                    worker.current is not None and time.monotonic() - worker.since > cfg.timeout_s
                )
                if code is None and not hung:
                    continue
                if hung:
                    worker.proc.kill()
                    worker.proc.wait()
                    _read(worker, found)
                if worker.current is not None:
                    status = "timeout" if hung else "crash"
                    reason = f"over {cfg.timeout_s:.0f}s" if hung else f"exit {code}: "
                    if not hung:
                        reason += _tail(worker.log)
                    found[worker.current] = OpResult(worker.current, cfg.mode, status, reason)
                elif code:
                    # Died before any op started (an import failure): every op reports it.
                    for op in _left(worker):
                        found[op] = OpResult(op, cfg.mode, "crash", _tail(worker.log))
                    worker.ops = []
                rest = _left(worker)
                if rest:
                    queue.appendleft(rest)
                active.remove(worker)
            if progress is not None:
                for op in ops:
                    if op in found and op not in reported:
                        reported.add(op)
                        progress(found[op])
    return [found[op] for op in ops if op in found]
