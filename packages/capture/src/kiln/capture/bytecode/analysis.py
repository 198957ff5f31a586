"""Control flow, stack depth and liveness over an instruction list.

Both analyses work on :class:`Instr` lists before assembly (jump targets are
references), so the evaluator can ask "how deep is the stack here" and "which
locals are still read from here on" of decoded code and of code it builds.
Exception edges count: an instruction covered by an exception-table entry may
continue at the entry's handler, with the stack cut to the entry's depth.
"""

from __future__ import annotations

import dis
from collections.abc import Iterable, Sequence

from kiln.capture.bytecode import optable
from kiln.capture.bytecode.instructions import ExceptionEntry, Instr, concrete_opname, name_flag
from kiln.capture.bytecode.optable import ArgKind
from kiln.capture.errors import CaptureError

__all__ = [
    "LOCAL_READS",
    "LOCAL_WRITES",
    "covering_entries",
    "live_locals",
    "local_accesses",
    "max_stack_depth",
    "prune_unreachable",
    "reachable",
    "stack_depths",
    "stack_effect",
    "successors",
]

_PRECALL = dis.opmap.get("PRECALL", 0)
_CALL = dis.opmap["CALL"]

#: Fast-local accesses that read the variable (DELETE_FAST raises if unbound).
LOCAL_READS = frozenset({"LOAD_FAST", "LOAD_FAST_CHECK", "LOAD_FAST_AND_CLEAR", "DELETE_FAST"})
LOCAL_WRITES = frozenset({"STORE_FAST", "STORE_FAST_MAYBE_NULL", "DELETE_FAST"})
#: 3.13's two-local superinstructions: per half, whether it writes (else reads).
_PAIR_WRITES = {
    "LOAD_FAST_LOAD_FAST": (False, False),
    "STORE_FAST_LOAD_FAST": (True, False),
    "STORE_FAST_STORE_FAST": (True, True),
}


def local_accesses(instr: Instr) -> list[tuple[bool, str]]:
    """``(writes, name)`` for each fast local ``instr`` touches, in the order it does.

    Every local instruction counts (a LOAD_CLOSURE or, on 3.13, a LOAD_FAST of a
    cell's slot too); DELETE_FAST reads (it raises if unbound) then writes.
    """
    if instr.opname in _PAIR_WRITES:
        return list(zip(_PAIR_WRITES[instr.opname], instr.arg, strict=True))
    if instr.kind != ArgKind.LOCAL:
        return []
    reads = instr.opname in LOCAL_READS or instr.opname not in LOCAL_WRITES
    writes = instr.opname in LOCAL_WRITES
    return [(False, instr.arg)] * reads + [(True, instr.arg)] * writes


def covering_entries(
    instrs: Sequence[Instr], table: Iterable[ExceptionEntry]
) -> dict[int, ExceptionEntry]:
    """Map ``id(instr)`` to the exception-table entry that covers it, if any."""
    index = {id(ins): i for i, ins in enumerate(instrs)}
    covered: dict[int, ExceptionEntry] = {}
    for entry in table:
        if not all(id(x) in index for x in (entry.start, entry.end, entry.target)):
            msg = f"an exception-table entry names an instruction not in the list: {entry}"
            raise CaptureError(msg)
        lo, hi = index[id(entry.start)], index[id(entry.end)]
        for ins in instrs[lo : hi + 1]:
            covered.setdefault(id(ins), entry)
    return covered


def _stack_oparg(instr: Instr) -> int | None:
    """The oparg as far as stack effects care (flag bits, counts), or None."""
    kind = instr.kind
    if kind == ArgKind.NONE:
        return None
    if kind == ArgKind.RAW:
        return int(instr.arg)
    if kind == ArgKind.NAME and instr.opname in optable.NAME_FLAG_BITS:
        return name_flag(instr)[0]
    return 0


def stack_effect(instr: Instr, *, jump: bool | None = None) -> int:
    """Net stack effect of ``instr``; ``jump`` picks the branch of a jump."""
    if instr.opname == "RETURN_GENERATOR":
        return 1  # resuming the new generator pushes the value sent in
    if optable.VERSION.precall and instr.opname in ("PRECALL", "CALL"):
        # CPython counts a call's arguments as consumed by PRECALL; they stay on the
        # stack until CALL, so count them there (the maximum depth is the same).
        if instr.opname == "PRECALL":
            return 0
        nargs = int(instr.arg)
        return dis.stack_effect(_PRECALL, nargs) + dis.stack_effect(_CALL, nargs)
    op = optable.opcode_of(concrete_opname(instr.opname))
    return dis.stack_effect(op, _stack_oparg(instr), jump=jump)


def successors(instrs: Sequence[Instr], i: int, index: dict[int, int]) -> list[tuple[int, int]]:
    """``(index, stack effect on that edge)`` for each normal way out of ``instrs[i]``.

    ``index`` maps ``id(instr)`` to its position. Exception edges are left to
    the caller (see :func:`covering_entries`): the table fixes their depth.
    """
    instr = instrs[i]
    out: list[tuple[int, int]] = []
    if instr.is_jump:
        try:
            target = index[id(instr.arg)]
        except KeyError:
            msg = f"jump target of {instr!r} (instruction {i}) is not in the instruction list"
            raise CaptureError(msg) from None
        out.append((target, stack_effect(instr, jump=True)))
        if optable.is_unconditional_jump(instr.opname):
            return out
        out.append((i + 1, stack_effect(instr, jump=False)))
    elif not optable.is_terminator(instr.opname):
        out.append((i + 1, stack_effect(instr, jump=False)))
    if out and out[-1][0] >= len(instrs):
        msg = f"control falls off the end of the code after {instr!r}; end it with a return"
        raise CaptureError(msg)
    return out


def _positions_of(instrs: Sequence[Instr]) -> dict[int, int]:
    return {id(ins): i for i, ins in enumerate(instrs)}


def reachable(
    instrs: Sequence[Instr], table: Sequence[ExceptionEntry] = (), *, handlers: bool = True
) -> set[int]:
    """Indices of the instructions control can reach from the first one.

    ``handlers=False`` ignores exception edges: what is left is the code that
    runs without an exception being raised and caught.
    """
    index = _positions_of(instrs)
    covered = covering_entries(instrs, table) if handlers else {}
    seen = {0} if instrs else set()
    work = list(seen)
    while work:
        i = work.pop()
        nexts = [j for j, _ in successors(instrs, i, index)]
        entry = covered.get(id(instrs[i]))
        if entry is not None:
            nexts.append(index[id(entry.target)])
        for j in nexts:
            if j not in seen:
                seen.add(j)
                work.append(j)
    return seen


def prune_unreachable(
    instrs: Sequence[Instr], table: Sequence[ExceptionEntry] = ()
) -> tuple[list[Instr], list[ExceptionEntry]]:
    """Drop code no path reaches; shrink exception entries to what is left of them."""
    keep = reachable(instrs, table)
    index = _positions_of(instrs)
    kept = [ins for i, ins in enumerate(instrs) if i in keep]
    entries = []
    for e in table:
        inside = [i for i in range(index[id(e.start)], index[id(e.end)] + 1) if i in keep]
        if inside:
            entries.append(
                ExceptionEntry(instrs[inside[0]], instrs[inside[-1]], e.target, e.depth, e.lasti)
            )
    return kept, entries


def stack_depths(
    instrs: Sequence[Instr], table: Sequence[ExceptionEntry] = (), *, entry_depth: int = 0
) -> list[int | None]:
    """Stack depth before each instruction (None where unreachable).

    Raises :class:`CaptureError` where two paths reach an instruction with
    different depths or the stack would go negative: such code would crash.
    """
    index = _positions_of(instrs)
    covered = covering_entries(instrs, table)
    depths: list[int | None] = [None] * len(instrs)
    work: list[int] = []

    def reach(j: int, depth: int, came_from: int) -> None:
        if depth < 0:
            msg = f"stack underflow after {instrs[came_from]!r} (instruction {came_from})"
            raise CaptureError(msg)
        seen = depths[j]
        if seen is None:
            depths[j] = depth
            work.append(j)
        elif seen != depth:
            msg = f"instruction {j} {instrs[j]!r} reached with stack depths {seen} and {depth}"
            raise CaptureError(msg)

    if instrs:
        reach(0, entry_depth, 0)
    while work:
        i = work.pop()
        depth = depths[i]
        assert depth is not None
        for j, effect in successors(instrs, i, index):
            reach(j, depth + effect, i)
        entry = covered.get(id(instrs[i]))
        if entry is not None:
            reach(index[id(entry.target)], entry.depth + int(entry.lasti) + 1, i)
    return depths


def max_stack_depth(
    instrs: Sequence[Instr], table: Sequence[ExceptionEntry] = (), *, entry_depth: int = 0
) -> int:
    """The ``co_stacksize`` the code needs: the deepest the stack gets on any edge."""
    depths = stack_depths(instrs, table, entry_depth=entry_depth)
    deepest = entry_depth
    for i, depth in enumerate(depths):
        if depth is not None:
            # the deepest point of an instruction is after it pushes, on whichever branch
            deepest = max(deepest, depth, depth + stack_effect(instrs[i]))
            if instrs[i].opname == "RETURN_CONST":
                deepest = max(deepest, depth + optable.VERSION.return_const_peak)
    return deepest


def live_locals(
    instrs: Sequence[Instr], table: Sequence[ExceptionEntry] = ()
) -> list[frozenset[str]]:
    """Fast locals live before each instruction: read later on some path before a write."""
    index = _positions_of(instrs)
    covered = covering_entries(instrs, table)
    n = len(instrs)
    preds: list[list[int]] = [[] for _ in range(n)]
    for i in range(n):
        for j, _ in successors(instrs, i, index):
            preds[j].append(i)
        entry = covered.get(id(instrs[i]))
        if entry is not None:
            preds[index[id(entry.target)]].append(i)
    live: list[frozenset[str]] = [frozenset()] * n
    live_out: list[set[str]] = [set() for _ in range(n)]
    work = list(range(n))
    pending = set(work)
    while work:
        i = work.pop()
        pending.discard(i)
        now = set(live_out[i])
        for writes, name in reversed(local_accesses(instrs[i])):
            if writes:
                now.discard(name)
            elif instrs[i].opname in LOCAL_READS or instrs[i].opname in _PAIR_WRITES:
                now.add(name)
        frozen = frozenset(now)
        if frozen == live[i]:
            continue
        live[i] = frozen
        for p in preds[i]:
            if not frozen <= live_out[p]:
                live_out[p] |= frozen
                if p not in pending:
                    pending.add(p)
                    work.append(p)
    return live
