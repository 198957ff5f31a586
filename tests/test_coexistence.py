"""Kiln beside other code: torch.compile, torch.jit and plain eager code run as they do without
Kiln, with Kiln imported and after Kiln compiled a module in the same process.

Importing Kiln patches nothing; the first module a check watches installs the patches of
``kiln.guards.stamps``, which touch ``nn.Module.__setattr__``/``__delattr__`` and
``nn.Parameter`` (never ``torch.Tensor``) and act only for the modules and tensors Kiln watches.
The process-level facts are checked in a fresh interpreter (one subprocess for the module).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import kiln
from kiln.guards import stamps

# Run in a fresh interpreter: what import and a first compile change, and torch.compile
# compiling a module that sets attributes in forward before and after Kiln compiled another.
_SCRIPT = textwrap.dedent(
    """
    import importlib, json, sys, warnings
    import torch
    import torch.utils.hooks
    accessor = importlib.import_module("torch.nn.utils._named_member_accessor")
    registration = torch.nn.modules.module
    CLASSES = {
        "Module": torch.nn.Module,
        "Tensor": torch.Tensor,
        "TensorBase": torch._C.TensorBase,
        "Parameter": torch.nn.Parameter,
        "RemovableHandle": torch.utils.hooks.RemovableHandle,
        "UntypedStorage": torch.UntypedStorage,
    }
    FUNCTIONS = {
        "swap_tensors": (torch.utils, "swap_tensors"),
        **{n: (accessor, n) for n in ("set_tensor", "swap_tensor", "swap_submodule")},
    }
    HOOK_DICTS = sorted(n for n in vars(registration) if n.startswith("_global_"))

    def snapshot():
        out = {}
        for name, cls in CLASSES.items():
            for key, value in vars(cls).items():
                out[f"{name}.{key}"] = id(value)
        for name, (where, attr) in FUNCTIONS.items():
            out[name] = id(getattr(where, attr))
        for name in HOOK_DICTS:
            value = getattr(registration, name)
            out[name] = (id(value), len(value) if hasattr(value, "__len__") else None)
        return out

    def differ(a, b):
        return sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))

    fresh = snapshot()
    import kiln
    from kiln.guards import stamps
    report = {"after_import": differ(fresh, snapshot()), "installed": stamps.installed()}

    import torch._dynamo
    from torch._dynamo.testing import CompileCounter
    from torch._dynamo.utils import counters

    class Sets(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)
            self.register_buffer("scale", torch.ones(4))

        def forward(self, x):
            self.batch = x.shape[0]          # plain attributes written in forward
            self.last = x.detach()
            del self.last
            self.lin.seen = True
            grad = self.lin.weight.requires_grad   # parameter attributes read in forward
            y = self.lin(x) * self.scale
            return y * 2 if grad else y

    def run_compiled(counter, module, calls=3):
        compiled = torch.compile(module, backend=counter)
        for _ in range(calls):
            x = torch.randn(3, 4)
            torch.testing.assert_close(compiled(x), module(x))
        return compiled

    before = CompileCounter()
    first = Sets()
    compiled_first = run_compiled(before, first)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 4)
            self.register_buffer("bias2", torch.zeros(4))

        def forward(self, x):
            return torch.relu(self.fc(x)) + self.bias2

    net = Net()
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # no eager fallback
        kc = kiln.compile(net, backend="eager")
        for _ in range(2):
            x = torch.randn(2, 4)
            torch.testing.assert_close(kc(x), net(x))
    report["installed_after_compile"] = stamps.installed()
    report["after_compile"] = differ(fresh, snapshot())

    for _ in range(3):   # the module torch.compile'd before Kiln compiled anything
        x = torch.randn(3, 4)
        torch.testing.assert_close(compiled_first(x), first(x))
    after = CompileCounter()
    run_compiled(after, Sets())   # and one compiled after
    report["frames_before"] = before.frame_count
    report["frames_after"] = after.frame_count
    report["graph_breaks"] = sum(counters["graph_break"].values())

    # unwatched modules and tensors never move the stamp
    stamp = stamps.current()
    m = torch.nn.Linear(2, 2)
    m.x = 1
    del m.x
    m.eval()
    m.register_forward_hook(lambda *a: None).remove()
    m.weight.requires_grad_(False)
    m.weight.data = torch.randn(2, 2)
    m.double()
    t = torch.randn(3)
    t.requires_grad_()
    t.data = torch.randn(5)
    report["unwatched_moved_stamp"] = stamps.current() != stamp
    report["watched_net"] = stamps.watched(net)
    json.dump(report, sys.stdout)
    """
)


@pytest.fixture(scope="module")
def fresh_process() -> dict[str, object]:
    env = dict(os.environ, TORCHDYNAMO_VERBOSE="0")
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr[-4000:]
    report: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return report


def test_import_patches_nothing(fresh_process: dict[str, object]) -> None:
    assert fresh_process["after_import"] == []
    assert fresh_process["installed"] is False


def test_a_first_compile_patches_only_module_setattr_and_parameter(
    fresh_process: dict[str, object],
) -> None:
    assert fresh_process["installed_after_compile"] is True
    changed = fresh_process["after_compile"]
    assert isinstance(changed, list)
    # torch.Tensor, its C base, hooks, registration hooks and functional_call stay torch's
    assert not [k for k in changed if k.startswith(("Tensor.", "TensorBase.", "RemovableHandle."))]
    assert not [k for k in changed if k.startswith("_global_")]
    assert {"Module.__setattr__", "Module.__delattr__"} <= set(changed)
    assert {"Parameter.data", "Parameter.requires_grad", "Parameter.set_"} <= set(changed)
    assert not {"Module._apply", "Module.requires_grad_", "set_tensor"} & set(changed)


def test_torch_compile_compiles_once_beside_kiln(fresh_process: dict[str, object]) -> None:
    assert fresh_process["frames_before"] == 1
    assert fresh_process["frames_after"] == 1
    assert fresh_process["graph_breaks"] == 0


def test_unwatched_modules_and_tensors_never_move_the_stamp(
    fresh_process: dict[str, object],
) -> None:
    assert fresh_process["watched_net"] is True
    assert fresh_process["unwatched_moved_stamp"] is False


class _Small(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)
        self.register_buffer("shift", torch.randn(3))
        self.scale = 2.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.fc(x)) * self.scale + self.shift


def _compiled_by_kiln(m: torch.nn.Module) -> None:
    c = kiln.compile(m, backend="eager")
    for _ in range(2):
        x = torch.randn(2, 4)
        torch.testing.assert_close(c(x), m(x))


@pytest.mark.filterwarnings("ignore:`torch.jit:FutureWarning")
@pytest.mark.parametrize("watched", [False, True])
def test_torch_jit_script_and_trace_agree(watched: bool) -> None:
    kiln.reset()
    _compiled_by_kiln(_Small())  # the patches are in place
    m = _Small()
    if watched:  # a module Kiln compiled: its dicts are watched
        _compiled_by_kiln(m)
        assert stamps.watched(m)
    scripted = torch.jit.script(m)
    traced = torch.jit.trace(m, torch.randn(2, 4))
    for _ in range(3):
        x = torch.randn(5, 4)
        want = m(x)
        torch.testing.assert_close(scripted(x), want)
        torch.testing.assert_close(traced(x), want)
    kiln.reset()


def test_plain_tensors_keep_torchs_descriptors() -> None:
    kiln.reset()
    _compiled_by_kiln(_Small())
    assert stamps.installed()
    base = vars(torch._C.TensorBase)
    for name in ("data", "requires_grad"):
        assert name not in vars(torch.Tensor)
        assert getattr(torch.Tensor, name) is base[name]
    for name in ("set_", "resize_", "t_", "unsqueeze_", "requires_grad_"):
        assert getattr(torch.Tensor, name) is base[name]
    kiln.reset()


def _agree(c: object, m: torch.nn.Module, calls: int = 2) -> None:
    for _ in range(calls):
        x = torch.randn(2, 4)
        torch.testing.assert_close(c(x), m(x))  # type: ignore[operator]


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_hooks_registered_after_a_compile_run() -> None:
    """Hook registrations are seen through the watched module's hook dicts and a per-call
    look at torch's global hook dicts, not through a process-wide patch."""
    kiln.reset()
    m = _Small()
    c = kiln.compile(m, backend="eager")
    _agree(c, m)
    handle = m.fc.register_forward_hook(lambda mod, args, out: out * 3)
    _agree(c, m)
    handle.remove()
    _agree(c, m)
    handle = torch.nn.modules.module.register_module_forward_hook(
        lambda mod, args, out: out + 1 if isinstance(mod, torch.nn.Linear) else out
    )
    try:
        _agree(c, m)
    finally:
        handle.remove()
    _agree(c, m)
    kiln.reset()


def test_buffer_metadata_changed_in_place_is_seen() -> None:
    kiln.reset()
    m = _Small()
    c = kiln.compile(m, backend="eager")
    _agree(c, m)
    m.shift.data = torch.randn(3)  # another storage, the same sizes: the same graph
    _agree(c, m)
    assert kiln.stats().frames_captured == 1
    m.shift.data = torch.randn(1)  # broadcasts: another graph
    _agree(c, m)
    assert kiln.stats().frames_captured == 2
    m.shift.requires_grad_()
    x = torch.randn(2, 4)
    assert c(x).requires_grad and m(x).requires_grad
    assert kiln.stats().frames_captured == 3
    kiln.reset()
