"""The rule that draws the breadth suite from the model zoo, and the command that applies it.

``python -m benchmarks.models.breadth_rule`` writes ``breadth_sample.json`` (the suite the
runner reads); ``--check`` applies the rule again and says whether the file still matches it.

1. **Pool.** The zoo's model ids (``timm:<family>`` for every timm family, ``hf:<model type>``
   for every transformers architecture: ``benchmarks.zoo.runner.model_ids()``) that the zoo's
   committed run (``ZOO_RUN``) built and ran in eager; those it skipped are left out.
   Transformers architectures count only where that run fed them token ids (with decoder ids
   for an encoder-decoder) or pixel values alone: audio models and models that need text and
   images together are left out, as are those that train only with labels given (the zoo
   passed them training inputs). Architectures sharing a modeling module (``aimv2`` and
   ``aimv2_vision_model``) count once: the type named like the module, else the first by name.
2. **Order.** The pool sorted by id, then shuffled by ``random.Random(SEED)``.
3. **Walk.** Each id in that order becomes an entry (:mod:`benchmarks.models.breadth`):
   ``hf.<model type>``, or ``timm.<variant>`` with the family's smallest variant other than
   timm's ``test_*`` toys (the zoo's ranking by name, then the fewest parameters among the
   first four, as ``timm_zoo.smallest`` does). The entry is built on the CPU at each preset's
   size and one sample of its inputs (batch 1) runs forward under ``FlopCounterMode``: its cost
   at that preset is those GFLOPs and its parameter count. An entry that fails to build or to
   run is left out, with why.
4. **Admit.** An entry joins a preset's sample (``gpu``: the ``breadth`` suite; ``cpu``:
   ``breadth-cpu``) while that sample holds fewer than ``QUOTA[preset][source]`` entries of
   its source (timm or hf) and its cost is within ``BOUND[preset]``. The walk stops once every
   quota is full.

The file records each walked id with its entry, costs and why it was left out, so the test
replays steps 2 and 4 without building a model.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from benchmarks.models import breadth

__all__ = ["BOUND", "QUOTA", "SEED", "ZOO_RUN", "admit", "derive", "main", "order", "pool"]

ROOT = Path(__file__).resolve().parents[2]
ZOO_RUN = ROOT / "benchmarks" / "results" / "0.1.0" / "zoo"
SEED = 36
QUOTA = {"gpu": {"timm": 32, "hf": 32}, "cpu": {"timm": 16, "hf": 16}}
# Largest forward GFLOPs per sample and millions of parameters per preset.
BOUND = {"gpu": {"gflops": 100.0, "params_m": 250.0}, "cpu": {"gflops": 25.0, "params_m": 120.0}}
PRESETS = ("gpu", "cpu")
_HF_INPUTS = ({"input_ids"}, {"pixel_values"}, {"input_ids", "decoder_input_ids"})
_CANDIDATES = 4


def pool(zoo_rows: Iterable[dict[str, Any]], ids: Iterable[str]) -> list[str]:
    """Step 1: the zoo ids the sample is drawn from, sorted."""
    from transformers.models.auto.configuration_auto import model_type_to_module_name

    ran = {r["id"]: r for r in zoo_rows if r["status"] == "ok"}
    chosen: dict[str, str] = {}  # timm family or transformers module -> id
    for model_id in sorted(ids):
        row = ran.get(model_id)
        if row is None:
            continue
        source, name = model_id.split(":", 1)
        if source == "timm":
            chosen[model_id] = model_id
            continue
        if set(row.get("inputs", {})) not in _HF_INPUTS or row.get("train_inputs"):
            continue
        module = model_type_to_module_name(name)
        if module not in chosen or name == module:
            chosen[module] = model_id
    return sorted(chosen.values())


def order(ids: list[str], seed: int = SEED) -> list[str]:
    """Step 2: the pool in the order the walk takes it."""
    shuffled = sorted(ids)
    random.Random(seed).shuffle(shuffled)
    return shuffled


def admit(record: dict[str, Any], taken: dict[str, dict[str, int]]) -> dict[str, bool]:
    """Step 4: the presets whose samples ``record`` (a walked entry) joins; counts it in
    ``taken`` (preset -> source -> entries so far)."""
    source = record["id"].split(":", 1)[0]
    joins: dict[str, bool] = {}
    for preset in PRESETS:
        gflops = (record.get("gflops") or {}).get(preset)
        bound = BOUND[preset]
        room = taken[preset][source] < QUOTA[preset][source]
        params = record.get("params_m")
        fits = gflops is not None and gflops <= bound["gflops"]
        fits = fits and params is not None and params <= bound["params_m"]
        joins[preset] = room and fits
        taken[preset][source] += joins[preset]
    return joins


def _full(taken: dict[str, dict[str, int]]) -> bool:
    return all(taken[p][s] >= QUOTA[p][s] for p in PRESETS for s in QUOTA[p])


def representative(family: str) -> str:
    """Step 3 for timm: the family's smallest variant that is not one of timm's test toys."""
    import timm

    from benchmarks.zoo.timm_zoo import _rank

    names = [n for n in timm.list_models(module=family) if not n.startswith("test_")]
    names = sorted(names, key=_rank)[:_CANDIDATES]
    sizes: dict[str, int] = {}
    for name in names:
        try:
            with torch.device("meta"):
                model = timm.create_model(name, pretrained=False)
            sizes[name] = sum(p.numel() for p in model.parameters())
        except Exception:  # judged by its name alone
            continue
    return min(sizes, key=lambda n: (sizes[n], names.index(n))) if sizes else names[0]


def _one_sample(x: Any) -> Any:
    return x[:1] if isinstance(x, torch.Tensor) and x.dim() > 0 else x


def measure(name: str, presets: list[str]) -> dict[str, Any]:
    """Step 3: parameters and forward GFLOPs per sample at each preset, or why it failed.

    Parameters are counted on the meta device first: a model over every preset's parameter
    bound is not built for real (a default config can hold billions). A timm model sees the
    same images at every preset, so it runs once.
    """
    from torch.utils.flop_counter import FlopCounterMode

    out: dict[str, Any] = {"gflops": {}}
    try:
        with torch.device("meta"):
            meta = breadth.build(name, presets[0]).model
        out["params_m"] = round(sum(p.numel() for p in meta.parameters()) / 1e6, 2)
    except Exception:  # a constructor that reads a value (``.item()``): counted when built
        out["params_m"] = 0.0
    if out["params_m"] > max(BOUND[p]["params_m"] for p in presets):
        out["why"] = "over the parameter bound"
        return out
    timm = name.startswith("timm.")  # the same images at every preset: measured once
    model: torch.nn.Module | None = None
    for preset in presets[:1] if timm else presets:
        try:
            built = breadth.build(name, preset) if model is None else breadth.inputs(model, preset)
            model = built.model.eval()
            args = tuple(map(_one_sample, built.args))
            kwargs = {k: _one_sample(v) for k, v in built.kwargs.items()}
            counter = FlopCounterMode(display=False)
            with torch.no_grad(), counter:
                model(*args, **kwargs)
        except Exception as e:
            out["why"] = f"{preset}: {type(e).__name__}: {' '.join(str(e).split())[:200]}"
            break
        out["params_m"] = round(sum(p.numel() for p in model.parameters()) / 1e6, 2)
        out["gflops"][preset] = round(counter.get_total_flops() / 1e9, 2)
    if timm and presets[0] in out["gflops"]:
        out["gflops"] = dict.fromkeys(presets, out["gflops"][presets[0]])
    return out


def _entry_name(model_id: str) -> str:
    source, name = model_id.split(":", 1)
    return f"hf.{name}" if source == "hf" else f"timm.{representative(name)}"


def derive(progress: bool = True) -> dict[str, Any]:
    """Apply the rule: the walk's records, the sample, and what the rule depended on."""
    import timm
    import transformers

    from benchmarks.zoo import report, runner

    zoo_meta, zoo_rows = report.load(ZOO_RUN)
    ids = pool(zoo_rows, runner.model_ids())
    taken = {p: dict.fromkeys(QUOTA[p], 0) for p in PRESETS}
    walk: list[dict[str, Any]] = []
    for model_id in order(ids):
        if _full(taken):
            break
        began = time.monotonic()
        source = model_id.split(":", 1)[0]
        open_presets = [p for p in PRESETS if taken[p][source] < QUOTA[p][source]]
        record: dict[str, Any] = {"id": model_id, "name": "", "gflops": {}, "params_m": None}
        if not open_presets:
            record["why"] = f"the {source} samples are full"
        else:
            try:
                record["name"] = _entry_name(model_id)
            except Exception as e:
                record["why"] = f"no variant: {type(e).__name__}: {e}"[:200]
        if record["name"]:
            record |= measure(record["name"], open_presets)
        record |= admit(record, taken)
        if not (record["gpu"] or record["cpu"] or "why" in record):
            record["why"] = "over the cost bound"
        walk.append(record)
        if progress:
            print(
                f"{len(walk):3} {model_id:40} {record['name']:45} gpu={record['gpu']:d} "
                f"cpu={record['cpu']:d} {time.monotonic() - began:5.1f}s {record.get('why', '')}",
                file=sys.stderr,
                flush=True,
            )
    return {
        "rule": {
            "seed": SEED,
            "quota": QUOTA,
            "bound": BOUND,
            "zoo_run": str(ZOO_RUN.relative_to(ROOT)),
            "pool": len(ids),
            "timm": timm.__version__,
            "transformers": transformers.__version__,
            "zoo_versions": {k: zoo_meta.get(k) for k in ("timm", "transformers", "torch")},
        },
        "entries": [
            {k: r[k] for k in ("name", "id", "gpu", "cpu", "params_m", "gflops")}
            for r in walk
            if r["gpu"] or r["cpu"]
        ],
        "walk": walk,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.models.breadth_rule", description=__doc__
    )
    p.add_argument("--check", action="store_true", help="compare with the file, write nothing")
    p.add_argument("--out", type=Path, default=breadth.SAMPLE_FILE)
    args = p.parse_args(argv)
    got = derive()
    if args.check:
        held = json.loads(args.out.read_text())
        same = [e["name"] for e in held["entries"]] == [e["name"] for e in got["entries"]]
        print("the sample matches the rule" if same else "the sample differs from the rule")
        return 0 if same else 1
    args.out.write_text(json.dumps(got, indent=1) + "\n")
    n = {p: sum(e[p] for e in got["entries"]) for p in PRESETS}
    print(f"wrote {args.out}: {n['gpu']} GPU entries, {n['cpu']} CPU entries")
    return 0


if __name__ == "__main__":
    sys.exit(main())
