"""Memory planning: allocate late, free after last use, reuse and work in place.

Over the ordered steps, each buffer a kernel writes is allocated right before
its first writer and deleted after its last reader. A new allocation takes over
a dead buffer of identical layout (reuse) and, when its kernel reads a dying
input at exactly the address it writes, that input's storage (in place). The
plan reports peak bytes of intermediates (inputs excluded).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from kiln.loopir.analysis import ReadWriteHandler
from kiln.loopir.ir.layout import Layout
from kiln.loopir.kernel import RINDEX, XINDEX, KernelGroup
from kiln.loopir.scheduler.order import ExternStep, KernelStep, NopStep, Step
from kiln.loopir.virtualized import set_ops_handler

__all__ = ["MemoryPlan", "plan_memory"]


@dataclasses.dataclass(frozen=True)
class MemoryPlan:
    """What the wrapper does around each step (by step position)."""

    allocate: dict[int, list[tuple[str, Layout]]]
    reuse: dict[int, list[tuple[str, str, str]]]  # (new, old, "reuse" | "inplace")
    free: dict[int, list[str]]
    peak_bytes: int


def _in_place_ok(group: KernelGroup, old: str, new: str) -> bool:
    """``old`` is read only by the node that writes ``new``, at the address written."""
    readers = []
    for node in group.nodes:
        handler = ReadWriteHandler()
        with set_ops_handler(handler):
            node.body(XINDEX, RINDEX if node.mode == "xr" else None)
        reads = [d for d in handler.reads if d.name == old]
        if reads:
            readers.append((node, reads, [d for d in handler.writes if d.name == new]))
    if len(readers) != 1:
        return False
    node, reads, writes = readers[0]
    if node.kind != "pointwise" or len(writes) != 1:
        return False
    return all(r.index == writes[0].index and not r.is_indirect() for r in reads)


def _may_alias(step: Step) -> bool:
    """An ATen call whose result may be a view of its inputs (``Tensor(a)`` returns)."""
    if isinstance(step, NopStep):
        return True
    if not isinstance(step, ExternStep):
        return False
    schema = getattr(step.buffer.op, "_schema", None)
    return schema is None or any(r.alias_info is not None for r in schema.returns)


def _extend_for_aliases(
    steps: Sequence[Step], last_use: dict[str, int], external: set[str]
) -> set[str]:
    """Keep a buffer alive while a view of it (an extern result) is, and never free
    what a kept view points into. Returns the widened ``external`` set."""
    external = set(external)
    for step in reversed(steps):  # later aliases first, so chains resolve in one pass
        if not _may_alias(step):
            continue
        for out in step.writes:
            for base in step.reads:
                last_use[base] = max(last_use.get(base, 0), last_use.get(out, 0))
                if out in external:
                    external.add(base)
    return external


def _shared_storage(steps: Sequence[Step]) -> set[str]:
    """Names that may share storage with another name: an aliasing ATen call's results
    (``view_as_real``, ``resolve_neg``: often their input itself) and what they read.

    None of them may be overwritten in place or handed to a later allocation: writing
    a view writes its base (a graph input, or a buffer read elsewhere), and the view
    dies with its base only when the base dies after it.
    """
    shared: set[str] = set()
    for step in steps:
        if isinstance(step, NopStep) and not step.reads & shared:
            continue  # one result of a multi-result call that returns no view
        if _may_alias(step):
            shared |= step.reads | step.writes
    return shared


def _same(a: Layout, b: Layout) -> bool:
    return a.as_fixed() == b.as_fixed()


def plan_memory(
    steps: Sequence[Step],
    layout_of: Callable[[str], Layout],
    external: set[str],
    released: set[str] | None = None,
) -> MemoryPlan:
    """Plan allocations; ``external`` names inputs, constants and outputs (never freed).

    A dead buffer that a later allocation takes over is not deleted when it dies;
    the wrapper renames it at the reuse (``new = old; del old``). ``released`` names
    inputs whose reference the wrapper drops after their last use (never reused: the
    caller may hold them too); a caller that hands over its own list of arguments
    frees them there, as a backward does with the activations saved for it.
    """
    last_use: dict[str, int] = {}
    for i, step in enumerate(steps):
        for name in step.reads | step.writes:
            last_use[name] = i
    external = _extend_for_aliases(steps, last_use, external)  # last uses of aliased bases
    pinned = external | _shared_storage(steps)  # never overwritten by another name
    dropped = released or set()  # a view that outlives its input's name keeps the storage
    allocate: dict[int, list[tuple[str, Layout]]] = {}
    reuse: dict[int, list[tuple[str, str, str]]] = {}
    free: dict[int, list[str]] = {}
    pool: list[tuple[str, Layout]] = []
    produced: set[str] = set()
    taken: set[str] = set()  # storage handed to another name (reuse or in place)
    moved: set[str] = set()  # the in-place donors among them
    for i, step in enumerate(steps):
        if isinstance(step, KernelStep):
            for name in step.group.outputs:
                if name in produced or (name in external and name in step.reads):
                    continue
                produced.add(name)
                layout = layout_of(name)
                donor = _donor(step, name, layout, pool, last_use, i, pinned, layout_of)
                if donor is None:
                    allocate.setdefault(i, []).append((name, layout))
                else:
                    reuse.setdefault(i, []).append(donor)
                    # either way the old name no longer owns its storage: it must not
                    # enter the pool when it dies (an in-place successor still lives)
                    taken.add(donor[1])
                    if donor[2] == "inplace":
                        moved.add(donor[1])
        else:
            produced |= step.writes
        for name in sorted(step.reads | step.writes):
            if last_use.get(name) == i and name in dropped:
                free.setdefault(i, []).append(name)
            elif last_use.get(name) == i and name not in external and name in produced:
                free.setdefault(i, []).append(name)
                if name not in taken and name not in pinned:
                    pool.append((name, layout_of(name)))
    # a reused name is deleted at the hand-over, not when it died; an in-place donor
    # is deleted after the kernel that overwrote it, as planned
    free = {i: [n for n in names if n not in taken or n in moved] for i, names in free.items()}
    plan = MemoryPlan(allocate, reuse, free, 0)
    return dataclasses.replace(plan, peak_bytes=_peak(steps, plan, layout_of))


def _peak(steps: Sequence[Step], plan: MemoryPlan, layout_of: Callable[[str], Layout]) -> int:
    """Bytes held by intermediates at the busiest point of the program."""
    live = peak = 0
    renamed = {new for entries in plan.reuse.values() for new, _, _ in entries}
    moved = {old for entries in plan.reuse.values() for _, old, how in entries if how == "inplace"}
    allocated = {name for entries in plan.allocate.values() for name, _ in entries}
    for i, step in enumerate(steps):
        live += sum(layout.nbytes() for _, layout in plan.allocate.get(i, []))
        if not isinstance(step, KernelStep):
            live += sum(layout_of(n).nbytes() for n in step.writes)
            allocated |= step.writes
        peak = max(peak, live)
        for name in plan.free.get(i, []):
            if (name in allocated or name in renamed) and name not in moved:
                live -= layout_of(name).nbytes()
    return peak


def _donor(
    step: KernelStep,
    name: str,
    layout: Layout,
    pool: list[tuple[str, Layout]],
    last_use: dict[str, int],
    i: int,
    external: set[str],
    layout_of: Callable[[str], Layout],
) -> tuple[str, str, str] | None:
    for old in sorted(step.reads):
        if old in external or last_use.get(old) != i or old in step.writes:
            continue
        if _same(layout_of(old), layout) and _in_place_ok(step.group, old, name):
            return name, old, "inplace"
    for k, (old, old_layout) in enumerate(pool):
        if _same(old_layout, layout) and last_use.get(old, -1) < i:
            del pool[k]
            return name, old, "reuse"
    return None
