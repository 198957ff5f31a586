"""The breadth suite: the committed sample is what its rule gives, it is big enough, and its
entries build and run."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

pytest.importorskip("timm")
pytest.importorskip("transformers")

from benchmarks import models  # noqa: E402
from benchmarks.models import breadth, breadth_rule  # noqa: E402

SAMPLE = json.loads(breadth.SAMPLE_FILE.read_text())


def test_the_samples_are_big_enough_and_selected_only_by_name():
    gpu, cpu = models.select(["breadth"]), models.select(["breadth-cpu"])
    assert len(gpu) >= 60 and len(cpu) >= 30
    for sample in (gpu, cpu):
        names = [s.name for s in sample]
        assert len(set(names)) == len(names)
        assert {n.split(".", 1)[0] for n in names} == {"timm", "hf"}
        assert all(s.suite == "breadth" for s in sample)
    assert all(s.suite != "breadth" for s in models.select(None))
    assert models.get("timm.resnet18").name == "timm.resnet18"  # any timm or hf name builds


def test_the_committed_sample_replays_from_the_rule():
    """Steps 1, 2 and 4 of the rule, with the costs the file recorded (step 3 builds every
    walked model: ``python -m benchmarks.models.breadth_rule --check`` does that)."""
    from benchmarks.zoo import report, runner

    _, rows = report.load(breadth_rule.ZOO_RUN)
    ids = breadth_rule.pool(rows, runner.model_ids())
    assert SAMPLE["rule"]["pool"] == len(ids)
    walk = SAMPLE["walk"]
    assert [r["id"] for r in walk] == breadth_rule.order(ids)[: len(walk)]
    assert breadth_rule.order(ids) == breadth_rule.order(ids[::-1])
    taken = {p: dict.fromkeys(breadth_rule.QUOTA[p], 0) for p in breadth_rule.PRESETS}
    for record in walk:
        assert breadth_rule.admit(record, taken) == {p: record[p] for p in breadth_rule.PRESETS}
    assert taken == breadth_rule.QUOTA
    assert SAMPLE["entries"] == [
        {k: r[k] for k in ("name", "id", "gpu", "cpu", "params_m", "gflops")}
        for r in walk
        if r["gpu"] or r["cpu"]
    ]


def _cheapest(source: str) -> str:
    mine = [e for e in SAMPLE["entries"] if e["cpu"] and e["name"].startswith(source + ".")]
    return min(mine, key=lambda e: e["gflops"]["cpu"] * e["params_m"])["name"]


@pytest.mark.parametrize("name", [_cheapest("timm"), _cheapest("hf")])
def test_sampled_entries_build_and_run_at_the_tiny_preset(name):
    spec = models.get(name)
    built = spec.build("tiny")
    with torch.no_grad():
        out = built.model.eval()(*built.args, **built.kwargs)
    assert torch.isfinite(spec.loss_of(out))


def test_a_config_keeps_at_most_the_layer_cap_and_no_dropout():
    config = breadth.hf_config("bert", "gpu")
    assert config.num_hidden_layers == 12 and config.hidden_size == 768
    assert config.hidden_dropout_prob == 0.0 and config.attention_probs_dropout_prob == 0.0
    assert breadth.hf_config("bert", "tiny").num_hidden_layers == 2
    assert [breadth.image_batch(s, "gpu") for s in (224, 256, 384, 512)] == [64, 32, 16, 8]
