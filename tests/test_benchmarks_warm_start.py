"""benchmarks.warm_start: the verdict of its table, and one model's cold and warm first calls
in fresh processes (the warm one loads every graph from the cache)."""

from __future__ import annotations

import argparse
from pathlib import Path

from benchmarks import warm_start


def test_the_table_marks_a_model_met_only_within_both_bounds() -> None:
    rows = [
        {"model": "a", "column": "kiln", "cold_s": 10.0, "warm_s": 1.0},
        {"model": "a", "column": "torch_compile", "cold_s": 20.0, "warm_s": 2.0},
        {"model": "b", "column": "kiln", "cold_s": 10.0, "warm_s": 2.0},  # 20% of cold
        {"model": "c", "column": "kiln", "cold_s": 10.0, "warm_s": 1.0},
        {"model": "c", "column": "torch_compile", "cold_s": 5.0, "warm_s": 0.5},  # faster
    ]
    lines = warm_start.table(rows).splitlines()
    verdicts = {line.split("|")[1].strip(): line.split("|")[7].strip() for line in lines[2:5]}
    assert verdicts == {"a": "yes", "b": "no", "c": "no"}
    assert "1/3 models" in lines[-1]


def test_a_fresh_process_finds_the_first_ones_graphs(tmp_path: Path) -> None:
    args = argparse.Namespace(
        device="cpu", mode="inference", dtype="float32", preset="cpu", repeat=1,
        timeout=300.0, stop_at=None, cache_root=tmp_path,
    )  # fmt: skip
    row = warm_start.measure_pair("debug_tiny", "kiln", args, threads=1)
    assert "reason" not in row, row
    assert row["cold_s"] > 0 and row["warm_s"] > 0
    assert (row["warm_hits"], row["warm_misses"]) == (row["cold_misses"], 0)
    assert row["warm_hits"] >= 1
