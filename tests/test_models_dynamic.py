"""The benchmark suite's models under ``dynamic=True``: one capture serves every size.

Each model from ``benchmarks.models`` (eval mode, ``no_grad``) is compiled with
``kiln.compile(model, backend=..., dynamic=True)`` for the backends that run symbolic graphs
(``eager``, ``aot_eager``) and called at three input sizes (batch, sequence length, image size
where the model allows one to change), each call compared with eager. A size change must not
capture again, fall back to eager or warn: the captures counted after the last call are at most
the model's entry in ``CAPTURES`` (one, unless the model breaks its graph).

By default a subset runs (every hand-written model, a few transformers, two timm models on
``aot_eager``) so CI stays within minutes; ``KILN_DYNAMIC_MODELS=all`` runs the whole suite.
A model in ``KNOWN`` is expected to fail (strictly: fixing it makes the test say so).
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import kiln

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import models  # noqa: E402
from benchmarks.models.spec import ModelSpec, first_tensor  # noqa: E402

BACKENDS = ["eager", "aot_eager"]
TOL = {"atol": 1e-4, "rtol": 1e-4}

# Models CI runs; the others are slow to capture (deep convolutional nets) or repeat an
# architecture already covered.
CI_MODELS = {
    *(s.name for s in models.select(["handwritten"])),
    "hf_bert",
    "hf_distilbert",
    "hf_gpt2",
    "hf_t5_encoder",
    "hf_bart",
    "hf_llama",
    "resnet18",
    "vit_tiny_patch16_224",
}

# Captures after three calls, where more than one: graph_break_numpy breaks twice (a numpy
# call, a branch on a tensor), so the module's call, its forward and two continuations are
# captured; the continuations take a float computed from the data, each captured static and
# then once more with the float symbolic.
CAPTURES = {"graph_break_numpy": 6}

# Known to capture more often than they should, and why.
KNOWN: dict[str, str] = {}

# timm models whose patch grid or windows fix the image size: only the batch changes.
_FIXED_IMAGE = ("vit_", "deit_", "swin_")

# Sizes differ from one another within a call (equal sizes would share one symbol, with a guard
# that they stay equal) and are never 0 or 1 (those are specialized).
_ROWS = [(32, 256), (48, 256), (40, 256)]
_IMAGES = [(2, 3, 64, 48), (4, 3, 96, 80), (5, 3, 48, 56)]
_TOKENS = [(2, 32), (3, 24), (4, 40)]


def _cases() -> list[Any]:
    """(model, backend) pairs; in CI, timm models on aot_eager alone (their capture is the
    slow part, and the same for both backends)."""
    everything = os.environ.get("KILN_DYNAMIC_MODELS") == "all"
    cases = []
    for spec in models.select(None):
        for backend in BACKENDS:
            if not everything and (
                spec.name not in CI_MODELS or (spec.suite == "timm" and backend == "eager")
            ):
                continue
            known = KNOWN.get(spec.name)
            marks = [pytest.mark.xfail(reason=known, strict=True)] if known else []
            cases.append(pytest.param(spec.name, backend, marks=marks))
    return cases


def _calls(spec: ModelSpec, vocab: int) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    """Three calls' inputs, each of other sizes."""
    torch.manual_seed(1)
    if spec.suite == "huggingface":
        return [((), {"input_ids": torch.randint(2, vocab, s)}) for s in _TOKENS]
    if spec.suite == "timm":
        if spec.name.startswith(_FIXED_IMAGE):
            shapes = [(b, 3, 224, 224) for b in (2, 4, 5)]
        else:
            shapes = _IMAGES
    elif spec.name == "attention_block":
        shapes = [(2, 32, 256), (3, 48, 256), (4, 40, 256)]
    elif spec.name == "rnn_loop":  # the time steps are a Python loop: only the batch changes
        shapes = [(4, 6, 128), (6, 6, 128), (8, 6, 128)]
    else:
        shapes = _ROWS
    return [((torch.randn(s),), {}) for s in shapes]


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    kiln.reset()
    yield
    kiln.reset()


@pytest.mark.slow
@pytest.mark.parametrize(("name", "backend"), _cases())
def test_model_at_three_sizes_is_captured_once(name: str, backend: str) -> None:
    spec = models.get(name)
    built = spec.build("cpu")
    model = built.model.eval()
    ids = built.kwargs.get("input_ids")
    calls = _calls(spec, int(ids.max()) + 1 if ids is not None else 0)
    compiled = kiln.compile(model, backend=backend, dynamic=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an eager fallback warns
        for args, kwargs in calls:
            with torch.no_grad():
                got, want = compiled(*args, **kwargs), model(*args, **kwargs)
            torch.testing.assert_close(first_tensor(got), first_tensor(want), **TOL)
    stats = kiln.stats()
    assert stats.eager_fallbacks == 0
    assert stats.frames_captured <= CAPTURES.get(name, 1), stats
