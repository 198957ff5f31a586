"""Mutations of state that outlives the call: recorded while tracing, replayed after the graph."""

from __future__ import annotations

import torch

from kiln.capture import capture


class Box:
    def __init__(self):
        self.value = 1
        self.items = []


BOX = Box()


def _capture(fn, *args):
    return capture(fn, args, {}, compile_graph=lambda gm, ex: gm.forward, wrap_callable=lambda f: f)


def test_attribute_read_after_store_sees_new_value():
    def fn(x, box):
        box.value = 5
        return x * box.value

    box = Box()
    res = _capture(fn, torch.randn(2), box)
    assert box.value == 1  # tracing did not touch the real object
    x = torch.randn(2)
    fresh = Box()
    torch.testing.assert_close(res.function(x, fresh), x * 5)
    assert fresh.value == 5


def test_global_object_attribute_store():
    def fn(x):
        BOX.value = BOX.value + 1
        return x + BOX.value

    BOX.value = 1
    res = _capture(fn, torch.randn(2))
    assert BOX.value == 1
    x = torch.randn(2)
    torch.testing.assert_close(res.function(x), x + 2)
    assert BOX.value == 2
    BOX.value = 1


def test_list_and_dict_arguments_written_back():
    def fn(x, lst, d):
        lst.append(x * 2)
        lst[0] = 7
        d["new"] = x + 1
        del d["old"]
        return x

    res = _capture(fn, torch.randn(2), [0], {"old": 1})
    x, lst, d = torch.randn(2), [0], {"old": 1}
    out = res.function(x, lst, d)
    assert out is x
    assert lst[0] == 7 and len(lst) == 2
    torch.testing.assert_close(lst[1], x * 2)
    assert list(d) == ["new"]
    torch.testing.assert_close(d["new"], x + 1)


def test_same_list_reached_twice_is_one_value():
    def fn(x, box):
        box.items.append(x)
        return len(box.items) * x

    box = Box()
    res = _capture(fn, torch.randn(2), box)
    fresh = Box()
    x = torch.randn(2)
    torch.testing.assert_close(res.function(x, fresh), x)
    assert len(fresh.items) == 1


def test_module_attribute_counter():
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.steps = 0

        def forward(self, x):
            self.steps += 1
            return x * self.steps

    m = M()
    res = _capture(m.forward, torch.randn(2))
    x = torch.randn(2)
    torch.testing.assert_close(res.function(x), x * 1)
    assert m.steps == 1
    assert res.side_effects == ["L['self'].steps = ..."]


def test_fresh_varargs_and_kwargs_may_be_mutated():
    def fn(*args, **kwargs):
        kwargs["extra"] = 1
        args = list(args)
        args.append(2)
        return args[0] * kwargs["extra"] * args[-1]

    res = _capture(fn, torch.randn(2))
    x = torch.randn(2)
    torch.testing.assert_close(res.function(x), x * 2)


def test_logging_and_print_are_replayed_after_the_graph(capsys, caplog):
    import logging
    import warnings

    log = logging.getLogger("kiln.tests.capture")

    def fn(x):
        log.warning("warned %d", 3)
        print("hello", 1)
        warnings.warn("careful", UserWarning)
        return x * 2

    res = _capture(fn, torch.randn(2))
    assert capsys.readouterr().out == ""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        x = torch.randn(2)
        torch.testing.assert_close(res.function(x), x * 2)
    assert capsys.readouterr().out == "hello 1\n"
    assert "warned 3" in caplog.text
    assert [str(w.message) for w in caught] == ["careful"]


def test_new_loss_module_in_forward():
    def fn(x, y):
        return torch.nn.CrossEntropyLoss(reduction="sum")(x, y)

    x, y = torch.randn(4, 3), torch.randint(0, 3, (4,))
    res = _capture(fn, x, y)
    torch.testing.assert_close(res.function(x, y), fn(x, y))


def test_new_module_with_parameters_refused():
    import pytest

    from kiln.capture import Unsupported

    with pytest.raises(Unsupported):
        capture(
            lambda x: torch.nn.Linear(2, 2)(x),
            (torch.randn(2),),
            {},
            compile_graph=lambda gm, ex: gm.forward,
            wrap_callable=lambda f: f,
            fullgraph=True,
        )


class Config:
    def __init__(self):
        self.size = 4
        self.nested = Box()


def test_deepcopy_snapshot_is_private_and_guarded():
    import copy

    from kiln.capture import GuardKind

    def fn(x, cfg):
        local = copy.deepcopy(cfg)
        local.size = 10
        delattr(local, "nested")
        return x * local.size + cfg.size

    cfg = Config()
    res = _capture(fn, torch.randn(2), cfg)
    assert cfg.size == 4 and hasattr(cfg, "nested")
    x = torch.randn(2)
    torch.testing.assert_close(res.function(x, cfg), x * 10 + 4)
    guarded = {(str(g.source), g.kind) for g in res.guards}
    assert ("L['cfg'].nested.value", GuardKind.EQUALS) in guarded


def test_del_attribute_of_object_made_in_trace():
    def fn(x):
        obj = Box()
        obj.extra = x * 2
        del obj.extra
        return x + obj.value

    x = torch.randn(2)
    torch.testing.assert_close(_capture(fn, x).function(x), x + 1)
