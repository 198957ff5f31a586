"""The sweep's Markdown summary: counts per mode, where graphs went, the failing ops and why."""

from __future__ import annotations

import collections
from collections.abc import Iterable

from opinfo.check import OpResult

__all__ = ["FAILING", "summary"]

#: Statuses that count as failures: a wrong answer, an error only compiled code raises, a crash,
#: a hang, or Kiln failing to compile a frame (it then ran eagerly with a warning).
FAILING = ("fail", "crash", "timeout", "kiln-error")
STATUSES = ("pass", *FAILING, "known", "eager-error", "skipped")
REACHED = ("kernels", "vendor-kernels", "aten-fallback", "no-kernel", "not-compiled")


def _cell(text: str) -> str:
    return " ".join(text.replace("|", "\\|").split())[:300]


def summary(results: Iterable[OpResult]) -> str:
    """A Markdown report of ``results`` (of one or several modes)."""
    by_mode: dict[str, list[OpResult]] = collections.defaultdict(list)
    for r in results:
        by_mode[r.mode].append(r)
    lines = [
        "| mode | ops | " + " | ".join((*STATUSES, *REACHED)) + " |",
        "|---" * (len(STATUSES) + len(REACHED) + 2) + "|",
    ]
    for mode, rs in by_mode.items():
        counts = collections.Counter(r.status for r in rs)
        ran = [r for r in rs if r.status in ("pass", "fail", "kiln-error", "known")]
        reached = collections.Counter(r.reached for r in ran)
        cells = [str(counts.get(s, 0)) for s in STATUSES] + [str(reached[k]) for k in REACHED]
        lines.append(f"| {mode} | {len(rs)} | " + " | ".join(cells) + " |")
    fallbacks: collections.Counter[str] = collections.Counter()
    for rs in by_mode.values():
        for r in rs:
            for name in r.fallback_ops:
                fallbacks[name.removeprefix("aten.")] += 1
    if fallbacks:
        lines += ["", "ATen fallback ops (number of op/mode pairs whose graphs call them):", ""]
        lines.append(", ".join(f"`{k}` {v}" for k, v in fallbacks.most_common()))
    bad = [r for rs in by_mode.values() for r in rs if r.status in (*FAILING, "known")]
    if bad:
        lines += ["", "| op | mode | status | reason |", "|---|---|---|---|"]
        lines += [f"| {r.op} | {r.mode} | {r.status} | {_cell(r.reason)} |" for r in bad]
    return "\n".join(lines) + "\n"
