"""Capture's static op memo kept beside the whole-graph cache (kiln.op_memo_store)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

CHILD = r"""
import json, sys
import torch
import kiln
from kiln.capture.shapes import memo

torch.manual_seed(0)
model = torch.nn.Sequential(
    torch.nn.Linear(16, 32), torch.nn.LayerNorm(32), torch.nn.GELU(), torch.nn.Linear(32, 8),
    torch.nn.Softmax(dim=-1),
)
x = torch.randn(4, 16)
with torch.no_grad():
    expected = model(x)
compiled = kiln.compile(model)
symbolic = "torch.fx.experimental.symbolic_shapes"
before = symbolic in sys.modules
with torch.no_grad():
    got = compiled(x)
imported = None if before else symbolic in sys.modules  # assert_close imports it
torch.testing.assert_close(got, expected)
s = kiln.stats()
print(json.dumps({
    "hits": s.graph_cache_hits, "misses": s.graph_cache_misses, "imported": imported,
    "entries": len(memo.static_entries()),
}))
"""


def _child(tmp_path: Path, cache: Path, **env: str) -> dict[str, object]:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    environ = {**os.environ, "KILN_CACHE_DIR": str(cache), "OMP_NUM_THREADS": "1"}
    for name in ("KILN_GRAPH_CACHE", "KILN_GRAPH_CACHE_DIR"):
        environ.pop(name, None)
    environ.update({"KILN_LOGS": "cache", **env})
    done = subprocess.run(
        [sys.executable, str(script)], env=environ, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    result["log"] = done.stderr[-2000:]
    return result


def test_a_warm_process_runs_no_meta_kernel_an_earlier_one_ran(tmp_path: Path):
    cache = tmp_path / "cache"
    cold = _child(tmp_path, cache)
    assert (cold["hits"], cold["misses"]) == (0, 1)
    kept = list((cache / "graphs" / "ops").glob("memo-*.pkl"))
    assert len(kept) == 1 and kept[0].with_name(kept[0].name + ".sha256").exists()
    warm = _child(tmp_path, cache)
    assert (warm["hits"], warm["misses"]) == (1, 0), warm["log"]
    assert warm["entries"] == cold["entries"] > 0  # every op answered from the kept table
    # the meta kernels' torch._check imports it; with every op answered, nothing does
    assert warm["imported"] in (False, None)
    assert cold["imported"] in (True, None)
    assert list((cache / "graphs" / "ops").glob("memo-*.pkl")) == kept  # nothing new to write


def test_the_graph_cache_switch_turns_it_off(tmp_path: Path):
    cache = tmp_path / "cache"
    _child(tmp_path, cache, KILN_GRAPH_CACHE="0")
    assert not (cache / "graphs" / "ops").exists()


@pytest.fixture
def store(tmp_path, monkeypatch):
    from kiln import op_memo_store
    from kiln.capture.shapes import memo

    monkeypatch.setenv("KILN_GRAPH_CACHE_DIR", str(tmp_path / "graphs"))
    monkeypatch.setattr(op_memo_store, "_state", {"path": None, "size": 0})
    monkeypatch.setattr(memo, "_STATIC", {})
    return op_memo_store, memo


def _fill(memo) -> None:
    a = torch.empty(3, 4, device="meta")
    b = torch.empty(4, 5, device="meta")
    for func, args in ((torch.ops.aten.mm.default, (a, b)), (torch.ops.aten.relu.default, (a,))):
        out, token = memo.recall(func, args, {})
        assert out is None and token is not None
        memo.remember(token, args, {}, func(*args))


def test_entries_round_trip_and_another_stamp_or_a_tampered_file_is_not_read(store, monkeypatch):
    op_memo_store, memo = store
    op_memo_store.load_once()
    _fill(memo)
    op_memo_store.store_if_grown()
    path = op_memo_store._state["path"]
    assert path.exists()
    kept = memo.static_entries()
    assert len(kept) == 2

    def reloaded() -> dict[object, object]:
        monkeypatch.setattr(op_memo_store, "_state", {"path": None, "size": 0})
        monkeypatch.setattr(memo, "_STATIC", {})
        op_memo_store.load_once()
        return memo.static_entries()

    assert reloaded() == kept
    a = torch.empty(3, 4, device="meta")
    made, _ = memo.recall(torch.ops.aten.mm.default, (a, torch.empty(4, 5, device="meta")), {})
    assert (made.shape, made.stride(), made.device.type) == ((3, 5), (5, 1), "meta")
    with monkeypatch.context() as m:  # another torch (or Kiln, or Python): another file
        m.setattr(torch, "__version__", "0.0.0-other")
        assert reloaded() == {}
        assert op_memo_store._state["path"] != path
    path.write_bytes(path.read_bytes()[:-1] + b"\x00")  # fails its sidecar's hash
    assert reloaded() == {}
