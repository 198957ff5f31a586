"""descriptors.class_static answers exactly as inspect.getattr_static does for a class: the
same object, the same default, the same AttributeError, whatever the metaclasses."""

from __future__ import annotations

import abc
import collections
import enum
import inspect
import types
from typing import Any

import pytest
import torch

from kiln.capture.descriptors import class_static


class _ShadowingMeta(type):
    __dict__ = property(lambda self: {"x": 1})  # type: ignore[assignment]


class _Shadowed(metaclass=_ShadowingMeta):
    y = 2


class _BelowShadowed(_Shadowed):
    z = 3


class _CustomGetattribute(abc.ABC):
    def __getattribute__(self, name: str) -> Any:
        return 1


class _Color(enum.Enum):
    RED = 1


class _Module(torch.nn.Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


CLASSES = [
    object,
    type,
    int,
    dict,
    collections.OrderedDict,
    types.FunctionType,
    abc.ABC,
    abc.ABCMeta,
    torch.Tensor,
    torch.nn.Parameter,
    torch.Size,
    torch.nn.Module,
    torch.nn.Linear,
    _Module,
    _ShadowingMeta,
    _Shadowed,
    _BelowShadowed,
    _CustomGetattribute,
    _Color,
]
NAMES = [
    "__getattribute__",
    "__getattr__",
    "__setattr__",
    "__call__",
    "__new__",
    "__init__",
    "__dict__",
    "__mro__",
    "__doc__",
    "__module__",
    "__subclasses__",
    "mro",
    "forward",
    "training",
    "RED",
    "register",
    "x",
    "y",
    "z",
    "missing",
]


def _outcome(lookup: Any, cls: type, name: str, *default: Any) -> tuple[str, Any]:
    try:
        return "found", lookup(cls, name, *default)
    except AttributeError as e:
        return "raised", str(e)


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_same_answer_as_getattr_static(cls: type) -> None:
    for name in NAMES:
        for default in ((), (None,)):
            expected = _outcome(inspect.getattr_static, cls, name, *default)
            found = _outcome(class_static, cls, name, *default)
            assert found[0] == expected[0], (cls, name, default)
            if expected[0] == "found":
                assert found[1] is expected[1], (cls, name, default)
            else:
                assert found[1] == expected[1], (cls, name, default)


def test_a_class_changed_later_is_read_again() -> None:
    class Late:
        pass

    assert class_static(Late, "hook", None) is None
    Late.hook = len  # type: ignore[attr-defined]
    assert class_static(Late, "hook") is len
