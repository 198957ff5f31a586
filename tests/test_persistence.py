"""Persistence: compiled modules and functions pickle by value of their originals."""

from __future__ import annotations

import copy
import io
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import kiln


@pytest.fixture(autouse=True)
def _fresh():
    kiln.reset()
    yield
    kiln.reset()


def _model() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Linear(6, 8), torch.nn.LayerNorm(8), torch.nn.GELU(), torch.nn.Linear(8, 3)
    )


def _agree(compiled, eager, calls: int = 3) -> None:
    for n in range(2, 2 + calls):
        x = torch.randn(n, 6)
        with torch.no_grad():
            torch.testing.assert_close(compiled(x), eager(x))


@kiln.compile
def decorated(x):
    return torch.sin(x) * 2 + x


def plain(x):
    return torch.cos(x) - x


def _roundtrips():
    def with_torch_save(obj):
        buf = io.BytesIO()
        torch.save(obj, buf)
        buf.seek(0)
        return torch.load(buf, weights_only=False)

    return {
        "pickle": lambda obj: pickle.loads(pickle.dumps(obj)),
        "torch.save": with_torch_save,
        "deepcopy": copy.deepcopy,
    }


@pytest.mark.parametrize("how", sorted(_roundtrips()))
def test_compiled_module_roundtrips_and_recompiles(how):
    model = _model()
    compiled = kiln.compile(model, options={"recompile_limit": 4})
    _agree(compiled, model)
    loaded = _roundtrips()[how](compiled)
    assert isinstance(loaded, kiln.OptimizedModule)
    assert loaded._orig_mod is not model  # by value, not a reference to this process's model
    assert loaded._kiln_call._config == compiled._kiln_call._config
    assert loaded._kiln_call._backend is compiled._kiln_call._backend
    for a, b in zip(loaded.state_dict().values(), model.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b)
    captured = kiln.stats().frames_captured
    _agree(loaded, model)
    assert kiln.stats().frames_captured > captured  # compiled again, lazily, on its first call
    assert kiln.stats().eager_fallbacks == 0


@pytest.mark.parametrize("how", sorted(_roundtrips()))
def test_compiled_functions_roundtrip(how):
    x = torch.randn(5)
    loaded = _roundtrips()[how](decorated)
    assert loaded is decorated  # the module's own name for it, as for a plain function
    torch.testing.assert_close(loaded(x), torch.sin(x) * 2 + x)
    compiled = kiln.compile(plain, backend="aot_eager")
    loaded = _roundtrips()[how](compiled)
    assert isinstance(loaded, kiln.CompiledFunction)
    assert loaded.original is plain
    torch.testing.assert_close(loaded(x), plain(x))
    assert kiln.stats().eager_fallbacks == 0


def test_user_backend_pickles_by_reference():
    compiled = kiln.compile(_model(), backend=kiln.backends.eager)
    loaded = pickle.loads(pickle.dumps(compiled))
    assert loaded._kiln_call._backend is kiln.backends.eager


def test_trained_module_loads_in_a_fresh_process(tmp_path: Path):
    model = _model()
    compiled = kiln.compile(model)
    opt = torch.optim.SGD(compiled.parameters(), lr=0.1)
    for _ in range(2):
        compiled(torch.randn(4, 6)).square().sum().backward()
        opt.step()
        opt.zero_grad()
    x = torch.randn(3, 6)
    path = tmp_path / "model.pt"
    torch.save({"model": compiled, "x": x, "expected": model(x).detach()}, path)
    child = f"""
import torch, kiln
saved = torch.load({str(path)!r}, weights_only=False)
with torch.no_grad():
    torch.testing.assert_close(saved["model"](saved["x"]), saved["expected"])
assert isinstance(saved["model"], kiln.OptimizedModule)
assert kiln.stats().frames_captured == 1 and kiln.stats().eager_fallbacks == 0
"""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", child], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]


# --- the whole-graph cache -------------------------------------------------------------------

CHILD = r"""
import json, sys, torch, kiln
from kiln import graph_cache
from kiln.capture import counters
from kiln.loopir.decompositions import _table
codegen = [0]  # fx's Python code written for a graph (a GraphModule's recompile)
_python_code = torch.fx.Graph.python_code
def _counted(self, *args, **kwargs):
    codegen[0] += 1
    return _python_code(self, *args, **kwargs)
torch.fx.Graph.python_code = _counted
# Kiln's sources change while this checkout is edited; the key's other parts are under test
graph_cache._kiln_sources = lambda: "pinned"
torch.manual_seed(0)
model = torch.nn.Sequential(
    torch.nn.Linear(6, 8), torch.nn.LayerNorm(8), torch.nn.GELU(), torch.nn.Linear(8, 3)
)
reference = [p.detach().clone() for p in model.parameters()]
if sys.argv[1:] == ["load"]:
    kiln.load_cache(sys.argv[0] + ".kc")
compiled = kiln.compile(model)
f = kiln.compile(lambda x, y: torch.softmax(x @ y, dim=-1).sum(0) * 2)
# compiled once for every size (sizes as arguments): stored and loaded as the others
sym = kiln.compile(lambda x: (x.cos() * x.shape[0]).cumsum(0), dynamic=True,
                   options={"dynamic_kernels": True})
for n in (5, 9, 3):
    x = torch.randn(n, 2)
    torch.testing.assert_close(sym(x), (x.cos() * n).cumsum(0))
for n in (4, 4, 4):
    x = torch.randn(n, 6)
    out = compiled(x)
    torch.testing.assert_close(out, model(x))
    out.square().sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model(x).square().sum().backward()
    for a, p in zip(grads, model.parameters()):
        torch.testing.assert_close(a, p.grad)
    model.zero_grad()
    a, b = torch.randn(3, 5), torch.randn(5, 2)
    torch.testing.assert_close(f(a, b), torch.softmax(a @ b, dim=-1).sum(0) * 2)
if sys.argv[1:] == ["save"]:
    kiln.save_cache(sys.argv[0] + ".kc")
s = kiln.stats()
print(json.dumps({
    "hits": s.graph_cache_hits, "misses": s.graph_cache_misses,
    "fallbacks": s.eager_fallbacks, "kernels": s.kernels,
    "cpp": counters.snapshot().get("codegen_cpp", {}),
    "decompositions": _table.cache_info().currsize, "fx_codegen": codegen[0],
}))
"""


def _child(tmp_path: Path, cache: Path, *args: str, **env: str) -> dict[str, object]:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    environ = {**os.environ, "KILN_CACHE_DIR": str(cache), "OMP_NUM_THREADS": "1"}
    for name in ("KILN_GRAPH_CACHE", "KILN_GRAPH_CACHE_DIR"):  # the default: on, in the root
        environ.pop(name, None)
    environ.update({"KILN_LOGS": "cache", **env})
    result = _last_json_line([sys.executable, str(script), *args], environ)
    assert result["fallbacks"] == 0
    return result


def _last_json_line(argv: list[str], env: dict[str, str]) -> dict[str, Any]:
    """What a child process printed as JSON on its last line, and its stderr as ``log``."""
    done = subprocess.run(argv, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    result["log"] = done.stderr
    return result


def test_a_fresh_process_loads_every_graph_and_compiles_nothing(tmp_path: Path):
    cold = _child(tmp_path, tmp_path / "cache")
    assert (cold["hits"], cold["misses"]) == (0, 3)
    assert cold["kernels"]
    warm = _child(tmp_path, tmp_path / "cache")  # the cache is on by default
    assert (warm["hits"], warm["misses"]) == (3, 0), warm["log"]
    assert warm["kernels"] == {}  # no graph lowered, no kernel generated
    assert warm["decompositions"] == 0  # nothing traced: the table is never built
    # nor the captured graphs' Python code written: a loaded program never runs them
    assert cold["fx_codegen"] and warm["fx_codegen"] == 0
    assert "libraries_built" not in warm["cpp"]
    assert warm["cpp"]["libraries_cached"] >= 1
    off = _child(tmp_path, tmp_path / "cache", KILN_GRAPH_CACHE="0")
    assert (off["hits"], off["misses"]) == (0, 0)


def test_a_saved_cache_file_warms_an_empty_cache(tmp_path: Path):
    _child(tmp_path, tmp_path / "first", "save")
    assert (tmp_path / "child.py.kc").stat().st_size > 0
    loaded = _child(tmp_path, tmp_path / "empty", "load")
    assert (loaded["hits"], loaded["misses"]) == (3, 0), loaded["log"]
    assert loaded["kernels"] == {}
    assert "libraries_built" not in loaded["cpp"]


@pytest.mark.parametrize(
    "member", ["graphs/../x.graph", "cpp/a/b.so", "triton/.x/y", "triton/a/b/c", "triton/a", "x/y"]
)
def test_a_cache_file_member_outside_its_folder_is_refused(tmp_path: Path, member: str):
    import hashlib
    import zipfile

    path = tmp_path / "bad.kc"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(member, b"data")
        entry = {"name": member, "sha256": hashlib.sha256(b"data").hexdigest()}
        archive.writestr("manifest.json", json.dumps({"format": 1, "files": [entry]}))
    with pytest.raises(ValueError, match="unexpected member"):
        kiln.load_cache(path)


@pytest.fixture
def graph_cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("KILN_GRAPH_CACHE", raising=False)  # on by default
    monkeypatch.delenv("KILN_GRAPH_CACHE_DIR")  # the conftest's: the default place instead
    return tmp_path / "graphs"


def _body(x, w):
    return torch.relu(x @ w) + x.sum()


def _compile_once(caplog, options=None, fn=_body, x=None, dynamic=None):
    kiln.reset()
    compiled = kiln.compile(fn, options=options, dynamic=dynamic)
    x = torch.randn(4, 4) if x is None else x
    w = torch.randn(4, 4, dtype=x.dtype)
    with caplog.at_level("INFO", logger="kiln.frontend.cache"):
        caplog.clear()
        got, expected = compiled(x, w), fn(x, w)
        # under autocast the fused kernel rounds to bfloat16 once where eager rounds twice
        loose = expected.dtype in (torch.bfloat16, torch.float16)
        torch.testing.assert_close(got, expected, **({"atol": 0.1, "rtol": 0.02} if loose else {}))
    s = kiln.stats()
    return (s.graph_cache_hits, s.graph_cache_misses), caplog.text


def test_changed_options_versions_or_graphs_miss(graph_cache_dir, caplog, monkeypatch):
    assert _compile_once(caplog)[0] == (0, 1)
    assert _compile_once(caplog)[0] == (1, 0)
    counts, why = _compile_once(caplog, {"cpp.simd": False})
    assert counts == (0, 1)
    assert "differs in: options" in why
    with monkeypatch.context() as m:
        m.setattr(torch, "__version__", "0.0.0+other")
        counts, why = _compile_once(caplog)
        assert counts == (0, 1)
        assert "differs in: versions" in why
    counts, why = _compile_once(caplog, fn=lambda x, w: torch.relu(x @ w) - x.sum())
    assert counts == (0, 1)
    assert "no entry for this graph" in why
    assert _compile_once(caplog)[0] == (1, 0)


def test_changed_inputs_or_process_state_miss(graph_cache_dir, caplog):
    assert _compile_once(caplog)[0] == (0, 1)
    changed = {
        "strides": torch.randn(4, 4).t(),
        "dtype": torch.randn(4, 4, dtype=torch.float64),
        "requires_grad": torch.randn(4, 4, requires_grad=True),
    }
    for what, x in changed.items():
        counts, why = _compile_once(caplog, x=x.to(torch.float32) if what == "strides" else x)
        assert counts == (0, 1), what  # the placeholders' metadata differ too: the graph
    with torch.no_grad():
        counts, why = _compile_once(caplog)
    assert counts == (0, 1)
    assert "differs in: settings" in why
    with torch.autocast("cpu", dtype=torch.bfloat16):
        kiln.reset()
        assert _compile_once(caplog)[0] == (0, 1)
    assert _compile_once(caplog)[0] == (1, 0)


def test_an_entry_that_fails_to_load_falls_back_to_compiling(graph_cache_dir, caplog):
    from kiln.loopir import disk_cache

    assert _compile_once(caplog)[0] == (0, 1)
    (entry,) = graph_cache_dir.glob("*.graph")
    staged = graph_cache_dir / "staged"
    staged.write_bytes(b"not a program")  # vouched for by its sidecar, but not a program
    disk_cache.seal(staged, entry)
    counts, why = _compile_once(caplog)
    assert counts == (0, 1)
    assert "its entry failed to load" in why
    assert kiln.stats().eager_fallbacks == 0
    assert _compile_once(caplog)[0] == (1, 0)


def test_an_unusable_folder_compiles_without_the_cache(tmp_path, monkeypatch, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("KILN_GRAPH_CACHE_DIR", str(blocker / "graphs"))  # under a file
    with pytest.warns(RuntimeWarning, match="not using the cache folder"):
        counts, _ = _compile_once(caplog)
    assert kiln.stats().eager_fallbacks == 0


def test_a_symbolic_program_is_stored_and_serves_every_size(graph_cache_dir, caplog):
    def body(x, w):
        return torch.relu(x @ w).softmax(-1) + x.sum(0)

    options = {"dynamic_kernels": True}
    first = torch.randn(5, 4)  # 4 would share its symbol with w's sizes (duck sizing)
    assert _compile_once(caplog, options, body, x=first, dynamic=True)[0] == (0, 1)
    kiln.reset()
    compiled = kiln.compile(body, options=options, dynamic=True)
    for n in (5, 7, 2, 9):
        x, w = torch.randn(n, 4), torch.randn(4, 4)
        torch.testing.assert_close(compiled(x, w), body(x, w))
    s = kiln.stats()
    assert (s.graph_cache_hits, s.graph_cache_misses) == (1, 0)
    assert s.kernels == {}  # the loaded program serves every size: nothing generated


def test_a_corrupt_entry_misses_and_is_replaced(graph_cache_dir, caplog):
    assert _compile_once(caplog)[0] == (0, 1)
    (entry,) = graph_cache_dir.glob("*.graph")
    entry.write_bytes(entry.read_bytes()[:-10])
    counts, why = _compile_once(caplog)
    assert counts == (0, 1)
    assert "fails verification" in why
    assert _compile_once(caplog)[0] == (1, 0)


class _Holder:
    """A callable object as a node's target: what it holds (subgraphs) is not in its name."""

    __module__ = "kiln.capture.control_flow"
    __qualname__ = "kiln_cond.same"
    __name__ = "kiln_cond"

    def __call__(self, x):
        return x


def _helper(x):
    return x + 1


@pytest.mark.parametrize(
    "target", [_helper, lambda x: x * 2, _Holder()], ids=["function", "lambda", "callable_object"]
)
def test_a_graph_calling_what_its_name_does_not_pin_is_not_cached(target):
    from torch import fx

    from kiln import graph_cache

    graph = fx.Graph()
    x = graph.placeholder("x")
    graph.output(graph.call_function(target, (x,)))
    gm = fx.GraphModule(torch.nn.Module(), graph)
    with pytest.raises(graph_cache._Unkeyable, match="the graph calls"):
        graph_cache.graph_key(gm, [torch.randn(2)], {})


class _Launcher:
    """Stands for a code generator's object that holds process state (a device handle)."""

    __module__ = "kiln.codegen_triton.runtime"

    def __init__(self) -> None:
        self.handle = 0x7F00


def test_kiln_objects_without_a_stored_form_are_refused():
    from kiln.loopir import serialize

    with pytest.raises(pickle.PicklingError, match="no stored form"):
        serialize.dumps({"kernel": _Launcher()})
    op = torch.ops.aten.mm.default
    assert serialize.loads(serialize.dumps([op, torch.ops.aten.mm])) == [op, torch.ops.aten.mm]


def test_the_cache_folder_is_listed_and_cleared(graph_cache_dir, caplog):
    assert _compile_once(caplog)[0] == (0, 1)
    assert kiln.cache.folders()["graphs"] == graph_cache_dir
    assert [i.entries for i in kiln.cache.info() if i.name == "graphs"] == [1]
    kiln.cache.clear()
    assert not list(graph_cache_dir.iterdir())


def test_state_is_keyed_by_metadata_and_constants_by_value():
    from torch import fx

    from kiln import graph_cache

    root = torch.nn.Module()
    root.w = torch.nn.Parameter(torch.randn(3))
    root.c = torch.randn(3)
    graph = fx.Graph()
    x = graph.placeholder("x")
    w, c = graph.get_attr("w"), graph.get_attr("c")
    graph.output(graph.call_function(torch.add, (graph.call_function(torch.mul, (x, w)), c)))
    gm = fx.GraphModule(root, graph)
    del gm.c  # registered as a buffer (state) by GraphModule: make it a plain constant again
    object.__setattr__(gm, "c", torch.randn(3))

    def key():
        return graph_cache.graph_key(gm, [torch.randn(3)], {})[0]

    first = key()
    with torch.no_grad():
        gm.w.add_(1)  # read at each call: the compiled program stays right
    assert key() == first
    gm.c.add_(1)  # baked into the compiled code
    assert key() != first


def test_the_cpu_toolchain_and_its_target_are_in_the_key(monkeypatch):
    from torch import fx

    from kiln import graph_cache

    graph = fx.Graph()
    graph.output(graph.call_function(torch.sin, (graph.placeholder("x"),)))
    gm = fx.GraphModule(torch.nn.Module(), graph)

    def device_part():
        return graph_cache.graph_key(gm, [torch.randn(2)], {})[1]["device"]

    first = device_part()
    monkeypatch.setenv("KILN_CPP_MARCH", "x86-64-v2")
    assert device_part() != first
    monkeypatch.delenv("KILN_CPP_MARCH")
    monkeypatch.setenv("CXX", "c++")  # another compiler, by path
    assert device_part() != first


def test_the_sources_digest_is_kept_until_a_source_changes(tmp_path, monkeypatch):
    """Kiln's sources are hashed once and the digest kept under their sizes and modification
    times: a later process reads it back, and a changed file is hashed again."""
    from kiln import graph_cache

    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))
    source = tmp_path / "module.py"
    source.write_text("x = 1\n")
    monkeypatch.setattr(graph_cache, "_source_files", lambda: [str(source)])

    def new_process() -> str:
        graph_cache._kiln_sources.cache_clear()
        return graph_cache._kiln_sources()

    try:
        first = new_process()
        assert list((tmp_path / "cache" / "probes").glob("sources-*.json"))
        info = source.stat()
        source.write_text("x = 2\n")  # same size; its time put back: the kept digest is read
        os.utime(source, ns=(info.st_atime_ns, info.st_mtime_ns))
        assert new_process() == first
        source.write_text("x = 20\n")  # changed: hashed again
        changed = new_process()
        assert changed != first
        for entry in (tmp_path / "cache" / "probes").glob("sources-*.json"):
            entry.write_text('{"stamp": "forged", "answer": "forged"}')  # fails verification
        assert new_process() == changed
    finally:
        graph_cache._kiln_sources.cache_clear()  # later tests hash the real sources


GPU_CHILD = """
import json, sys, torch, kiln
from kiln.codegen_triton import compile_pool
torch.manual_seed(0)
model = torch.nn.Sequential(
    torch.nn.Linear(64, 128), torch.nn.LayerNorm(128), torch.nn.GELU(), torch.nn.Linear(128, 32)
).cuda()
compiled = kiln.compile(model)
with torch.no_grad():
    for n in (16, 16, 16):
        x = torch.randn(n, 64, device="cuda")
        torch.testing.assert_close(compiled(x), model(x), atol=1e-4, rtol=1e-4)
if sys.argv[1:] == ["save"]:
    kiln.save_cache(sys.argv[0] + ".kc")
s = kiln.stats()
print(json.dumps({"hits": s.graph_cache_hits, "misses": s.graph_cache_misses,
                  "fallbacks": s.eager_fallbacks, "kernels": s.kernels,
                  "workers_started": compile_pool._pool is not None}))
"""


def _gpu_env(folder: Path) -> dict[str, str]:
    """An environment with Kiln's and Triton's caches under ``folder``, placed as by default."""
    env = {**os.environ, "KILN_CACHE_DIR": str(folder / "kiln")}
    env["TRITON_CACHE_DIR"] = str(folder / "triton")
    for name in ("KILN_TRITON_CACHE", "KILN_GRAPH_CACHE", "KILN_GRAPH_CACHE_DIR"):
        env.pop(name, None)
    return env


def _gpu_child(script: Path, folder: Path, *args: str) -> dict[str, Any]:
    """GPU_CHILD in a new process with its caches under ``folder``."""
    return _last_json_line([sys.executable, str(script), *args], _gpu_env(folder))


@pytest.mark.gpu
def test_a_fresh_process_loads_a_gpu_program_and_compiles_no_kernel(tmp_path: Path):
    """Triton programs are stored too: the next process generates no kernel and starts no
    compile worker, and its outputs equal eager."""
    script = tmp_path / "gpu_child.py"
    script.write_text(GPU_CHILD)
    cold, warm = (_gpu_child(script, tmp_path / "cache") for _ in range(2))
    assert (cold["hits"], cold["misses"], cold["fallbacks"]) == (0, 1, 0)
    assert cold["kernels"].get("triton")
    assert (warm["hits"], warm["misses"], warm["fallbacks"]) == (1, 0, 0)
    assert not warm["kernels"] and not warm["workers_started"]


def _files(folder: Path) -> set[Path]:
    return {p for p in folder.rglob("*") if p.is_file() and "lock" not in p.name}


@pytest.mark.gpu
def test_a_saved_gpu_cache_file_leaves_triton_nothing_to_compile(tmp_path: Path):
    """A cache file saved after a GPU run carries Triton's binaries, their launchers and the
    autotuning records: a process with empty caches that loads it compiles nothing, tunes
    nothing, and Triton's cache gains no file beyond what the load wrote."""
    script = tmp_path / "gpu_child.py"
    script.write_text(GPU_CHILD)
    _gpu_child(script, tmp_path / "first", "save")
    empty = tmp_path / "empty"
    loader = "import kiln, sys; kiln.load_cache(sys.argv[1])"
    subprocess.run([sys.executable, "-c", loader, f"{script}.kc"], env=_gpu_env(empty), check=True)
    restored = _files(empty / "triton")
    assert restored and any(p.suffix == ".cubin" for p in restored)
    loaded = _gpu_child(script, empty)
    assert (loaded["hits"], loaded["misses"], loaded["fallbacks"]) == (1, 0, 0)
    assert not loaded["kernels"] and not loaded["workers_started"]
    assert _files(empty / "triton") == restored
