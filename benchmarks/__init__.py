"""Kiln's benchmark harness: a model suite and a runner measuring Kiln against eager PyTorch
and torch.compile, model by model (works? how fast? how long to compile? how captured?).

Run ``python -m benchmarks --help`` from the repository root; ``docs/performance.md`` holds the
latest tables and how to reproduce them.
"""
