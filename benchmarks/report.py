"""Reports of a run: results.csv, summary.md (geomeans, the distribution over models with the
worst model, the paper's Table 1 statistics, per-model tables, correctness failures apart
from crashes), speedups.png (per model) and distribution.png (models sorted by speedup).

``python -m benchmarks.report DIR [DIR ...] --out DIR`` merges shards of a run (each with its
results.csv and meta.json) into one set of reports; a later folder's row for the same model and
backend replaces an earlier one, unless the later one was skipped.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.results import Result, read_csv, write_csv

log = logging.getLogger(__name__)

__all__ = [
    "geomean",
    "main",
    "summary_markdown",
    "write_chart",
    "write_distribution_chart",
    "write_reports",
]

# What the distribution tables count: a compiled model below this speedup over eager, or
# below this fraction of the reference backend's speedup (torch.compile), is a regression.
SLOW_VS_EAGER = 0.95
BEHIND_REFERENCE = 0.9
REFERENCE = "torch_compile"


def geomean(values: Sequence[float]) -> float | None:
    values = [v for v in values if v > 0]
    if not values:
        return None
    return math.exp(sum(map(math.log, values)) / len(values))


def _fmt(value: float | None, spec: str = ".2f", suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def _mean(values: Sequence[float | int | None]) -> float | None:
    got = [float(v) for v in values if v is not None]
    return sum(got) / len(got) if got else None


def _backends(rows: list[Result]) -> list[str]:
    return list(dict.fromkeys(r.backend for r in rows))


def _speed_table(rows: list[Result], backends: list[str]) -> list[str]:
    out = [
        "| backend | models working | incorrect | failed | geomean speedup | "
        "mean compile s | mean warm compile s | mean peak MiB |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for b in backends:
        mine = [r for r in rows if r.backend == b and r.status != "skipped"]
        ok = [r for r in mine if r.works]
        bad = sum(r.status == "incorrect" for r in mine)
        failed = len(mine) - len(ok) - bad
        speed = geomean([r.speedup for r in ok if r.speedup])
        out.append(
            f"| {b} | {len(ok)}/{len(mine)} | {bad} | {failed} | {_fmt(speed, '.2f', 'x')} | "
            f"{_fmt(_mean([r.compile_s for r in ok]))} | "
            f"{_fmt(_mean([r.warm_compile_s for r in ok]))} | "
            f"{_fmt(_mean([r.peak_mem_mb for r in ok]), '.0f')} |"
        )
    return out


def _quantile(ordered: list[float], q: float) -> float:
    """The ``q`` quantile of sorted values, interpolated between neighbours."""
    pos = q * (len(ordered) - 1)
    low = math.floor(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def speedups(rows: list[Result], backend: str) -> dict[str, float]:
    """Per model, ``backend``'s speedup over eager where it works and was timed."""
    return {r.model: r.speedup for r in rows if r.backend == backend and r.works and r.speedup}


def versus(rows: list[Result], backend: str, reference: str = REFERENCE) -> dict[str, float]:
    """Per model where both work, ``backend``'s speedup over ``reference``'s (above 1: ahead)."""
    mine, theirs = speedups(rows, backend), speedups(rows, reference)
    return {m: s / theirs[m] for m, s in mine.items() if m in theirs}


def _spread(values: dict[str, float], below: float) -> str:
    """Cells: models, geomean, worst model, p10, median, p90, best, and how many are below."""
    if not values:
        return "0 | - | - | - | - | - | - | -"
    ordered = sorted(values.values())
    worst = min(values, key=lambda m: values[m])
    best = max(values, key=lambda m: values[m])
    cells = [
        str(len(values)),
        _fmt(geomean(ordered), ".2f", "x"),
        f"{worst} {values[worst]:.2f}x",
        *(f"{_quantile(ordered, q):.2f}x" for q in (0.1, 0.5, 0.9)),
        f"{best} {values[best]:.2f}x",
        _pct(sum(v < below for v in ordered), len(ordered)),
    ]
    return " | ".join(cells)


def _distribution_tables(rows: list[Result], backends: list[str]) -> list[str]:
    """Speedup over eager per compiled backend, and against the reference where it ran."""
    compiled = [b for b in backends if b != "eager"]
    out = [
        "| backend | models timed | geomean | worst model | p10 | median | p90 | best model | "
        f"below {SLOW_VS_EAGER:g}x eager |",
        "|---|---|---|---|---|---|---|---|---|",
        *(f"| {b} | {_spread(speedups(rows, b), SLOW_VS_EAGER)} |" for b in compiled),
    ]
    others = [b for b in compiled if b != REFERENCE]
    if REFERENCE in backends and others:
        out += [
            "",
            f"Against {REFERENCE} (speedup over eager divided by {REFERENCE}'s, per model where"
            " both work; above 1.00x is ahead):",
            "",
            "| backend | models | geomean | worst model | p10 | median | p90 | best model | "
            f"more than {100 * (1 - BEHIND_REFERENCE):.0f}% behind |",
            "|---|---|---|---|---|---|---|---|---|",
            *(f"| {b} | {_spread(versus(rows, b), BEHIND_REFERENCE)} |" for b in others),
        ]
    return out


def _pct(n: int, total: int) -> str:
    return f"{n} ({100 * n / total:.0f}%)" if total else "0"


def _capture_table(rows: list[Result], backends: list[str]) -> list[str]:
    """The paper's Table 1 per compiled backend, over the models that work with it."""
    out = [
        "| backend | models working | with a graph | operators captured | mean ops per graph | "
        "mean graphs per model | 0 breaks | 1-9 breaks | 10+ breaks |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for b in backends:
        if b == "eager":
            continue
        mine = [r for r in rows if r.backend == b and r.status != "skipped"]
        ok = [r for r in mine if r.works]
        breaks = [r.graph_breaks or 0 for r in ok]
        ops = sum(r.ops_total or 0 for r in ok)
        graphs = sum(r.graphs or 0 for r in ok)
        out.append(
            f"| {b} | {_pct(len(ok), len(mine))} | {sum(bool(r.graphs) for r in ok)} | {ops} | "
            f"{_fmt(ops / graphs if graphs else None, '.1f')} | "
            f"{_fmt(_mean([r.graphs for r in ok]), '.1f')} | "
            f"{_pct(sum(n == 0 for n in breaks), len(ok))} | "
            f"{_pct(sum(0 < n < 10 for n in breaks), len(ok))} | "
            f"{_pct(sum(n >= 10 for n in breaks), len(ok))} |"
        )
    return out


def _cell(r: Result | None) -> str:
    if r is None:
        return "-"
    if r.works:
        return f"{_fmt(r.speedup, '.2f', 'x')} ({_fmt(r.compile_s, '.1f', ' s')})"
    return r.status


def _model_table(rows: list[Result], backends: list[str]) -> list[str]:
    others = [b for b in backends if b != "eager"]
    out = [
        "| model | suite | eager ms | " + " | ".join(others) + " |",
        "|---|---|---|" + "---|" * len(others),
    ]
    models = list(dict.fromkeys(r.model for r in rows))
    by_key = {(r.model, r.backend): r for r in rows}
    for m in models:
        eager = by_key.get((m, "eager"))
        suite = eager.suite if eager else ""
        eager_ms = (
            _fmt(eager.ms, ".2f") if eager and eager.works else (eager.status if eager else "-")
        )
        cells = " | ".join(_cell(by_key.get((m, b))) for b in others)
        out.append(f"| {m} | {suite} | {eager_ms} | {cells} |")
    return out


def _detail_table(rows: list[Result]) -> list[str]:
    out = [
        "| model | backend | graphs | breaks | ops/graph | kernels | fallback ops | eager fallbacks |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r.backend == "eager" or not r.works:
            continue
        fallbacks = ", ".join(f"{k}x{v}" for k, v in sorted(r.fallback_ops.items())) or "-"
        out.append(
            f"| {r.model} | {r.backend} | {_fmt(r.graphs, 'd')} | {_fmt(r.graph_breaks, 'd')} | "
            f"{_fmt(r.ops_per_graph, '.1f')} | {_fmt(r.kernels, 'd')} | {fallbacks} | "
            f"{_fmt(r.eager_fallbacks, 'd')} |"
        )
    return out


def _failures(rows: list[Result], statuses: tuple[str, ...]) -> list[str]:
    bad = [r for r in rows if r.status in statuses]
    if not bad:
        return ["None."]
    return [
        f"- `{r.model}` / `{r.backend}`: {r.status}"
        + (f": {r.reason.replace('|', '/')}" if r.reason else "")
        for r in bad
    ]


def summary_markdown(rows: list[Result], meta: dict[str, Any]) -> str:
    backends = _backends(rows)
    setting = ", ".join(f"{k} {v}" for k, v in meta.items())
    lines = [
        "# Kiln benchmark results",
        "",
        f"Setting: {setting}.",
        "",
        "## Speedup over eager (geomean over models that work and match eager)",
        "",
        *_speed_table(rows, backends),
        "",
        "## Distribution over models",
        "",
        "Speedup over eager of each compiled backend over the models where it works, its"
        " worst model and quantiles (chart: distribution.png; per model: speedups.png).",
        "",
        *_distribution_tables(rows, backends),
        "",
        "## Capture statistics (the paper's Table 1)",
        "",
        "Operators captured: FX operator nodes handed to the backend, summed over working models."
        " With a graph: working models of which at least one graph was compiled (the others ran"
        " eagerly).",
        "",
        *_capture_table(rows, backends),
        "",
        "## Per model: speedup over eager (cold compile time), or status",
        "",
        *_model_table(rows, backends),
        "",
        "## Capture detail of working compiled columns",
        "",
        *_detail_table(rows),
        "",
        "## Correctness failures (ran, but differ from eager)",
        "",
        "A column further from eager than the tolerance still counts as correct when it is no",
        "more than twice as far from the same step in float64 as eager is (plus a tenth of the",
        "tolerance): ill-conditioned training gradients (densenet121, resnet50) differ from",
        "eager's float32 for any compiler.",
        "",
        *_failures(rows, ("incorrect",)),
        "",
        "## Failures (raised, crashed, timed out or skipped)",
        "",
        *_failures(rows, ("failed", "crashed", "timeout", "skipped")),
        "",
    ]
    return "\n".join(lines)


def write_chart(path: Path, rows: list[Result]) -> None:
    """Per-model speedup over eager, one bar per compiled backend; failures labelled by status."""
    try:
        import matplotlib
    except ImportError:
        log.warning("matplotlib is not installed: no chart written")
        return

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    backends = [b for b in _backends(rows) if b != "eager"]
    models = list(dict.fromkeys(r.model for r in rows))
    by_key = {(r.model, r.backend): r for r in rows}
    height = 0.8 / max(1, len(backends))
    fig, ax = plt.subplots(figsize=(9, 1.0 + 0.32 * len(models) * max(1, len(backends)) ** 0.5))
    for i, b in enumerate(backends):
        ys = [m_i + i * height for m_i in range(len(models))]
        got = [by_key.get((m, b)) for m in models]
        vals = [r.speedup if r is not None and r.works and r.speedup else 0.0 for r in got]
        ax.barh(ys, vals, height=height, label=b)
        for y, v, r in zip(ys, vals, got, strict=True):
            if v == 0.0:
                label = "missing" if r is None else r.status
                ax.text(0.02, y, f"{b}: {label}", va="center", fontsize=6, color="gray")
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_yticks([m_i + 0.4 - height / 2 for m_i in range(len(models))], models, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("speedup over eager (higher is better)")
    if backends:
        ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_distribution_chart(path: Path, rows: list[Result]) -> None:
    """Each compiled backend's speedups over eager, models sorted from worst to best (one line
    per backend, log scale); beside it, where torch.compile ran, each other backend's speedup
    over torch.compile's, sorted the same way. The dashed lines are the regression thresholds."""
    try:
        import matplotlib
    except ImportError:
        log.warning("matplotlib is not installed: no chart written")
        return

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt
    from matplotlib import ticker

    compiled = [b for b in _backends(rows) if b != "eager"]
    others = [b for b in compiled if b != REFERENCE] if REFERENCE in compiled else []
    panels = [("speedup over eager", {b: speedups(rows, b) for b in compiled}, SLOW_VS_EAGER)]
    if others:
        title = f"speedup over {REFERENCE}"
        panels.append((title, {b: versus(rows, b) for b in others}, BEHIND_REFERENCE))
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4), squeeze=False)
    for ax, (label, series, threshold) in zip(axes[0], panels, strict=True):
        for b, values in series.items():
            if not values:
                continue
            ordered = sorted(values.values())
            xs = [100 * (i + 0.5) / len(ordered) for i in range(len(ordered))]
            mean = geomean(ordered) or 0.0
            ax.plot(xs, ordered, marker=".", label=f"{b} (geomean {mean:.2f}x, n={len(ordered)})")
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.axhline(threshold, color="gray", linewidth=0.8, linestyle="--")
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:.2g}x"))
        ax.yaxis.set_minor_formatter(ticker.FuncFormatter(lambda v, _: f"{v:.2g}x"))
        ax.tick_params(axis="y", which="minor", labelsize=7)
        ax.set_xlabel("models, sorted by speedup (percent of models)")
        ax.set_ylabel(f"{label} (higher is better)")
        ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_reports(out: Path, rows: list[Result], meta: dict[str, Any]) -> None:
    """results.csv, summary.md, speedups.png, distribution.png and meta.json under ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    write_csv(out / "results.csv", rows)
    (out / "meta.json").write_text(json.dumps(meta, indent=1))
    (out / "summary.md").write_text(summary_markdown(rows, meta))
    write_chart(out / "speedups.png", rows)
    write_distribution_chart(out / "distribution.png", rows)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="merge benchmark shards into one report")
    parser.add_argument("dirs", nargs="+", type=Path, help="folders with results.csv")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    rows: dict[tuple[str, ...], Result] = {}
    meta: dict[str, Any] = {}
    for d in args.dirs:
        for r in read_csv(d / "results.csv"):
            key = (r.model, r.backend, r.device, r.dtype, r.mode)
            # A re-run of models an earlier run skipped (budget) replaces those rows.
            if key not in rows or r.status != "skipped":
                rows[key] = r
        if (d / "meta.json").exists():
            meta = {**json.loads((d / "meta.json").read_text()), **meta}
    meta.pop("shard", None)
    write_reports(args.out, list(rows.values()), meta)


if __name__ == "__main__":
    main()
