"""The ``SHAPE`` kind: the relations between input sizes a graph traced with symbolic sizes
assumes (``L['x'].size()[0] > 16``, ``L['x'].size()[1] == L['y'].size()[0]``).

Capture keeps them in its :class:`~kiln.capture.shapes.ShapeEnv` and prints them as Python
over sources (:func:`~kiln.capture.shapes.guard_code`); the check spells each source the way it
reads every other one, so a size comes from the shape tuple the tensor's own condition kept.
The relations run after every tensor's condition, which checked the ranks they index by. A
failure is explained by capture's own evaluation of the relations on the call's sizes, which
does not depend on the printed text.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from typing import Any

from kiln.capture.guard_data import GuardKind, GuardSpec
from kiln.capture.shapes import ShapeEnv, describe_failure, failing_guards, guard_code
from kiln.capture.source import Source
from kiln.guards.kinds.base import Emitter, Kind, Rank, register

__all__ = ["ShapeKind"]

_MATH = re.compile(r"\bmath\.")


@register(GuardKind.SHAPE)
class ShapeKind(Kind):
    """``expected`` is the capture's :class:`ShapeEnv`; the guard's source is None."""

    rank = Rank.SHAPE
    has_source = False
    reads_frame = True

    def accepts(self, expected: Any) -> bool:
        return isinstance(expected, ShapeEnv)

    def implied(self, guard: GuardSpec, others: Sequence[GuardSpec]) -> bool:
        # an environment without relations asserts nothing: the check gets no test for it
        env: ShapeEnv = guard.expected
        return not env.guards

    def condition(self, out: Emitter, guard: GuardSpec, v: str) -> str:
        relations = guard_code(guard.expected, out.expr)
        text = " and ".join(f"({r})" if " or " in r or " if " in r else r for r in relations)
        if _MATH.search(text):  # floor and ceil print as ``math.floor(...)``
            out.in_scope("math", math)
        return text

    def explain(self, guard: GuardSpec, where: str, value: Any) -> str | None:
        env: ShapeEnv = guard.expected
        read: Callable[[Source], Any] = value
        values = {}
        for s, info in env.symbols.items():
            try:
                got = read(info.source)
                values[s] = got if isinstance(got, float) else int(got)  # a number input's float
            except Exception as e:  # no tensor guard checked its rank (the check says False)
                return f"could not read {info.source}: {type(e).__name__}: {e}"
        failed = failing_guards(env, values)
        return describe_failure(env, failed[0], values) if failed else None
