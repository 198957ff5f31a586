"""The kernel module cache, its index, the compile worker, and the launcher's calling convention."""

import json
import subprocess

import torch
from triton_corpus import group, inp, pointwise

from kiln.codegen_triton import TritonBackend, TritonOptions
from kiln.codegen_triton.compile_pool import REPLY_PREFIX, worker_command
from kiln.codegen_triton.module_cache import load_module, module_path, write_module
from kiln.loopir.virtualized import ops


def test_modules_are_written_once_and_indexed(tmp_path):
    text = "import triton\nVALUE = 3\n"
    path = write_module(tmp_path, text, "kernel7")
    assert path == module_path(tmp_path, text) and path.read_text() == text
    assert write_module(tmp_path, text, "kernel7") == path
    index = json.loads((tmp_path / "index.json").read_text())
    assert index[path.stem]["kernel"] == "kernel7"
    assert load_module(path).VALUE == 3
    assert load_module(path) is load_module(path)


def test_same_kernel_source_shares_one_file(tmp_path):
    backend = TritonBackend(TritonOptions(cache_dir=tmp_path))
    x = inp("x", torch.float32, [40])
    out = pointwise("buf0", torch.float32, [40], lambda i: ops.exp(x.make_loader()(i)))
    g = group("kernel0", [x], [(out, "x")], 40)
    first, second = backend.codegen_kernel(g), backend.codegen_kernel(g)
    assert first.source == second.source and first.language == "triton"
    assert len(list((tmp_path / "kernels").glob("*.py"))) == 1
    src, dst = torch.randn(40), torch.empty(40)
    first.fn(src, dst)
    torch.testing.assert_close(dst, src.exp())


def test_a_name_passed_twice_is_one_kernel_argument():
    x = inp("x", torch.float32, [16])
    out = pointwise("buf0", torch.float32, [16], lambda i: ops.neg(x.make_loader()(i)))
    g = group("kernel0", [x], [(out, "x")], 16)
    code = TritonBackend().codegen_kernel(g)
    assert code.fn.positions is None  # distinct names, in order: the call's arguments as they are


def test_compile_worker_reports_errors_as_replies(tmp_path):
    job = json.dumps(
        {
            "path": str(tmp_path / "missing.py"),
            "name": "k",
            "dtypes": [],
            "scalars": [],
            "configs": [],
        }
    )
    out = subprocess.run(
        worker_command(), input=job + "\n", capture_output=True, text=True, timeout=120,
        check=True,
    )  # fmt: skip
    reply = json.loads(
        next(line for line in out.stdout.splitlines() if line.startswith(REPLY_PREFIX))[
            len(REPLY_PREFIX) :
        ]
    )
    assert reply["ok"] is False and "missing" in reply["error"]


def test_a_compile_worker_imports_neither_the_frontend_nor_the_packages_it_does_not_use(tmp_path):
    """A kernel module that reports which Kiln modules its worker had loaded."""
    seen = tmp_path / "seen.json"
    module = tmp_path / "probe.py"
    module.write_text(
        "import json, sys\n"
        f"json.dump(sorted(m for m in sys.modules if m.startswith('kiln')), open({str(seen)!r}, 'w'))\n"
    )
    job = {"path": str(module), "name": "k", "dtypes": [], "scalars": [], "configs": []}
    out = subprocess.run(
        worker_command(), input=json.dumps(job) + "\n", capture_output=True, text=True,
        timeout=120, check=True,
    )  # fmt: skip
    assert REPLY_PREFIX in out.stdout  # answered (no kernel named k: not ok)
    loaded = set(json.loads(seen.read_text()))
    assert "kiln.codegen_triton.module_cache" in loaded
    assert not loaded & {"kiln.graph_cache", "kiln.api", "kiln.autograd_aot", "kiln.guards"}
    assert "kiln.codegen_triton.scheduling" not in loaded and "kiln.capture.tracer" not in loaded


def test_compile_worker_loads_a_built_kernel_and_leaves_its_errors_to_the_parent():
    from kiln.codegen_triton.compile_worker import _load

    class Built:
        loads = 0

        def _init_handles(self):  # Triton's load: builds the launcher on Triton up to 3.6
            Built.loads += 1

    class TooLarge:
        def _init_handles(self):
            raise RuntimeError("out of resource: shared memory")

    _load(Built())
    assert Built.loads == 1
    _load(TooLarge())  # the parent meets the error again where it loads, and handles it there
    _load(object())  # a Triton without the method: nothing to do


def test_damaged_module_file_is_rewritten(tmp_path):
    text = "import triton\nVALUE = 11\n"
    path = write_module(tmp_path, text, "kernel8")
    for damaged in (text[: len(text) // 2], "", "VALUE = 12\n"):
        path.write_text(damaged)
        assert write_module(tmp_path, text, "kernel8") == path
        assert path.read_text() == text
    assert not list(path.parent.glob("*.tmp"))


def test_world_writable_triton_cache_refused(tmp_path):
    import os

    import pytest

    from kiln.loopir.disk_cache import CacheDirWarning

    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    with pytest.warns(CacheDirWarning, match="other users can write"):
        path = write_module(shared, "VALUE = 1\n", "kernel9")
    assert shared not in path.parents and not list(shared.iterdir())
