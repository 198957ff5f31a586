"""Readable dumps of code objects and instruction lists, for logs and artifacts.

``KILN_LOGS=bytecode`` and ``KILN_DEBUG_DIR`` dumps show code through these,
so an original and a transformed body print the same way.
"""

from __future__ import annotations

import dis
import logging
import re
from collections.abc import Sequence
from types import CodeType

from kiln.capture import artifacts
from kiln.capture.bytecode.instructions import Bytecode, ExceptionEntry, Instr

__all__ = ["format_bytecode", "format_code", "log_code"]

bytecode_log = logging.getLogger("kiln.capture.bytecode")


def format_code(code: CodeType) -> str:
    """``dis`` text of ``code`` with a header naming it (nested code objects included)."""
    head = (
        f"# {code.co_qualname} ({code.co_filename}:{code.co_firstlineno}) "
        f"args={code.co_argcount} locals={code.co_varnames} cells={code.co_cellvars} "
        f"free={code.co_freevars} stacksize={code.co_stacksize} flags={code.co_flags:#x}"
    )
    body = dis.Bytecode(code).dis()
    nested = [format_code(c) for c in code.co_consts if isinstance(c, CodeType)]
    return "\n".join([head, body, *nested])


def format_bytecode(code: Bytecode | Sequence[Instr], table: Sequence[ExceptionEntry] = ()) -> str:
    """One line per instruction, jumps shown as ``-> #index``, before assembly."""
    if isinstance(code, Bytecode):
        instrs: Sequence[Instr] = code.instrs
        table = code.exception_table
    else:
        instrs = code
    index = {id(ins): i for i, ins in enumerate(instrs)}
    lines = []
    for i, ins in enumerate(instrs):
        if isinstance(ins.arg, Instr):
            arg = f"-> #{index.get(id(ins.arg), '?')}"
        elif ins.arg is None:
            arg = ""
        else:
            arg = repr(ins.arg)
        where = f"L{ins.lineno}" if ins.lineno is not None else "L-"
        origin = f"@{ins.offset}" if ins.offset is not None else ""
        lines.append(f"{i:4d} {where:>6} {ins.opname:<28} {arg} {origin}".rstrip())
    for e in table:
        s, t, g = (index.get(id(x), "?") for x in (e.start, e.end, e.target))
        lasti = " lasti" if e.lasti else ""
        lines.append(f"  except #{s}..#{t} -> #{g} depth={e.depth}{lasti}")
    return "\n".join(lines)


def log_code(label: str, code: CodeType) -> None:
    """Show ``code`` on the ``bytecode`` channel and dump it as a debug artifact.

    ``label`` says what it is ("original", "transformed", "resume_at_42"); the
    text is only built when someone is listening.
    """
    dumping = artifacts.current_frame_dir() is not None
    if not dumping and not bytecode_log.isEnabledFor(logging.INFO):
        return
    text = format_code(code)
    bytecode_log.info("%s bytecode of %s\n%s", label, code.co_qualname, text)
    if dumping:
        artifacts.dump(f"bytecode_{re.sub(r'[^A-Za-z0-9_]+', '_', label)}.txt", text)
