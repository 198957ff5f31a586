"""A fixed sample of the model zoo under Kiln: eager's answer, and no more graphs or breaks.

Twenty models from ``benchmarks.zoo`` (timm families and transformers architectures built from
tiny configs, random weights, CPU), each in eval and train mode, compiled with
``kiln.compile(backend="eager")`` and compared with eager over several calls with fresh inputs
(train mode: outputs and every parameter's gradient). The graph, break and eager-frame counts
recorded here are ceilings: capture may improve on them (lower the entry then), never regress.
The full zoo, with torch.compile beside Kiln, is ``nox -s zoo``.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import time
import types
from pathlib import Path
from typing import Any

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

pytest.importorskip("timm")
pytest.importorskip("transformers")

from benchmarks.zoo import hf_zoo, report, runner  # noqa: E402
from benchmarks.zoo.check import check  # noqa: E402
from benchmarks.zoo.spec import Built, InputSpec  # noqa: E402

# model -> mode -> (graphs, graph breaks, frames run eagerly), each at most
CEILINGS: dict[str, dict[str, tuple[int, int, int]]] = {
    "hf:bart": {"eval": (1, 0, 0), "train": (7, 16, 0)},
    "hf:bert": {"eval": (1, 0, 0), "train": (1, 0, 0)},
    "hf:clip": {"eval": (1, 0, 0), "train": (1, 0, 0)},
    "hf:distilbert": {"eval": (1, 0, 0), "train": (1, 0, 0)},
    "hf:gpt2": {"eval": (1, 0, 0), "train": (1, 0, 0)},
    "hf:llama": {"eval": (1, 0, 0), "train": (1, 0, 0)},
    "hf:mistral": {"eval": (1, 0, 0), "train": (1, 0, 0)},
    "hf:t5": {"eval": (1, 0, 0), "train": (1, 0, 0)},
    "hf:vit": {"eval": (1, 0, 0), "train": (1, 0, 0)},
    "hf:whisper": {"eval": (1, 0, 0), "train": (6, 16, 0)},
    "timm:convnext": {"eval": (1, 0, 0), "train": (1, 0, 0)},
    "timm:crossvit": {"eval": (9, 8, 0), "train": (9, 8, 0)},
    "timm:deit": {"eval": (1, 0, 0), "train": (1, 0, 0)},
    "timm:efficientnet": {"eval": (1, 0, 0), "train": (1, 0, 0)},
    "timm:mlp_mixer": {"eval": (1, 0, 0), "train": (1, 0, 0)},
    "timm:mobilenetv3": {"eval": (1, 0, 0), "train": (1, 0, 0)},
    "timm:regnet": {"eval": (1, 0, 0), "train": (1, 0, 0)},
    "timm:resnet": {"eval": (1, 0, 0), "train": (1, 0, 0)},
    "timm:swin_transformer": {"eval": (1, 0, 0), "train": (1, 0, 0)},
    "timm:vision_transformer": {"eval": (1, 0, 0), "train": (1, 0, 0)},
}


@functools.cache
def _built(model_id: str) -> Any:
    return runner.build(model_id)


@pytest.mark.parametrize("mode", ["eval", "train"])
@pytest.mark.parametrize("model_id", sorted(CEILINGS))
def test_zoo_model_matches_eager_within_its_capture_ceiling(model_id: str, mode: str) -> None:
    o = check(_built(model_id), "kiln", mode)
    assert not o.error, o.error
    assert o.matches, f"{model_id} {mode}: worst relative error {o.max_error:g} against eager"
    graphs, breaks, eager_frames = CEILINGS[model_id][mode]
    got = (o.graphs, o.breaks, len(o.gave_up))
    sites = [f"{s['kind']} at {s['where']}" for s in o.sites] + [
        f"gave up on {g['frame']}: {g['kind']}: {g['explanation']}" for g in o.gave_up
    ]
    assert o.graphs <= graphs and o.breaks <= breaks and len(o.gave_up) <= eager_frames, (
        f"{model_id} {mode}: (graphs, breaks, eager frames) {got}, more than "
        f"{(graphs, breaks, eager_frames)}:\n" + "\n".join(sites)
    )


def _slow_build(model_id: str) -> Any:
    if model_id == "x:hangs":
        time.sleep(60)
    if model_id == "x:dies":
        os._exit(3)
    raise ValueError(f"cannot build {model_id}")


def test_runner_records_a_model_that_cannot_be_built_hangs_or_dies(monkeypatch) -> None:
    monkeypatch.setattr(runner, "build", _slow_build)  # the forked children see it too
    rows = runner.run_zoo(["x:fails", "x:hangs", "x:dies"], 3, 5.0, ("kiln",), progress=False)
    by_id = {r["id"]: r for r in rows}
    assert by_id["x:fails"]["status"] == "skipped"
    assert "ValueError: cannot build x:fails" in by_id["x:fails"]["reason"]
    assert by_id["x:hangs"]["reason"] == "timeout while building"
    assert by_id["x:dies"]["reason"] == "crashed (exit 3) while building"


def test_report_counts_one_graph_only_with_no_break_and_eager_results() -> None:
    def outcome(
        compiler: str, mode: str, graphs: int, breaks: int, matches: bool
    ) -> dict[str, Any]:
        o = {"compiler": compiler, "mode": mode, "graphs": graphs, "breaks": breaks}
        sites = [{"kind": "k", "explanation": "why 12", "where": "/x/site-packages/m.py:3 in f"}]
        o.update(matches=matches, sites=sites * breaks, gave_up=[], error="")
        return {**o, "one_graph": matches and graphs == 1 and breaks == 0}

    rows = [
        {"id": f"hf:m{i}", "status": "ok", "variant": "M", "params": 1, "outcomes": outs}
        for i, outs in enumerate(
            [
                [
                    outcome(c, m, 1, 0, True)
                    for c in ("kiln", "torch.compile")
                    for m in ("eval", "train")
                ],
                [outcome("kiln", m, 2, 1, True) for m in ("eval", "train")]
                + [outcome("torch.compile", m, 1, 0, True) for m in ("eval", "train")],
            ]
        )
    ]
    rows.append({"id": "timm:gone", "status": "skipped", "reason": "no", "outcomes": []})
    text = report.render({"kiln": "0"}, rows)
    assert "| **one graph, no break** | 1 | 2 | 1 | 2 |" in text
    assert "| 1 | 1 | 2 | k | why N | hf:m1 (eval) at `m.py:3 in f` |" in text
    assert "| hf:m1 | eval | 2 / 1 ✓ | 1 / 0 ✓ |" in text
    assert "| timm:gone | no |" in text


def test_merge_puts_a_rerun_in_place_and_the_report_names_it(tmp_path: Path) -> None:
    def row(model_id: str, error: str) -> dict[str, Any]:
        o = {"compiler": "kiln", "mode": "eval", "graphs": 1, "breaks": 0, "matches": not error}
        o.update(error=error, one_graph=not error)
        return {"id": model_id, "status": "ok", "outcomes": [o]}

    first = {"kiln": "0", "torch": "2.11", "python": "3.12", "cpus": "16"}
    for name, ids in (("zoo-1of2.json", ["hf:a", "hf:b"]), ("zoo-2of2.json", ["hf:c"])):
        rows = [row(m, "timeout") for m in ids]
        (tmp_path / name).write_text(json.dumps({"meta": first, "rows": rows}, indent=1))
    later = {"kiln": "0", "torch": "2.14", "python": "3.12", "cpus": "2", "command": "python -m z"}
    report.merge(tmp_path, [row("hf:b", ""), row("hf:c", ""), row("hf:new", "")], later)
    meta, rows = report.load(tmp_path)
    assert [(r["id"], r["outcomes"][0]["error"]) for r in rows] == [
        ("hf:a", "timeout"),
        ("hf:b", ""),
        ("hf:c", ""),
        ("hf:new", ""),
    ]
    assert meta["torch"] == "2.11" and meta["reruns"][0]["models"] == ["hf:b", "hf:c", "hf:new"]
    text = report.render(meta, rows)
    assert "Run: kiln 0, torch 2.11, python 3.12; 16 CPUs." in text
    assert "Re-run later and merged in: hf:b, hf:c, hf:new (torch 2.14; 2 CPUs;" in text
    assert "| hf:b (re-run) |" in text and "| hf:a |" in text


def test_builders_shrink_timm_wrapped_configs() -> None:
    wrapper = hf_zoo.tiny_config("timm_wrapper")
    assert wrapper.architecture == "test_resnet"  # its family's smallest variant
    gemma = hf_zoo.tiny_config("gemma3n_vision")  # MobileNet-V5: every variant is large
    assert gemma.architecture == "mobilenetv5_300m_enc" and "block_args" in gemma.model_args


class _Speech(torch.nn.Module):
    """Trains only on given durations and spectrograms, as FastSpeech2-Conformer does."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(99, 8)

    def forward(
        self,
        input_ids: torch.Tensor,
        duration_labels: torch.Tensor | None = None,
        spectrogram_labels: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if self.training and (duration_labels is None or spectrogram_labels is None):
            raise ValueError("All labels must be provided to run in training mode.")
        h = self.embed(input_ids)
        if self.training:
            h = h.repeat_interleave(duration_labels[0], dim=1)
            return (h.mean(-1, keepdim=True) - spectrogram_labels).square().mean()
        return h


def test_train_mode_gets_the_labels_a_forward_requires_in_training() -> None:
    config = types.SimpleNamespace(num_mel_bins=1)
    inputs = {"input_ids": InputSpec("ids", (2, 16), 3, 89)}
    labels = hf_zoo._train_labels(_Speech(), config, inputs)
    assert {n: s.shape for n, s in labels.items()} == {
        "duration_labels": (2, 16),
        "spectrogram_labels": (2, 32, 1),
    }
    built = Built("speech", _Speech().eval(), inputs, "_Speech", train_inputs=labels)
    assert set(built.inputs_for(False)) == {"input_ids"}
    for mode in ("eval", "train"):
        o = check(built, "kiln", mode)
        assert not o.error and o.matches, (mode, o.error)
    assert hf_zoo._train_labels(torch.nn.Embedding(99, 8), config, inputs) == {}
