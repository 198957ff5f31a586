"""The benchmark harness: suite registry, runner (in process and in a child), report writers."""

from __future__ import annotations

import functools
import math
import sys
import time
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import models, runner  # noqa: E402
from benchmarks.measure import interleaved_medians, relative_error  # noqa: E402
from benchmarks.report import geomean, write_reports  # noqa: E402
from benchmarks.results import Result, read_csv  # noqa: E402
from benchmarks.runner import RunConfig, run_suite  # noqa: E402
from benchmarks.worker import DEVICE_FAULT, TIMING, poisons_device  # noqa: E402


def test_suite_has_the_promised_models():
    suites = [s.suite for s in models.select(None)]
    assert suites.count("timm") >= 12
    assert suites.count("huggingface") >= 10
    assert suites.count("handwritten") >= 6
    assert "debug" not in suites
    assert [s.name for s in models.select(["handwritten", "debug_tiny"])][-1] == "debug_tiny"
    with pytest.raises(KeyError, match="unknown model"):
        models.get("no_such_model")


@pytest.mark.parametrize("spec", models.select(["handwritten"]), ids=lambda s: s.name)
def test_handwritten_models_run_and_train(spec):
    built = spec.build("cpu")
    out = built.model(*built.args, **built.kwargs)
    spec.loss_of(out).backward()
    assert all(p.grad is not None for p in built.model.parameters())


def test_relative_error_and_geomean():
    a = torch.randn(100)
    assert relative_error([a], [a.clone()]) == 0.0
    assert 0 < relative_error([a * 1.01], [a]) < 0.02
    assert relative_error([a], [a[:50]]) == math.inf
    assert relative_error([a, a], [a]) == math.inf
    assert geomean([2.0, 8.0]) == pytest.approx(4.0)
    assert geomean([]) is None


def test_interleaved_medians_rotate_the_order():
    calls: list[str] = []
    steps = {name: functools.partial(calls.append, name) for name in "abc"}
    medians = interleaved_medians(steps, "cpu", iters=4, budget_s=60.0, min_call_s=0.0)
    assert list(medians) == ["a", "b", "c"] and all(t > 0 for t in medians.values())
    assert "".join(calls) == "abc" + "abc" + "bca" + "cab" + "abc"  # one call each to size
    calls.clear()
    interleaved_medians(steps, "cpu", iters=10, budget_s=0.0, min_call_s=0.0)
    assert len(calls) == 3 + 9  # three rounds at least, then the spent budget stops it


def test_short_steps_are_timed_over_back_to_back_calls():
    calls: list[str] = []
    steps = {
        "fast": lambda: calls.append("f"),
        "slow": lambda: (time.sleep(2e-3), calls.append("s")),
    }
    medians = interleaved_medians(steps, "cpu", iters=3, budget_s=60.0, min_call_s=0.01)
    assert medians["slow"] == pytest.approx(2e-3, rel=0.5)
    # the fastest step sets one count for all: 50 calls (the cap) per step and round
    assert calls.count("f") == calls.count("s") == 1 + 3 * 50


@pytest.mark.slow
def test_in_process_run_times_eager_and_kiln(tmp_path):
    import kiln

    backends = ["eager", "kiln", "aot_eager"]
    cfg = RunConfig(backends, tmp_path, warm=False, iters=3, isolate=False)
    rows = run_suite([models.get("debug_tiny")], cfg)
    assert [(r.backend, r.status) for r in rows] == [(b, "ok") for b in backends]
    assert all(r.ms and r.ms > 0 for r in rows)
    assert rows[1].speedup == pytest.approx(rows[0].ms / rows[1].ms)
    # Only aot_eager's compile since its counters were zeroed: the timing compiled nothing again.
    assert kiln.stats().cache_misses == 1


def _fake_children(monkeypatch, script):
    """Replace the child processes with ``script``: per attempt, the backends it is asked for,
    then its events (each a backend's result, a start, or a timing), in flight and failure."""
    asked: list[list[str]] = []

    def attempt(cfg, job, backends, n, workdir, env):
        asked.append(backends)
        events, failure = script[n - 1]
        evs = [e if "event" in e else {"event": "result", "phase": "cold", **e} for e in events]
        in_flight = next((e["backend"] for e in reversed(evs) if e["event"] == "start"), None)
        return evs, in_flight, failure

    monkeypatch.setattr(runner, "_attempt", attempt)
    return asked


def test_a_child_dying_before_timing_is_followed_by_one_that_times_again(tmp_path, monkeypatch):
    ok = {"status": "ok", "rel_error": 0.0}
    script = [
        (
            [
                {"backend": "eager", **ok, "first_call_s": 0.1},
                {"event": "start", "backend": "kiln"},
            ],
            ("crashed", "child exited with code -11"),
        ),
        (
            [
                {"backend": "eager", **ok, "first_call_s": 0.2},
                {"backend": "torch_compile", **ok, "first_call_s": 3.0},
                {"event": "start", "backend": TIMING},
                {"event": "timing", "ms": {"eager": 2.0, "torch_compile": 1.0}},
            ],
            ("crashed", "child exited with code 0"),
        ),
    ]
    asked = _fake_children(monkeypatch, script)
    cfg = RunConfig(["eager", "kiln", "torch_compile"], tmp_path, warm=False)
    eager, kiln, compiled = run_suite([models.get("debug_tiny")], cfg)
    assert asked == [["eager", "kiln", "torch_compile"], ["eager", "torch_compile"]]
    assert (eager.ms, eager.first_call_s, eager.reason) == (2.0, 0.1, "")
    assert kiln.status == "crashed" and "-11" in kiln.reason
    assert compiled.ms == 1.0 and compiled.speedup == 2.0


def test_a_child_dying_while_timing_keeps_its_rows_untimed(tmp_path, monkeypatch):
    ok = {"status": "ok", "rel_error": 0.0, "first_call_s": 1.0}
    events = [{"backend": "eager", **ok}, {"backend": "kiln", **ok}]
    script = [([*events, {"event": "start", "backend": TIMING}], ("timeout", "no result in 5 s"))]
    asked = _fake_children(monkeypatch, script)
    rows = run_suite([models.get("debug_tiny")], RunConfig(["kiln"], tmp_path, warm=False))
    assert len(asked) == 1
    for row in rows:
        assert row.status == "ok" and row.ms is None and row.first_call_s == 1.0
        assert row.reason == "timing did not finish: no result in 5 s"
    assert rows[1].speedup is None and rows[1].compile_s is None
    write_reports(tmp_path, rows, {"device": "cpu"})


def test_a_device_fault_ends_the_child_and_the_others_go_on_in_a_fresh_one(tmp_path, monkeypatch):
    """A CUDA error poisons the child's context: the column after a faulting one would fail
    too, so the child stops there and a fresh one runs (and times) the others."""
    ok = {"status": "ok", "rel_error": 0.0}
    fault = "AcceleratorError: CUDA error: misaligned address"
    script = [
        (
            [
                {"backend": "eager", **ok, "first_call_s": 0.1},
                {"event": "start", "backend": "kiln"},
                {"backend": "kiln", "status": "failed", "reason": fault},
                {"event": DEVICE_FAULT, "backend": "kiln"},
            ],
            ("crashed", "child exited with code 0"),
        ),
        (
            [
                {"backend": "eager", **ok, "first_call_s": 0.2},
                {"backend": "torch_compile", **ok, "first_call_s": 3.0},
                {"event": "start", "backend": TIMING},
                {"event": "timing", "ms": {"eager": 2.0, "torch_compile": 1.0}},
            ],
            ("crashed", "child exited with code 0"),
        ),
    ]
    asked = _fake_children(monkeypatch, script)
    cfg = RunConfig(["eager", "kiln", "torch_compile"], tmp_path, warm=False)
    eager, kiln, compiled = run_suite([models.get("debug_tiny")], cfg)
    assert asked == [["eager", "kiln", "torch_compile"], ["eager", "torch_compile"]]
    assert (eager.ms, eager.reason) == (2.0, "")
    assert (kiln.status, kiln.reason) == ("failed", fault)
    assert compiled.status == "ok" and compiled.speedup == 2.0


def test_cuda_errors_are_told_from_other_failures():
    class AcceleratorError(RuntimeError):
        pass

    assert poisons_device(AcceleratorError("CUDA error: an illegal memory access"))
    assert poisons_device(RuntimeError("CUDA error: misaligned address"))
    assert not poisons_device(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))


def test_runner_records_failures_and_goes_on(tmp_path):
    cfg = RunConfig(["eager"], tmp_path, warm=False, iters=3, isolate=False)
    specs = [models.get("debug_fail"), models.get("debug_tiny")]
    rows = run_suite(specs, cfg)
    by_model = {r.model: r for r in rows}
    assert by_model["debug_fail"].status == "failed"
    assert "on purpose" in by_model["debug_fail"].reason
    tiny = by_model["debug_tiny"]
    assert tiny.status == "ok" and tiny.rel_error == 0.0
    assert tiny.ms > 0 and tiny.speedup == pytest.approx(1.0)
    write_reports(tmp_path, rows, {"device": "cpu"})
    for name in ("results.csv", "summary.md", "speedups.png", "meta.json"):
        assert (tmp_path / name).stat().st_size > 0
    again = read_csv(tmp_path / "results.csv")
    assert [(r.model, r.status, r.ms) for r in again] == [(r.model, r.status, r.ms) for r in rows]
    summary = (tmp_path / "summary.md").read_text()
    assert "debug_fail" in summary.split("## Failures")[1]


def test_training_mode_checks_gradients(tmp_path):
    cfg = RunConfig(["eager"], tmp_path, mode="training", warm=False, iters=3, isolate=False)
    (row,) = run_suite([models.get("debug_tiny")], cfg)
    assert row.status == "ok" and row.rel_error == 0.0


@pytest.mark.slow
def test_checkpointed_bert_trains_in_one_graph_with_its_peak_memory(tmp_path):
    """The suite's hf_bert_checkpointed (transformers' ``gradient_checkpointing_enable()``) in
    training: kiln's step is one graph with no break or fallback, its outputs and gradients
    within the suite's tolerance of eager's, and each column's peak memory is recorded."""
    cfg = RunConfig(
        ["eager", "kiln"], tmp_path, mode="training", warm=False, iters=2, isolate=False
    )
    rows = run_suite([models.get("hf_bert_checkpointed")], cfg)
    assert [(r.backend, r.status) for r in rows] == [("eager", "ok"), ("kiln", "ok")]
    kiln_row = rows[1]
    assert (kiln_row.graphs, kiln_row.graph_breaks, kiln_row.eager_fallbacks) == (1, 0, 0)
    assert kiln_row.recompiles == 0 and kiln_row.rel_error is not None
    assert all(r.peak_mem_mb is not None for r in rows)


@pytest.mark.slow
def test_crash_in_child_is_recorded(tmp_path):
    cfg = RunConfig(["eager"], tmp_path, warm=False, timeout_s=120)
    (row,) = run_suite([models.get("debug_crash")], cfg)
    assert row.status == "crashed"
    assert "code 3" in row.reason


@pytest.mark.slow
def test_hang_in_child_times_out(tmp_path):
    cfg = RunConfig(["eager"], tmp_path, warm=False, timeout_s=2)
    (row,) = run_suite([models.get("debug_hang")], cfg)
    assert row.status == "timeout"


def test_spent_budget_skips_the_rest(tmp_path):
    cfg = RunConfig(["eager", "torch_compile"], tmp_path, budget_s=0, isolate=False)
    rows = run_suite([models.get("debug_tiny")], cfg)
    assert [(r.backend, r.status) for r in rows] == [
        ("eager", "skipped"),
        ("torch_compile", "skipped"),
    ]
    assert "budget" in rows[0].reason


def test_merge_prefers_rows_that_ran(tmp_path):
    from benchmarks.report import main as merge
    from benchmarks.results import Result, write_csv

    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir(), second.mkdir()
    base = ("m", "s", "eager", "cpu", "float32", "inference")
    write_csv(first / "results.csv", [Result(*base, status="skipped")])
    write_csv(second / "results.csv", [Result(*base, status="ok", ms=2.0)])
    merge([str(first), str(second), "--out", str(tmp_path / "merged")])
    (row,) = read_csv(tmp_path / "merged" / "results.csv")
    assert row.status == "ok" and row.ms == 2.0


def test_the_summary_shows_the_distribution_and_the_worst_model(tmp_path):
    rows = []
    for model, kiln, compiled in (("a", 1.0, 2.0), ("b", 4.0, 2.0), ("c", 0.5, 1.0)):
        base = {"model": model, "suite": "breadth", "device": "cpu"}
        base |= {"dtype": "float32", "mode": "inference", "status": "ok", "eager_ms": 1.0}
        rows.append(Result.from_dict({**base, "backend": "eager", "ms": 1.0}))
        rows.append(Result.from_dict({**base, "backend": "kiln", "speedup": kiln}))
        rows.append(Result.from_dict({**base, "backend": "torch_compile", "speedup": compiled}))
    write_reports(tmp_path, rows, {"device": "cpu"})
    summary = (tmp_path / "summary.md").read_text()
    table = summary.split("## Distribution over models")[1].split("## Capture")[0]
    assert "| kiln | 3 | 1.26x | c 0.50x |" in table
    assert "| torch_compile | 3 | 1.59x | c 1.00x |" in table
    assert "| kiln | 3 | 0.79x | a 0.50x |" in table  # against torch.compile; 2 of 3 behind
    assert "2 (67%)" in table
    assert (tmp_path / "distribution.png").stat().st_size > 0


def test_relative_error_floors_tiny_tensors():
    big, tiny = torch.randn(100), torch.randn(100) * 1e-9
    assert relative_error([big, tiny * 2], [big, tiny]) < 1e-6
    assert relative_error([big, big[:100] * 0.5], [big, big]) == pytest.approx(0.5)


def test_float32_training_on_cuda_runs_convolutions_without_tf32():
    from benchmarks.worker import strict_float32

    assert strict_float32("cuda", "float32", "training")
    assert not strict_float32("cuda", "float32", "inference")
    assert not strict_float32("cuda", "bfloat16", "training")
    assert not strict_float32("cpu", "float32", "training")


def test_timm_models_train_without_dropout():
    """Swin's stochastic depth made two eager training steps differ by 0.29."""
    pytest.importorskip("timm")
    built = models.get("swin_tiny_patch4_window7_224").build("cpu")
    model = built.model.train()
    torch.testing.assert_close(model(*built.args), model(*built.args))


def test_an_output_far_from_eager_is_judged_against_float64():
    from benchmarks.worker import Job, Reference, _judge, _prepare

    spec, job = models.get("debug_tiny"), Job("debug_tiny", ["eager"], mode="training")
    reference = Reference(spec, _prepare(spec, job), job)
    # debug_tiny is well conditioned: eager float32 is near float64, an output 1% off is not
    off = [t * 1.01 if t.is_floating_point() else t for t in reference.eager]
    row = {"rel_error": relative_error(off, reference.eager)}
    _judge(row, off, reference, job)
    assert row["status"] == "incorrect" and "against float64" in row["reason"]
    assert row["rel_error_f64"] == pytest.approx(1e-2, rel=1e-3)

    class IllConditioned:  # eager float32 itself 1.5e-2 from float64 (densenet121 training)
        def float64_errors(self, out):
            return 2e-2, 1.5e-2

    row = {"rel_error": 1e-2}
    _judge(row, [], IllConditioned(), job)
    assert row["status"] == "ok" and row["rel_error_f64"] == 2e-2


@pytest.mark.parametrize("nhwc_error", [3.3e-3, None, 1e-5])
def test_a_channels_last_result_is_judged_against_eager_in_channels_last(nhwc_error):
    """mobilenetv3_small training: one ReLU flip, eager's own in channels-last (3.3e-3)."""
    from benchmarks.worker import Job, _judge

    class FlipsInChannelsLast:
        def float64_errors(self, out):
            return 3.3e-3, 7.6e-6

        def channels_last_error(self):
            return nhwc_error

    row = {"rel_error": 3.3e-3}
    _judge(row, [], FlipsInChannelsLast(), Job("m", ["kiln"], mode="training"))
    if nhwc_error == 3.3e-3:
        assert row["status"] == "ok" and "eager in channels-last: 0.0033" in row["reason"]
    else:
        assert row["status"] == "incorrect" and "against float64" in row["reason"]


def test_channels_last_eager_runs_only_for_4d_inputs():
    from benchmarks.worker import Job, Reference, _prepare

    spec, job = models.get("debug_tiny"), Job("debug_tiny", ["eager"], mode="training")
    assert Reference(spec, _prepare(spec, job), job).channels_last_error() is None


def test_distributed_median_table_compares_each_setup_medians():
    from benchmarks.distributed import median_table

    rows = [
        {"setup": s, "compiler": c, "tokens_per_s": t}
        for s, c, t in [
            ("ddp", "eager", 100.0), ("ddp", "kiln", 130.0), ("ddp", "torch_compile", 110.0),
            ("ddp", "eager", 80.0), ("ddp", "kiln", 118.0), ("ddp", "eager", 90.0),
            ("fsdp2", "kiln", 50.0),
        ]
    ]  # fmt: skip
    lines = median_table(rows).splitlines()
    assert lines[2] == "| ddp | eager | 3 | 90 | 80-100 | 1.00 | 0.82 |"
    assert lines[3] == "| ddp | kiln | 2 | 124 | 118-130 | 1.38 | 1.13 |"
    assert lines[5] == "| fsdp2 | kiln | 1 | 50 | 50-50 |  |  |"


def test_distributed_rows_time_the_collector():
    import gc

    from benchmarks.distributed import _collections_timed

    with _collections_timed() as spent:
        gc.collect()
    assert spent[0] > 0
    assert all(getattr(cb, "__name__", "") != "note" for cb in gc.callbacks)
