"""The backend registry: explicit registration, entry points, module fallbacks, reference."""

import dataclasses
import logging
import sys
import types

import pytest
import torch
from loopir_testing import aten_graph, to_meta

from kiln.loopir import BackendError, BackendTraits, ReferenceBackend, compile_graph
from kiln.loopir import backend as registry

aten = torch.ops.aten


class Recording(ReferenceBackend):
    name = "recording"

    def __init__(self):
        self.groups = []

    def codegen_kernel(self, group):
        self.groups.append(group)
        return super().codegen_kernel(group)


@pytest.fixture
def fresh_registry(monkeypatch):
    monkeypatch.setattr(registry, "_registered", {})
    monkeypatch.setattr(registry, "_resolved", {})
    monkeypatch.setattr(registry, "FALLBACK_MODULES", {})
    monkeypatch.setattr(registry, "_from_entry_points", lambda device_type: None)


def test_register_backend_is_used_by_compile_graph(fresh_registry):
    rec = Recording()
    registry.register_backend("cpu", rec)
    x = torch.randn(4, 4)
    gm = aten_graph(lambda x: (aten.sin.default(x),), x)
    out = compile_graph(gm, [to_meta(x)])(x)
    torch.testing.assert_close(out[0], x.sin())
    assert len(rec.groups) == 1 and rec.groups[0].args == ("x", "buf0")


def test_factory_and_class_registrations(fresh_registry):
    registry.register_backend("cpu", Recording)
    assert isinstance(registry.get_backend("cpu"), Recording)
    registry.register_backend("cpu", lambda device_type: Recording())
    assert isinstance(registry.get_backend("cpu"), Recording)


def test_fallback_module_with_make_backend(fresh_registry, monkeypatch):
    module = types.ModuleType("fake_codegen")
    module.make_backend = lambda device_type: Recording()
    monkeypatch.setitem(sys.modules, "fake_codegen", module)
    monkeypatch.setitem(registry.FALLBACK_MODULES, "cpu", ("missing_codegen", "fake_codegen"))
    assert isinstance(registry.get_backend("cpu"), Recording)


def test_unavailable_backend_falls_through_to_reference(fresh_registry, monkeypatch, caplog):
    module = types.ModuleType("broken_codegen")

    def make_backend(device_type):
        raise BackendError("no compiler here")

    module.make_backend = make_backend
    monkeypatch.setitem(sys.modules, "broken_codegen", module)
    monkeypatch.setitem(registry.FALLBACK_MODULES, "cpu", ("broken_codegen",))
    with caplog.at_level(logging.WARNING):
        found = registry.get_backend("cpu")
    assert isinstance(found, ReferenceBackend)
    assert "reference backend" in caplog.text


def test_entry_points_are_searched(monkeypatch):
    monkeypatch.setattr(registry, "_registered", {})
    monkeypatch.setattr(registry, "_resolved", {})

    class EP:
        name, value = "fakedev", "fake:make"

        def load(self):
            return Recording

    monkeypatch.setattr(registry.metadata, "entry_points", lambda group: [EP()])
    assert isinstance(registry.get_backend("fakedev"), Recording)


def test_fusion_veto_is_respected(fresh_registry, caplog):
    class NoFusion(Recording):
        def fusion_veto(self, group):
            return "this backend runs one node per kernel"

    x = torch.randn(4, 4)
    gm = aten_graph(
        lambda x: (aten.sum.dim_IntList(aten.sin.default(x), [1]), aten.cos.default(x)), x
    )
    with caplog.at_level(logging.INFO, logger="kiln.loopir.fusion"):
        compiled = compile_graph(gm, [to_meta(x)], backend=NoFusion())
    assert compiled.kernel_count == 2
    assert "backend refused: this backend runs one node per kernel" in caplog.text


def test_finalize_is_called_once_per_graph(fresh_registry):
    class Batching(Recording):
        finalized = 0

        def finalize(self):
            Batching.finalized += 1

    x = torch.randn(4, 4)
    gm = aten_graph(lambda x: (aten.sin.default(x), aten.sum.dim_IntList(x, [0])), x)
    compile_graph(gm, [to_meta(x)], backend=Batching())
    assert Batching.finalized == 1


class PrefersAten(Recording):
    """A backend whose lanes make gathers and masked loads slow (the C++ backend's traits)."""

    traits = BackendTraits(
        pointwise_cat=False, extern_ops=frozenset({"max_pool2d_with_indices_backward"})
    )


def test_backend_traits_steer_lowering():
    from kiln.loopir.ir.buffers import SliceBuffer
    from kiln.loopir.scheduler.order import ExternStep, KernelStep

    x, a, b = torch.randn(1, 2, 8, 8), torch.randn(3, 4), torch.randn(3, 5)

    def fn(x, a, b):
        out, idx = aten.max_pool2d_with_indices.default(x, [3, 3], [2, 2], [1, 1])
        grad = aten.max_pool2d_with_indices_backward.default(
            aten.sin.default(out), x, [3, 3], [2, 2], [1, 1], [1, 1], False, idx
        )
        return grad, aten.cat.default([aten.cos.default(a), b], 1)

    for backend, extern, slices in [(Recording(), 0, 0), (PrefersAten(), 1, 2)]:
        compiled = compile_graph(aten_graph(fn, x, a, b), [to_meta(t) for t in (x, a, b)],
                                 backend=backend)  # fmt: skip
        for got, want in zip(compiled(x, a, b), fn(x, a, b), strict=True):
            torch.testing.assert_close(got, want)
        externs = [s for s in compiled.steps if isinstance(s, ExternStep)]
        assert sum("max_pool2d" in s.buffer.describe() for s in externs) == extern
        kernels = [s for s in compiled.steps if isinstance(s, KernelStep)]
        nodes = [n for s in kernels for n in s.group.nodes]
        assert sum(isinstance(n.buffer, SliceBuffer) for n in nodes) == slices


def test_the_fallback_warning_names_what_could_not_be_imported(fresh_registry, monkeypatch, caplog):
    monkeypatch.setitem(registry.FALLBACK_MODULES, "cuda", ("kiln_absent_codegen",))
    with caplog.at_level(logging.WARNING):
        found = registry.get_backend("cuda")
    assert isinstance(found, ReferenceBackend)
    assert "no code generator for device 'cuda'" in caplog.text
    assert "No module named 'kiln_absent_codegen'" in caplog.text


def test_traits_are_one_frozen_object_with_defaults_for_any_device():
    traits = ReferenceBackend().traits
    assert traits == BackendTraits()
    assert traits.pointwise_cat and not traits.extern_ops and traits.reduction_split_rows == 0
    with pytest.raises(dataclasses.FrozenInstanceError):
        traits.pointwise_cat = False  # type: ignore[misc]


def test_a_backend_without_the_whole_protocol_is_refused(fresh_registry):
    """``traits``, ``finalize`` and ``with_options`` are members of the protocol, not optional
    attributes looked up with defaults: an object missing one is not a backend."""

    class NoTraits:
        name = "no-traits"

        def codegen_kernel(self, group):
            raise AssertionError

        def fusion_veto(self, group):
            return None

        def finalize(self):
            pass

        def with_options(self, options):
            return self

    registry.register_backend("cpu", lambda device_type: NoTraits())
    with pytest.raises(BackendError, match="lacks a member"):
        registry.get_backend("cpu")


def test_with_options_is_called_only_for_graphs_with_options():
    class Configured(Recording):
        seen: list = []

        def with_options(self, options):
            Configured.seen.append(dict(options))
            return self

    backend = Configured()
    assert registry.configure(backend, {}) is backend
    assert registry.configure(backend, {"cpp.threads": 2}) is backend
    assert Configured.seen == [{"cpp.threads": 2}]
