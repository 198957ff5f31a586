"""Per-code-object facts the evaluator asks about again and again, computed once.

:func:`code_info` decodes a code object and runs the analyses on it; the
answer is cached by code object, so the symbolic evaluator can ask "what is at
offset 42, how deep is the stack there, which locals are live" cheaply.
The cached :class:`~.Bytecode` is shared: :meth:`~.Bytecode.clone` it before
editing.
"""

from __future__ import annotations

import dataclasses
import functools
from types import CodeType

from kiln.capture.bytecode.analysis import live_locals, stack_depths
from kiln.capture.bytecode.decode import decode
from kiln.capture.bytecode.instructions import Bytecode, Instr
from kiln.capture.errors import CaptureError

__all__ = ["CodeInfo", "code_info"]


@dataclasses.dataclass(frozen=True, eq=False)
class CodeInfo:
    """A decoded code object with stack depth and live locals before each instruction."""

    code: CodeType
    body: Bytecode
    depths: tuple[int | None, ...]
    live: tuple[frozenset[str], ...]
    positions: dict[int, int]  # offset -> index in body.instrs
    jump_targets: frozenset[int]  # offsets that some jump or handler lands on

    def index(self, offset: int) -> int:
        try:
            return self.positions[offset]
        except KeyError:
            msg = f"offset {offset} is not the start of an instruction in {self.code.co_qualname}"
            raise CaptureError(msg) from None

    def at(self, offset: int) -> Instr:
        """The instruction at ``offset``."""
        return self.body.instrs[self.index(offset)]

    def stack_depth(self, offset: int) -> int | None:
        """Items on the stack before the instruction at ``offset`` (None: unreachable)."""
        return self.depths[self.index(offset)]

    def live_at(self, offset: int) -> frozenset[str]:
        """Fast locals read on some path from ``offset`` before being written."""
        return self.live[self.index(offset)]


def code_info(code: CodeType) -> CodeInfo:
    """Decode and analyse ``code`` (cached per code object)."""
    # code objects compare equal across files (== ignores co_filename): the file is part of
    # the key, so a resume function never takes another file's name and lines
    return _code_info(code, code.co_filename)


@functools.lru_cache(maxsize=512)
def _code_info(code: CodeType, filename: str) -> CodeInfo:
    body = decode(code)
    instrs, table = body.instrs, body.exception_table
    targets = {ins.arg.offset for ins in instrs if ins.is_jump}
    targets |= {entry.target.offset for entry in table}
    return CodeInfo(
        code=code,
        body=body,
        depths=tuple(stack_depths(instrs, table)),
        live=tuple(live_locals(instrs, table)),
        positions={ins.offset: i for i, ins in enumerate(instrs) if ins.offset is not None},
        jump_targets=frozenset(t for t in targets if t is not None),
    )
