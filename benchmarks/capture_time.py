"""Capture time: milliseconds kiln.capture spends per 1,000 captured operators.

Only capture is timed: the graph goes to a trivial backend, so nothing is compiled. Each model is
captured ``--repeat`` times (the median is reported); the first capture also pays Python's own
warm-up, so it is reported apart.

Run: ``python benchmarks/capture_time.py`` (with every kiln package importable).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import timm
import torch
import transformers

from kiln.capture import capture


def _bert() -> tuple[torch.nn.Module, tuple[Any, ...]]:
    cfg = transformers.BertConfig(
        hidden_size=64, num_hidden_layers=4, num_attention_heads=2, intermediate_size=128
    )
    return transformers.BertModel(cfg), (torch.randint(0, 100, (2, 16)),)


def _gpt2() -> tuple[torch.nn.Module, tuple[Any, ...]]:
    cfg = transformers.GPT2Config(n_embd=64, n_layer=4, n_head=2)
    return transformers.GPT2Model(cfg), (torch.randint(0, 100, (2, 16)),)


def _timm(name: str) -> Callable[[], tuple[torch.nn.Module, tuple[Any, ...]]]:
    return lambda: (timm.create_model(name, pretrained=False), (torch.randn(1, 3, 224, 224),))


MODELS = {
    "resnet18": _timm("resnet18"),
    "mobilenetv3_small_100": _timm("mobilenetv3_small_100"),
    "vit_tiny_patch16_224": _timm("vit_tiny_patch16_224"),
    "bert (4 layers)": _bert,
    "gpt2 (4 layers)": _gpt2,
}


def capture_once(model: torch.nn.Module, inputs: tuple[Any, ...]) -> tuple[float, int]:
    start = time.perf_counter()
    result = capture(
        model.forward,
        inputs,
        {},
        compile_graph=lambda gm, example_inputs: gm.forward,
        wrap_callable=lambda f: f,
    )
    elapsed = time.perf_counter() - start
    ops = sum(
        1
        for gm in result.graphs
        for n in gm.graph.nodes
        if n.op in ("call_function", "call_method", "call_module")
    )
    return elapsed, ops


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print(f"torch {torch.__version__}; capture only, eval mode")
    print(f"{'model':24} {'ops':>6} {'first s':>8} {'median s':>9} {'ms/1000 ops':>12}")
    for name, make in MODELS.items():
        torch.manual_seed(0)
        model, inputs = make()
        model.eval()
        first, ops = capture_once(model, inputs)
        times = [capture_once(model, inputs)[0] for _ in range(args.repeat)]
        median = statistics.median(times)
        print(f"{name:24} {ops:6d} {first:8.2f} {median:9.2f} {median / ops * 1e6:12.0f}")


if __name__ == "__main__":
    main()
