"""The backend registry: built-ins, registration, lookup."""

import pytest
import torch

import kiln
from kiln.backends import lookup_backend


def test_builtins_are_listed():
    names = kiln.list_backends()
    for name in ("eager", "aot_eager", "aot_eager_decomp_partition", "kiln", "loopir_reference"):
        assert name in names


def test_register_with_and_without_name():
    @kiln.register_backend
    def my_test_backend(gm, example_inputs):
        return gm.forward

    @kiln.register_backend("named_test_backend")
    def other(gm, example_inputs):
        return gm.forward

    assert "my_test_backend" in kiln.list_backends()
    assert lookup_backend("named_test_backend") is other


def test_registering_a_name_twice_needs_override():
    with pytest.raises(ValueError, match="exists"):
        kiln.register_backend("eager")(lambda gm, inputs: gm.forward)


def test_a_callable_backend_is_used_as_is():
    def backend(gm, inputs):
        return gm.forward

    assert lookup_backend(backend) is backend
    with pytest.raises(TypeError):
        lookup_backend(3)  # type: ignore[arg-type]


def test_options_reach_a_backend_that_takes_them():
    seen = []

    def with_options(gm, example_inputs, *, options):
        seen.append(dict(options))
        return gm.forward

    f = kiln.compile(lambda x: x * 2, backend=with_options, options={"fusion": False})
    x = torch.randn(3)
    torch.testing.assert_close(f(x), x * 2)
    assert seen == [{"fusion": False}]


def test_a_backend_gets_no_options_keyword_when_none_are_set():
    seen = []

    def plain(gm, example_inputs):
        seen.append(len(example_inputs))
        return gm.forward

    kiln.compile(lambda x: x + 1, backend=plain)(torch.randn(2))
    assert seen == [1]
