"""Composite ops called at the torch level on fakes with symbolic sizes, as capture calls them.

A C++ composite kernel may read a fake's sizes as integers (torch 2.11's ``matmul`` inside
CUDA-device attention sends ``aten.size.default`` to the fake). Capture turns torch's Python
dispatcher on around such a call so the Python kernel keeps the sizes symbolic; a size query
that still reaches the fake is answered from its symbolic sizes, and reading one as an
integer specializes it with a guard, never silently.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kiln.capture.meta import FakeTensor
from kiln.capture.shapes import ShapeEnv, expr_of, symbolic_meta
from kiln.capture.shapes.dispatch import composites_in_python
from kiln.capture.source import LocalSource


def _fake(env: ShapeEnv, shape: tuple[int, ...], name: str, device: str) -> FakeTensor:
    meta = symbolic_meta(torch.empty(*shape), LocalSource(name), env)
    return FakeTensor(meta, torch.device(device))


def _attention_inputs(env: ShapeEnv, device: str, n: int = 17) -> list[FakeTensor]:
    return [
        *(_fake(env, (2, 2, n, 32), name, device) for name in "qkv"),
        _fake(env, (2, 1, n, n), "mask", device),
    ]


def test_attention_on_cuda_fakes_keeps_the_sequence_length_symbolic() -> None:
    for device in ("cpu", "cuda"):
        env = ShapeEnv()
        q, k, v, mask = _attention_inputs(env, device)
        with composites_in_python([q, k, v], {"attn_mask": mask}):
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        assert out.device.type == device
        assert tuple(out.shape[:2]) == (2, 2) and out.shape[3] == 32
        length = expr_of(out.shape[2])
        assert length.free_symbols, f"{device}: the length was specialized to {length}"
        assert not any("17" in str(g.expr) for g in env.guards), env.guards


def test_matmul_of_symbolic_fakes_stays_symbolic() -> None:
    env = ShapeEnv()
    a = _fake(env, (3, 5, 7), "a", "cuda")
    b = _fake(env, (7, 4), "b", "cuda")
    with composites_in_python([a, b], {}):
        out = torch.matmul(a, b)
    assert all(expr_of(s).free_symbols for s in out.shape)


def test_a_size_query_reaching_a_fake_is_answered_from_its_symbols() -> None:
    env = ShapeEnv()
    x = _fake(env, (4, 6), "x", "cpu")
    assert list(torch.ops.aten.size.default(x)) == list(x.shape)
    assert torch.ops.aten.stride.default(x) == list(x.stride())
    assert torch.ops.aten.sym_numel.default(x) == x.numel()


def test_plain_calls_do_not_turn_the_python_dispatcher_on() -> None:
    x = torch.empty(3, 4)
    with composites_in_python([x], {}) as ctx:
        assert ctx is None
