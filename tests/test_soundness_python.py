"""Python-level behaviour through kiln.compile: user hooks, stack introspection, seeding.

Compilation runs where a compiled function is first called, possibly inside the
user's saved-tensor hooks (activation checkpointing); it must neither call those
hooks nor let them see fake tensors. Functions that read the call stack run on the
program's frames.
"""

from __future__ import annotations

import inspect
import warnings

import pytest
import torch
from torch.utils.checkpoint import checkpoint

import kiln


@pytest.fixture(autouse=True)
def _fresh():
    kiln.reset()
    yield
    kiln.reset()


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 16)
        self.fc2 = torch.nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.nn.functional.gelu(self.fc1(x))).sin()


class Checkpointed(torch.nn.Module):
    def __init__(self, reentrant: bool) -> None:
        super().__init__()
        self.block = Block()
        self.head = torch.nn.Linear(8, 4)
        self.reentrant = reentrant

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x * 2
        h = checkpoint(self.block, h, use_reentrant=self.reentrant)
        return self.head(h).relu().sum(-1)


def _grads(model: torch.nn.Module, x: torch.Tensor, fn) -> tuple[torch.Tensor, ...]:
    model.zero_grad(set_to_none=True)
    x = x.detach().requires_grad_(True)
    out = fn(x)
    out.sum().backward()
    assert x.grad is not None
    return (out.detach(), x.grad, *(p.grad for p in model.parameters()))


@pytest.mark.parametrize("reentrant", [False, True])
def test_checkpoint_matches_eager(reentrant: bool) -> None:
    torch.manual_seed(0)
    model = Checkpointed(reentrant)
    compiled = kiln.compile(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback to eager
        for _ in range(3):
            x = torch.randn(5, 8)
            got = _grads(model, x, compiled)
            want = _grads(model, x, model)
            for a, b in zip(got, want, strict=True):
                torch.testing.assert_close(a, b)


def test_compiling_under_saved_tensor_hooks_calls_no_hook() -> None:
    """The hooks see exactly the tensors eager saves, all of them real."""
    model = Block()
    compiled = kiln.compile(model)

    def run(fn, x: torch.Tensor) -> list[torch.Tensor]:
        seen: list[torch.Tensor] = []

        def pack(t: torch.Tensor) -> torch.Tensor:
            seen.append(t)
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            fn(x).sum().backward()
        return seen

    x = torch.randn(4, 8, requires_grad=True)
    packed = run(compiled, x)  # compiles under the hooks
    assert all(type(t) in (torch.Tensor, torch.nn.Parameter) for t in packed)
    assert all(t.device.type != "meta" for t in packed)
    assert len(run(compiled, x)) == len(packed)  # compiled code saves the same on every call
    # compiling again (a new shape) inside the hooks adds no saves of its own
    y = torch.randn(6, 8, requires_grad=True)
    assert len(run(compiled, y)) == len(packed)


def test_inspect_stack_sees_the_program_frames() -> None:
    def fn(x: torch.Tensor) -> tuple[torch.Tensor, str, str]:
        here = inspect.stack()[0]
        frame = inspect.currentframe()
        assert frame is not None
        return x + 1, here.function, frame.f_code.co_filename

    compiled = kiln.compile(fn)
    x = torch.randn(3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = compiled(x)
    want = fn(x)
    torch.testing.assert_close(got[0], want[0])
    assert got[1] == want[1] == "fn"
    # a continuation after a graph break is a function of its own, made from this file's
    assert __file__ in got[2] and want[2] == __file__


def _reseed(seed: int) -> None:
    torch.manual_seed(seed)


@pytest.mark.parametrize("helper", [False, True], ids=["direct", "in_a_helper"])
def test_manual_seed_inside_gives_eager_random_numbers(helper: bool) -> None:
    """After the frame reseeds, its random ops draw what eager draws, and leave the
    generator where eager leaves it."""

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = x.sin()
        if helper:
            _reseed(7)
        else:
            torch.manual_seed(7)
        a = torch.nn.functional.dropout(y, 0.5) + torch.rand_like(y)
        b = torch.empty(3).uniform_() * torch.randn(3)
        return a * 2, b

    compiled = kiln.compile(fn)
    for _ in range(2):
        x = torch.randn(16)
        got = compiled(x)
        after_got = torch.rand(4)
        want = fn(x)
        after_want = torch.rand(4)
        for a, b in zip(got, want, strict=True):
            torch.testing.assert_close(a, b)
        torch.testing.assert_close(after_got, after_want)


class _Interface(dict):
    """A registry of functions read through ``super()``, as transformers' interfaces are."""

    def get_interface(self, name: str, default):
        if name not in self:
            raise KeyError(name)
        return super().get(name, default)


class _Outputs(dict):
    def __getitem__(self, key):
        return super().__getitem__(key)

    def collect(self, key, value):
        super().setdefault(key, []).append(value)


ATTENTION = _Interface(sdpa=torch.nn.functional.scaled_dot_product_attention)


class _Attention(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = torch.nn.Linear(16, 48)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).unflatten(-1, (3, 2, 8)).transpose(1, 3).unbind(2)
        fn = ATTENTION.get_interface("sdpa", None)
        outputs = _Outputs()
        outputs.collect("attn", fn(q, k, v))
        outputs.collect("attn", q)
        return outputs["attn"][0].transpose(1, 2).flatten(2) + len(outputs)


def test_dict_subclass_registry_compiles_without_breaks() -> None:
    model = _Attention()
    x = torch.randn(2, 5, 16)
    explained = kiln.explain(model)(x)
    assert explained.graph_break_count == 0, str(explained)
    compiled = kiln.compile(model)
    for _ in range(2):
        x = torch.randn(2, 5, 16)
        torch.testing.assert_close(compiled(x), model(x))


def test_dict_view_across_a_graph_break() -> None:
    def fn(x: torch.Tensor) -> tuple[int, torch.Tensor]:
        d = {"a": x}
        keys = d.keys()
        y = x + 1
        if y.sum() > 0:  # a graph break: d and keys pass to the continuation
            y = y * 2
        d["b"] = x
        return len(keys), y

    compiled = kiln.compile(fn)
    for _ in range(2):
        x = torch.randn(4)
        assert compiled(x)[0] == fn(x)[0] == 2


def _list_comp(y: torch.Tensor) -> list[int]:
    return [int(v > 0) for v in y.reshape(-1)[:3]]


def _list_comp_mixed(y: torch.Tensor) -> list[int]:
    return [int(v) for v in [1.0, 2.0, y.sum()]]


def _list_comp_item(y: torch.Tensor) -> list[float]:
    return [v.item() * 2 for v in y.reshape(-1)[:3]]


def _set_comp(y: torch.Tensor) -> set[int]:
    return {int(v > 0) + i for i, v in enumerate(y.reshape(-1)[:4])}


def _dict_comp(y: torch.Tensor) -> dict[int, int]:
    return {i: int(v > 0) for i, v in enumerate(y.reshape(-1)[:3])}


def _nested_comp(y: torch.Tensor) -> list[list[int]]:
    return [[int(v > 0) for v in row] for row in y[:2]]


def _comp_then_tensor(y: torch.Tensor) -> tuple[torch.Tensor, list[int]]:
    signs = [int(v > 0) for v in y.reshape(-1)[:3]]
    return y * len(signs) + sum(signs), signs


def _unpacked_into_list(y: torch.Tensor) -> list[object]:
    return [*[1, 2], *(int(v > 0) for v in y[:2, 0]), y.sum()]


@pytest.mark.parametrize(
    "fn",
    [
        _list_comp,
        _list_comp_mixed,
        _list_comp_item,
        _set_comp,
        _dict_comp,
        _nested_comp,
        _comp_then_tensor,
        _unpacked_into_list,
    ],
)
def test_graph_break_inside_a_comprehension_keeps_the_items_built(fn) -> None:
    # Python 3.12 inlines comprehensions: a break inside one passes the container being
    # built to the continuation, whose appends must reach that same container.
    compiled = kiln.compile(fn)
    for _ in range(3):
        y = torch.randn(5, 2)
        got, want = compiled(y), fn(y)
        if isinstance(want, tuple):
            torch.testing.assert_close(got[0], want[0])
            got, want = got[1], want[1]
        if isinstance(want, list) and want and isinstance(want[-1], torch.Tensor):
            torch.testing.assert_close(got[-1], want[-1])
            got, want = got[:-1], want[:-1]
        assert got == want
