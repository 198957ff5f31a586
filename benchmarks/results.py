"""One row of results per (model, backend), and their CSV form.

Every row says whether the column works (``status``), why not (``reason``), how close it is
to eager, how fast, how long it compiles, and how the program was captured.
"""

from __future__ import annotations

import csv
import dataclasses
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

__all__ = ["STATUSES", "Result", "read_csv", "write_csv"]

# ok: correct within tolerance; incorrect: ran, but differs from eager; failed: raised;
# timeout / crashed: the child process hung or died; skipped: not run (budget, dtype).
STATUSES = ("ok", "incorrect", "failed", "timeout", "crashed", "skipped")


@dataclasses.dataclass
class Result:
    model: str
    suite: str
    backend: str
    device: str
    dtype: str
    mode: str
    status: str = "failed"
    reason: str = ""
    rel_error: float | None = None
    rel_error_f64: float | None = None  # measured only when rel_error is above the tolerance
    eager_ms: float | None = None
    ms: float | None = None
    speedup: float | None = None
    first_call_s: float | None = None
    compile_s: float | None = None
    warm_compile_s: float | None = None
    peak_mem_mb: float | None = None
    graphs: int | None = None
    graph_breaks: int | None = None
    ops_total: int | None = None
    ops_per_graph: float | None = None
    kernels: int | None = None
    eager_fallbacks: int | None = None
    recompiles: int | None = None
    fallback_ops: dict[str, int] = dataclasses.field(default_factory=dict)
    break_kinds: dict[str, int] = dataclasses.field(default_factory=dict)

    @property
    def works(self) -> bool:
        return self.status == "ok"

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Result:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


FIELDS = [f.name for f in dataclasses.fields(Result)]
_DICTS = {"fallback_ops", "break_kinds"}
_INTS = {"graphs", "graph_breaks", "ops_total", "kernels", "eager_fallbacks", "recompiles"}
_FLOATS = {
    f.name for f in dataclasses.fields(Result) if "float" in str(f.type) and f.name not in _INTS
}


def write_csv(path: Path, rows: Iterable[Result]) -> None:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        writer.writeheader()
        for row in rows:
            data = dataclasses.asdict(row)
            for key in _DICTS:
                data[key] = json.dumps(data[key], sort_keys=True) if data[key] else ""
            writer.writerow({k: "" if v is None else v for k, v in data.items()})


def _parse(key: str, text: str) -> Any:
    if key in _DICTS:
        return json.loads(text) if text else {}
    if text == "":
        return None
    if key in _INTS:
        return int(float(text))
    if key in _FLOATS:
        return float(text)
    return text


def read_csv(path: Path) -> list[Result]:
    with path.open(newline="") as f:
        return [
            Result.from_dict({k: _parse(k, v) for k, v in r.items()}) for r in csv.DictReader(f)
        ]
