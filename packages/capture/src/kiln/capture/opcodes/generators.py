"""Generators inlined at their call: ``yield``, ``yield from`` and the 3.12 intrinsics they use.

A generator function called from the traced code runs to its end at the call
(``Tracer.inline``): its yields are collected, and the caller iterates them as a
list (:class:`~kiln.capture.values.iterators.GeneratorIterator`). Nothing is
ever sent or thrown into it, so each ``yield`` evaluates to None, and
``yield from`` (``GET_YIELD_FROM_ITER``, then a ``SEND`` / ``YIELD_VALUE`` loop)
hands on the items of the inner iterator and takes the inner generator's return
value as its own value, as ``StopIteration.value`` does in Python. Coroutines and
async generators are not inlined (``await`` suspends on an event loop that
capture does not run), so their opcodes live in :mod:`.unsupported`.
"""

from __future__ import annotations

import dis
from typing import TYPE_CHECKING

from kiln.capture import dispatch, iteration
from kiln.capture.breaks.reasons import raised, unsupported
from kiln.capture.bytecode.versions import VERSION
from kiln.capture.opcodes.common import registry
from kiln.capture.values.base import ConstantValue, Value
from kiln.capture.values.iterators import GeneratorIterator, IteratorValue
from kiln.capture.values.objects import ObjectValue
from kiln.capture.wrap import wrap

if TYPE_CHECKING:
    from kiln.capture.tracer import Tracer

HANDLERS, handles = registry()

#: items one generator may yield, ``yield from`` included, before capture gives up on it
MAX_YIELDS = 100_000


@handles("RETURN_GENERATOR")
def return_generator(tr: Tracer, ins: dis.Instruction) -> None:
    """A generator starts: the value sent by the first ``next`` is None."""
    if tr.yielded is None:
        raise unsupported("unsupported_opcode", "a generator outside inlining")
    tr.push(ConstantValue(None))


@handles("YIELD_VALUE")
def yield_value(tr: Tracer, ins: dis.Instruction) -> None:
    if tr.yielded is None:
        raise unsupported("unsupported_opcode", "yield outside an inlined generator")
    tr.check_generator_state()
    tr.yielded.append(tr.pop())
    if len(tr.yielded) > MAX_YIELDS:
        raise unsupported("inline_limit", f"a generator with over {MAX_YIELDS} items")
    tr.push(ConstantValue(None))


@handles("GET_YIELD_FROM_ITER")
def get_yield_from_iter(tr: Tracer, ins: dis.Instruction) -> None:
    """``yield from x`` iterates ``x``; an inlined generator is its own iterator."""
    tr.push(dispatch.iterate(tr, tr.pop()))


@handles("SEND")
def send(tr: Tracer, ins: dis.Instruction) -> None:
    """One step of ``yield from``: the inner iterator's next item, or its return value at the end.

    3.11 replaces the inner iterator with the return value before jumping; 3.12
    pushes it above and ``END_SEND`` at the target drops the iterator.
    """
    sent = tr.pop()
    receiver = tr.peek()
    if not (isinstance(sent, ConstantValue) and sent.is_none()):
        raise unsupported("unsupported_opcode", "SEND of a value into a generator")
    if not isinstance(receiver, IteratorValue):
        raise unsupported("unsupported_opcode", f"yield from {receiver}")
    item = iteration.next_item(tr, receiver)
    if item is not None:
        tr.push(item)
        return
    returned: Value = ConstantValue(None)
    if isinstance(receiver, GeneratorIterator):
        returned = receiver.returned
    if not VERSION.send_keeps_receiver:
        tr.pop()
    tr.push(returned)
    tr.jump_to(ins.argval)


@handles("END_SEND")
def end_send(tr: Tracer, ins: dis.Instruction) -> None:
    value = tr.pop()
    tr.pop()  # the exhausted inner iterator
    tr.push(value)


@handles("CLEANUP_THROW")
def cleanup_throw(tr: Tracer, ins: dis.Instruction) -> None:
    """3.12: an exception thrown into ``yield from``; a StopIteration ends it with its value.

    Capture never throws into an inlined generator, so only an exception table
    can lead here; it is modelled as Python runs it.
    """
    exc_v = tr.pop()
    tr.popn(2)  # the inner iterator and the last value sent
    exc = exc_v.obj if isinstance(exc_v, ObjectValue) else None
    if not isinstance(exc, BaseException):
        raise unsupported("unsupported_value", f"CLEANUP_THROW of {exc_v}")
    if not isinstance(exc, StopIteration):
        raise raised(exc)
    tr.push(ConstantValue(None))
    tr.push(wrap(tr.out, exc.value, None))
