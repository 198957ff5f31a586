"""Frozen CPU inference with and without oneDNN weight prepacking, beside eager.

Per model and batch, three columns timed interleaved in one process (each round calls every
column once, starting at another column each round; medians over the rounds): ``eager`` (the
model under ``no_grad``), ``frozen`` (``kiln.compile`` with ``KILN_FREEZING_PREPACK=0``:
batch norm folded, ATen's convolutions and matrix products) and ``prepack`` (the default:
convolutions and linears on weights reordered once for oneDNN, with the op after them fused).
A model is a timm one on 224x224 images, or a HuggingFace transformer of ``benchmarks.models``
(``hf_bert``...) built with base-size layers (width 768, 12 heads, MLP 3072; ``--layers`` of
them) on ``--seq`` tokens, whose linears multiply batch times tokens rows. Both wall time and the process's
CPU time are reported: on a shared machine other processes' load moves wall time far more.
``--no-eager`` leaves eager out of the rounds (its threads then never run between the two
compiled columns). The graph cache is off, so each column compiles its own program.

Run: ``python -m benchmarks.freezing_prepack --models resnet18 hf_bert --batches 1 8``
from the repository root (every kiln package importable, timm installed).
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

import kiln
from benchmarks.models import text
from benchmarks.models.spec import first_tensor


def _compiled(
    model: torch.nn.Module, x: dict[str, torch.Tensor], prepack: bool
) -> Callable[[], torch.Tensor]:
    os.environ["KILN_FREEZING_PREPACK"] = "1" if prepack else "0"  # read when compiling
    # a model of its own: compiled functions of one model share its forward's frame cache, so
    # (after kiln.reset()) the first column would run the program the second compiled
    model = copy.deepcopy(model)
    compiled = kiln.compile(model)
    compiled(**x)
    return lambda: first_tensor(compiled(**x))


def _model(name: str, batch: int, seq: int, layers: int) -> tuple[torch.nn.Module, dict[str, Any]]:
    torch.manual_seed(0)
    if name.startswith("hf_"):
        make, _ = text._MODELS[name]
        size = text.Size(
            hidden=768, layers=layers, heads=12, ffn=3072, vocab=1024, seq=seq, batch=batch
        )
        model = make(size)
        x = {"input_ids": torch.randint(2, size.vocab, (batch, seq))}
    else:
        import timm

        model = timm.create_model(name, pretrained=False)
        x = {"x": torch.randn(batch, 3, 224, 224)}
    return model.eval().requires_grad_(False), x


def run(name: str, batch: int, rounds: int, eager: bool, seq: int = 128, layers: int = 2) -> str:
    model, x = _model(name, batch, seq, layers)
    kiln.reset()
    with torch.no_grad():
        ref = first_tensor(model(**x))
        steps = {"frozen": _compiled(model, x, False), "prepack": _compiled(model, x, True)}
        if eager:
            steps["eager"] = lambda: first_tensor(model(**x))
        errors = {k: float((steps[k]() - ref).norm() / ref.norm()) for k in ("frozen", "prepack")}
        wall: dict[str, list[float]] = {k: [] for k in steps}
        cpu: dict[str, list[float]] = {k: [] for k in steps}
        names = list(steps)
        for r in range(rounds):
            for k in names[r % len(names) :] + names[: r % len(names)]:
                t, c = time.perf_counter(), time.process_time()
                steps[k]()
                wall[k].append(time.perf_counter() - t)
                cpu[k].append(time.process_time() - c)
    parts = [f"{name} b{batch}"]
    for label, times in (("wall", wall), ("cpu", cpu)):
        med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
        cols = " ".join(f"{k} {v:.1f}" for k, v in med.items())
        ratio = f"prepack {med['frozen'] / med['prepack']:.2f}x frozen"
        if eager:
            ratio += f", {med['eager'] / med['prepack']:.2f}x eager"
        parts.append(f"{label} ms: {cols} ({ratio})")
    parts.append(f"rel. error frozen {errors['frozen']:.1e} prepack {errors['prepack']:.1e}")
    return " | ".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["resnet18"])
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 8])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    parser.add_argument("--no-eager", action="store_true")
    parser.add_argument("--seq", type=int, default=128, help="tokens of a transformer's input")
    parser.add_argument("--layers", type=int, default=2, help="a transformer's layers")
    args = parser.parse_args()
    os.environ["KILN_GRAPH_CACHE"] = "0"
    if args.threads:
        torch.set_num_threads(args.threads)
    for batch in args.batches:
        for name in args.models:
            line = run(name, batch, args.rounds, not args.no_eager, args.seq, args.layers)
            print(line, flush=True)


if __name__ == "__main__":
    main()
