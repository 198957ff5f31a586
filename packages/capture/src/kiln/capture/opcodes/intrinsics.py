"""3.12's CALL_INTRINSIC_1 and CALL_INTRINSIC_2: small operations the compiler calls by number.

The ones ordinary function code reaches are modelled: unary ``+``, a list
turned into a tuple for ``f(*a)``, ``except*``'s recombination of exception
groups, and the RuntimeError a StopIteration becomes when it leaves a generator.
The others belong to module bodies (``import *``), the interactive prompt
(``print`` of an expression statement), async generators, or create PEP 695 type
parameters (``def f[T]``, ``type X = ...``) inside a function; they raise
``unsupported_opcode``, so the graph breaks there and the instruction runs in
Python (:mod:`kiln.capture.breaks.native`).
"""

from __future__ import annotations

import dis
from typing import TYPE_CHECKING

from kiln.capture import dispatch
from kiln.capture.breaks.reasons import unsupported
from kiln.capture.opcodes.common import registry
from kiln.capture.opcodes.exceptions import exception_of, prep_reraise_star
from kiln.capture.values.containers import ListValue, TupleValue
from kiln.capture.values.iterators import leaving_generator
from kiln.capture.values.objects import ObjectValue

if TYPE_CHECKING:
    from kiln.capture.tracer import Tracer

HANDLERS, handles = registry()


@handles("CALL_INTRINSIC_1")
def call_intrinsic_1(tr: Tracer, ins: dis.Instruction) -> None:
    if ins.argrepr == "INTRINSIC_UNARY_POSITIVE":
        tr.push(dispatch.unary_op(tr, "pos", tr.pop()))
    elif ins.argrepr == "INTRINSIC_LIST_TO_TUPLE":
        lst = tr.pop()
        assert isinstance(lst, ListValue)
        tr.push(TupleValue(list(lst.items)))
    elif ins.argrepr == "INTRINSIC_STOPITERATION_ERROR":
        # PEP 479: a StopIteration must not end the generator silently; RERAISE raises it next
        tr.push(ObjectValue(leaving_generator(exception_of(tr.pop()))))
    else:
        raise unsupported("unsupported_opcode", f"CALL_INTRINSIC_1 {ins.argrepr}")


@handles("CALL_INTRINSIC_2")
def call_intrinsic_2(tr: Tracer, ins: dis.Instruction) -> None:
    if ins.argrepr != "INTRINSIC_PREP_RERAISE_STAR":
        raise unsupported("unsupported_opcode", f"CALL_INTRINSIC_2 {ins.argrepr}")
    excs = tr.pop()
    tr.push(prep_reraise_star(tr.pop(), excs))
