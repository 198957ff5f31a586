"""Parallel kernel compilation in worker interpreters.

Each worker runs ``kiln.codegen_triton.compile_worker`` in an interpreter started with
``subprocess`` (:func:`worker_command`; not multiprocessing: a spawned child re-imports the user's
``__main__``, which breaks scripts without a main guard, and CUDA does not
survive fork). Jobs go out as JSON lines; a thread per job waits for a free
worker and its answer, so ``submit`` returns a future at once.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import json
import os
import queue
import subprocess
import sys
import threading
from typing import Any

from kiln.codegen_triton.errors import TritonLaunchError

__all__ = ["REPLY_PREFIX", "CompilePool", "compile_pool", "worker_command"]

REPLY_PREFIX = "KILN-DONE "
"""How a worker's answer line starts (anything else on its stdout is ignored)."""


_BARE_PACKAGES = ("kiln", "kiln.capture", "kiln.loopir", "kiln.codegen_triton")
"""Packages a worker holds without running their ``__init__``: importing ``kiln`` runs the
frontend's, which imports every package (seconds of imports per worker, all started at once
when a graph's first kernel is written); a worker needs only a few modules of these."""

_BOOTSTRAP = """\
import json, runpy, sys, types
for name, path in json.loads(sys.argv[1]).items():
    sys.modules[name] = module = types.ModuleType(name)
    module.__path__ = path
    parent, _, child = name.rpartition(".")
    if parent:
        setattr(sys.modules[parent], child, module)
runpy.run_module("kiln.codegen_triton.compile_worker", run_name="__main__")
"""


def worker_command() -> list[str]:
    """How a worker is started: its module run with :data:`_BARE_PACKAGES` as bare packages
    (their folders, as this process found them, and none of their ``__init__`` code)."""
    paths = {name: list(sys.modules[name].__path__) for name in _BARE_PACKAGES}
    return [sys.executable, "-c", _BOOTSTRAP, json.dumps(paths)]


class CompilePool:
    """``workers`` compile processes, started lazily, stopped at exit."""

    def __init__(self, workers: int) -> None:
        self.size = max(1, workers)
        self._idle: queue.Queue[subprocess.Popen[str]] = queue.Queue()
        self._started: list[subprocess.Popen[str]] = []
        self._lock = threading.Lock()
        self._threads = concurrent.futures.ThreadPoolExecutor(self.size, "kiln-compile")

    def _spawn(self) -> subprocess.Popen[str]:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        proc = subprocess.Popen(
            worker_command(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
        )
        self._started.append(proc)
        return proc

    def start(self) -> None:
        """Start every worker now (they import torch and triton while kernels are written)."""
        with self._lock:
            while len(self._started) < self.size:
                self._idle.put(self._spawn())

    def _worker(self) -> subprocess.Popen[str]:
        with self._lock:
            if self._idle.empty() and len(self._started) < self.size:
                return self._spawn()
        return self._idle.get()

    def _run(self, job: dict[str, Any]) -> None:
        proc = self._worker()
        assert proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(json.dumps(job) + "\n")
            proc.stdin.flush()
            for line in proc.stdout:
                if line.startswith(REPLY_PREFIX):
                    reply = json.loads(line[len(REPLY_PREFIX) :])
                    break
            else:
                msg = f"compile worker exited with {proc.wait()}"
                raise TritonLaunchError(msg)
        finally:
            if proc.poll() is None:
                self._idle.put(proc)
        if not reply["ok"]:
            raise TritonLaunchError(reply["error"])

    def submit(self, job: dict[str, Any]) -> concurrent.futures.Future[None]:
        return self._threads.submit(self._run, job)

    def close(self) -> None:
        self._threads.shutdown(wait=False, cancel_futures=True)
        for proc in self._started:
            if proc.poll() is None:
                proc.kill()


_pool: CompilePool | None = None
_pool_lock = threading.Lock()


def compile_pool(workers: int) -> CompilePool:
    """The process-wide pool (created on first use)."""
    global _pool  # one pool per process
    with _pool_lock:
        if _pool is None:
            _pool = CompilePool(workers)
            atexit.register(_pool.close)
        return _pool
