"""Bad arguments to kiln.compile fail at once with errors naming the problem."""

import pytest
import torch

import kiln


def f(x):
    return x + 1


def test_unknown_backend_lists_valid_ones():
    with pytest.raises(ValueError, match="unknown backend 'nope'.*eager.*kiln"):
        kiln.compile(f, backend="nope")


def test_unknown_mode_lists_valid_ones():
    with pytest.raises(ValueError, match="unknown mode 'fast'.*reduce-overhead"):
        kiln.compile(f, mode="fast")


def test_unknown_option_lists_valid_ones():
    with pytest.raises(ValueError, match="unknown option 'fusoin'.*fusion"):
        kiln.compile(f, options={"fusoin": True})


@pytest.mark.parametrize(
    ("key", "value"),
    [("recompile_limit", "8"), ("recompile_limit", True), ("fusion", 1), ("debug_dir", 3)],
)
def test_option_of_wrong_type_names_the_option(key, value):
    with pytest.raises(TypeError, match=f"option '{key}' must be"):
        kiln.compile(f, options={key: value})


def test_options_must_be_a_dict():
    with pytest.raises(TypeError, match="options must be a dict"):
        kiln.compile(f, options=[("fusion", True)])


def test_non_callable_is_a_type_error():
    with pytest.raises(TypeError, match="non-callable int"):
        kiln.compile(3)


@pytest.mark.parametrize(("kw", "value"), [("fullgraph", "yes"), ("dynamic", 1), ("disable", None)])
def test_flags_must_be_bools(kw, value):
    with pytest.raises(TypeError, match=kw):
        kiln.compile(f, **{kw: value})


def test_mode_implies_options_and_explicit_options_win():
    from kiln.config import make_config

    cfg = make_config(fullgraph=False, dynamic=None, mode="reduce-overhead", options=None)
    assert cfg.option("cudagraphs") is True
    cfg = make_config(
        fullgraph=False, dynamic=None, mode="reduce-overhead", options={"cudagraphs": False}
    )
    assert cfg.option("cudagraphs") is False


def test_disable_flag_returns_the_original():
    m = torch.nn.Linear(2, 2)
    assert kiln.compile(m, disable=True) is m


def test_backend_options_include_what_the_mode_implies():
    from kiln.config import make_config

    cfg = make_config(fullgraph=False, dynamic=None, mode="max-autotune", options={"fusion": False})
    assert cfg.backend_options() == {"max_autotune": True, "cudagraphs": True, "fusion": False}
    cfg = make_config(fullgraph=False, dynamic=None, mode=None, options={"recompile_limit": 3})
    assert cfg.backend_options() == {}


def test_cpp_threads_must_be_positive():
    with pytest.raises(ValueError, match="'cpp.threads' must be at least 1, got 0"):
        kiln.compile(f, options={"cpp.threads": 0})


@pytest.mark.parametrize(
    ("mode", "options"), [("reduce-overhead", None), (None, {"max_autotune": True})]
)
def test_a_backend_without_options_refuses_them(mode, options):
    with pytest.raises(ValueError, match="backend 'eager' takes no options.*cudagraphs|max_aut"):
        kiln.compile(f, backend="eager", mode=mode, options=options)
    # frontend-only options are fine with any backend
    kiln.compile(f, backend="eager", options={"recompile_limit": 2})
